r"""2-Wasserstein bounds for (Entropy-)Langevin samplers on strongly convex potentials.

Every bound is Dalalyan & Karagulyan's (2019, "User-friendly guarantees for the Langevin Monte
Carlo with inaccurate gradient", arXiv:1710.00095, Theorems 1 and 4) for the Langevin chain
:math:`x_{k+1} = x_k - h\,G(x_k) + \sqrt{2h}\,\xi_k` on a :math:`p`-dimensional potential that
is :math:`m`-strongly convex and :math:`M`-smooth, with step :math:`h \le 2/(m+M)` and a gradient
estimate :math:`G` whose error has bias :math:`\le \delta\sqrt p` and variance :math:`\le \sigma^2 p`:

.. math::

    W_2(\nu_K, \pi) \le (1 - mh)^K\,W_2(\nu_0, \pi) + 1.65\,\frac{M}{m}\,(hp)^{1/2}
        + \frac{\delta\sqrt p}{m} + \frac{\sigma^2 (hp)^{1/2}}{1.65M + \sigma\sqrt m}.

pyro-flat's kernels step :math:`z \leftarrow z - \alpha\widehat{\nabla U} + \sqrt{2\alpha T}\,\xi`:
that is the chain above on the tempered potential :math:`U/T` with :math:`h = \alpha T`, in the
same coordinates, so every function here takes the kernel's ``step_size`` :math:`\alpha`, the
``temperature`` :math:`T` and the constants :math:`(m, M)` of :math:`U/T` (those returned by
:func:`~pyro_flat.theory.logistic_regression_constants`), and gradient errors of :math:`\nabla U`
in the kernel's units (divided by :math:`T` inside).

- :func:`sgld_w2_bound`: SGLD, :math:`p = d`.
- :func:`entropy_mcmc_w2_bound`: Entropy-MCMC (Li & Zhang 2024, Theorem 1 form): the same bound
  on the joint, :math:`p = 2d`, constants :func:`~pyro_flat.theory.joint_constants`. It bounds the
  :math:`\theta`- and :math:`\theta_a`-marginals too (a projection is 1-Lipschitz).
- :func:`local_entropy_w2_bound`: Entropy-SGLD / Entropy-SGD (Theorems 2/3 form): the bound on the
  local-entropy potential with the inner chain's error as a gradient bias
  (:func:`local_entropy_gradient_error`, the term "A").
- ``langevin=False`` in :func:`langevin_w2_bound` gives the noiseless (SGD) version,
  :math:`\lVert x_K - x^\star\rVert_{L^2} \le (1 - mh)^K\lVert x_0 - x^\star\rVert + \delta\sqrt p/m
  + h\sigma\sqrt p/\sqrt{1 - (1 - mh)^2}`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Union

import numpy as np

from ..validation import check_positive
from .constants import (
    check_constants,
    check_step_size,
    joint_constants,
    local_entropy_constants,
)

Iterations = Union[int, np.ndarray]

#: Dalalyan & Karagulyan's constant in the discretisation term
DK_CONSTANT = 1.65


@dataclass(frozen=True)
class W2Bound:
    """A bound on :math:`W_2(\\nu_k, \\pi)` at each of ``iterations``, term by term.

    ``total = contraction + discretization + gradient_bias + gradient_noise``; ``constants``
    holds every number the bound used (:math:`m, M, h, p`, ...).
    """

    iterations: np.ndarray
    contraction: np.ndarray
    discretization: float
    gradient_bias: float
    gradient_noise: float
    constants: Dict[str, float] = field(default_factory=dict)

    @property
    def asymptote(self) -> float:
        """The bound as :math:`k \\to \\infty`."""
        return self.discretization + self.gradient_bias + self.gradient_noise

    @property
    def total(self) -> np.ndarray:
        return self.contraction + self.asymptote


def _iterations(num_iterations: Iterations) -> np.ndarray:
    if np.ndim(num_iterations) == 0:
        k = int(num_iterations)
        if k < 0:
            raise ValueError(f"num_iterations must be >= 0, got {num_iterations!r}.")
        return np.arange(k + 1)
    k = np.asarray(num_iterations)
    if k.min() < 0:
        raise ValueError("iterations must be >= 0.")
    return k


def langevin_w2_bound(
    m: float,
    M: float,
    step_size: float,
    dim: int,
    num_iterations: Iterations,
    initial_w2: float,
    *,
    temperature: float = 1.0,
    gradient_bias: float = 0.0,
    gradient_noise: float = 0.0,
    langevin: bool = True,
) -> W2Bound:
    r"""Dalalyan & Karagulyan's bound for a kernel step :math:`\alpha` on :math:`U/T` (see the module).

    :param m, M: constants of the tempered potential :math:`U/T`.
    :param step_size: the kernel's :math:`\alpha`; :math:`h = \alpha T` must be :math:`\le 2/(m+M)`.
    :param dim: :math:`p`, the dimension sampled.
    :param num_iterations: :math:`K` (bound at :math:`0..K`) or an array of iteration counts.
    :param initial_w2: :math:`W_2(\nu_0, \pi)` (for a start at a point :math:`x_0`:
        :math:`\sqrt{\lVert x_0 - \mathbb E_\pi x\rVert^2 + \mathrm{tr}\,\mathrm{Cov}_\pi}`).
    :param gradient_bias: a bound on :math:`\lVert\mathbb E\,\widehat{\nabla U} - \nabla U\rVert`
        (any gradient error, counted by its :math:`L^2` norm), so :math:`\delta\sqrt p` is this over :math:`T`.
    :param gradient_noise: a bound on :math:`\sqrt{\mathbb E\lVert\widehat{\nabla U} - \mathbb E\widehat{\nabla U}\rVert^2}`
        (minibatch noise), so :math:`\sigma\sqrt p` is this over :math:`T`.
    :param langevin: ``False`` for the noiseless chain (SGD), whose target is the minimiser.
    :raises ValueError: for :math:`m \le 0`, :math:`M < m` or a step above :math:`2/((m+M)T)`.

    Example::

        >>> from pyro_flat.theory import langevin_w2_bound
        >>> b = langevin_w2_bound(1.0, 10.0, step_size=0.01, dim=2, num_iterations=100, initial_w2=5.0)
        >>> round(float(b.total[0]), 3), round(b.asymptote, 3)
        (7.333, 2.333)
    """
    m, M = check_constants(m, M)
    T = check_positive("temperature", temperature)
    alpha = check_step_size(step_size, m, M, T)
    p = int(dim)
    if p < 1:
        raise ValueError(f"dim must be >= 1, got {dim!r}.")
    w0 = float(initial_w2)
    if not (math.isfinite(w0) and w0 >= 0):
        raise ValueError(f"initial_w2 must be a finite number >= 0, got {initial_w2!r}.")
    h = alpha * T
    k = _iterations(num_iterations)
    contraction = (1.0 - h * m) ** k * w0
    bias = float(gradient_bias) / T  # delta * sqrt(p)
    noise = float(gradient_noise) / T  # sigma * sqrt(p)
    if langevin:
        discretization = DK_CONSTANT * (M / m) * math.sqrt(h * p)
        sigma = noise / math.sqrt(p)
        noise_term = sigma**2 * math.sqrt(h * p) / (DK_CONSTANT * M + sigma * math.sqrt(m))
    else:
        discretization = 0.0
        noise_term = h * noise / math.sqrt(1.0 - (1.0 - h * m) ** 2)
    return W2Bound(
        iterations=k,
        contraction=contraction,
        discretization=discretization,
        gradient_bias=bias / m,
        gradient_noise=noise_term,
        constants={"m": m, "M": M, "h": h, "step_size": alpha, "temperature": T, "dim": p,
                   "initial_w2": w0, "gradient_bias": float(gradient_bias),
                   "gradient_noise": float(gradient_noise)},
    )


def sgld_w2_bound(m: float, M: float, step_size: float, dim: int, num_iterations: Iterations,
                  initial_w2: float, *, temperature: float = 1.0,
                  gradient_noise: float = 0.0) -> W2Bound:
    r"""SGLD to the posterior :math:`\propto e^{-U/T}`: :func:`langevin_w2_bound` with :math:`p = d`."""
    return langevin_w2_bound(m, M, step_size, dim, num_iterations, initial_w2,
                             temperature=temperature, gradient_noise=gradient_noise)


def sgd_bound(m: float, M: float, step_size: float, dim: int, num_iterations: Iterations,
              initial_distance: float, *, gradient_noise: float = 0.0) -> W2Bound:
    r"""SGD to the minimiser: :math:`\lVert x_k - x^\star\rVert_{L^2}` (noiseless :func:`langevin_w2_bound`, :math:`T = 1`)."""
    return langevin_w2_bound(m, M, step_size, dim, num_iterations, initial_distance,
                             gradient_noise=gradient_noise, langevin=False)


def entropy_mcmc_w2_bound(
    m: float, M: float, eta: float, step_size: float, dim: int, num_iterations: Iterations,
    initial_w2: float, *, temperature: float = 1.0, gradient_noise: float = 0.0,
) -> W2Bound:
    r"""Entropy-MCMC (:class:`~pyro_flat.EntropySGLD`) to the joint :math:`\propto e^{-U(\theta,\theta_a)/T}`.

    Li & Zhang's Theorem 1 form: :func:`langevin_w2_bound` on the joint, dimension :math:`p = 2d`,
    constants :math:`(m_J, M_J)` = :func:`~pyro_flat.theory.joint_constants` of the tempered
    :math:`(m, M)` with coupling :math:`\eta T`. Only the :math:`\theta` block's gradient is a
    minibatch estimate (``gradient_noise``). ``initial_w2`` is that of the joint; a start at
    :math:`\theta = \theta_a = x_0` has
    :math:`W_2^2 = \lVert (x_0, x_0) - \mathbb E_\pi\rVert^2 + \mathrm{tr}\,\mathrm{Cov}_\pi`.
    """
    T = check_positive("temperature", temperature)
    m_joint, M_joint = joint_constants(m, M, check_positive("eta", eta) * T)
    bound = langevin_w2_bound(m_joint, M_joint, step_size, 2 * int(dim), num_iterations,
                              initial_w2, temperature=T, gradient_noise=gradient_noise)
    bound.constants.update({"m_base": float(m), "M_base": float(M), "eta": float(eta)})
    return bound


def local_entropy_gradient_error(
    m: float, M: float, eta: float, inner_step_size: float, num_inner_steps: int,
    mean_weight: float, dim: int, radius: float, *, temperature: float = 1.0,
    gradient_noise: float = 0.0,
) -> float:
    r"""A bound :math:`A` on the :math:`L^2` error of the local-entropy gradient :math:`(\theta - \mu)/\eta`.

    The exact gradient is :math:`(\theta - \mathbb E_{\pi_\theta}\theta')/\eta` with
    :math:`\pi_\theta \propto e^{-(f(\theta') + \lVert\theta'-\theta\rVert^2/(2\eta))/T}`, which is
    :math:`m_{in} = m + 1/(\eta T)`-strongly convex and :math:`M_{in} = M + 1/(\eta T)`-smooth (tempered).
    :math:`\mu = \sum_{l=0}^L w_l\,\theta'_l` with :math:`w_0 = (1-a)^L`, :math:`w_l = a(1-a)^{L-l}`.
    With :math:`W_l \le \rho^l R_0 + D_{in}` (Dalalyan & Karagulyan on the inner chain,
    :math:`\rho = 1 - \alpha' T m_{in}`, :math:`D_{in}` its discretisation and noise terms),
    :math:`\lVert\theta'_l - \mathbb E\theta'\rVert_{L^2} \le W_l + \sqrt{\mathrm{tr\,Cov}}` and
    :math:`\mathrm{tr\,Cov}_{\pi_\theta} \le d/m_{in}` (Brascamp–Lieb):

    .. math::

        \eta A \le \Big(\sum_l w_l \rho^l\Big) R_0 + D_{in} + \sqrt{d/m_{in}}, \qquad
        R_0 = W_2(\delta_\theta, \pi_\theta) \le \eta T M_F\,r + \sqrt{d/m_{in}},

    using :math:`\lVert\theta - \mathbb E\theta'\rVert = \eta\lVert\nabla F(\theta)\rVert \le
    \eta T M_F \lVert\theta - \theta^\star_F\rVert` and :math:`r` = ``radius``, a bound on
    :math:`\sqrt{\mathbb E\lVert\theta_k - \theta^\star_F\rVert^2}` along the run (the flat
    posterior's mode :math:`\theta^\star_F`). The :math:`\sqrt{d/m_{in}}` term, the spread of
    the inner chain that a running mean of :math:`L` correlated iterates does not average away,
    does not vanish as the steps shrink: it is why these methods converge to a worse neighbourhood.

    Returns :math:`A` in the units of :math:`\nabla F` (not tempered).
    """
    T = check_positive("temperature", temperature)
    eta_t = check_positive("eta", eta) * T
    m, M = check_constants(m, M)
    m_in, M_in = m + 1.0 / eta_t, M + 1.0 / eta_t
    alpha_in = check_step_size(inner_step_size, m_in, M_in, T, what="inner_step_size")
    L = int(num_inner_steps)
    a = float(mean_weight)
    if L < 1 or not 0 < a <= 1:
        raise ValueError(f"need num_inner_steps >= 1 and 0 < mean_weight <= 1, got {L}, {a}.")
    r = float(radius)
    if not (math.isfinite(r) and r >= 0):
        raise ValueError(f"radius must be a finite number >= 0, got {radius!r}.")
    inner = langevin_w2_bound(m_in, M_in, alpha_in, dim, 0, 0.0, temperature=T,
                              gradient_noise=gradient_noise)
    rho = 1.0 - alpha_in * T * m_in
    l = np.arange(L + 1)
    weights = a * (1.0 - a) ** (L - l)
    weights[0] = (1.0 - a) ** L
    spread = math.sqrt(dim / m_in)
    _, M_F = local_entropy_constants(m, M, eta_t)
    r0 = eta_t * M_F * r + spread
    mean_error = float((weights * rho**l).sum()) * r0 + inner.asymptote + spread
    return mean_error / float(eta)


def local_entropy_w2_bound(
    m: float, M: float, eta: float, step_size: float, dim: int, num_iterations: Iterations,
    initial_w2: float, *, num_inner_steps: int, inner_step_size: float, mean_weight: float,
    radius: float, temperature: float = 1.0, gradient_noise: float = 0.0,
    outer_noise: bool = True,
) -> W2Bound:
    r"""Entropy-SGLD (:class:`~pyro_flat.LocalEntropySGLD`) to the flat posterior :math:`\propto e^{-F/T}`.

    Li & Zhang's Theorems 2/3 form: :func:`langevin_w2_bound` with :math:`p = d`, the constants
    :math:`(m_F, M_F)` = :func:`~pyro_flat.theory.local_entropy_constants` (tempered, coupling
    :math:`\eta T`), and the inner chain's error :math:`A` =
    :func:`local_entropy_gradient_error` as a gradient bias: the extra term :math:`A/(T m_F)`.
    With ``outer_noise=False`` (Entropy-SGD) it bounds :math:`\lVert\theta_k - \theta^\star_F\rVert_{L^2}`.
    """
    T = check_positive("temperature", temperature)
    m_F, M_F = local_entropy_constants(m, M, check_positive("eta", eta) * T)
    A = local_entropy_gradient_error(m, M, eta, inner_step_size, num_inner_steps, mean_weight,
                                     dim, radius, temperature=T, gradient_noise=gradient_noise)
    bound = langevin_w2_bound(m_F, M_F, step_size, dim, num_iterations, initial_w2,
                              temperature=T, gradient_bias=A, langevin=outer_noise)
    bound.constants.update({"m_base": float(m), "M_base": float(M), "eta": float(eta),
                            "A": A, "radius": float(radius)})
    return bound
