r"""Strong-convexity and smoothness constants, and the admissible step sizes.

The bounds of :mod:`pyro_flat.theory.bounds` need a potential that is :math:`m`-strongly convex
and :math:`M`-smooth: :math:`m I \preceq \nabla^2 f \preceq M I` everywhere. All constants here
are those of the *tempered* potential :math:`f/T` (the law sampled at temperature :math:`T` is
:math:`\propto e^{-f/T}`).
"""

from __future__ import annotations

import math
from typing import Tuple, Union

import numpy as np
import torch

from ..validation import check_positive, to_numpy

ArrayLike = Union[np.ndarray, torch.Tensor, float]


def check_constants(m: float, M: float) -> Tuple[float, float]:
    m, M = float(m), float(M)
    if not (math.isfinite(m) and m > 0):
        raise ValueError(
            f"the potential must be strongly convex (m > 0), got m={m!r}: the Wasserstein bounds "
            "do not apply. For Bayesian logistic regression use prior_precision > 0."
        )
    if not (math.isfinite(M) and M >= m):
        raise ValueError(f"the smoothness constant must satisfy M >= m, got m={m!r}, M={M!r}.")
    return m, M


def logistic_regression_constants(
    X: ArrayLike, prior_precision: ArrayLike, temperature: float = 1.0
) -> Tuple[float, float]:
    r""":math:`(m, M)` of Bayesian logistic regression's potential, tempered by :math:`T`.

    .. math::

        f(w) = \sum_i \log\big(1 + e^{-s_i x_i^\top w}\big) + \tfrac12 w^\top \Lambda w,
        \qquad \nabla^2 f(w) = X^\top D(w) X + \Lambda,\quad
        D = \mathrm{diag}\big(\sigma_i(1 - \sigma_i)\big) \preceq \tfrac14 I,

    so :math:`m = \lambda_{\min}(\Lambda)` (the infimum: :math:`D \to 0` far from the data) and
    :math:`M = \lambda_{\max}(X^\top X / 4 + \Lambda)` (attained at :math:`w = 0`); with
    :math:`\Lambda = \lambda I` this is docs/theory.md's (section 3) :math:`m = \lambda`,
    :math:`M = \lambda + \lambda_{\max}(X^\top X)/4`. Both are divided by ``temperature``.

    :param X: ``(n, d)`` design; include a column of ones for an intercept.
    :param prior_precision: :math:`\lambda > 0`, a number or a ``(d,)`` vector (diagonal
        :math:`\Lambda`), the Gaussian prior's precision.
    :param temperature: :math:`T > 0`.
    :raises ValueError: for a zero or negative precision (not strongly convex) or a bad ``X``.

    Example::

        >>> import torch
        >>> from pyro_flat.theory import logistic_regression_constants
        >>> X = torch.tensor([[1., 0.], [0., 2.]])
        >>> logistic_regression_constants(X, prior_precision=1.0)
        (1.0, 2.0)
    """
    X = to_numpy(X)
    if X.ndim != 2 or not np.isfinite(X).all():
        raise ValueError(f"X must be a finite (n, d) matrix, got shape {X.shape} "
                         f"{'' if np.isfinite(X).all() else 'with NaN/inf entries'}.")
    precision = np.broadcast_to(to_numpy(prior_precision), (X.shape[1],))
    if not np.isfinite(precision).all() or precision.min() <= 0:
        raise ValueError(
            f"prior_precision must be > 0 for every weight, got min {precision.min()!r}: with a "
            "flat prior the logistic potential is not strongly convex (m = 0) and no Wasserstein "
            "bound applies. Use a Gaussian prior, e.g. prior_precision=1.0."
        )
    T = float(temperature)
    if not (math.isfinite(T) and T > 0):
        raise ValueError(f"temperature must be > 0, got temperature={temperature!r}.")
    hessian_bound = X.T @ X / 4.0 + np.diag(precision)
    M = float(np.linalg.eigvalsh(hessian_bound)[-1])
    return float(precision.min()) / T, M / T


