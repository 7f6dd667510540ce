"""Preconditioned SGLD and EntropySGLD on ill-conditioned Gaussians (condition number 1,000)
against the exact law of the preconditioned update (docs/theory.md, section 2).

With a fixed metric P = M⁻¹ the update z ← z − αP∇U + √(2αT) L ξ (P = LLᵀ) on U = ½(z−μ)ᵀH(z−μ)
is the linear recursion z ← Bz + c + ε with B = I − αPH, ε ~ N(0, 2αTP); its stationary law solves
a discrete Lyapunov equation (pyro_flat.theory.LinearGaussianChain.stationary). The step size is
large (α = 0.3 in the metric's units, where the plain kernels would need α < 2/1000), so the
discretisation is visible and the test checks the update itself, not only its limit.
"""

import numpy as np
import pytest
import torch

import pyro
import pyro.distributions as dist
from pyro_flat import MCMC, SGD, SGLD, EntropySGLD, LocalEntropySGLD
from pyro_flat.kernels.mass_matrix import CoupledFactor
from pyro_flat.kernels.preconditioning import Preconditioner
from pyro_flat.convergence.references import exact_chain
from pyro_flat.theory import GaussianProblem

from moments import assert_moments, moment_errors

D, ETA, STEP = 4, 0.01, 0.3
CHAINS, NUM_SAMPLES, WARMUP = 8, 3000, 100


def _precision() -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    Q, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64))
    return Q @ torch.diag(torch.tensor([1.0, 10.0, 100.0, 1000.0], dtype=torch.float64)) @ Q.T


A = _precision()
MU = torch.linspace(-1.0, 1.0, D, dtype=torch.float64)
PROBLEM = GaussianProblem(A, MU)


def gaussian_model():
    pyro.sample("theta", dist.MultivariateNormal(MU.float(), precision_matrix=A.float()))


def run(kernel):
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, num_samples=NUM_SAMPLES, warmup_steps=WARMUP, num_chains=CHAINS, disable_progbar=True)
    mcmc.run()
    s = mcmc.get_samples(group_by_chain=True)
    x = s["theta"] if "theta_aux" not in s else torch.cat([s["theta"], s["theta_aux"]], -1)
    return x.double().numpy()


def test_the_dense_estimate_is_the_inverse_hessian_and_stays_frozen():
    kernel = SGLD(gaussian_model, preconditioner="dense", step_size=STEP)
    run(kernel)
    P = kernel.preconditioner.covariance(0).double()
    assert torch.allclose(P, torch.linalg.inv(A), rtol=1e-3, atol=1e-6)
    # estimates at the start and at warm-up iterations 10, 25, 50: none while sampling
    assert kernel.preconditioner.num_hvp == 4 * D


@pytest.mark.parametrize("kind", ["dense", "diagonal"])
def test_preconditioned_sgld_has_the_exact_law_of_its_update(kind):
    kernel = SGLD(gaussian_model, preconditioner=kind, step_size=STEP)
    x = run(kernel)
    mean, cov = exact_chain(PROBLEM, kernel).stationary()
    assert_moments(x, mean, cov)


@pytest.mark.parametrize("kind", ["dense", "diagonal"])
@pytest.mark.parametrize("coupling_metric", ["block", "joint", "pulled", 0.5])
def test_preconditioned_entropy_sgld_has_the_exact_joint_law_of_its_update(coupling_metric, kind):
    """θ and θa together, with η = 0.01 far below the largest posterior variance (1): every joint
    metric must carry the stiff direction θ − θa (the pulled metric at strength ε is stable for
    α < 2/(1 + 2ε), here 0.67 at ε = 1, whatever λη: λη runs from 0.01 to 10 on this target)."""
    kernel = EntropySGLD(gaussian_model, eta=ETA, preconditioner=kind, step_size=STEP,
                         coupling_metric=coupling_metric)
    x = run(kernel)
    chain = exact_chain(PROBLEM, kernel)
    mean, cov = chain.stationary()
    assert_moments(x, mean, cov)
    if coupling_metric == "joint" and kind == "dense":
        # the law is close to the true joint (the discretisation error at α = 0.3 is the factor
        # 1 / (1 - α/2) on every variance, for the exact metric)
        true_cov = np.block([[np.linalg.inv(A.numpy())] * 2,
                             [np.linalg.inv(A.numpy()), np.linalg.inv(A.numpy()) + ETA * np.eye(D)]])
        ratio = np.diag(cov) / np.diag(true_cov)
        assert np.allclose(ratio, 1 / (1 - STEP / 2), rtol=1e-3)


