"""``LastLayerLaplace`` against truths computed another way: the Hessian of the NLL by autograd, the
evidence by quadrature, the prior's limit, and sample moments within their standard errors."""

import math

import pytest
import torch
import torch.nn.functional as F

from pyro_flat.variational import LastLayerLaplace
from pyro_flat.variational import laplace as laplace_module
from pyro_flat.roundoff import assert_close_roundoff

F64 = torch.float64


def _problem(n=40, d=2, k=3, seed=0, dtype=F64):
    """Features, labels drawn from a random softmax head, and a random (non-MAP) head."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=dtype)
    truth = 1.5 * torch.randn(k, d, generator=g, dtype=dtype)
    y = torch.multinomial(torch.softmax(x @ truth.T, -1), 1, generator=g).squeeze(-1)
    return x, y, torch.randn(k, d, generator=g, dtype=dtype), torch.randn(k, generator=g, dtype=dtype)


def _nll(x, y, k, bias):
    """θ ↦ the summed NLL, θ = vec([W, b]) row by row."""
    d = x.shape[1]

    def nll(theta):
        head = theta.view(k, d + bias)
        logits = x @ head[:, :d].T + (head[:, d] if bias else 0.0)
        return F.cross_entropy(logits, y, reduction="sum")
    return nll


def _flat(w, b):
    return (torch.cat([w, b[:, None]], 1) if b is not None else w).reshape(-1)


def _map_fit(x, y, k, lam, bias=True):
    """The MAP of NLL + λ/2‖θ‖² by Newton's method on autograd's gradient and Hessian."""
    nll = _nll(x, y, k, bias)
    loss = lambda t: nll(t) + 0.5 * lam * t.square().sum()  # noqa: E731
    theta = torch.zeros(k * (x.shape[1] + bias), dtype=F64)
    for _ in range(50):
        g = torch.autograd.functional.jacobian(loss, theta)
        theta = theta - torch.linalg.solve(torch.autograd.functional.hessian(loss, theta), g)
    assert float(torch.autograd.functional.jacobian(loss, theta).abs().max()) < 1e-9
    d = x.shape[1]
    head = theta.view(k, d + bias)
    return head[:, :d].clone(), (head[:, d].clone() if bias else None)


@pytest.mark.parametrize("bias", [True, False])
def test_full_ggn_equals_the_autograd_hessian_of_the_nll(bias, monkeypatch):
    monkeypatch.setattr(laplace_module, "_BATCH_ELEMENTS", 50)  # several batches of rows
    x, y, w, b = _problem(n=37, d=3, k=4)
    b = b if bias else None
    la = LastLayerLaplace(x, y, w, b, prior_precision=0.7)
    exact = torch.autograd.functional.hessian(_nll(x, y, 4, bias), _flat(w, b))
    m = 4 * (3 + bias)
    assert la.num_params == m and la.posterior_precision.shape == (m, m)
    torch.testing.assert_close(la.posterior_precision - 0.7 * torch.eye(m, dtype=F64), exact, rtol=1e-10, atol=1e-10)


def test_diag_is_the_diagonal_of_full_and_the_input_dtype_comes_back():
    x, y, w, b = _problem(n=60, d=3, k=3)
    full = LastLayerLaplace(x, y, w, b, hessian="full", prior_precision=0.3)
    diag = LastLayerLaplace(x, y, w, b, hessian="diag", prior_precision=0.3)
    assert diag.posterior_precision.shape == (12,)
    torch.testing.assert_close(diag.posterior_precision, full.posterior_precision.diagonal(), rtol=1e-12, atol=1e-12)
    la32 = LastLayerLaplace(x.float(), y, w.float(), b.float(), prior_precision=0.3)
    assert la32.posterior_precision.dtype == torch.float32 and la32.sample(3)["weight"].dtype == torch.float32
    assert la32.predictive(x[:4].float(), num_samples=5).dtype == torch.float32
    # float32's round-off of a sum over 60 rows of 3 classes' curvature
    assert_close_roundoff(la32.posterior_precision, full.posterior_precision, length=60 * 3)


@pytest.mark.parametrize("hessian", ["full", "diag"])
def test_marglik_picks_the_grid_maximum_of_the_evidence(hessian):
    x, y, _, _ = _problem(n=80, d=3, k=3, seed=1)
    w, b = _map_fit(x, y, 3, lam=1.0)
    la = LastLayerLaplace(x, y, w, b, hessian=hessian)
    grid = LastLayerLaplace.PRIOR_PRECISION_GRID.tolist()
    evidence = [la.log_marginal_likelihood(lam) for lam in grid]
    best = max(range(len(grid)), key=evidence.__getitem__)
    assert la.prior_precision == grid[best] and 0 < best < len(grid) - 1  # an interior maximum
    fixed = LastLayerLaplace(x, y, w, b, hessian=hessian, prior_precision=1.0)
    shift = la.prior_precision - 1.0
    expected = fixed.posterior_precision + (shift * torch.eye(12, dtype=F64) if hessian == "full" else shift)
    torch.testing.assert_close(la.posterior_precision, expected)


def _quadrature_evidence(x, y, lam):
    """Two classes, no bias, one feature: logits (w₁φ, w₂φ) depend on u = w₁ - w₂ ~ N(0, 2/λ) alone,
    so p(y|X) = ∫ Π_n σ(±uφ_n) N(u; 0, 2/λ) du, by the trapezoid rule on a fine grid."""
    sd = math.sqrt(2.0 / lam)
    u = torch.linspace(-12 * sd, 12 * sd, 200_001, dtype=F64)
    sign = torch.where(y == 0, 1.0, -1.0).to(F64)
    log_lik = F.logsigmoid(u[:, None] * (sign * x[:, 0])[None, :]).sum(1)
    log_f = log_lik - 0.5 * (u / sd) ** 2 - math.log(sd * math.sqrt(2 * math.pi))
    top = log_f.max()
    return float(top + torch.log(torch.trapezoid(torch.exp(log_f - top), u)))


def test_the_laplace_evidence_approaches_the_exact_evidence_as_data_grow():
    lam, errors = 0.3, []
    for n in (25, 400):
        g = torch.Generator().manual_seed(3)
        x = torch.randn(n, 1, generator=g, dtype=F64)
        y = (torch.rand(n, generator=g, dtype=F64) < torch.sigmoid(-1.2 * x[:, 0])).long()
        w, _ = _map_fit(x, y, 2, lam, bias=False)
        la = LastLayerLaplace(x, y, w, None, prior_precision=lam)
        errors.append(abs(la.log_marginal_likelihood(lam) - _quadrature_evidence(x, y, lam)))
    assert errors[1] < 0.005 and errors[1] < errors[0] / 4, errors  # Laplace's error is O(1/N)


def test_a_huge_prior_precision_gives_the_prior_covariance_and_the_likelihood_as_evidence():
    x, y, w, b = _problem(n=50, d=2, k=3, seed=2)
    lam = 1e8
    la = LastLayerLaplace(x, y, w, b, prior_precision=lam, prior_mean={"weight": w, "bias": b})
    covariance = torch.linalg.inv(la.posterior_precision)
    torch.testing.assert_close(lam * covariance, torch.eye(9, dtype=F64), rtol=0, atol=1e-5)
    # a prior that is a point mass at θ*: the evidence is the likelihood at θ*
    log_lik = -float(F.cross_entropy(x @ w.T + b, y, reduction="sum"))
    assert abs(la.log_marginal_likelihood(lam) - log_lik) < 1e-4


@pytest.mark.parametrize("hessian", ["full", "diag"])
def test_sample_moments_match_the_posterior_within_monte_carlo_error(hessian):
    x, y, w, b = _problem(n=30, d=2, k=3, seed=4)
    lam, s = 0.5, 20_000
    la = LastLayerLaplace(x, y, w, b, hessian=hessian, prior_precision=lam)
    precision = torch.autograd.functional.hessian(_nll(x, y, 3, True), _flat(w, b)) + lam * torch.eye(9, dtype=F64)
    cov = torch.linalg.inv(precision) if hessian == "full" else torch.diag(1.0 / precision.diagonal())
    draws = la.sample(s, generator=torch.Generator().manual_seed(5))
    assert draws["weight"].shape == (s, 3, 2) and draws["bias"].shape == (s, 3)
    theta = torch.cat([draws["weight"], draws["bias"][..., None]], -1).reshape(s, 9)
    var = cov.diagonal()
    assert ((theta.mean(0) - _flat(w, b)).abs() < 5 * (var / s).sqrt()).all()
    centred = theta - _flat(w, b)
    sample_cov = centred.T @ centred / s
    se = ((var[:, None] * var[None, :] + cov.square()) / s).sqrt()  # sd of a Gaussian product's mean
    assert ((sample_cov - cov).abs() < 5 * se).all()
    again = la.sample(s, generator=torch.Generator().manual_seed(5))
    assert torch.equal(again["weight"], draws["weight"])


def test_predictive_approaches_the_map_softmax_as_the_posterior_shrinks():
    """The data repeated r times: the same MAP (the weights given), covariance ≈ (rH + λI)⁻¹ → 0."""
    x, y, _, _ = _problem(n=30, d=2, k=3, seed=6)
    w, b = _map_fit(x, y, 3, lam=1.0)
    at_map = torch.softmax(x @ w.T + b, -1)
    gaps = []
    for r in (1, 100, 10_000):
        la = LastLayerLaplace(x.repeat(r, 1), y.repeat(r), w, b, prior_precision=1.0)
        probs = la.predictive(x, num_samples=400, generator=torch.Generator().manual_seed(7))
        torch.testing.assert_close(probs.sum(-1), torch.ones(30, dtype=F64))
        gaps.append(float((probs - at_map).abs().max()))
    assert gaps[0] > 0.05 and gaps[1] < gaps[0] / 3 and gaps[2] < gaps[1] / 3 and gaps[2] < 5e-3, gaps


def test_predictive_is_less_confident_than_the_map_softmax():
    x, y, _, _ = _problem(n=20, d=2, k=3, seed=8)
    w, b = _map_fit(x, y, 3, lam=0.1)
    la = LastLayerLaplace(x, y, w, b, prior_precision=0.1)
    test_x = 2.0 * torch.randn(200, 2, generator=torch.Generator().manual_seed(9), dtype=F64)
    probs = la.predictive(test_x, num_samples=2000, generator=torch.Generator().manual_seed(10))
    at_map = torch.softmax(test_x @ w.T + b, -1)
    entropy = lambda p: -(p * p.clamp_min(1e-300).log()).sum(-1)  # noqa: E731
    assert entropy(probs).mean() > entropy(at_map).mean() + 0.05
    assert probs.max(-1).values.mean() < at_map.max(-1).values.mean()


def _bad(**change):
    x, y, w, b = _problem(n=10, d=2, k=3)
    args = dict(features=x, y=y, weight=w, bias=b, prior_precision=1.0)
    args.update(change)
    return LastLayerLaplace(args.pop("features"), args.pop("y"), args.pop("weight"), args.pop("bias"), **args)


X, Y, W, B = _problem(n=10, d=2, k=3)


@pytest.mark.parametrize("change, name", [
    (dict(y=Y[:9]), "y has 9 labels"),
    (dict(weight=torch.randn(3, 4, dtype=F64)), "weight has 4"),
    (dict(bias=torch.zeros(4, dtype=F64)), "bias must"),
    (dict(y=torch.where(torch.arange(10) == 0, 3, Y)), "y holds labels"),
    (dict(y=torch.where(torch.arange(10) == 0, -1, Y)), "y holds labels"),
    (dict(y=Y.double()), "y must be"),
    (dict(features=torch.where(torch.arange(10)[:, None] == 2, float("nan"), X)), "features holds NaN"),
    (dict(features=X[:, 0]), "features must"),
    (dict(prior_precision=0.0), "prior_precision"),
    (dict(prior_precision=-1), "prior_precision"),
    (dict(prior_precision="evidence"), "prior_precision"),
    (dict(hessian="kron"), "hessian"),
    (dict(prior_mean={"weight": torch.zeros(2, 2)}), r"prior_mean\['weight'\]"),
    (dict(prior_mean={"bais": torch.zeros(3)}), "prior_mean"),
])
def test_bad_inputs_are_refused_by_name(change, name):
    with pytest.raises(ValueError, match=name):
        _bad(**change)


def test_a_too_large_full_hessian_is_refused_and_diag_works():
    x = torch.randn(4, 100, dtype=F64)
    y, w, b = torch.tensor([0, 1, 2, 200]), torch.zeros(201, 100, dtype=F64), torch.zeros(201, dtype=F64)
    with pytest.raises(ValueError, match="20301 x 20301.*pass hessian='diag'"):
        LastLayerLaplace(x, y, w, b, hessian="full", prior_precision=1.0)
    la = LastLayerLaplace(x, y, w, b, hessian="diag")
    assert la.posterior_precision.shape == (20301,)
    assert la.predictive(x, num_samples=3).shape == (4, 201)


def test_bad_method_arguments_are_refused_by_name():
    la = _bad()
    for call, name in [(lambda: la.log_marginal_likelihood(0.0), "prior_precision"),
                       (lambda: la.sample(0), "num"),
                       (lambda: la.predictive(X, num_samples=0), "num_samples"),
                       (lambda: la.predictive(torch.randn(5, 3, dtype=F64)), "features has 3 columns")]:
        with pytest.raises(ValueError, match=name):
            call()