def joint_constants(m: float, M: float, eta: float) -> Tuple[float, float]:
    r""":math:`(m_J, M_J)` of the Entropy-MCMC joint :math:`f(\theta) + \lVert\theta - \theta_a\rVert^2/(2\eta)`.

    On each eigen-direction of :math:`\nabla^2 f` with eigenvalue :math:`\lambda` the joint
    Hessian is :math:`\begin{pmatrix}\lambda + 1/\eta & -1/\eta\\ -1/\eta & 1/\eta\end{pmatrix}`,
    with eigenvalues :math:`\tfrac12\big(\lambda + 2/\eta \pm \sqrt{\lambda^2 + 4/\eta^2}\big)`;
    the smaller one increases and the larger one increases with :math:`\lambda`, so

    .. math:: m_J = \tfrac12\Big(m + \tfrac2\eta - \sqrt{m^2 + 4/\eta^2}\Big), \qquad
              M_J = \tfrac12\Big(M + \tfrac2\eta + \sqrt{M^2 + 4/\eta^2}\Big).

    For the tempered joint :math:`U/T` pass the tempered :math:`(m, M)` and :math:`\eta T`.

    Example::

        >>> from pyro_flat.theory import joint_constants
        >>> [round(c, 4) for c in joint_constants(1.0, 10.0, eta=1.0)]
        [0.382, 11.099]
    """
    m, M = check_constants(m, M)
    eta = check_positive("eta", eta)
    inv = 1.0 / eta
    # m + 2/eta - sqrt(m^2 + 4/eta^2) = 2 m/eta / (m + 2/eta + sqrt(...)): no cancellation
    m_joint = 2.0 * m * inv / (m + 2.0 * inv + math.sqrt(m * m + 4.0 * inv * inv))
    M_joint = 0.5 * (M + 2.0 * inv + math.sqrt(M * M + 4.0 * inv * inv))
    return m_joint, M_joint


def joint_hessian(hessian, eta: float) -> np.ndarray:
    r"""The Hessian :math:`\begin{pmatrix}H + I/\eta & -I/\eta\\ -I/\eta & I/\eta\end{pmatrix}` of
    the Entropy-MCMC joint over :math:`(\theta, \theta_a)` for :math:`\nabla^2 f = H`."""
    H = to_numpy(hessian)
    inv = np.eye(H.shape[0]) / check_positive("eta", eta)
    return np.block([[H + inv, -inv], [-inv, inv]])


def preconditioned_constants(lower, upper, factor, temperature: float = 1.0) -> Tuple[float, float]:
    r""":math:`(\tilde m, \tilde M)` of the preconditioned potential :math:`\tilde U(y) = U(Ly)/T`.

    A preconditioned Langevin chain :math:`z \leftarrow z - \alpha LL^\top\nabla U + \sqrt{2\alpha T}L\xi`
    is plain Langevin on :math:`y = L^{-1}z` with :math:`\nabla^2\tilde U = L^\top\nabla^2 U L/T`.
    When :math:`\nabla^2 U` lies between ``lower`` and ``upper`` (Loewner order, e.g.
    :math:`\Lambda \preceq \nabla^2 U \preceq X^\top X/4 + \Lambda` for logistic regression),
    :math:`\tilde m = \lambda_{\min}(L^\top \text{lower}\, L)/T` and
    :math:`\tilde M = \lambda_{\max}(L^\top \text{upper}\, L)/T`.

    Example::

        >>> import numpy as np
        >>> A = np.diag([1.0, 1000.0])
        >>> [round(c, 6) for c in preconditioned_constants(A, A, np.diag(1 / np.sqrt([1.0, 1000.0])))]
        [1.0, 1.0]
    """
    L, T = to_numpy(factor), check_positive("temperature", temperature)
    low = np.linalg.eigvalsh(L.T @ to_numpy(lower) @ L)[0]
    high = np.linalg.eigvalsh(L.T @ to_numpy(upper) @ L)[-1]
    return check_constants(low / T, high / T)


