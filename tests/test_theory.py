"""pyro_flat.theory: constants against brute force, bounds against exact Gaussian trajectories,
W2 estimators against closed forms (docs/theory.md, section 3)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from pyro_flat import theory
from pyro_flat.theory import (
    admissible_step_size,
    empirical_w2,
    entropy_langevin_chain,
    entropy_mcmc_w2_bound,
    gaussian_targets,
    gaussian_w2,
    joint_constants,
    langevin_chain,
    local_entropy_chain,
    local_entropy_constants,
    local_entropy_w2_bound,
    logistic_gradient_noise,
    logistic_regression_constants,
    sgld_w2_bound,
)


def rotated_precision(d: int, cond: float, seed: int, m: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    eig = m * np.geomspace(1.0, cond, d)
    return (q * eig) @ q.T


# ----------------------------------------------------------------------------- constants
def test_logistic_constants_match_brute_force_hessians():
    rng = np.random.default_rng(0)
    X = torch.as_tensor(rng.standard_normal((30, 4)))
    y = torch.as_tensor(rng.random(30) < 0.5, dtype=X.dtype)
    lam = torch.tensor([0.5, 1.0, 2.0, 3.0], dtype=X.dtype)
    signs = 2 * y - 1

    def f(w):
        return torch.nn.functional.softplus(-signs * (X @ w)).sum() + 0.5 * (lam * w * w).sum()

    m, M = logistic_regression_constants(X, lam)
    eig0 = torch.linalg.eigvalsh(torch.autograd.functional.hessian(f, torch.zeros(4, dtype=X.dtype)))
    assert math.isclose(M, float(eig0[-1]), rel_tol=1e-10)  # attained at w = 0 (D = I/4)
    assert m == 0.5
    lowest = math.inf
    for scale in (0.3, 1.0, 3.0, 30.0):
        for _ in range(10):
            w = torch.as_tensor(rng.standard_normal(4) * scale)
            eig = torch.linalg.eigvalsh(torch.autograd.functional.hessian(f, w))
            assert float(eig[0]) >= m - 1e-12 and float(eig[-1]) <= M + 1e-9
            lowest = min(lowest, float(eig[0]))
    assert lowest < m + 0.05  # far from the data the curvature falls to the prior's
    # temperature divides both
    m2, M2 = logistic_regression_constants(X, lam, temperature=2.0)
    assert (m2, M2) == pytest.approx((m / 2, M / 2))


def test_joint_and_local_entropy_constants_match_gaussian_spectra():
    A = rotated_precision(4, 50.0, seed=1, m=0.3)
    eig = np.linalg.eigvalsh(A)
    for eta in (0.01, 0.5, 20.0):
        joint = np.block([[A + np.eye(4) / eta, -np.eye(4) / eta], [-np.eye(4) / eta, np.eye(4) / eta]])
        jeig = np.linalg.eigvalsh(joint)
        assert joint_constants(eig[0], eig[-1], eta) == pytest.approx((jeig[0], jeig[-1]), rel=1e-9)
        flat = np.linalg.inv(np.linalg.inv(A) + eta * np.eye(4))
        feig = np.linalg.eigvalsh(flat)
        assert local_entropy_constants(eig[0], eig[-1], eta) == pytest.approx((feig[0], feig[-1]), rel=1e-9)


def test_gradient_noise_matches_monte_carlo_and_bound():
    rng = np.random.default_rng(2)
    n, d, B = 60, 3, 7
    X = rng.standard_normal((n, d))
    y = (rng.random(n) < 0.4).astype(float)
    w = rng.standard_normal(d)
    g = (1 / (1 + np.exp(-(X @ w))) - y)[:, None] * X
    full = g.sum(0)
    sq = np.array([((n / B * g[rng.choice(n, B, replace=False)].sum(0) - full) ** 2).sum()
                   for _ in range(20000)])
    exact = logistic_gradient_noise(X, B, y, w) ** 2
    assert abs(sq.mean() - exact) < 4 * sq.std() / math.sqrt(len(sq))
    assert logistic_gradient_noise(X, B) ** 2 >= exact


def test_constants_reject_non_strongly_convex_problems():
    X = torch.randn(5, 2)
    with pytest.raises(ValueError, match="prior_precision must be > 0"):
        logistic_regression_constants(X, 0.0)
    with pytest.raises(ValueError, match="strongly convex"):
        joint_constants(0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="eta"):
        joint_constants(1.0, 2.0, -1.0)


def test_bounds_reject_inadmissible_steps():
    limit = admissible_step_size(1.0, 9.0)
    assert limit == pytest.approx(0.2)
    with pytest.raises(ValueError, match=r"step_size=0\.3 is above the admissible bound"):
        sgld_w2_bound(1.0, 9.0, 0.3, dim=2, num_iterations=10, initial_w2=1.0)
    mJ, MJ = joint_constants(1.0, 9.0, 0.1)
    with pytest.raises(ValueError, match="admissible"):  # the joint is stiffer than the posterior
        entropy_mcmc_w2_bound(1.0, 9.0, 0.1, 0.9 * limit, dim=2, num_iterations=10, initial_w2=1.0)
    assert admissible_step_size(mJ, MJ) < limit


# ----------------------------------------------------------------------------- bounds vs exact
GRID = list(itertools.product((2, 5), (1.0, 10.0, 100.0), (0.1, 1.0, 10.0), (0.2, 1.0)))


def _horizon(step: float, m: float) -> int:
    return int(min(math.ceil(4.0 / (step * m)), 1500))


@pytest.mark.parametrize("d,cond,eta,frac", GRID)
def test_exact_trajectories_stay_below_bounds(d, cond, eta, frac):
    A = rotated_precision(d, cond, seed=d + int(cond))
    mu = np.linspace(-1.0, 2.0, d)
    T = 1.0 if eta != 1.0 else 0.5  # one temperature other than 1 in the grid
    m, M = cond ** 0 / T, cond / T  # constants of f / T
    eig = np.linalg.eigvalsh(A)
    assert (eig[0] / T, eig[-1] / T) == pytest.approx((m, M))
    targets = gaussian_targets(A, mu, eta, T)
    x0 = np.full(d, 3.0)

    # SGLD -> posterior
    step = frac * admissible_step_size(m, M, T)
    K = _horizon(step * T, m)
    exact = langevin_chain(A, mu, step, T).w2_trajectory(x0, np.zeros((d, d)), K, targets["posterior"])
    bound = sgld_w2_bound(m, M, step, d, K, exact[0], temperature=T).total
    assert (exact <= bound).all(), f"SGLD exceeds its bound by {np.max(exact - bound):.3g}"

    # Entropy-MCMC -> joint
    mJ, MJ = joint_constants(m, M, eta * T)
    step = frac * admissible_step_size(mJ, MJ, T)
    K = _horizon(step * T, mJ)
    start = np.concatenate([x0, x0])
    exact = entropy_langevin_chain(A, mu, eta, step, T).w2_trajectory(
        start, np.zeros((2 * d, 2 * d)), K, targets["joint"])
    bound = entropy_mcmc_w2_bound(m, M, eta, step, d, K, exact[0], temperature=T).total
    assert (exact <= bound).all(), f"Entropy-MCMC exceeds its bound by {np.max(exact - bound):.3g}"

    # Entropy-SGLD (local entropy) -> flat posterior
    mF, MF = local_entropy_constants(m, M, eta * T)
    step = frac * admissible_step_size(mF, MF, T)
    inner = 0.5 * admissible_step_size(m + 1 / (eta * T), M + 1 / (eta * T), T)
    K = min(_horizon(step * T, mF), 600)
    chain = local_entropy_chain(A, mu, eta, step, num_inner_steps=5, inner_step_size=inner,
                                mean_weight=0.25, temperature=T)
    mean, cov, radius = x0, np.zeros((d, d)), 0.0
    for _ in range(K + 1):  # the L2 radius around the flat mode (mu) along the exact run
        radius = max(radius, math.sqrt(((mean - mu) ** 2).sum() + np.trace(cov)))
        mean, cov = chain.step(mean, cov)
    exact = chain.w2_trajectory(x0, np.zeros((d, d)), K, targets["flat"])
    bound = local_entropy_w2_bound(m, M, eta, step, d, K, exact[0], num_inner_steps=5,
                                   inner_step_size=inner, mean_weight=0.25, radius=radius,
                                   temperature=T).total
    assert (exact <= bound).all(), f"Entropy-SGLD exceeds its bound by {np.max(exact - bound):.3g}"


def test_biased_samplers_violate_the_bounds():
    """A wrong noise scale or a gradient bias breaks the bias-free bound; the bias term restores it."""
    A, mu, d = np.diag([1.0, 2.0]), np.zeros(2), 2
    target = gaussian_targets(A, mu)["posterior"]
    step, K = 0.01, 1500
    x0 = np.ones(d)
    right = langevin_chain(A, mu, step).w2_trajectory(x0, np.zeros((d, d)), K, target)
    bound = sgld_w2_bound(1.0, 2.0, step, d, K, right[0]).total
    assert (right <= bound).all()
    noisy = langevin_chain(A, mu, step, noise_scale=3.0).w2_trajectory(x0, np.zeros((d, d)), K, target)
    assert noisy[-1] > 2 * bound[-1]
    bias = np.array([5.0, 0.0])
    biased = langevin_chain(A, mu, step, gradient_bias=bias).w2_trajectory(x0, np.zeros((d, d)), K, target)
    assert biased[-1] > 2 * bound[-1]
    with_bias = theory.langevin_w2_bound(1.0, 2.0, step, d, K, right[0], gradient_bias=5.0).total
    assert (biased <= with_bias).all()

    # Entropy-MCMC: the same noise bug on the joint breaks Theorem 1's bound
    eta = 1.0
    tj = gaussian_targets(A, mu, eta)["joint"]
    good = entropy_langevin_chain(A, mu, eta, step)
    joint_precision = np.block([[A + np.eye(2) / eta, -np.eye(2) / eta], [-np.eye(2) / eta, np.eye(2) / eta]])
    bad = langevin_chain(joint_precision, np.zeros(4), step, noise_scale=3.0)
    start = np.ones(4)
    w_good = good.w2_trajectory(start, np.zeros((4, 4)), K, tj)
    w_bad = bad.w2_trajectory(start, np.zeros((4, 4)), K, tj)
    jb = entropy_mcmc_w2_bound(1.0, 2.0, eta, step, d, K, w_good[0]).total
    assert (w_good <= jb).all() and w_bad[-1] > jb[-1]


def test_local_entropy_chain_approaches_the_flat_posterior_as_L_grows():
    A, mu, eta = np.diag([1.0, 4.0]), np.ones(2), 0.5
    flat = gaussian_targets(A, mu, eta)["flat"]
    errors, sgd_errors = [], []
    for L in (1, 3, 10, 30, 100):
        for noise, out in ((True, errors), (False, sgd_errors)):
            chain = local_entropy_chain(A, mu, eta, 0.05, num_inner_steps=L, inner_step_size=0.02,
                                        mean_weight=0.25, outer_noise=noise, temperature=1.0 if noise else 1e-4)
            mean, cov = np.full(2, 4.0), np.zeros((2, 2))
            for _ in range(3000):
                mean, cov = chain.step(mean, cov)
            out.append(gaussian_w2(mean, cov, *flat) if noise else math.sqrt(((mean - mu) ** 2).sum() + np.trace(cov)))
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 0.05 * errors[0] and errors[-1] < 0.05
    # Entropy-SGD (no outer noise, cold inner chain): the minimiser of F, which is mu here
    assert sgd_errors[0] > 1e-2 and max(sgd_errors[1:]) < 1e-2, sgd_errors


# ----------------------------------------------------------------------------- W2 estimators
def test_gaussian_w2_closed_form_cases():
    assert gaussian_w2(np.zeros(3), np.eye(3), np.ones(3), np.eye(3)) == pytest.approx(math.sqrt(3))
    # commuting covariances: ||m1 - m2||^2 + ||S1^1/2 - S2^1/2||_F^2
    S1, S2 = np.diag([1.0, 4.0]), np.diag([9.0, 1.0])
    assert gaussian_w2(np.zeros(2), S1, np.zeros(2), S2) == pytest.approx(math.sqrt(4 + 1))
    # point mass to a Gaussian
    assert gaussian_w2(np.ones(2), np.zeros((2, 2)), np.zeros(2), S1) == pytest.approx(math.sqrt(2 + 5))
    A = rotated_precision(3, 10.0, seed=3)
    assert gaussian_w2(np.zeros(3), A, np.zeros(3), A) == pytest.approx(0.0, abs=1e-6)


def test_w2_estimators_agree_with_closed_forms_within_error_bars():
    rng = np.random.default_rng(4)
    d = 3
    S1 = np.linalg.inv(rotated_precision(d, 5.0, seed=5))
    m1 = np.array([1.0, -0.5, 0.3])
    S2, m2 = np.diag([0.5, 1.0, 2.0]), np.zeros(d)
    x = rng.multivariate_normal(m1, S1, size=1000)
    truth = gaussian_w2(m1, S1, m2, S2)
    ref = (m2, S2)

    def within(est, value, what):
        tol = 4 * est.stderr + est.floor
        assert abs(est.value - value) < tol, f"{what}: {est} vs {value:.4f} (tol {tol:.3g})"

    within(empirical_w2(x, ref, method="gaussian", num_bootstrap=100), truth, "gaussian")
    within(empirical_w2(x[:500], ref, method="exact", num_reference=1000, num_bootstrap=10, seed=1),
           truth, "exact OT")
    marginal = math.sqrt(((m1 - m2) ** 2).sum() + ((np.sqrt(np.diag(S1)) - np.sqrt(np.diag(S2))) ** 2).sum())
    within(empirical_w2(x, ref, method="marginal", num_bootstrap=100), marginal, "marginal")
    assert marginal <= truth  # a lower bound of W2
    # sliced: the closed form averaged over many directions (the estimator uses 2000 of its own)
    u = rng.standard_normal((d, 200_000))
    u /= np.linalg.norm(u, axis=0)
    s1 = np.sqrt(np.einsum("ik,ij,jk->k", u, S1, u))
    s2 = np.sqrt(np.einsum("ik,ij,jk->k", u, S2, u))
    sliced = math.sqrt(float((((m1 - m2) @ u) ** 2 + (s1 - s2) ** 2).mean()))
    within(empirical_w2(x, ref, method="sliced", num_projections=1000, num_reference=4000,
                        num_bootstrap=50), sliced, "sliced")
    assert sliced < truth
    # the floor is what exact draws of the reference give
    y = rng.multivariate_normal(m2, S2, size=1000)
    assert empirical_w2(y, ref).value < 4 * empirical_w2(y, ref).floor


def test_marginal_estimator_has_a_small_floor_in_high_dimension():
    rng = np.random.default_rng(6)
    d, n = 300, 100
    x = rng.standard_normal((n, d)) + 0.5
    gauss = empirical_w2(x, (np.zeros(d), np.eye(d)), method="gaussian", num_bootstrap=10)
    marg = empirical_w2(x, (np.zeros(d), np.eye(d)), method="marginal", num_bootstrap=10)
    truth = 0.5 * math.sqrt(d)  # a pure shift: W2 = marginal W2
    assert gauss.floor > truth  # the Bures plug-in is swamped by its own bias when n < d
    assert marg.floor < 0.5 * truth and abs(marg.debiased - truth) < 0.1 * truth


def test_estimators_reject_bad_samples():
    with pytest.raises(ValueError, match="at least 2 samples"):
        empirical_w2(np.zeros((1, 2)), (np.zeros(2), np.eye(2)))
    with pytest.raises(ValueError, match="NaN"):
        empirical_w2(np.full((5, 2), np.nan), (np.zeros(2), np.eye(2)))
    with pytest.raises(ValueError, match="method"):
        empirical_w2(np.zeros((5, 2)), (np.zeros(2), np.eye(2)), method="kl")
    with pytest.raises(ValueError, match="dimension"):
        empirical_w2(np.zeros((5, 2)), np.zeros((5, 3)))
