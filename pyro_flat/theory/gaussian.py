r"""Exact laws of (Entropy-)Langevin chains on Gaussian targets, and the Gaussian W2.

On a quadratic potential :math:`f(\theta) = \tfrac12(\theta - \mu)^\top A(\theta - \mu)` every
kernel of pyro-flat is a linear map plus Gaussian noise, :math:`z_{k+1} = B z_k + c + \epsilon_k`,
:math:`\epsilon_k \sim \mathcal N(0, Q)`, so a chain started from a Gaussian (or a point) stays
Gaussian with

.. math:: m_{k+1} = B m_k + c, \qquad S_{k+1} = B S_k B^\top + Q,

and its distance to the target is :func:`gaussian_w2` at every step: a check of the bounds that
is neither vacuous nor noisy. :func:`langevin_chain`, :func:`entropy_langevin_chain` and
:func:`local_entropy_chain` build :math:`(B, c, Q)` for SGLD/SGD, Entropy-MCMC and
Entropy-SGLD/SGD; :func:`gaussian_targets` gives the laws they target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

from ..validation import check_positive, to_numpy


def psd_sqrt(S: np.ndarray) -> np.ndarray:
    """The symmetric square root of a positive semi-definite matrix (negative rounding clipped)."""
    vals, vecs = np.linalg.eigh(0.5 * (S + S.T))
    return (vecs * np.sqrt(np.clip(vals, 0.0, None))) @ vecs.T


def gaussian_w2(mean1, cov1, mean2, cov2) -> float:
    r"""The 2-Wasserstein distance between :math:`\mathcal N(m_1, \Sigma_1)` and :math:`\mathcal N(m_2, \Sigma_2)`.

    .. math:: W_2^2 = \lVert m_1 - m_2\rVert^2 + \mathrm{tr}\,\Sigma_1 + \mathrm{tr}\,\Sigma_2
              - 2\,\mathrm{tr}\big(\Sigma_2^{1/2}\Sigma_1\Sigma_2^{1/2}\big)^{1/2}

    (the Bures metric). Singular covariances (point masses) are allowed.

    Example::

        >>> import numpy as np
        >>> from pyro_flat.theory import gaussian_w2
        >>> round(gaussian_w2(np.zeros(2), np.eye(2), np.ones(2), 4 * np.eye(2)), 6)  # sqrt(2 + 2)
        2.0
    """
    m1, m2 = to_numpy(mean1).reshape(-1), to_numpy(mean2).reshape(-1)
    S1, S2 = to_numpy(cov1), to_numpy(cov2)
    if S1.shape != (m1.size, m1.size) or S2.shape != (m2.size, m2.size) or m1.size != m2.size:
        raise ValueError(f"shapes do not match: means {m1.shape}, {m2.shape}; covariances "
                         f"{S1.shape}, {S2.shape}.")
    root = psd_sqrt(S2)
    cross = np.linalg.eigvalsh(root @ S1 @ root)
    w2sq = ((m1 - m2) ** 2).sum() + np.trace(S1) + np.trace(S2) - 2 * np.sqrt(np.clip(cross, 0, None)).sum()
    return float(np.sqrt(max(w2sq, 0.0)))


def gaussian_targets(precision, mean, eta: Optional[float] = None,
                     temperature: float = 1.0) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
    r"""``{"posterior", "flat", "joint"}`` → ``(mean, cov)`` for :math:`f = \tfrac12(\theta-\mu)^\top A(\theta-\mu)` at temperature :math:`T`.

    :math:`\theta \sim \mathcal N(\mu, TA^{-1})`, :math:`\theta_a \sim \mathcal N(\mu, T(A^{-1} + \eta I))`,
    :math:`\mathrm{Cov}(\theta, \theta_a) = TA^{-1}` (docs/theory.md, section 1); the joint stacks
    :math:`(\theta, \theta_a)`. Without ``eta`` only the posterior.
    """
    A, mu = to_numpy(precision), to_numpy(mean).reshape(-1)
    T = check_positive("temperature", temperature)
    cov = T * np.linalg.inv(A)
    out = {"posterior": (mu, cov)}
    if eta is not None:
        flat = cov + T * check_positive("eta", eta) * np.eye(mu.size)
        out["flat"] = (mu, flat)
        out["joint"] = (np.concatenate([mu, mu]), np.block([[cov, cov], [cov, flat]]))
    return out


@dataclass(frozen=True)
class LinearGaussianChain:
    r""":math:`z_{k+1} = B z_k + c + \epsilon_k`, :math:`\epsilon_k \sim \mathcal N(0, Q)`."""

    B: np.ndarray
    c: np.ndarray
    Q: np.ndarray

    def step(self, mean: np.ndarray, cov: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        return self.B @ mean + self.c, self.B @ cov @ self.B.T + self.Q

    def whitened(self, factor: np.ndarray) -> "LinearGaussianChain":
        r"""The same chain seen in :math:`y = L^{-1} z` (``factor`` is :math:`L`): a preconditioned
        kernel's chain in the coordinates where its metric is the identity."""
        inv = np.linalg.inv(factor)
        return LinearGaussianChain(inv @ self.B @ factor, inv @ self.c, inv @ self.Q @ inv.T)

    def stationary(self) -> Tuple[np.ndarray, np.ndarray]:
        r"""The chain's own stationary law: mean :math:`(I - B)^{-1}c` and the covariance solving
        the discrete Lyapunov equation :math:`\Sigma = B\Sigma B^\top + Q` (needs
        :math:`\rho(B) < 1`: a stable step)."""
        radius = np.abs(np.linalg.eigvals(self.B)).max()
        if radius >= 1:
            raise ValueError(f"the chain is unstable (spectral radius of B {radius:.4g} >= 1): no "
                             "stationary law; use a smaller step size.")
        d = self.B.shape[0]
        mean = np.linalg.solve(np.eye(d) - self.B, self.c)
        # vec(Σ) = (I - B ⊗ B)^{-1} vec(Q), small d only; iterate the doubling recursion instead
        cov, B = self.Q.copy(), self.B.copy()
        for _ in range(64):  # Σ_{2k} = Σ_k + B^k Σ_k B^kᵀ: converges geometrically
            cov = cov + B @ cov @ B.T
            B = B @ B
            if np.abs(B).max() < 1e-18:
                break
        return mean, 0.5 * (cov + cov.T)

    def w2_trajectory(self, mean0, cov0, iterations, target: Tuple[np.ndarray, np.ndarray],
                      project: Optional[slice] = None) -> np.ndarray:
        r""":func:`gaussian_w2` to ``target`` from :math:`\mathcal N(` ``mean0, cov0`` :math:`)`,
        at iterations ``0..iterations`` (an int) or at the given iteration counts (an array);
        ``project``: the coordinates compared."""
        if np.ndim(iterations) == 0:
            iterations = np.arange(int(iterations) + 1)
        iterations = np.asarray(iterations, dtype=int)
        mean, cov = to_numpy(mean0).reshape(-1), to_numpy(cov0)
        sel = slice(None) if project is None else project
        out, k = np.empty(len(iterations)), 0
        for i in np.argsort(iterations, kind="stable"):
            while k < iterations[i]:
                mean, cov = self.step(mean, cov)
                k += 1
            out[i] = gaussian_w2(mean[sel], cov[sel, sel], *target)
        return out