class DriftWithTheJointNoise(EntropySGLD):
    """A wrong pulled or block-Jacobi update: the metric's drift with the noise of the exact joint metric
    (covariance [[Σ, Σ], [Σ, Σ + ηI]] instead of the metric's own)."""

    def update(self, params, grads, step_size, temperature):
        p = self.preconditioner
        z, g = p._pack(params), p._pack(grads)
        joint = CoupledFactor(p.factor.inner, p.factor.eta, p.factor.num_coupled)
        noise = joint.increment(torch.zeros_like(g), torch.randn_like(z), 0.0, (2 * step_size * temperature) ** 0.5)
        return p._unpack(z - step_size * p.factor.velocity(g) + noise)


@pytest.mark.parametrize("coupling_metric", ["block", "pulled"])
def test_a_pulling_metric_with_the_joint_noise_fails(coupling_metric):
    kernel = DriftWithTheJointNoise(gaussian_model, eta=ETA, preconditioner="dense", step_size=STEP,
                                    coupling_metric=coupling_metric)
    x = run(kernel)
    mean, cov = exact_chain(PROBLEM, kernel).stationary()
    with pytest.raises(AssertionError, match="Monte-Carlo sd"):
        assert_moments(x, mean, cov)


@pytest.mark.parametrize("kind", ["dense", "diagonal"])
@pytest.mark.parametrize("coupling_metric, strength", [("block", 1.0), ("joint", 0.0), ("pulled", 1.0), (0.5, 0.5)])
def test_theta_feels_theta_aux_unless_the_metric_is_exact(coupling_metric, strength, kind):
    """Move θa and compare θ's drift (one noise-free step from the same θ): under the block and the
    pulled metrics it changes by α ε K Δθa / η with K = (H + I/η)⁻¹ (ε = 1 for block; K diagonal
    for a diagonal metric), toward θa; under the joint's exact inverse Hessian not at all."""
    kernel = EntropySGLD(gaussian_model, eta=ETA, preconditioner=kind, step_size=STEP,
                         coupling_metric=coupling_metric)
    run(kernel)  # estimates (and freezes) the metric
    theta = MU.float().expand(CHAINS, D).clone()
    shift = torch.full((CHAINS, D), 0.05)

    def next_theta(aux):
        grad_f = (theta.double() - MU) @ A
        coupling = (theta - aux) / ETA
        grads = {"theta": grad_f.float() + coupling, "theta_aux": -coupling}
        return kernel.preconditioner.step({"theta": theta, "theta_aux": aux}, grads, STEP, 0.0)["theta"]

    moved = next_theta(theta + shift) - next_theta(theta.clone())
    curvature = A if kind == "dense" else torch.diag(torch.diag(A))
    expected = STEP * strength * torch.linalg.solve(curvature + torch.eye(D, dtype=A.dtype) / ETA,
                                                    shift[0].double() / ETA)
    if strength > 0:
        assert torch.allclose(moved[0].double(), expected, rtol=1e-3, atol=1e-6)
        assert float(moved[0] @ shift[0]) > 0  # toward θa
    else:
        assert float(moved.abs().max()) < 1e-6


class NoiseScaledByTheMetric(SGLD):
    """A wrong preconditioned update: the noise scaled by M⁻¹ instead of M^(-1/2)."""

    def update(self, params, grads, step_size, temperature):
        p = self.preconditioner
        z, g = p._pack(params), p._pack(grads)
        xi = torch.randn_like(z)
        new = z - step_size * p.factor.velocity(g) + (2 * step_size) ** 0.5 * p.factor.velocity(xi)
        return p._unpack(new)


def test_noise_scaled_by_the_inverse_metric_fails():
    kernel = NoiseScaledByTheMetric(gaussian_model, preconditioner="dense", step_size=STEP)
    x = run(kernel)
    mean, cov = exact_chain(PROBLEM, kernel).stationary()
    _, z_cov, _ = moment_errors(x, mean, cov)
    assert np.abs(z_cov).max() > 2 * 4.5
    with pytest.raises(AssertionError, match="Monte-Carlo sd"):
        assert_moments(x, mean, cov)


