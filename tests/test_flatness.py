"""pyro_flat.flatness against Hessians known in closed form."""

import math

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from pyro_flat import models
from pyro_flat.flatness import (
    FlatLoss,
    HessianOperator,
    eigenvalue_density,
    flatness_at_samples,
    hessian_eigenvalues,
    hessian_trace,
    interpolation_curve,
    local_entropy,
    perturbation_curve,
    power_iteration,
    top_eigenvalues,
)
from pyro_flat.flatness import spectrum


def quadratic(eigenvalues, seed=0):
    """0.5 (x - 1)' A (x - 1) with A = Q diag(eigenvalues) Q', Q a random rotation (float64)."""
    lam = torch.as_tensor(eigenvalues, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(len(lam), len(lam), generator=gen, dtype=torch.float64))
    A = Q @ torch.diag(lam) @ Q.T
    A = 0.5 * (A + A.T)
    return A, (lambda x: 0.5 * (x - 1) @ A @ (x - 1))


SPECTRUM = np.concatenate([[50.0, 30.0, 20.0, 12.0, 8.0], np.linspace(0.1, 3.0, 35)])


def test_exact_and_lanczos_eigenvalues_match_the_known_spectrum():
    A, f = quadratic(SPECTRUM)
    x = torch.randn(40, dtype=torch.float64)
    truth = np.sort(SPECTRUM)[::-1]
    np.testing.assert_allclose(hessian_eigenvalues(f, x), truth, rtol=1e-10, atol=1e-10)
    lanczos5 = top_eigenvalues(f, x, k=5, method="lanczos", tol=1e-8)
    np.testing.assert_allclose(lanczos5, truth[:5], rtol=1e-8)
    assert top_eigenvalues(f, x, k=5) == pytest.approx(list(truth[:5]), rel=1e-10)  # auto: exact
    # power iteration with deflation finds the same, less precisely (relative-change stopping rule)
    np.testing.assert_allclose(power_iteration(f, x, k=3, tol=1e-10), truth[:3], rtol=1e-4)


def test_lanczos_on_a_large_float32_problem_and_its_stopping_rule():
    d = 3000  # a bulk in [0, 1] and outliers, the shape of neural-network Hessians
    lam = torch.cat([torch.tensor([100.0, 80.0, 60.0, 45.0, 40.0]), torch.rand(d - 5, generator=torch.Generator().manual_seed(0))])
    f = lambda x: 0.5 * (lam * x * x).sum()
    top = top_eigenvalues(f, torch.zeros(d), k=5, tol=1e-4)
    np.testing.assert_allclose(top, [100.0, 80.0, 60.0, 45.0, 40.0], rtol=1e-4)
    with pytest.warns(RuntimeWarning, match="did not converge"):
        top_eigenvalues(f, torch.zeros(d), k=3, max_steps=5)
    # eigenvalues 0.1 apart at the top of a dense spectrum: 100 steps are not enough, and it says so
    dense = torch.linspace(0.0, 1.0, d) ** 3 * 100.0
    with pytest.warns(RuntimeWarning, match="did not converge in 100 steps"):
        top_eigenvalues(lambda x: 0.5 * (dense * x * x).sum(), torch.zeros(d), k=3)


def test_hutchinson_trace_is_within_its_standard_error_and_the_error_is_right():
    A, f = quadratic(SPECTRUM)
    x = torch.zeros(40, dtype=torch.float64)
    est = hessian_trace(f, x, num_probes=400, seed=1)
    truth = float(SPECTRUM.sum())
    assert abs(est.value - truth) < 4 * est.stderr
    # Var(v'Av) = 2 sum_{i != j} A_ij^2 for Rademacher probes
    sd = math.sqrt(2 * float((A ** 2).sum() - (A.diagonal() ** 2).sum()))
    assert est.stderr == pytest.approx(sd / math.sqrt(400), rel=0.15)
    # a diagonal Hessian has zero Rademacher variance: the estimate is exact
    diag = hessian_trace(lambda z: 0.5 * (torch.arange(1.0, 41.0, dtype=torch.float64) * z ** 2).sum(), x, num_probes=5)
    assert diag.value == pytest.approx(820.0) and diag.stderr == pytest.approx(0.0, abs=1e-9)