def _gradient_noise_cov(d: int, gradient_noise_cov) -> np.ndarray:
    return np.zeros((d, d)) if gradient_noise_cov is None else to_numpy(gradient_noise_cov)


def langevin_chain(precision, mean, step_size: float, temperature: float = 1.0, *,
                   noise_scale: float = 1.0, gradient_bias=None,
                   gradient_noise_cov=None, preconditioner=None) -> LinearGaussianChain:
    r"""SGLD on :math:`\tfrac12(\theta-\mu)^\top A(\theta-\mu)` with a fixed preconditioner
    :math:`P = M^{-1}` (default :math:`I`): :math:`B = I - \alpha PA`,
    :math:`c = \alpha P(A\mu - b)`, :math:`Q = 2\alpha T s^2 P + \alpha^2 P V P`.

    ``temperature=0`` is SGD. ``noise_scale`` :math:`s`, a constant ``gradient_bias`` :math:`b`
    and a minibatch-noise covariance :math:`V` are there to model a wrong sampler or a noisy one.
    """
    A, mu = to_numpy(precision), to_numpy(mean).reshape(-1)
    alpha = check_positive("step_size", step_size)
    d = mu.size
    P = np.eye(d) if preconditioner is None else to_numpy(preconditioner)
    bias = np.zeros(d) if gradient_bias is None else to_numpy(gradient_bias).reshape(-1)
    V = _gradient_noise_cov(d, gradient_noise_cov)
    Q = 2 * alpha * float(temperature) * noise_scale**2 * P + alpha**2 * P @ V @ P
    return LinearGaussianChain(np.eye(d) - alpha * P @ A, alpha * P @ (A @ mu - bias), Q)