def local_entropy_constants(m: float, M: float, eta: float) -> Tuple[float, float]:
    r""":math:`(m_F, M_F)` of the local-entropy potential :math:`F(\theta) = -\log\int e^{-f(\theta') - \lVert\theta'-\theta\rVert^2/(2\eta)}\,d\theta'`.

    :math:`\nabla^2 F = I/\eta - \mathrm{Cov}(\theta' \mid \theta)/\eta^2`, and the conditional law
    of :math:`\theta'` is :math:`(m + 1/\eta)`-strongly log-concave and :math:`(M + 1/\eta)`-smooth,
    so :math:`(M + 1/\eta)^{-1} I \preceq \mathrm{Cov} \preceq (m + 1/\eta)^{-1} I` (Cramér–Rao
    and Brascamp–Lieb), hence

    .. math:: m_F = \frac{m}{1 + \eta m}, \qquad M_F = \frac{M}{1 + \eta M},

    exact for Gaussians (:math:`(A^{-1} + \eta I)^{-1}`). :math:`F` is the potential of the flat
    posterior (the :math:`\theta_a`-marginal), which :class:`~pyro_flat.LocalEntropySGLD` samples.
    For the tempered potential pass the tempered :math:`(m, M)` and :math:`\eta T`.

    Example::

        >>> from pyro_flat.theory import local_entropy_constants
        >>> local_entropy_constants(1.0, 9.0, eta=1.0)
        (0.5, 0.9)
    """
    m, M = check_constants(m, M)
    eta = check_positive("eta", eta)
    return m / (1.0 + eta * m), M / (1.0 + eta * M)


def admissible_step_size(m: float, M: float, temperature: float = 1.0) -> float:
    r"""The largest kernel step :math:`\alpha` the bounds allow: :math:`\alpha T \le 2/(m + M)`.

    The kernels step :math:`z \leftarrow z - \alpha\nabla U + \sqrt{2\alpha T}\,\xi`, which is
    Dalalyan & Karagulyan's Langevin step of size :math:`h = \alpha T` on the tempered potential
    :math:`U/T` with constants :math:`(m, M)`; their bounds need :math:`h \le 2/(m + M)`.
    """
    m, M = check_constants(m, M)
    return 2.0 / ((m + M) * check_positive("temperature", temperature))


def check_step_size(step_size: float, m: float, M: float, temperature: float = 1.0,
                    *, what: str = "step_size") -> float:
    """``step_size`` if it is admissible for ``(m, M)``, else a ``ValueError`` giving the limit."""
    step = check_positive(what, step_size)
    limit = admissible_step_size(m, M, temperature)
    if step > limit * (1.0 + 1e-12):
        raise ValueError(
            f"{what}={step:.4g} is above the admissible bound 2/((m + M) T) = {limit:.4g} "
            f"(m={m:.4g}, M={M:.4g}, T={temperature:g}): the Wasserstein bound does not apply. "
            f"Use {what} <= {limit:.4g}."
        )
    return step


def logistic_gradient_noise(
    X: ArrayLike, batch_size: int, y: ArrayLike = None, theta: ArrayLike = None
) -> float:
    r""":math:`\sqrt{\mathbb E\lVert \widehat{\nabla f} - \nabla f\rVert^2}` of logistic regression's minibatch gradient.

    The estimate is :math:`(N/B)\sum_{i \in \mathcal B} g_i` over a batch drawn without
    replacement, :math:`g_i = (\sigma(x_i^\top w) - y_i)\,x_i` (the prior's gradient is exact),
    whose variance is :math:`N^2 (1 - B/N) S^2 / B` with
    :math:`S^2 = \sum_i \lVert g_i - \bar g\rVert^2/(N - 1)`.

    With ``y`` and ``theta`` this is that value at ``theta`` (a ``(d,)`` vector); without them a
    bound valid at every :math:`w`, from :math:`\lVert g_i\rVert \le \lVert x_i\rVert`:
    :math:`S^2 \le N \max_i \lVert x_i\rVert^2/(N-1)` (docs/theory.md, section 3: :math:`(n^2/B)\max_i\lVert x_i\rVert^2`
    with the without-replacement factor).
    """
    X = to_numpy(X)
    n = X.shape[0]
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= n:
        raise ValueError(f"batch_size must be an integer in [1, {n}], got {batch_size!r}.")
    if batch_size == n:
        return 0.0
    factor = n * n * (1.0 - batch_size / n) / batch_size
    if theta is None:
        return math.sqrt(factor * n * float((X * X).sum(1).max()) / (n - 1))
    if y is None:
        raise ValueError("logistic_gradient_noise needs y together with theta.")
    w = to_numpy(theta)
    probs = 1.0 / (1.0 + np.exp(-(X @ w)))
    g = (probs - to_numpy(y))[:, None] * X
    s2 = float(((g - g.mean(0)) ** 2).sum() / (n - 1))
    return math.sqrt(factor * s2)