def test_slq_density_and_moments_match_the_spectrum():
    A, f = quadratic(SPECTRUM, seed=3)
    x = torch.zeros(40, dtype=torch.float64)
    rho = eigenvalue_density(f, x, num_probes=60, num_steps=12, seed=2)
    np.testing.assert_allclose(rho.weights.sum(1), 1.0, rtol=1e-10)
    for power in (1, 2, 3):  # Gauss quadrature with 12 nodes is exact up to degree 23
        est, se = rho.expect(lambda t: t ** power)
        truth = float((SPECTRUM ** power).mean())
        assert abs(est - truth) < 4 * se, (power, est, truth, se)
    grid = np.linspace(-8, 60, 400)
    h = 1.5
    truth = np.exp(-0.5 * ((grid[None] - SPECTRUM[:, None]) / h) ** 2).sum(0) / (len(SPECTRUM) * h * math.sqrt(2 * math.pi))
    est, se = rho.density(grid, bandwidth=h)
    assert np.trapezoid(est, grid) == pytest.approx(1.0, abs=1e-3)
    assert np.all(np.abs(est - truth) < 4 * se + 0.02 * truth.max())
    # a density of the wrong spectrum is rejected by the same tolerance
    shifted = np.exp(-0.5 * ((grid[None] - 1.2 * SPECTRUM[:, None]) / h) ** 2).sum(0) / (len(SPECTRUM) * h * math.sqrt(2 * math.pi))
    assert not np.all(np.abs(est - shifted) < 4 * se + 0.02 * truth.max())


def test_per_site_measures_are_those_of_the_diagonal_blocks():
    A, f = quadratic(SPECTRUM, seed=5)
    blocks = {"a": slice(0, 10), "b": slice(10, 40)}
    loss = FlatLoss(f, torch.zeros(40, dtype=torch.float64), blocks)
    exact = hessian_eigenvalues(loss, per_site=True)
    for name, where in blocks.items():
        block = A[where, where]
        np.testing.assert_allclose(exact[name], torch.linalg.eigvalsh(block).flip(0).numpy(), rtol=1e-10)
        top = top_eigenvalues(loss, k=2, per_site=True, method="lanczos", tol=1e-9)[name]
        np.testing.assert_allclose(top, torch.linalg.eigvalsh(block).flip(0)[:2].numpy(), rtol=1e-7)
    traces = hessian_trace(loss, num_probes=300, per_site=True)
    for name, where in blocks.items():
        assert abs(traces[name].value - float(A[where, where].trace())) < 4 * traces[name].stderr + 1e-9
    rho = eigenvalue_density(loss, num_probes=20, num_steps=10, per_site=True)
    est, se = rho["a"].expect()
    assert abs(est - float(A[:10, :10].trace()) / 10) < 4 * se


def _logistic_data(n=60, d=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=gen, dtype=torch.float64)
    y = (torch.rand(n, generator=gen, dtype=torch.float64) < 0.5).to(torch.float64)
    return X, y


@pytest.mark.parametrize("batch_size", [None, 20, 25])  # 25 does not divide 60: overlapping last block
def test_logistic_regression_hessian_from_hvps_is_x_d_x_plus_prior(batch_size):
    X, y = _logistic_data()
    scale = 0.5
    w, b = torch.randn(4, dtype=torch.float64), torch.tensor(0.3, dtype=torch.float64)
    loss = FlatLoss.from_model(models.logistic_regression, {"w": w, "b": b}, X, y,
                               batch_size=batch_size, prior_scale=scale)
    assert list(loss.blocks) == ["w", "b"]
    Z = torch.cat([X, torch.ones(len(X), 1, dtype=torch.float64)], 1)  # the bias as a column
    p = torch.sigmoid(X @ w + b)
    analytic = Z.T @ (Z * (p * (1 - p))[:, None]) + torch.eye(5, dtype=torch.float64) / scale ** 2
    torch.testing.assert_close(HessianOperator(loss).dense(), analytic, rtol=1e-10, atol=1e-10)
    # the energy itself is the full-data potential, whatever the minibatch size
    expected = -(dist.Bernoulli(logits=X @ w + b).log_prob(y).sum()
                 + dist.Normal(0.0, scale).log_prob(w).sum() + dist.Normal(0.0, scale).log_prob(b))
    assert float(loss(loss.params)) == pytest.approx(float(expected), rel=1e-9)


def test_from_module_matches_autograd_hvp_and_names_the_layers():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).double()
    X, y = torch.randn(30, 3, dtype=torch.float64), torch.randint(0, 2, (30,))
    loss = FlatLoss.from_module(net, lambda m: torch.nn.functional.cross_entropy(m(X), y))
    assert list(loss.blocks) == ["0.weight", "0.bias", "2.weight", "2.bias"] and loss.dim == 32
    v = torch.randn(32, dtype=torch.float64)
    _, hv = torch.autograd.functional.hvp(lambda x: loss(x), loss.params, v)
    torch.testing.assert_close(HessianOperator(loss).matvec(v), hv)
    assert float(loss(loss.params).detach()) == pytest.approx(float(torch.nn.functional.cross_entropy(net(X), y).detach()))