def test_a_fixed_tensor_preconditioner_is_used_as_given():
    variance = 1 / A.diagonal().float()  # Jacobi: the eigenvalues of PA stay below D = 4
    kernel = SGLD(gaussian_model, preconditioner=variance, step_size=0.1)
    x = run(kernel)
    assert torch.allclose(kernel.preconditioner.covariance(0), torch.diag(variance))
    assert kernel.preconditioner.num_hvp == 0
    mean, cov = exact_chain(PROBLEM, kernel).stationary()
    assert_moments(x, mean, cov)


def test_sgd_with_a_preconditioner_is_newton_with_damping():
    """At temperature 0 with the exact metric every step contracts the error by (1 - α)."""
    kernel = SGD(gaussian_model, preconditioner="dense", step_size=0.5)
    mcmc = MCMC(kernel, num_samples=30, warmup_steps=0, initial_params={"theta": torch.zeros(D)},
                disable_progbar=True)
    mcmc.run()
    error = (mcmc.get_samples()["theta"].double() - MU).norm(dim=-1)
    assert float(error[-1]) < 1e-6 * float(MU.norm()) + 1e-5
    assert torch.allclose(error[1:6] / error[:5], torch.full((5,), 0.5, dtype=torch.float64), rtol=1e-3)


@pytest.mark.parametrize("spec, message", [
    ("cholesky", "not known"),
    (torch.tensor([1, 2, 3, 4]), "dtype"),
    (torch.ones(2, 3), "shape"),
    (torch.tensor([1.0, -1.0, 1.0, 1.0]), "positive"),
    (torch.tensor([1.0, float("nan"), 1.0, 1.0]), "NaN"),
    (torch.tensor([[1.0, 2.0], [2.0, 1.0]]), "positive definite"),
    (torch.tensor([[1.0, 0.5], [0.0, 1.0]]), "symmetric"),
    ([1.0, 1.0], "tensor"),
])
def test_bad_preconditioners_are_named(spec, message):
    with pytest.raises(ValueError, match=message):
        SGLD(gaussian_model, preconditioner=spec, step_size=0.1)


def test_a_preconditioner_of_the_wrong_size_is_caught_at_setup():
    kernel = SGLD(gaussian_model, preconditioner=torch.ones(3), step_size=0.1)
    with pytest.raises(ValueError, match=r"3 rows but the sites \['theta'\] have 4"):
        MCMC(kernel, num_samples=5, warmup_steps=0, disable_progbar=True).run()


def test_step_size_defaults_only_with_a_preconditioner():
    assert SGLD(gaussian_model, preconditioner="dense").step_size == 0.1
    with pytest.raises(ValueError, match="step_size"):
        SGLD(gaussian_model)
    with pytest.raises(ValueError, match="no preconditioner"):
        LocalEntropySGLD(gaussian_model, eta=0.1, step_size=0.1, preconditioner="dense")
    assert isinstance(EntropySGLD(gaussian_model, eta=0.1, preconditioner="diagonal").preconditioner,
                      Preconditioner)


def test_check_convergence_covers_the_preconditioned_update():
    """The W2 theory in the metric's coordinates: with M⁻¹ = A⁻¹ the preconditioned potential has
    m = M = 1, so a step of 0.3 is admissible (plain SGLD would need α < 2/1001), the ensemble's
    W2 stays within the bound and tracks the exact W2 of the preconditioned chain."""
    from pyro_flat import check_convergence

    for sampler, extra in (("sgld", {}), ("entropy_sgld", {"eta": ETA})):
        metric = torch.linalg.inv(A).float()
        result = check_convergence(PROBLEM, sampler, preconditioner=metric, step_size=STEP, num_chains=400,
                                   num_iterations=60, progress_bar=False, **extra)
        assert result.passed, str(result)
        if sampler == "sgld":
            assert abs(result.constants["m"] - 1) < 1e-3 and abs(result.constants["M"] - 1) < 1e-3
        err = np.abs(result.w2_debiased - result.exact_w2)
        assert (err < 4 * result.w2_stderr + result.w2_floor + 1e-3).all(), np.c_[result.w2_debiased, result.exact_w2]
    with pytest.raises(ValueError, match="fixed metric"):
        check_convergence(PROBLEM, "sgld", preconditioner="dense", step_size=STEP, num_chains=100,
                          num_iterations=5, progress_bar=False)


