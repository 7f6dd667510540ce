"""Minimum-energy paths against potentials whose minima and saddles are known."""

import math
import warnings

import numpy as np
import pyro
import pytest
import torch

from pyro_flat.flatness import curvature_along_path, minimum_energy_path, projected_dynamics, straight_path
from pyro_flat.mixtures import sharp_flat_2d

# Müller & Brown (1979): minima and saddles tabulated in the NEB literature
A = torch.tensor([-200.0, -100.0, -170.0, 15.0], dtype=torch.float64)
a = torch.tensor([-1.0, -1.0, -6.5, 0.7], dtype=torch.float64)
b = torch.tensor([0.0, 0.0, 11.0, 0.6], dtype=torch.float64)
c = torch.tensor([-10.0, -10.0, -6.5, 0.7], dtype=torch.float64)
X0 = torch.tensor([1.0, 0.0, -0.5, -1.0], dtype=torch.float64)
Y0 = torch.tensor([0.0, 0.5, 1.5, 1.0], dtype=torch.float64)
MIN_A, MIN_B, MIN_C = [-0.558, 1.442], [0.623, 0.028], [-0.050, 0.467]
SADDLE_1, SADDLE_1_ENERGY = [-0.822, 0.624], -40.66


def muller_brown(p):
    dx, dy = p[0] - X0, p[1] - Y0
    return (A * torch.exp(a * dx ** 2 + b * dx * dy + c * dy ** 2)).sum()


def test_muller_brown_path_climbs_to_the_known_saddle_through_the_intermediate_minimum():
    start, end = torch.tensor(MIN_A, dtype=torch.float64), torch.tensor(MIN_B, dtype=torch.float64)
    path = minimum_energy_path(muller_brown, start, end, num_points=15, step_size=1e-4, spring=100.0,
                               tol=0.1, max_steps=5000)
    assert path.converged
    assert torch.allclose(path.points[0], start) and torch.allclose(path.points[-1], end)
    top = path.points[path.highest]
    assert (top - torch.tensor(SADDLE_1, dtype=torch.float64)).norm() < 0.01
    assert path.loss.max() == pytest.approx(SADDLE_1_ENERGY, abs=0.05)
    # through the intermediate minimum (-0.050, 0.467), not along the straight line
    assert float((path.points - torch.tensor(MIN_C, dtype=torch.float64)).norm(dim=-1).min()) < 0.1
    assert straight_path(muller_brown, start, end, num_points=15).loss.max() > 0  # the line crosses a ridge
    assert np.all(np.diff(path.arc_length) > 0)
    spacing = np.diff(path.arc_length)
    assert spacing.max() / spacing.min() < 1.5  # the springs keep the images evenly spaced


def test_autoneb_inserts_pivots_where_the_loss_rises_between_neighbours():
    """With 7 images the band between Müller-Brown's A and B has segments over which the loss rises
    above both ends (around the intermediate minimum's barriers): one round inserts pivots there."""
    start, end = torch.tensor(MIN_A, dtype=torch.float64), torch.tensor(MIN_B, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        paths = [minimum_energy_path(muller_brown, start, end, num_points=7, step_size=1e-4, spring=100.0,
                                     tol=0.1, max_steps=3000, insertion_rounds=rounds) for rounds in (0, 1)]
    assert len(paths[0].points) == 7 and len(paths[1].points) > 7


def test_mixture_path_passes_the_exact_saddle():
    m = sharp_flat_2d()
    energy = lambda x: -m.log_prob(x.double()).double()  # noqa: E731
    path = minimum_energy_path(energy, m.sharp_loc.double(), m.flat_loc.double(), num_points=11, step_size=0.01,
                               spring=5.0, tol=1e-3, max_steps=4000)
    saddle = m.saddle()
    assert path.converged
    assert float((path.points[path.highest] - saddle).norm()) < 1e-2
    assert path.barrier == pytest.approx(m.barriers()[1], abs=1e-3)  # above the higher end: the flat mode
    spacing = np.diff(path.arc_length)
    assert spacing.max() / spacing.min() < 1.5


def test_curvature_along_a_quadratic_valley_is_its_hessian():
    hessian = torch.diag(torch.tensor([1.0, 4.0, 9.0], dtype=torch.float64))
    loss = lambda x: 0.5 * x @ hessian @ x  # noqa: E731
    line = straight_path(loss, torch.tensor([-1.0, 0.0, 0.0], dtype=torch.float64),
                         torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64), num_points=5)
    profile = curvature_along_path(loss, line, num_probes=50)
    assert np.allclose(profile["top_eigenvalue"], 9.0, atol=1e-4)
    assert np.all(np.abs(profile["trace"] - 14.0) < 4 * profile["trace_stderr"] + 1e-9)
    assert np.allclose(profile["position"], [0, 0.25, 0.5, 0.75, 1.0])
    assert np.allclose(profile["loss"], [0.5, 0.125, 0.0, 0.125, 0.5])