def test_interpolation_shows_the_barrier_and_perturbation_the_curvature():
    double_well = lambda x: ((x[0] ** 2 - 1) ** 2 + 0.5 * x[1] ** 2)
    curve = interpolation_curve(double_well, torch.tensor([-1.0, 0.0], dtype=torch.float64),
                                torch.tensor([1.0, 0.0], dtype=torch.float64), num_points=21,
                                trace_probes=4)
    assert curve.loss[0] == pytest.approx(0.0) and curve.loss[-1] == pytest.approx(0.0)
    assert curve.loss[10] == pytest.approx(1.0)  # the barrier at x = 0
    # d^2/dx0^2 = 12 x0^2 - 4, plus 1 for x1: the trace along the path is exact (diagonal)
    x0 = np.linspace(-1, 1, 21)
    np.testing.assert_allclose(curve.trace, 12 * x0 ** 2 - 4 + 1, atol=1e-9)
    A, f = quadratic(SPECTRUM)
    radii = [0.0, 0.5, 1.0, 2.0]
    pert = perturbation_curve(f, torch.ones(40, dtype=torch.float64), radii, num_directions=400)
    expected = np.array(radii) ** 2 * SPECTRUM.sum() / (2 * 40)  # E[u'Au] = tr A / d
    assert np.all(np.abs(pert.loss - expected) <= 4 * pert.loss_stderr + 1e-12)
    assert pert.loss[-1] > 3 * pert.loss[1]


def test_local_entropy_matches_the_gaussian_closed_form():
    lam = np.array([4.0, 1.0, 0.25])
    A, f = quadratic(lam, seed=2)
    theta = torch.tensor([0.5, 1.5, 1.0], dtype=torch.float64)
    eta = 0.7
    # F = -0.5 a'(A^-1 + eta I)^-1 a - 0.5 log det(I + eta A) + (d/2) log(2 pi eta), a = theta - 1
    a = theta - 1
    S = torch.linalg.inv(torch.linalg.inv(A) + eta * torch.eye(3, dtype=torch.float64))
    truth = float(-0.5 * a @ S @ a - 0.5 * np.log1p(eta * lam).sum() + 1.5 * math.log(2 * math.pi * eta))
    laplace = local_entropy(f, theta, eta=eta, method="laplace")
    assert laplace.value == pytest.approx(truth, rel=1e-8)
    mc = local_entropy(f, theta, eta=eta, num_samples=20000, seed=3)
    assert abs(mc.value - truth) < 4 * mc.stderr and mc.ess > 1000
    # the sharper the quadratic, the lower its local entropy at its minimum
    _, sharp = quadratic(lam * 10, seed=2)
    assert local_entropy(sharp, torch.ones(3, dtype=torch.float64), eta=eta, method="laplace").value < \
        local_entropy(f, torch.ones(3, dtype=torch.float64), eta=eta, method="laplace").value - 2
    # large d: the log-determinant from SLQ, with its error
    lam_big = np.linspace(0.5, 5.0, 300)
    big = lambda x: 0.5 * (torch.as_tensor(lam_big) * x ** 2).sum()
    est = local_entropy(big, torch.zeros(300, dtype=torch.float64), eta=0.3, method="laplace", num_probes=30)
    truth_big = -0.5 * np.log1p(0.3 * lam_big).sum() + 150 * math.log(2 * math.pi * 0.3)
    assert abs(est.value - truth_big) < 4 * est.stderr + 1e-6


def test_flatness_at_samples_matches_the_dense_hessian_of_each_draw():
    X, y = _logistic_data(n=40, d=3)
    draws = {"w": torch.randn(4, 3, dtype=torch.float64), "b": torch.randn(4, dtype=torch.float64),
             "w_aux": torch.randn(4, 3, dtype=torch.float64), "b_aux": torch.randn(4, dtype=torch.float64)}
    out = flatness_at_samples(models.logistic_regression, draws, X, y, batch_size=10, k=2, num_probes=50)
    out_aux = flatness_at_samples(models.logistic_regression, draws, X, y, batch_size=10, use="aux",
                                  num_draws=2, num_probes=50)
    Z = torch.cat([X, torch.ones(len(X), 1, dtype=torch.float64)], 1)
    for s in range(4):
        p = torch.sigmoid(X @ draws["w"][s] + draws["b"][s])
        H = Z.T @ (Z * (p * (1 - p))[:, None]) + torch.eye(4, dtype=torch.float64)
        eig = torch.linalg.eigvalsh(H).flip(0)
        np.testing.assert_allclose(out["top_eigenvalues"][s], eig[:2].numpy(), rtol=1e-10)
        assert abs(out["trace"][s] - float(H.trace())) < 4 * out["trace_stderr"][s] + 1e-9
    assert out_aux["draw"].tolist() == [0, 3]
    p = torch.sigmoid(X @ draws["w_aux"][3] + draws["b_aux"][3])
    H = Z.T @ (Z * (p * (1 - p))[:, None]) + torch.eye(4, dtype=torch.float64)
    assert out_aux["top_eigenvalues"][1, 0] == pytest.approx(float(torch.linalg.eigvalsh(H)[-1]), rel=1e-10)