def test_the_wrong_preconditioned_noise_leaves_the_exact_w2():
    from pyro_flat import check_convergence

    metric = torch.linalg.inv(A).float()
    settings = dict(preconditioner=metric, step_size=STEP, num_chains=400, num_iterations=60, progress_bar=False)
    right = check_convergence(PROBLEM, "sgld", **settings)
    wrong = check_convergence(PROBLEM, NoiseScaledByTheMetric, **settings)
    gap = np.abs(wrong.w2_debiased - right.exact_w2)[-1]
    assert gap > 10 * wrong.w2_stderr[-1] + wrong.w2_floor, (wrong.w2_debiased, right.exact_w2)


def test_a_near_zero_diagonal_estimate_is_floored_at_a_tenth_of_the_median():
    """A Hutchinson estimate of one entry can fall near zero by chance; its variance must not explode."""
    from pyro_flat.kernels.curvature import inverse_diagonal

    diagonal = torch.tensor([[100.0, 120.0, 80.0, 1e-6, -90.0]])
    variance = inverse_diagonal(diagonal)
    assert torch.allclose(variance[0, [0, 1, 2, 4]], 1 / torch.tensor([100.0, 120.0, 80.0, 90.0]))
    assert float(variance[0, 3]) == pytest.approx(1 / (0.1 * 90.0))


# --------------------------------------------------------------------------- non-convex: a double well
# U(x) = Σ_i (x_i² − 1)²: curvature 8 at the minima ±1, −4 at the saddle 0 and 0 at the inflections
# |x_i| = 1/√3. A diagonal metric taken at the last warm-up point alone diverged in most of these
# runs (a point near an inflection gave variances up to 542 where the wells need ~1/8).
WELL_ETA = 0.1
WELL_WARMUP, WELL_SAMPLES = 100, 2000


def _double_well(params):
    x = params["x"]
    return ((x ** 2 - 1) ** 2).sum(-1)


def _double_well_moments():
    """E[x²] and E[(x² − 1)²] of one coordinate of exp(−U) (symmetric, bimodal), by quadrature."""
    from scipy.integrate import quad

    density = lambda x, g: g(x) * np.exp(-((x * x - 1) ** 2))  # noqa: E731
    mass = quad(density, -np.inf, np.inf, args=(lambda x: 1.0,))[0]
    return tuple(quad(density, -np.inf, np.inf, args=(g,))[0] / mass
                 for g in (lambda x: x * x, lambda x: (x * x - 1) ** 2))


def _pooled(series):
    """Mean over independent ``(chain, draw)`` series of equal length and its Monte-Carlo sd (ArviZ ESS
    per series, whose chains are those of one run; the runs, and the coordinates of this separable
    target, are independent)."""
    from moments import _ess

    means = np.array([s.mean() for s in series])
    se = np.array([s.std() / np.sqrt(_ess(s)) for s in series])
    return means.mean(), np.sqrt((se ** 2).sum()) / len(series)


def test_the_diagonal_metric_keeps_the_largest_curvature_met_and_the_dense_the_latest():
    """The update rule itself: at 1 (curvature 8), then 1/√3 + 0.01 (an inflection: 0.28), then 1.5
    (23): "diagonal" keeps 1/8, then 1/23; "dense" follows the latest point. Its schedule also has
    the early re-estimates (1 and 3); the dense one does not."""
    from pyro_flat.targets import CallablePotential

    points = [1.0, 3 ** -0.5 + 0.01, 1.5]
    curvature = [12 * x * x - 4 for x in points]
    start = {"x": torch.full((1, 2), points[0])}
    for spec, expected in (("diagonal", [8.0, 8.0, curvature[2]]), ("dense", curvature)):
        p = Preconditioner(spec)
        p.setup(CallablePotential(_double_well, start, 1), start, num_chains=1, warmup_steps=100)
        assert p.adaptation_iterations == ({1, 3, 10, 25, 50} if spec == "diagonal" else {10, 25, 50})
        for k, (x, c) in enumerate(zip(points, expected)):
            if k:
                p.estimate({"x": torch.full((1, 2), x)})
            assert torch.allclose(p.covariance(0), torch.eye(2) / c, rtol=1e-4), (spec, x)