def test_curvature_along_a_line_is_measured_at_each_image():
    """A quartic: the Hessian diag(3x²) changes along the line, so each image has its own values."""
    loss = lambda x: (x ** 4).sum() / 4  # noqa: E731
    line = straight_path(loss, torch.tensor([0.2, 1.0, -0.5], dtype=torch.float64),
                         torch.tensor([1.5, -0.3, 0.4], dtype=torch.float64), num_points=5)
    profile = curvature_along_path(loss, line, num_probes=50)
    for i, point in enumerate(line.points):
        exact = torch.linalg.eigvalsh(torch.autograd.functional.hessian(loss, point))
        assert profile["top_eigenvalue"][i] == pytest.approx(float(exact[-1]), rel=1e-4)
        assert abs(profile["trace"][i] - float(exact.sum())) < 4 * profile["trace_stderr"][i] + 1e-9


def test_bad_paths_are_refused():
    f = lambda x: (x ** 2).sum()  # noqa: E731
    x = torch.tensor([1.0, 0.0])
    with pytest.raises(ValueError, match="start and end are the same point"):
        minimum_energy_path(f, x, x.clone())
    with pytest.raises(ValueError, match="num_points must be an integer >= 3"):
        minimum_energy_path(f, x, -x, num_points=2)
    with pytest.raises(ValueError, match="same shape"):
        straight_path(f, x, torch.zeros(3))
    hole = lambda x: torch.where(x[0].abs() < 0.2, torch.tensor(float("nan")), (x ** 2).sum())  # noqa: E731
    with pytest.raises(ValueError, match="the loss is nan at image 2 of the path"):
        minimum_energy_path(hole, x, -x, num_points=5)
    with pytest.raises(ValueError, match="spring must be a positive finite number"):
        minimum_energy_path(f, x, -x, spring=0.0)


def test_unconverged_path_warns():
    with pytest.warns(RuntimeWarning, match="did not converge"):
        path = minimum_energy_path(muller_brown, torch.tensor(MIN_A, dtype=torch.float64),
                                   torch.tensor(MIN_B, dtype=torch.float64), num_points=9, step_size=1e-5,
                                   max_steps=20, insertion_rounds=0)
    assert not path.converged and math.isfinite(path.max_force)


