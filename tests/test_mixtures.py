"""The sharp/flat mixtures computed exactly: smoothing, critical points, basins and their masses.

Each exact quantity is checked against an independent computation: Monte Carlo with exact draws,
brute-force gradient descent, closed-form 1-D integrals, dense line searches.
"""

import math

import numpy as np
import pytest
import torch

from pyro_flat import EntropySGLD, SGLD
from pyro_flat.convergence import run_ensemble
from pyro_flat.infer.sampling_loop import run_chains
from pyro_flat.mixtures import basin_boundary, sharp_flat_1d, sharp_flat_2d


@pytest.mark.parametrize("mixture", [sharp_flat_1d(), sharp_flat_2d()], ids=["1d", "2d"])
def test_smoothed_mixture_is_the_convolution(mixture):
    """p * N(0, ηI) in closed form equals the numerical convolution, at a few points."""
    eta = 0.4
    torch.manual_seed(0)
    eps = torch.randn(400_000, mixture.dim, dtype=torch.float64) * eta**0.5
    for point in (mixture.sharp_loc, mixture.flat_loc, torch.zeros(mixture.dim)):
        mc = mixture.log_prob((point.double() - eps).float()).exp().double()
        closed = float(mixture.log_prob(point, eta=eta).exp())
        assert abs(float(mc.mean()) - closed) < 4 * float(mc.std()) / len(mc) ** 0.5 + 1e-6


def _gradient_and_hessian(mixture, point, eta):
    x = torch.tensor(point, dtype=torch.float64)
    f = lambda y: mixture.log_prob(y, eta=eta).double()  # noqa: E731
    grad = torch.autograd.functional.jacobian(f, x)
    return grad, torch.linalg.eigvalsh(torch.autograd.functional.hessian(f, x))


@pytest.mark.parametrize("eta", [0.0, 0.25, 1.0, 2.0])
def test_critical_points_are_two_maxima_and_a_saddle(eta):
    m = sharp_flat_2d()
    points = m.critical_points(eta)
    assert len(points["modes"]) == 2
    for mode in points["modes"]:
        grad, eig = _gradient_and_hessian(m, mode, eta)
        assert grad.abs().max() < 1e-4 and (eig < 0).all()  # a maximum of log p
    grad, eig = _gradient_and_hessian(m, points["saddle"], eta)
    assert grad.abs().max() < 1e-4 and eig[0] < 0 < eig[1]  # a saddle
    barrier_sharp, barrier_flat = m.barriers(eta)
    log_p = m.log_prob(torch.as_tensor(np.vstack([points["modes"], points["saddle"]])).float(), eta=eta)
    assert barrier_sharp == pytest.approx(float(log_p[0] - log_p[2]), abs=1e-4)
    assert barrier_flat == pytest.approx(float(log_p[1] - log_p[2]), abs=1e-4)


def _maxima_on_axis(m, eta):
    """Heights of the local maxima of log p_η along the axis, from a dense line search."""
    t = torch.linspace(-0.5, 1.5, 40001, dtype=torch.float64)
    line = m.sharp_loc.double() + t[:, None] * (m.flat_loc - m.sharp_loc).double()
    lp = m.log_prob(line, eta=eta).double()
    inside = (lp[1:-1] > lp[:-2]) & (lp[1:-1] > lp[2:])
    return lp[1:-1][inside]


def test_peak_crossover_and_merge_agree_with_a_dense_line_search():
    m = sharp_flat_2d()
    crossover, merge = m.peak_crossover(), m.unimodal_beyond()
    before, after = _maxima_on_axis(m, crossover - 0.01), _maxima_on_axis(m, crossover + 0.01)
    assert len(before) == len(after) == 2
    assert before[0] > before[1] and after[0] < after[1]  # the sharp peak is first along the axis
    assert len(_maxima_on_axis(m, merge - 0.01)) == 2 and len(_maxima_on_axis(m, merge + 0.01)) == 1
    assert m.saddle(merge + 0.01) is None and m.barriers(merge + 0.01) is None
    assert m.highest_peak(0.0) == "sharp" and m.highest_peak(merge + 1) == "flat"


def _descend(m, x, eta=0.0, dt=0.02, steps=2000):
    """Brute force: RK4 on the gradient flow of −log p_η (in the time of dθ/dt = ∇log p / Σ_k r_k/σ_k²,
    which has the same paths), then the nearest mean."""
    locs = np.asarray(m.locs)
    s = m.component_scales(eta)
    w = np.asarray(m.weights)

    def velocity(y):
        d = locs[None] - y[:, None]
        logr = np.log(w) - (d ** 2).sum(-1) / (2 * s ** 2) - m.dim * np.log(s)
        r = np.exp(logr - logr.max(1, keepdims=True)) / s ** 2
        r = r / r.sum(1, keepdims=True)
        return (r[..., None] * d).sum(1)

    for _ in range(steps):
        k1 = velocity(x)
        k2 = velocity(x + dt / 2 * k1)
        k3 = velocity(x + dt / 2 * k2)
        k4 = velocity(x + dt * k3)
        x = x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    dist = ((x[:, None] - locs[None]) ** 2).sum(-1)
    return dist.argmin(1) == int(np.argmax(m.scales))