@pytest.mark.parametrize("kind", ["sgld", "entropy_sgld"])
def test_the_diagonal_metric_is_stable_and_right_on_a_double_well(kind):
    """Every seed × start (the saddle 0, the minimum 1) runs without divergence at the default step,
    and the pooled moments of every coordinate match quadrature.

    Tolerance: 4 Monte-Carlo sd (ArviZ ESS: ~2,700 for E[x²], ~8,000 for E[(x² − 1)²] over the 20
    series) plus an allowance for the step's own bias, measured on these starts with 1,000 chains ×
    5,000 draws (Monte-Carlo sd 0.001): at most 0.009 on the pooled E[x²] (0.01 allowed), 0.015 on
    E[(x² − 1)²], the mean energy of a coordinate, which grows with the noise like a temperature
    (0.02 allowed), and 0.004 on E[x_aux²] (0.01 allowed). Measured on these seeds, as the error
    beyond the allowance in Monte-Carlo sd (the limit is 4; the right samplers: at most 2.5), wrong
    samplers fail: the noise scaled by M⁻¹ instead of M^(-1/2) (an effective temperature of ~0.1)
    by 8.6-130, a temperature of 1.3 by 7.8 (SGLD) and 9.5 (EntropySGLD) on E[(x² − 1)²], a
    temperature of 0.7 by 10.5 (SGLD) and 5.4 (EntropySGLD, on E[x_aux²]); the metric of the last
    warm-up point alone diverges.
    """
    m2, energy = _double_well_moments()
    theta, aux = [], []
    for seed in range(5):
        for start in (0.0, 1.0):
            pyro.set_rng_seed(seed)
            kernel = (SGLD(potential_fn=_double_well, preconditioner="diagonal") if kind == "sgld" else
                      EntropySGLD(potential_fn=_double_well, eta=WELL_ETA, preconditioner="diagonal"))
            mcmc = MCMC(kernel, num_samples=WELL_SAMPLES, warmup_steps=WELL_WARMUP, num_chains=2,
                        initial_params={"x": torch.full((2, 2), start)}, disable_progbar=True)
            mcmc.run()  # a DivergenceError fails the test
            s = mcmc.get_samples(group_by_chain=True)
            theta += [s["x"][..., i].double().numpy() for i in range(2)]
            aux += [s["x_aux"][..., i].double().numpy() for i in range(2)] if "x_aux" in s else []
            # the variance is that of the largest curvature met (>= |U''(0)| = 4 from these starts),
            # never that of a point near an inflection
            assert float(kernel.preconditioner.curvature.min()) >= 4.0 - 1e-4
    checks = [("E[x²]", [x ** 2 for x in theta], m2, 0.01),
              ("E[(x² − 1)²]", [(x ** 2 - 1) ** 2 for x in theta], energy, 0.02)]
    if aux:  # θa = θ + √η ξ: its second moment is E[x²] + η
        checks.append(("E[x_aux²]", [x ** 2 for x in aux], m2 + WELL_ETA, 0.01))
    for name, series, exact, bias in checks:
        mean, se = _pooled(series)
        assert abs(mean - exact) < 4 * se + bias, f"{name} = {mean:.4f} ± {se:.4f}, exact {exact:.4f}"


def _pulled_covariance(precision: torch.Tensor, eta: float, num_coupled: int, strength: float) -> torch.Tensor:
    """[[Σ, (Σ − εK)E], [Eᵀ(Σ − εK), EᵀΣE + ηI]] with K = (Σ⁻¹ + EEᵀ/η)⁻¹, written out."""
    dim = precision.shape[-1]
    E = torch.eye(dim, dtype=precision.dtype)[:, :num_coupled]
    sigma = torch.linalg.inv(precision)
    cross = (sigma - strength * torch.linalg.inv(precision + E @ E.T / eta)) @ E
    return torch.cat([torch.cat([sigma, cross], -1),
                      torch.cat([cross.mT, E.T @ sigma @ E + eta * torch.eye(num_coupled, dtype=precision.dtype)], -1)],
                     -2)