def test_projected_sgld_samples_the_loss_restricted_to_the_path():
    """SGLD along a straight path through a quadratic bowl: positions ~ N(middle, T/h), h = 2 the
    curvature along the path (Euler's variance factor 1/(1 - αh/2) computed in)."""
    line = straight_path(lambda x: (x ** 2).sum(), torch.tensor([-1.0, 0.5], dtype=torch.float64),
                         torch.tensor([1.0, 0.5], dtype=torch.float64), num_points=9)
    alpha, temperature, chains = 0.05, 0.01, 2000
    run = projected_dynamics(line, lambda x: 2 * x, start=0.8, step_size=alpha, num_steps=300,
                             temperature=temperature, num_chains=chains, seed=1, constrained=True)
    end = (run.position[-1] - 0.5) * 2.0  # arc length from the middle (the path has length 2)
    sd = math.sqrt(temperature / 2.0 / (1 - alpha * 2.0 / 2))
    assert abs(end.mean()) < 4 * sd / math.sqrt(chains)
    assert end.std() == pytest.approx(sd, rel=4 / math.sqrt(2 * chains) + 0.01)
    assert not run.distance.any() and run.position.shape == (301, chains)
    with pytest.raises(ValueError, match=r"start is a position along the path in \[0, 1\]"):
        projected_dynamics(line, lambda x: 2 * x, start=1.5, step_size=0.1, num_steps=1)
    with pytest.raises(ValueError, match="num_chains must be a positive integer"):
        projected_dynamics(line, lambda x: 2 * x, start=0.5, step_size=0.1, num_steps=1, num_chains=0)


def _entropic_valley(x):
    """Flat along y = 0 for |x| <= 1, walls beyond; curvature across, k(x) = 1 + 8 exp(-4x²), peaks
    in the middle. Returns the loss and its gradient, rows of x ``(C, 2)``."""
    k = 1 + 8 * torch.exp(-4 * x[:, 0] ** 2)
    over = (x[:, 0].abs() - 1).clamp_min(0.0)
    loss = 0.5 * k * x[:, 1] ** 2 + WALL * over ** 2
    dk = -64 * x[:, 0] * torch.exp(-4 * x[:, 0] ** 2)
    grad = torch.stack([0.5 * dk * x[:, 1] ** 2 + 2 * WALL * over * x[:, 0].sign(), k * x[:, 1]], dim=-1)
    return loss, grad


WALL = 50.0


def test_noise_drives_projected_sgld_to_the_flat_ends_by_the_exact_entropic_force():
    """SGLD in the plane, read off as a position on the flat path from (-1, 0) to (1, 0). The loss
    along the path is flat, but the stationary law of x is p(x) ∝ k(x)^{-1/2} e^{-wall/T} (the
    Gaussian across the path integrated out; Euler's factor (1 - αk/2)^{-1/2} computed in), so the
    chains leave the sharp middle. The constrained dynamics, blind to k, spread evenly instead."""
    from scipy.integrate import quad

    alpha, temperature, chains = 2e-3, 0.5, 4000
    line = straight_path(lambda x: _entropic_valley(x[None])[0][0], torch.tensor([-1.0, 0.0], dtype=torch.float64),
                         torch.tensor([1.0, 0.0], dtype=torch.float64), num_points=5)
    kwargs = dict(start=0.5, step_size=alpha, num_steps=3000, temperature=temperature, num_chains=chains,
                  seed=2, vectorized=True, record_every=1000)
    free = projected_dynamics(line, lambda x: _entropic_valley(x)[1], **kwargs)
    along = projected_dynamics(line, lambda x: _entropic_valley(x)[1], constrained=True, **kwargs)

    def density(x):
        k = 1 + 8 * math.exp(-4 * x * x)
        return (k * (1 - alpha * k / 2)) ** -0.5 * math.exp(-WALL * max(abs(x) - 1, 0.0) ** 2 / temperature)

    middle = quad(density, -0.5, 0.5)[0] / quad(density, -3, 3, points=[-1, 1])[0]   # about 0.30
    for run, exact in ((free, middle), (along, 0.5)):
        share = np.mean(np.abs(run.position[-1] - 0.5) < 0.25)
        assert share == pytest.approx(exact, abs=4 * math.sqrt(exact * (1 - exact) / chains) + 0.01)
    # the middle share does not depend on T; the distance across the path does: for chains in the middle
    # half it is |y|, y ~ N(0, T / (k (1 - αk/2))) given x, so E|y| = E_x sqrt(2 T / (π k (1 - αk/2)))
    def spread(x):
        k = 1 + 8 * math.exp(-4 * x * x)
        return density(x) * math.sqrt(2 * temperature / (math.pi * k * (1 - alpha * k / 2)))

    inside = np.abs(free.position[-1] - 0.5) < 0.25
    exact_distance = quad(spread, -0.5, 0.5)[0] / quad(density, -0.5, 0.5)[0]
    sd = free.distance[-1][inside].std() / math.sqrt(inside.sum())
    assert free.distance[-1][inside].mean() == pytest.approx(exact_distance, abs=4 * sd + 0.005)
    assert free.steps.tolist() == [0, 1000, 2000, 3000]
    assert free.to_nearer_end[-1].mean() < free.to_nearer_end[0].mean() - 0.1
    # the distance from the path is |y| for chains inside the ends: E|y| = sqrt(2T/(π k)) at stationarity
    assert np.median(free.distance[-1]) < 1.0