@pytest.mark.parametrize("eta", [0.0, 1.0])
def test_flat_basin_agrees_with_brute_force_gradient_descent(eta):
    """The basins of U_η, for the posterior (η = 0) and a smoothed posterior (η = 1)."""
    m = sharp_flat_2d()
    rng = np.random.default_rng(0)
    x = rng.uniform([-5.0, -4.0], [3.0, 3.0], size=(600, 2))
    edge = basin_boundary(m, eta)
    dense = np.vstack([np.interp(np.linspace(0, len(edge) - 1, 20000), np.arange(len(edge)), edge[:, k])
                       for k in range(2)]).T
    far = np.sqrt(((x[:, None] - dense[None]) ** 2).sum(-1)).min(1) > 0.05
    assert far.sum() > 500 and (~far).sum() > 0
    fast = m.in_flat_basin(torch.as_tensor(x), eta=eta).numpy()
    slow = _descend(m, x, eta=eta)
    assert 0.1 < slow.mean() < 0.9  # both basins are sampled
    assert (fast[far] == slow[far]).all()


@pytest.mark.parametrize("eta", [0.0, 1.0, 4.0])
def test_flat_basin_mass_matches_exact_draws(eta):
    """Quadrature of p_η over U's flat basin against the share of 200,000 exact draws of p_η."""
    m = sharp_flat_2d()
    torch.manual_seed(1)
    draws = m.distribution(eta).sample((200_000,))
    flat = m.in_flat_basin(draws).double()
    share, se = float(flat.mean()), float(flat.std()) / math.sqrt(len(flat))
    exact = m.flat_basin_mass(eta=eta)
    assert abs(share - exact) < 4 * se, (share, exact, se)
    assert {0.0: 0.70, 1.0: 0.837, 4.0: 0.899}[eta] == pytest.approx(exact, abs=1e-3)


def test_flat_basin_mass_is_the_closed_form_in_one_dimension():
    m = sharp_flat_1d()
    saddle = float(m.saddle())
    # in 1-D the flat basin is the side of the saddle towards the flat mode
    points = torch.tensor([[-1.5], [saddle - 0.01], [saddle + 0.01], [1.5]])
    assert m.in_flat_basin(points).tolist() == [False, False, True, True]
    for eta in (0.0, 0.5):
        s = m.component_scales(eta)
        exact = sum(w * 0.5 * math.erfc((saddle - loc[0]) / (sd * math.sqrt(2)))
                    for w, loc, sd in zip(m.weights, m.locs, s))
        if eta > 0:  # the basins are U's, at η = 0
            assert m.flat_basin_mass(eta=eta) == pytest.approx(exact, abs=1e-7)
        else:
            assert m.flat_basin_mass() == pytest.approx(exact, abs=1e-7)


def test_randomly_smoothed_density_is_the_expected_energy():
    m = sharp_flat_2d()
    sigma = 0.3
    log_q = m.randomly_smoothed_log_density(sigma)
    torch.manual_seed(2)
    eps = sigma * torch.randn(200_000, 2, dtype=torch.float64)
    for point in ([-2.0, -1.0], [-1.3, -0.6], [2.0, 1.0]):
        energies = -m.log_prob(torch.tensor(point, dtype=torch.float64) + eps).double()
        mc, se = float(energies.mean()), float(energies.std()) / math.sqrt(len(eps))
        assert abs(-float(log_q(np.array([point]))[0]) - mc) < 4 * se + 1e-6


def test_entropy_sgld_guiding_variable_keeps_the_smoothed_basin_share():
    """Chains started from the exact joint law (θ ~ p, θa = θ + √η ξ) stay in it: θa's share in U's
    flat basin is that of p * N(0, ηI) (0.837), not that of p (0.700)."""
    m = sharp_flat_2d()
    eta, chains = 1.0, 4000
    torch.manual_seed(3)
    theta = m.distribution().sample((chains,))
    kernel = EntropySGLD(potential_fn=lambda p: -m.log_prob(p["theta"]), eta=eta, step_size=2e-3)
    kernel.configure(num_chains=chains)
    kernel.initial_params = {"theta": theta, "theta_aux": theta + eta ** 0.5 * torch.randn_like(theta)}
    for _, _, params in run_chains(kernel, 300, 0):
        pass
    flat = m.in_flat_basin(params["theta_aux"]).double()
    share, se = float(flat.mean()), float(flat.std()) / math.sqrt(chains)
    exact = m.flat_basin_mass(eta=eta)
    assert abs(share - exact) < 4 * se + 0.01, (share, exact, se)
    assert abs(share - m.flat_basin_mass()) > 10 * se  # the law of θ would fail


def test_guiding_variable_leaves_the_sharp_basin_while_theta_stays():
    """From the sharp mode, within 3,000 steps (transient, measured: θa about 0.4 in U's flat basin,
    θ and SGLD 0): the barrier out of the sharp basin is 12.8 for θ, the smoothed one 1.0 for θa."""
    m = sharp_flat_2d()
    potential = lambda p: -m.log_prob(p["theta"])  # noqa: E731
    shares = {}
    for name, kernel in (("sgld", SGLD(potential_fn=potential, step_size=2e-3)),
                         ("entropy", EntropySGLD(potential_fn=potential, eta=1.0, step_size=2e-3))):
        torch.manual_seed(4)
        end = run_ensemble(kernel, m.sharp_loc, 400, [3000], progress_bar=False)[3000]
        for site, value in end.items():
            shares[f"{name} {site}"] = float(m.in_flat_basin(value).double().mean())
    assert shares["sgld theta"] < 0.02 and shares["entropy theta"] < 0.02, shares
    assert shares["entropy theta_aux"] > 0.25, shares


def test_bad_points_and_mixtures_are_refused():
    m = sharp_flat_2d()
    with pytest.raises(ValueError, match="last dimension of size 2"):
        m.in_flat_basin(torch.zeros(3))
    with pytest.raises(ValueError, match="eta must be >= 0"):
        m.component_scales(-1.0)
    with pytest.raises(ValueError, match="scales must differ"):
        type(m)(weights=(0.5, 0.5), locs=((0.0,), (1.0,)), scales=(1.0, 1.0))