@pytest.mark.parametrize("kind, num_coupled", [("dense", 5), ("dense", 3), ("diagonal", 3), ("diagonal", 5)])
def test_the_pulled_factor_is_the_metric_it_claims(kind, num_coupled):
    """Every dense or diagonal, fully or partly coupled layout (eigenbasis, joint precision or 2 x 2
    blocks): the velocity is M⁻¹, the noise has covariance M⁻¹, and solve_lt inverts Lᵀ."""
    from pyro_flat.kernels.mass_matrix import DiagonalFactor, PrecisionFactor, PulledFactor

    g = torch.Generator().manual_seed(1)
    chains, dim, eta, strength = 2, 5, 0.1, 0.7
    if kind == "dense":
        Q, _ = torch.linalg.qr(torch.randn(chains, dim, dim, generator=g, dtype=torch.float64))
        precision = Q @ torch.diag_embed(0.5 + 10 * torch.rand(chains, dim, generator=g, dtype=torch.float64)) @ Q.mT
        factor = PulledFactor(PrecisionFactor(precision), eta, num_coupled, strength)
    else:
        variance = 0.1 + torch.rand(chains, dim, generator=g, dtype=torch.float64)
        precision = torch.diag_embed(1 / variance)
        factor = PulledFactor(DiagonalFactor(variance), eta, num_coupled, strength)
    expected = torch.stack([_pulled_covariance(p, eta, num_coupled, strength) for p in precision])
    eye = torch.eye(dim + num_coupled, dtype=torch.float64)
    columns = lambda f: torch.stack([f(e.expand(chains, -1)) for e in eye], -1)  # noqa: E731
    velocity = columns(factor.velocity)
    noise = columns(lambda e: factor.increment(torch.zeros_like(e), e, 0.0, 1.0))  # L
    inverse = columns(factor.solve_lt)  # L^{-T}
    assert torch.allclose(velocity, expected, atol=1e-8)
    assert torch.allclose(noise @ noise.mT, expected, atol=1e-8)
    assert torch.allclose(inverse.mT @ noise, eye.expand(chains, -1, -1), atol=1e-8)


def test_the_pulled_factor_does_not_depend_on_the_eigenbasis_of_a_repeated_eigenvalue():
    """A Hessian with a repeated eigenvalue (mnist79's prior-only pixels) has no unique eigenbasis: any
    rotation inside the eigenspace is one. The step must not depend on that choice; it did when the noise
    was laid out in the basis (L = Q L_paired), and a round-off change of the Hessian, as on another
    number of ranks, then changed the draws by order 1."""
    from pyro_flat.kernels.mass_matrix import PrecisionFactor, PulledFactor

    g = torch.Generator().manual_seed(2)
    dim, eta = 5, 0.1
    curvature = torch.tensor([[1.0, 1.0, 1.0, 4.0, 9.0]], dtype=torch.float64)  # a three-fold eigenvalue
    Q, _ = torch.linalg.qr(torch.randn(1, dim, dim, generator=g, dtype=torch.float64))
    R, _ = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=torch.float64))
    turn = torch.eye(dim, dtype=torch.float64)
    turn[:3, :3] = R
    Q2 = Q @ turn  # another eigenbasis of the same matrix
    precision = Q @ torch.diag_embed(curvature) @ Q.mT
    assert torch.allclose(Q2 @ torch.diag_embed(curvature) @ Q2.mT, precision, atol=1e-12)
    first, second = (PulledFactor(PrecisionFactor(precision), eta, dim, 1.0, spectrum=(curvature, basis))
                     for basis in (Q, Q2))
    grad, xi = torch.randn(2, 1, 2 * dim, generator=g, dtype=torch.float64)
    assert torch.allclose(first.increment(grad, xi, 0.1, 0.4), second.increment(grad, xi, 0.1, 0.4), atol=1e-12)
    assert torch.allclose(first.solve_lt(xi), second.solve_lt(xi), atol=1e-12)
    assert torch.allclose(first.velocity(grad), second.velocity(grad), atol=1e-12)


@pytest.mark.parametrize("bad", [1.5, -0.1, True, "kappa", "0.5"])
def test_a_bad_coupling_metric_is_named(bad):
    with pytest.raises(ValueError, match=r"coupling_metric=.* is not known; use 'pulled'"):
        EntropySGLD(gaussian_model, eta=ETA, preconditioner="dense", coupling_metric=bad)