def test_a_path_projects_points_onto_its_nearest_segment():
    """An L-shaped path of two segments of lengths 1 and 2 (total 3)."""
    from pyro_flat.flatness import EnergyPath

    path = EnergyPath(torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 2.0]]), np.zeros(3))
    position, distance = path.project(torch.tensor([[0.5, -0.4], [2.0, 1.5], [-1.0, 0.0], [1.0, 5.0]]))
    assert position.tolist() == pytest.approx([0.5 / 3, 2.5 / 3, 0.0, 1.0])
    assert distance.tolist() == pytest.approx([0.4, 1.0, 1.0, 3.0])
    assert path.at(0.5).tolist() == pytest.approx([1.0, 0.5])
    assert path.at(torch.tensor([0.0, 1.0])).flatten().tolist() == pytest.approx([0.0, 0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match=r"position along the path lies in \[0, 1\]"):
        path.at(1.5)


def _dynamics_run(kind, shift, se=0.0, chains=16, batch_size=10, temperature=0.0):
    return {"kind": kind, "alpha_lambda": 0.4, "step_size": 0.5, "batch_size": batch_size, "chains": chains,
            "temperature": temperature, "steps": [0, 10000], "diverged": False, "shift": shift, "shift_se": se,
            "final_distance": 1.0, "settled": [0.5 + shift - se * math.sqrt(chains), 0.5 + shift + se * math.sqrt(chains)]}


def _study_report(free_shift=-0.08, fixed_shift=-0.01, se=0.005, control=-0.01):
    """A path study's report with made-up numbers, to check the sentences computed from them: end 0
    is the flatter (lower trace), so a negative shift is toward it."""
    profile = {"position": [0, 0.25, 0.5, 0.75, 1], "loss": [0.0290, 0.0295, 0.0300, 0.0295, 0.0292],
               "top_eigenvalue": [0.8, 0.9, 1.0, 0.9, 0.85], "trace": [85.0, 88.0, 90.0, 88.0, 87.0],
               "trace_stderr": [0.2] * 5}
    draw = {"loss": 0.2, "top_eigenvalue": 3.0, "trace": 50.0, "trace_stderr": 1.0, "position": 0.5, "distance": 30.0}
    dynamics = [_dynamics_run("free full-batch descent", control, chains=1, batch_size=None),
                _dynamics_run("constrained full-batch descent", control, chains=1, batch_size=None),
                _dynamics_run("free SGD", free_shift, se), _dynamics_run("constrained SGD", fixed_shift, se),
                _dynamics_run("free SGLD", control, se, chains=4, temperature=1e-6)]
    return {"n_train": 1000, "path_length": 40.0, "endpoints_loss": [0.029, 0.0292], "endpoints_gradient": [3e-4, 3e-4],
            "decay_trace": 79.0, "config": {"dynamics_start": 0.5, "insertion_rounds": 2, "tol": 1e-3, "trace_probes": 10},
            "path": {"converged": True, "max_force": 9e-4, "images": 18},
            "profiles": {"minimum-energy path": profile, "straight line": profile},
            "draws": {"SGLD": [dict(draw, distance=10.0), draw], "FlatSGLD": [dict(draw, top_eigenvalue=1.0)] * 2},
            "dynamics": dynamics}


def test_draws_within_their_error_are_a_tie_not_a_winner():
    """The issue's case: 3.8116 against 3.8111 from 2 draws each is no ranking."""
    from pyro_flat.experiments.paths.study import findings

    report = _study_report()
    pair = report["draws"]["SGLD"]
    report["draws"] = {"EntropySGLD θa": [dict(pair[0], top_eigenvalue=3.70), dict(pair[1], top_eigenvalue=3.9232)],
                       "FlatSGLD": [dict(pair[0], top_eigenvalue=3.75), dict(pair[1], top_eigenvalue=3.8722)]}
    seen = next(t for t in findings(report) if t.startswith("Of the samplers' draws"))
    assert "EntropySGLD θa's and FlatSGLD's have the highest mean top eigenvalue" in seen
    assert "tied within t = 12.71 standard errors (the 95 % t critical value for 2 draws)" in seen
    assert "beyond" not in seen


def test_path_study_findings_follow_the_numbers():
    from pyro_flat.experiments.paths.study import findings

    seen = " ".join(findings(_study_report()))
    assert "end 0 is the flatter by the Hessian trace (end 0: 85 ± 0.2, end 1: 87 ± 0.2)" in seen
    assert "free SGD: -0.0700 ± 0.0050, toward end 0 (the flatter)" in seen
    assert "Free SGD's excess beyond constrained SGD's (the part the curvature across the path can cause): " \
        "-0.0700 ± 0.0071, toward end 0 (the flatter)" in seen
    assert "drift toward the flatter end appears in every setting" in seen
    assert "constrained SGD: +0.0000 ± 0.0050, no shift" in seen
    assert "no run's chains moved more than 0.080 of the path" in seen and "travel along the path" in seen
    assert "trace of the NLL's Hessian (the weight decay's constant 79 taken off) 7 at the ends and 11 at its highest" \
        in seen
    assert "every image of its middle half has a higher top eigenvalue and trace" in seen
    assert "FlatSGLD's have the lowest mean top eigenvalue (± its standard error over 2 draws) (1 ± 0), beyond t = " \
        "12.71 standard errors (the 95 % t critical value for 2 draws) of every other; SGLD's have the highest" in seen
    assert " FlatSGLD: farther from the path than half its length" in seen  # SGLD has a draw 10 from it
    assert "SGLD, FlatSGLD: farther" not in seen and "FlatSGLD, SGLD: farther" not in seen
    # noise moves the free and the constrained runs alike: no entropic drift
    same = " ".join(findings(_study_report(free_shift=-0.08, fixed_shift=-0.08)))
    assert "+0.0000 ± 0.0071, no drift measurable here" in same and "does not appear" in same
    # toward the sharper end
    away = " ".join(findings(_study_report(free_shift=0.06)))
    assert "free SGD: +0.0700 ± 0.0050, toward end 1 (the sharper)" in away
    assert "toward the flatter end beyond its controls in 0 of 1 settings and toward the sharper end in 1" in away
    # a shift beyond 2 standard errors but below a hundredth of the path is no drift
    tiny = " ".join(findings(_study_report(free_shift=-0.0105, fixed_shift=-0.01, se=1e-5)))
    assert "free SGD: -0.0005 ± 0.0000, no shift" in tiny and "does not appear" in tiny
    assert "no run's chains moved more than 0.011 of the path" in tiny and "barely move along this path" in tiny
    # tied traces: no end is measurably flatter, so a drift says nothing about the flatter end
    report = _study_report(free_shift=0.06)
    report["profiles"]["minimum-energy path"]["trace"] = [86.0, 88.0, 90.0, 88.0, 86.1]
    tied = " ".join(findings(report))
    assert "the ends' traces are the same within t = 2.26 standard errors (the 95 % t critical value for 10 " \
        "probes)" in tied and "end 0 has the lower top" in tied
    assert "free SGD: +0.0700 ± 0.0050, toward end 1 (1 from the path)" in tied
    assert "(toward end 1), but neither end is measurably flatter by the Hessian trace" in tied


def test_matched_temperature_gives_the_noise_variance_per_step():
    """Minibatch gradients g + σ ξ in d dimensions: SGD's noise has variance α² σ² d per step, so
    isotropic noise of the same variance has T = α σ² / 2."""
    from pyro_flat.experiments.paths.dynamics import matched_temperature

    torch.manual_seed(0)
    d, sigma, alpha, m = 10, 0.3, 0.5, 4000
    exact = lambda x: 2 * x  # noqa: E731
    noisy = lambda x: 2 * x + sigma * torch.randn(x.shape, dtype=x.dtype)  # noqa: E731
    T = matched_temperature(noisy, exact, torch.ones(d, dtype=torch.float64), alpha, m)
    # the estimate is a mean of m chi-square(d) draws times σ²/d: relative sd sqrt(2 / (m d))
    assert T == pytest.approx(alpha * sigma ** 2 / 2, rel=4 * math.sqrt(2 / (m * d)))


def test_mlp_gradient_matches_autograd_of_the_path_loss_per_chain():
    """The study's vectorized gradient against torch's gradient of the flat loss, chain by chain; a
    minibatch of the whole data set (one epoch) is the full gradient."""
    from pyro_flat.experiments.paths.dynamics import mlp_gradient
    from pyro_flat.flatness import FlatLoss
    from pyro_flat.models import BayesianMLP
    from pyro_flat.targets.batching import EpochBatcher

    torch.manual_seed(0)
    n, decay_scale = 30, 0.7
    X, y = torch.randn(n, 6), torch.randint(0, 3, (n,))
    model = BayesianMLP(6, [5], 3, prior_scale=1.0)
    trace = pyro.poutine.trace(model).get_trace(X, y)  # a draw of the prior
    draw = {k: v["value"] for k, v in trace.nodes.items() if v["type"] == "sample" and not v["is_observed"]}
    nll = FlatLoss.from_model(model, draw, X, y, likelihood_only=True)
    loss = lambda x: nll.fn(x) / n + x.square().sum() / (2 * n * decay_scale ** 2)  # noqa: E731
    x = torch.stack([nll.params, 0.5 * nll.params + 0.1])
    expected = torch.stack([torch.func.grad(loss)(row) for row in x])
    full = mlp_gradient(model, nll.blocks, X, y, decay_scale, None)
    assert torch.allclose(full(x), expected, atol=1e-6)
    epoch = mlp_gradient(model, nll.blocks, X, y, decay_scale, EpochBatcher(n, n, X.device, num_chains=2))
    assert torch.allclose(epoch(x), expected, atol=1e-6)
    batcher, drawn = EpochBatcher(n, n // 2, X.device, num_chains=2), []
    half = mlp_gradient(model, nll.blocks, X, y, decay_scale, lambda: drawn.append(batcher()) or drawn[-1])
    g = half(x)
    assert not torch.allclose(g, expected, atol=1e-2)  # a real minibatch is noisy
    for chain, idx in enumerate(drawn[0]):  # each chain on its own minibatch
        own = FlatLoss.from_model(model, draw, X[idx], y[idx], likelihood_only=True)
        mine = torch.func.grad(lambda z: own.fn(z) / len(idx) + z.square().sum() / (2 * n * decay_scale ** 2))
        assert torch.allclose(g[chain], mine(x[chain]), atol=1e-6)


def test_a_drift_counts_beyond_the_t_critical_value_for_its_chains():
    """A shift of 3 standard errors is a drift over 16 chains (t = 2.13), not over 3 (t = 4.30)."""
    from pyro_flat.experiments.paths.dynamics import moved

    assert moved(-0.03, 0.01, 16) and not moved(-0.03, 0.01, 3)
    assert not moved(-0.005, 1e-5, 16)  # below a hundredth of the path