def entropy_langevin_chain(precision, mean, eta: float, step_size: float,
                           temperature: float = 1.0, *, gradient_noise_cov=None,
                           preconditioner=None) -> LinearGaussianChain:
    r"""Entropy-MCMC (:class:`~pyro_flat.EntropySGLD`) on the joint of a quadratic :math:`f`.

    SGLD on :math:`(\theta, \theta_a)` with the joint precision
    :math:`\begin{pmatrix} A + I/\eta & -I/\eta \\ -I/\eta & I/\eta\end{pmatrix}` and mean
    :math:`(\mu, \mu)`; minibatch noise (``gradient_noise_cov``) enters the :math:`\theta` block only.
    ``preconditioner``: the fixed ``(2d, 2d)`` joint metric :math:`M^{-1}`, if any.
    """
    A, mu = to_numpy(precision), to_numpy(mean).reshape(-1)
    eta = check_positive("eta", eta)
    d = mu.size
    eye = np.eye(d)
    joint = np.block([[A + eye / eta, -eye / eta], [-eye / eta, eye / eta]])
    V = np.zeros((2 * d, 2 * d))
    V[:d, :d] = _gradient_noise_cov(d, gradient_noise_cov)
    return langevin_chain(joint, np.concatenate([mu, mu]), step_size, temperature, gradient_noise_cov=V,
                          preconditioner=preconditioner)


def local_entropy_chain(precision, mean, eta: float, step_size: float, *, num_inner_steps: int,
                        inner_step_size: float, mean_weight: float, temperature: float = 1.0,
                        outer_noise: bool = True, gradient_noise_cov=None) -> LinearGaussianChain:
    r"""One outer step of :class:`~pyro_flat.LocalEntropySGLD` (or ``SGD``) on a quadratic :math:`f`.

    The inner state :math:`s_l = (\theta'_l, \mu_l)` is linear in :math:`\theta` plus noise:
    :math:`\theta'_l = B_{in}\theta'_{l-1} + \alpha'(A\mu^\star + \theta/\eta) + \epsilon_l`,
    :math:`B_{in} = I - \alpha'(A + I/\eta)`, :math:`\mu_l = (1-a)\mu_{l-1} + a\theta'_l`, from
    :math:`\theta'_0 = \mu_0 = \theta`. After :math:`L` steps :math:`\mu_L = P\theta + q + n`,
    :math:`n \sim \mathcal N(0, R)`, and the outer step
    :math:`\theta \leftarrow \theta - \alpha(\theta - \mu_L)/\eta + \sqrt{2\alpha T}\xi` gives
    :math:`B = I - \tfrac\alpha\eta(I - P)`, :math:`c = \tfrac\alpha\eta q`,
    :math:`Q = \tfrac{\alpha^2}{\eta^2}R + 2\alpha T I`.
    """
    A, mu_star = to_numpy(precision), to_numpy(mean).reshape(-1)
    eta = check_positive("eta", eta)
    alpha = check_positive("step_size", step_size)
    alpha_in = check_positive("inner_step_size", inner_step_size)
    a, T = float(mean_weight), float(temperature)
    d = mu_star.size
    eye = np.eye(d)
    B_in = eye - alpha_in * (A + eye / eta)
    # state s = (theta', mu) = P_s theta + q_s + noise(cov S)
    G = np.block([[B_in, np.zeros((d, d))], [a * B_in, (1 - a) * eye]])
    H = np.vstack([alpha_in / eta * eye, a * alpha_in / eta * eye])
    g = np.concatenate([alpha_in * A @ mu_star, a * alpha_in * A @ mu_star])
    E = np.vstack([eye, a * eye])
    W = 2 * alpha_in * T * eye + alpha_in**2 * _gradient_noise_cov(d, gradient_noise_cov)
    P_s, q_s, S = np.vstack([eye, eye]), np.zeros(2 * d), np.zeros((2 * d, 2 * d))
    for _ in range(int(num_inner_steps)):
        P_s, q_s, S = G @ P_s + H, G @ q_s + g, G @ S @ G.T + E @ W @ E.T
    P, q, R = P_s[d:], q_s[d:], S[d:, d:]
    B = eye - alpha / eta * (eye - P)
    Q = (alpha / eta) ** 2 * R + (2 * alpha * T * eye if outer_noise else 0.0)
    return LinearGaussianChain(B, alpha / eta * q, Q)