# ------------------------------------------------------------------------------------ bad input
def test_bad_input_gets_errors_that_say_what_to_change(monkeypatch):
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="scalar"):
        top_eigenvalues(lambda z: z ** 2, x)
    with pytest.raises(ValueError, match="does not depend on params"):
        hessian_trace(lambda z: (z.detach() ** 2).sum(), x)
    with pytest.raises(ValueError, match="does not depend on params"):
        top_eigenvalues(lambda z: torch.tensor(1.0), x)
    with pytest.raises(ValueError, match=r"k=4 exceeds the dimension of params \(3\)"):
        top_eigenvalues(lambda z: (z ** 2).sum(), x, k=4)
    with pytest.raises(ValueError, match="flat 1-D"):
        top_eigenvalues(lambda z: (z ** 2).sum(), torch.zeros(2, 2))
    with pytest.raises(TypeError, match="floating-point"):
        top_eigenvalues(lambda z: (z ** 2).sum(), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="finite"):
        hessian_trace(lambda z: (z ** 2).sum() / 0.0, torch.ones(3))
    with pytest.raises(ValueError, match="per_site=True needs named blocks"):
        hessian_trace(lambda z: (z ** 2).sum(), x, per_site=True)
    with pytest.raises(ValueError, match="num_probes"):
        hessian_trace(lambda z: (z ** 2).sum(), x, num_probes=1)
    frozen = torch.nn.Linear(2, 1).requires_grad_(False)
    with pytest.raises(ValueError, match="requires_grad"):
        FlatLoss.from_module(frozen, lambda m: m(torch.ones(1, 2)).sum())
    with pytest.raises(ValueError, match="eta"):
        local_entropy(lambda z: (z ** 2).sum(), x, eta=0.0)
    with pytest.raises(ValueError, match="positive definite"):
        local_entropy(lambda z: -(z ** 2).sum(), x, eta=1.0, method="laplace")
    with pytest.raises(ValueError, match="no value for the model's latent site"):
        FlatLoss.from_model(models.logistic_regression, {"w": torch.zeros(3)}, torch.zeros(5, 3), torch.zeros(5))
    # too large for the exact path: the dense Hessian is refused, top_eigenvalues switches and says so
    monkeypatch.setattr(spectrum, "MAX_EXACT_DIM", 50)
    lam = torch.linspace(1.0, 10.0, 60)
    f = lambda z: 0.5 * (lam * z * z).sum()
    with pytest.raises(ValueError, match="top_eigenvalues"):
        hessian_eigenvalues(f, torch.zeros(60))
    with pytest.warns(UserWarning, match="too large for the exact Hessian.*Lanczos"):
        top = top_eigenvalues(f, torch.zeros(60), k=1, method="exact")
    assert top[0] == pytest.approx(10.0, rel=1e-4)


def test_likelihood_only_drops_the_prior_from_the_hessian():
    X, y = _logistic_data()
    w, b = torch.randn(4, dtype=torch.float64), torch.tensor(0.3, dtype=torch.float64)
    for batch_size in (None, 25):
        full = FlatLoss.from_model(models.logistic_regression, {"w": w, "b": b}, X, y, batch_size=batch_size,
                                   prior_scale=0.5)
        lik = FlatLoss.from_model(models.logistic_regression, {"w": w, "b": b}, X, y, batch_size=batch_size,
                                  prior_scale=0.5, likelihood_only=True)
        torch.testing.assert_close(HessianOperator(full).dense() - HessianOperator(lik).dense(),
                                   4.0 * torch.eye(5, dtype=torch.float64))
        nll = -dist.Bernoulli(logits=X @ w + b).log_prob(y).sum()
        assert float(lik(lik.params)) == pytest.approx(float(nll), rel=1e-10)
