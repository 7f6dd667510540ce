"""Moment checks whose tolerances come from the effective sample size (ArviZ, method="mean")."""

from __future__ import annotations

import arviz as az
import numpy as np


def _ess(x: np.ndarray) -> float:
    """ESS of the mean of a (chain, draw) array (ArviZ method="mean": the estimator used here), floored
    at 10 so a stuck chain gives a finite, wide band."""
    return max(float(az.ess(x[None] if x.ndim == 1 else x, method="mean")), 10.0)


def moment_errors(x: np.ndarray, mean: np.ndarray, cov: np.ndarray):
    """Standardised errors of the sample mean and covariance entries.

    ``x``: (chain, draw, d). For each mean coordinate and each covariance entry the error is
    (estimate - truth) / (sd / sqrt(ESS)), where the sd and ESS are those of the series whose average
    is the estimate (x_i, or the centred products (x_i - mu_i)(x_j - mu_j)).
    Returns (mean z-scores (d,), covariance z-scores (d, d), covariance standard errors (d, d)).
    """
    d = x.shape[-1]
    z_mean = np.empty(d)
    for i in range(d):
        series = x[..., i]
        z_mean[i] = (series.mean() - mean[i]) / (series.std() / np.sqrt(_ess(series)))
    centred = x - mean
    z_cov, se_cov = np.empty((d, d)), np.empty((d, d))
    for i in range(d):
        for j in range(i, d):
            series = centred[..., i] * centred[..., j]
            se = series.std() / np.sqrt(_ess(series))
            z_cov[i, j] = z_cov[j, i] = (series.mean() - cov[i, j]) / se
            se_cov[i, j] = se_cov[j, i] = se
    return z_mean, z_cov, se_cov


def assert_moments(
    x: np.ndarray, mean: np.ndarray, cov: np.ndarray, n_sd: float = 4.5, known_bias=None
) -> None:
    """Fail unless every mean and covariance entry lies within ``n_sd`` Monte-Carlo errors.

    4.5 sd per entry keeps the family-wise false-alarm rate below 1e-3 for up to ~150 entries
    (Bonferroni with the Gaussian tail 6.8e-6). ``known_bias`` (d, d): the sampler's exact
    step-size bias of the covariance; it must stay below one Monte-Carlo sd of every entry, so that
    it cannot decide the outcome (the family-wise false-alarm rate then stays below ~5%).
    """
    z_mean, z_cov, se_cov = moment_errors(x, mean, cov)
    if known_bias is not None:
        ratio = np.abs(known_bias / se_cov).max()
        assert ratio < 1.0, f"step-size bias is {ratio:.2f} Monte-Carlo sd: use a smaller step size"
    worst = max(np.abs(z_mean).max(), np.abs(z_cov).max())
    assert worst < n_sd, (
        f"moments off by {worst:.1f} Monte-Carlo sd (limit {n_sd}):\n"
        f"mean z: {np.round(z_mean, 1)}\ncov z:\n{np.round(z_cov, 1)}"
    )


def minibatch_noise_covariance(per_datum_grads: np.ndarray, num_data: int, batch_size: int) -> np.ndarray:
    """Covariance of the minibatch gradient N/B Σ_{i∈batch} g_i (B of N drawn without replacement)."""
    n, b = num_data, batch_size
    return n ** 2 / b * (n - b) / (n - 1) * np.cov(per_datum_grads.T, bias=True)


def sgld_stationary_covariance(hessian: np.ndarray, step: float, noise_cov: np.ndarray) -> np.ndarray:
    """SGLD's exact stationary covariance on a Gaussian target with constant gradient-noise covariance:
    Σ = (I - αH) Σ (I - αH)ᵀ + 2αI + α²C (the discrete Lyapunov equation)."""
    import scipy.linalg

    eye = np.eye(len(hessian))
    return scipy.linalg.solve_discrete_lyapunov(eye - step * hessian, 2 * step * eye + step ** 2 * noise_cov)


def baoab_stationary_covariance(hessian: np.ndarray, time_step: float, decay: float, noise_cov: np.ndarray,
                                temperature: float = 1.0) -> np.ndarray:
    """The stationary covariance of θ under BAOAB (unit mass) on a Gaussian target of Hessian H whose
    gradient carries noise of constant covariance C: the discrete Lyapunov equation of the linear chain
    p' = p - h(Hθ + ε), θ ← θ + h/2 (p' + p''), p'' = c p' + √(T(1-c²)) ξ, over the pair (θ, p)."""
    import scipy.linalg

    d = len(hessian)
    eye, h, c = np.eye(d), time_step, decay
    s = np.sqrt(temperature * (1 - c * c))
    transition = np.block([[eye - h * h * (1 + c) / 2 * hessian, h * (1 + c) / 2 * eye], [-c * h * hessian, c * eye]])
    from_xi = np.vstack([h * s / 2 * eye, s * eye])
    from_noise = np.vstack([-h * h * (1 + c) / 2 * eye, -c * h * eye])
    forcing = from_xi @ from_xi.T + from_noise @ noise_cov @ from_noise.T
    return scipy.linalg.solve_discrete_lyapunov(transition, forcing)[:d, :d]
