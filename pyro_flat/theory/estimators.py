r"""Empirical 2-Wasserstein distances between samples and a reference, with bootstrap error bars.

Three estimators, one function (:func:`empirical_w2`):

- ``"gaussian"``: the Bures distance :func:`~pyro_flat.theory.gaussian_w2` between the samples'
  mean and covariance and the reference's. Exact for Gaussian laws, cheap in any dimension: with
  :math:`n < d` samples the cross term is an :math:`n \times n` eigenproblem.
- ``"marginal"``: :math:`\big(\sum_i W_2^2(x_i, y_i)\big)^{1/2}` over the coordinates, each
  1-D distance exact between the empirical laws. A lower bound of :math:`W_2` (every coupling of
  the vectors couples each coordinate) that sees means and marginal spreads, not correlations,
  with a floor about :math:`\sqrt{1.5\,\mathrm{tr}\,\Sigma/n}` where the Bures estimate's grows
  like :math:`\sqrt{\mathrm{tr}\,\Sigma}` once :math:`n < d`: the one to use in high dimension.
- ``"exact"``: optimal transport between the two empirical measures (POT's network simplex,
  ``ot.emd2``); for a few thousand points at most.
- ``"sliced"``: the sliced distance :math:`\big(\mathbb E_u W_2^2(u_\#x, u_\#y)\big)^{1/2}` over
  random directions :math:`u` (POT's ``ot.sliced_wasserstein_distance``). It is *not* :math:`W_2`:
  it is a lower bound of it, about :math:`W_2/\sqrt d` for a shift.

Each plug-in estimate is biased upward by the finite sample (two independent samples of one law
are not at distance 0): :attr:`W2Estimate.floor` is that bias, measured by the same estimator on
``n`` draws of the reference itself. The error bar is the bootstrap standard deviation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Tuple, Union

import numpy as np

from ..validation import to_numpy
from .gaussian import psd_sqrt

Reference = Union[np.ndarray, Tuple[np.ndarray, np.ndarray]]
METHODS = ("gaussian", "marginal", "exact", "sliced")


@dataclass(frozen=True)
class W2Estimate:
    """An empirical :math:`W_2` with its bootstrap standard error and finite-sample floor."""

    value: float
    stderr: float
    method: str
    num_samples: int
    floor: float = 0.0

    @property
    def debiased(self) -> float:
        r""":math:`\sqrt{\max(\text{value}^2 - \text{floor}^2, 0)}`: the floor removed in quadrature
        (the sampling error and the distance add about so for independent errors)."""
        return math.sqrt(max(self.value**2 - self.floor**2, 0.0))

    def __repr__(self) -> str:
        return (f"W2Estimate({self.value:.4g} ± {self.stderr:.2g}, method={self.method!r}, "
                f"n={self.num_samples}, floor={self.floor:.3g})")


def _as_samples(x, name: str) -> np.ndarray:
    x = to_numpy(x)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2:
        raise ValueError(f"{name} must be a (num_samples, dim) array, got shape {x.shape}.")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} has NaN/inf entries: a diverged chain? Drop it or rerun with a "
                         "smaller step size.")
    return x


class GaussianW2:
    r"""Bures :math:`W_2` of weighted samples to a fixed :math:`\mathcal N(m_2, \Sigma_2)`, fast under resampling.

    With :math:`K = X\Sigma_2X^\top` precomputed, a resample's cross term
    :math:`\mathrm{tr}(\Sigma_2^{1/2}\hat\Sigma\Sigma_2^{1/2})^{1/2}` is the sum of square roots
    of the eigenvalues of the centred :math:`n \times n` matrix :math:`HK_{II}H/n` (or the
    :math:`d \times d` one when :math:`d < n`).
    """

    def __init__(self, x: np.ndarray, mean: np.ndarray, cov: np.ndarray):
        self.x, self.mean, self.cov = x, mean, cov
        self.n, self.d = x.shape
        self.trace_ref = float(np.trace(cov))
        if self.n <= self.d:
            self.K = x @ cov @ x.T
        else:
            self.root = psd_sqrt(cov)

    def __call__(self, idx: Optional[np.ndarray] = None) -> float:
        x = self.x if idx is None else self.x[idx]
        n = x.shape[0]
        m = x.mean(0)
        xc = x - m
        trace = float((xc * xc).sum()) / n
        if self.n <= self.d:
            K = self.K if idx is None else self.K[np.ix_(idx, idx)]
            v = K @ np.ones(n) / n
            mk = float(v.mean())
            Kc = K - v[:, None] - v[None, :] + mk  # H K H
            cross = np.linalg.eigvalsh(Kc / n)
        else:
            y = xc @ self.root
            cross = np.linalg.eigvalsh(y.T @ y / n)
        w2sq = (((m - self.mean) ** 2).sum() + trace + self.trace_ref
                - 2.0 * np.sqrt(np.clip(cross, 0.0, None)).sum())
        return math.sqrt(max(w2sq, 0.0))


def _exact(x: np.ndarray, y: np.ndarray) -> float:
    import ot

    cost = ot.dist(x, y)  # squared Euclidean
    a, b = np.full(len(x), 1.0 / len(x)), np.full(len(y), 1.0 / len(y))
    return math.sqrt(max(float(ot.emd2(a, b, cost, numItermax=10_000_000)), 0.0))


class SortedW2:
    r"""Exact :math:`W_2^2` between the empirical law of each column of ``x`` (n, k) and of a fixed ``y`` (N, k).

    :math:`W_2^2 = \int_0^1 (F_x^{-1}(u) - F_y^{-1}(u))^2\,du` with piecewise-constant quantile
    functions, integrated over the merged breakpoints :math:`\{j/n\} \cup \{l/N\}`; ``y`` is
    sorted once.
    """

    def __init__(self, y: np.ndarray):
        self.y = np.sort(y, axis=0)
        self._levels: dict = {}

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.sort(x, axis=0)
        n, N = len(x), len(self.y)
        if n == N:
            return ((x - self.y) ** 2).mean(0)
        if n not in self._levels:
            levels = np.union1d(np.arange(n + 1) / n, np.arange(N + 1) / N)
            mid = 0.5 * (levels[1:] + levels[:-1])
            self._levels[n] = (np.diff(levels)[:, None], np.minimum((mid * n).astype(int), n - 1),
                               np.minimum((mid * N).astype(int), N - 1))
        width, ix, iy = self._levels[n]
        return (width * (x[ix] - self.y[iy]) ** 2).sum(0)


def random_directions(dim: int, num: int, rng: np.random.Generator) -> np.ndarray:
    """``(dim, num)`` unit vectors, uniform on the sphere."""
    u = rng.standard_normal((dim, num))
    return u / np.linalg.norm(u, axis=0, keepdims=True)


class W2Estimator:
    r"""Estimates :math:`W_2` of many sample sets to one reference, preparing the reference once.

    :param reference: reference samples ``(N, d)``, or ``(mean, cov)`` of a Gaussian reference
        (the sample-based methods then draw ``num_reference`` points from it, default
        ``max(20000, 10 d)``; ``"exact"``: 2000).
    :param method: ``"gaussian"``, ``"marginal"``, ``"exact"`` or ``"sliced"`` (see the module).
    :param num_bootstrap: resamples of the samples for ``stderr`` (the reference is held fixed).
    :param num_projections: directions for ``"sliced"`` (the same for every call).
    :param floor: also estimate the finite-sample floor: ``method`` on ``n`` draws of the
        reference itself (taken out of the reference samples when there are at least ``2n``;
        computed once per ``n``).
    :param seed: seed of the bootstrap, the directions and the Gaussian reference draws.
    """

    def __init__(self, reference: Reference, *, method: str = "gaussian", num_bootstrap: int = 100,
                 num_projections: int = 200, num_reference: Optional[int] = None,
                 floor: bool = True, seed: int = 0):
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
        self.method, self.num_bootstrap, self.floor = method, num_bootstrap, floor
        self.rng = np.random.default_rng(seed)
        if isinstance(reference, tuple):
            self.mean, self.cov = to_numpy(reference[0]).reshape(-1), to_numpy(reference[1])
            d = self.mean.size
            if self.cov.shape != (d, d):
                raise ValueError(f"reference (mean, cov) has shapes {self.mean.shape}, "
                                 f"{self.cov.shape}.")
            self.ref = None
            if method != "gaussian":
                size = num_reference or (2000 if method == "exact" else max(20000, 10 * d))
                self.ref = self.rng.multivariate_normal(self.mean, self.cov, size=size, method="eigh")
        else:
            self.ref = _as_samples(reference, "reference")
            self.mean = self.ref.mean(0)
            self.cov = np.cov(self.ref, rowvar=False).reshape(len(self.mean), len(self.mean))
        self.dim = len(self.mean)
        self.projections = (random_directions(self.dim, num_projections, self.rng)
                            if method == "sliced" else None)
        self._sorted = None  # the reference prepared for "marginal"/"sliced"
        self._floors: dict = {}

    def _estimator(self, samples: np.ndarray, against: Optional[np.ndarray], sorted_ref=None) -> Callable:
        """``idx -> W2`` of ``samples[idx]`` to the reference."""
        method = self.method
        if method == "gaussian":
            return GaussianW2(samples, self.mean, self.cov)
        pick = (lambda idx: samples if idx is None else samples[idx])
        if method == "exact":
            return lambda idx=None: _exact(pick(idx), against)
        if method == "sliced":
            w2sq = sorted_ref or SortedW2(against @ self.projections)
            return lambda idx=None: math.sqrt(float(w2sq(pick(idx) @ self.projections).mean()))
        w2sq = sorted_ref or SortedW2(against)
        return lambda idx=None: math.sqrt(float(w2sq(pick(idx)).sum()))

    def floor_for(self, n: int) -> float:
        if n not in self._floors:
            rng = np.random.default_rng(n)
            if self.ref is not None and len(self.ref) >= 2 * n:
                pick = rng.permutation(len(self.ref))
                own, rest = self.ref[pick[:n]], self.ref[pick[n:]]
            else:
                own = rng.multivariate_normal(self.mean, self.cov, size=n, method="eigh")
                rest = self.ref
            self._floors[n] = float(self._estimator(own, rest)())
        return self._floors[n]

    def __call__(self, x) -> W2Estimate:
        x = _as_samples(x, "x")
        n, d = x.shape
        if n < 2:
            raise ValueError(f"a W2 estimate needs at least 2 samples, got {n}; run more chains.")
        if d != self.dim:
            raise ValueError(f"the samples have dimension {d}, the reference {self.dim}.")
        if self._sorted is None and self.method in ("marginal", "sliced"):
            self._sorted = SortedW2(self.ref if self.method == "marginal" else self.ref @ self.projections)
        fn = self._estimator(x, self.ref, self._sorted)
        value = fn()
        boots = [fn(self.rng.integers(0, n, n)) for _ in range(self.num_bootstrap)]
        stderr = float(np.std(boots, ddof=1)) if self.num_bootstrap > 1 else float("nan")
        return W2Estimate(float(value), stderr, self.method, n, self.floor_for(n) if self.floor else 0.0)


def empirical_w2(
    x,
    reference: Reference,
    *,
    method: str = "gaussian",
    num_bootstrap: int = 100,
    num_projections: int = 200,
    num_reference: Optional[int] = None,
    floor: bool = True,
    seed: int = 0,
) -> W2Estimate:
    r""":math:`W_2` between the samples ``x`` ``(n, d)`` and a reference, with a bootstrap error bar.

    One call of a :class:`W2Estimator` (see it for the arguments); use the class to compare many
    sample sets with one reference.

    :raises ValueError: for fewer than 2 samples, NaN/inf samples, mismatched dimensions or an
        unknown method.

    Example::

        >>> import numpy as np
        >>> from pyro_flat.theory import empirical_w2
        >>> rng = np.random.default_rng(0)
        >>> x = rng.standard_normal((4000, 2)) + [3.0, 0.0]
        >>> est = empirical_w2(x, (np.zeros(2), np.eye(2)))
        >>> abs(est.value - 3.0) < 3 * est.stderr + est.floor
        True
    """
    estimator = W2Estimator(reference, method=method, num_bootstrap=num_bootstrap,
                            num_projections=num_projections, num_reference=num_reference,
                            floor=floor, seed=seed)
    return estimator(x)
