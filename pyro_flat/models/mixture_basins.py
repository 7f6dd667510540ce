r"""The basins of attraction of a sharp/flat mixture's energy, computed exactly: critical points,
the boundary between the basins, membership, and the mass of a density over the flat basin.

A basin is a **basin of attraction of the energy** ``U_η = −log p_η`` of a two-component
isotropic Gaussian mixture (:class:`~pyro_flat.mixtures.SharpFlatMixture`): the set of points
from which gradient descent ends at that mode. Every critical point of an isotropic mixture lies on
the axis through the component means (the gradient is a positive combination of ``μ_k − θ``), so
the saddle between the modes is found by a 1-D search, and the boundary between the basins is the
saddle's stable manifold. It is traced once by integrating gradient *ascent* from the saddle
(scipy's ``solve_ivp``; the manifold attracts that flow, so the trace is stable); in polar
coordinates ``(r, φ)`` around the saddle, φ measured from the direction of the sharp mode, the
sharp basin is the sector ``|φ| < φ_b(r)``. :meth:`Basins.is_flat` classifies points with it, and
:meth:`Basins.flat_share` integrates any density over the flat basin exactly (up to quadrature
error, Gauss–Legendre in ``r`` and in each sector of ``φ``).

>>> from pyro_flat.mixtures import sharp_flat_2d
>>> m = sharp_flat_2d()
>>> points = critical_points_on_axis(m, 0.0)
>>> len(points["modes"]), [round(x, 2) for x in points["saddle"].tolist()]
(2, [-1.27, -0.64])
>>> basins_of(m, 0.0).is_flat(np.array([[-1.0, -0.5], [-1.5, -0.8]])).tolist()
[True, False]
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, Dict, Optional, Protocol, Tuple

import numpy as np

#: Gauss–Legendre nodes per radial panel and per angular sector of the basin quadrature.
RADIAL_NODES, ANGULAR_NODES = 8, 96


class IsotropicMixture(Protocol):
    """What the geometry reads of a mixture ``Σ_k w_k N(μ_k, σ_k² I)`` (hashable, for the caches):
    :class:`~pyro_flat.mixtures.SharpFlatMixture`."""

    @property
    def weights(self) -> Tuple[float, ...]: ...

    @property
    def locs(self) -> Tuple[Tuple[float, ...], ...]: ...

    @property
    def scales(self) -> Tuple[float, ...]: ...

    @property
    def dim(self) -> int: ...

    def component_scales(self, eta: float = 0.0) -> np.ndarray: ...


def _grad_log_density(mixture: IsotropicMixture, x: np.ndarray, eta: float) -> np.ndarray:
    s = mixture.component_scales(eta)
    locs = np.asarray(mixture.locs, dtype=float)
    d = locs - np.asarray(x, dtype=float)[..., None, :]
    terms = np.log(mixture.weights) - (d ** 2).sum(-1) / (2 * s ** 2) - mixture.dim * np.log(s)
    r = np.exp(terms - terms.max(-1, keepdims=True))
    r = r / r.sum(-1, keepdims=True)
    return ((r / s ** 2)[..., None] * d).sum(-2)


def _axis(mixture: IsotropicMixture) -> Tuple[np.ndarray, np.ndarray]:
    """The sharp mean and the vector from it to the flat mean."""
    sharp = np.asarray(mixture.locs[int(np.argmin(mixture.scales))], dtype=float)
    flat = np.asarray(mixture.locs[int(np.argmax(mixture.scales))], dtype=float)
    return sharp, flat - sharp


def axis_position(mixture: IsotropicMixture, x: np.ndarray) -> float:
    """Where ``x`` projects on the axis: 0 at the sharp mean, 1 at the flat one."""
    start, direction = _axis(mixture)
    return float((x - start) @ direction / (direction @ direction))


@lru_cache(maxsize=64)
def critical_points_on_axis(mixture: IsotropicMixture, eta: float) -> Dict[str, np.ndarray]:
    """The modes of ``p_η`` (sharp side first) and, when it has two, the saddle between them, in
    float64: the roots of the derivative of ``log p_η`` along the axis from the sharp to the flat mean."""
    from scipy.optimize import brentq

    start, direction = _axis(mixture)
    slope = lambda t: float(_grad_log_density(mixture, start + t * direction, eta) @ direction)  # noqa: E731
    # all critical points lie between the means: outside, both components pull the same way
    ts = np.linspace(0.0, 1.0, 4001)
    slopes = _grad_log_density(mixture, start + ts[:, None] * direction, eta) @ direction
    modes, saddles = [], []  # the slope is > 0 at the sharp mean and < 0 at the flat one
    for i in np.flatnonzero(np.sign(slopes[:-1]) != np.sign(slopes[1:])):
        if slopes[i] == 0:
            continue
        root = brentq(slope, ts[i], ts[i + 1], xtol=1e-14)
        (modes if slopes[i] > 0 else saddles).append(root)
    points = {"modes": np.stack([start + t * direction for t in modes]),
              "saddle": start + saddles[0] * direction if saddles else None}
    return points


class Basins:
    """The two basins of ``U_η``, as the sector ``|φ| < φ_b(r)`` around the saddle (sharp side)."""

    def __init__(self, mixture: IsotropicMixture, eta: float):
        self.mixture, self.eta = mixture, eta
        points = critical_points_on_axis(mixture, eta)
        start, direction = _axis(mixture)
        self.unit = direction / np.linalg.norm(direction)  # towards the flat mode
        self.saddle = points["saddle"]
        self.reach = np.linalg.norm(direction) + 12 * mixture.component_scales(eta).max()
        if self.saddle is not None and mixture.dim > 1:
            self.radii, self.angles = self._trace_boundary()

    def _polar(self, x: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Distance from the saddle and angle from the direction of the sharp mode, in [0, π]."""
        offset = x - self.saddle
        along = offset @ self.unit
        across = np.sqrt(np.maximum((offset ** 2).sum(-1) - along ** 2, 0.0))
        return np.hypot(along, across), np.arctan2(across, -along)

    def _trace_boundary(self) -> Tuple[np.ndarray, np.ndarray]:
        """The stable manifold of the saddle in the (along, across) half plane, as φ_b(r)."""
        from scipy.integrate import solve_ivp

        mixture, eta = self.mixture, self.eta
        # the means sit on the axis: in the (along, across) plane they are (position, 0)
        centres = np.array([[(np.asarray(loc) - self.saddle) @ self.unit, 0.0] for loc in mixture.locs])
        s = mixture.component_scales(eta)

        def ascent(_, y):
            d = centres - y
            terms = np.log(mixture.weights) - (d ** 2).sum(-1) / (2 * s ** 2) - mixture.dim * np.log(s)
            r = np.exp(terms - terms.max())
            r = r / r.sum()
            g = -((r / s ** 2)[:, None] * d).sum(0)  # ∇U
            return g / np.linalg.norm(g)

        leave = lambda _, y: np.hypot(*y) - self.reach  # noqa: E731
        leave.terminal = True
        tiny = 1e-7 * s.min()
        sol = solve_ivp(ascent, (0.0, 50 * self.reach), [0.0, tiny], events=leave, rtol=1e-10, atol=1e-12,
                        max_step=0.02 * s.min() + 0.01)
        along, across = sol.y
        radii, angles = np.hypot(along, across), np.arctan2(across, -along)
        if np.any(np.diff(radii) <= 0):
            raise RuntimeError("the basin boundary is not a graph over the distance from the saddle")
        return np.concatenate([[0.0], radii]), np.concatenate([[np.pi / 2], angles])

    def boundary(self, num: int = 400) -> Optional[np.ndarray]:
        """Points ``(2 * num, dim=2)`` of the boundary between the basins (for plots); 2-D only."""
        if self.saddle is None or self.mixture.dim != 2:
            return None
        r = np.linspace(0.0, self.radii[-1], num)
        phi = np.interp(r, self.radii, self.angles)
        normal = np.array([-self.unit[1], self.unit[0]])
        branch = [self.saddle - r[:, None] * (np.cos(phi)[:, None] * self.unit - sign * np.sin(phi)[:, None] * normal)
                  for sign in (1.0, -1.0)]
        return np.vstack([branch[0][::-1], branch[1]])

    def sharp_sector(self, radii: np.ndarray) -> np.ndarray:
        return np.interp(radii, self.radii, self.angles)

    def is_flat(self, x: np.ndarray) -> np.ndarray:
        if self.saddle is None:
            return np.ones(x.shape[:-1], dtype=bool)
        radius, angle = self._polar(x)
        if self.mixture.dim == 1:
            return angle > np.pi / 2
        return angle > self.sharp_sector(radius)

    def flat_share(self, log_density: Callable[[np.ndarray], np.ndarray]) -> float:
        if self.saddle is None:
            return 1.0
        centre = self.saddle
        r, wr = _panels(0.0, self.reach, int(np.ceil(self.reach / 0.05)), RADIAL_NODES)
        if self.mixture.dim == 1:
            points = np.concatenate([centre - r[:, None] * self.unit, centre + r[:, None] * self.unit])
            logq = log_density(points)
            q = np.exp(logq - logq.max()) * np.concatenate([wr, wr])
            return float(q[len(r):].sum() / q.sum())
        bound = self.sharp_sector(r)
        normal = np.array([-self.unit[1], self.unit[0]])
        z, wz = np.polynomial.legendre.leggauss(ANGULAR_NODES)
        shares = []
        # sectors in φ (from the sharp direction): flat [-π, -φ_b], sharp [-φ_b, φ_b], flat [φ_b, π]
        for lo, hi in ((-np.pi + 0 * bound, -bound), (-bound, bound), (bound, np.pi + 0 * bound)):
            half = (hi - lo)[:, None] / 2
            phi = (lo + hi)[:, None] / 2 + half * z
            points = centre - r[:, None, None] * (np.cos(phi)[..., None] * self.unit
                                                   - np.sin(phi)[..., None] * normal)
            logq = log_density(points.reshape(-1, 2)).reshape(phi.shape)
            shares.append((logq, (wr * r)[:, None] * half * wz))
        top = max(float(l.max()) for l, _ in shares)
        mass = [float((np.exp(l - top) * w).sum()) for l, w in shares]
        return (mass[0] + mass[2]) / sum(mass)


def _panels(lo: float, hi: float, count: int, nodes: int) -> Tuple[np.ndarray, np.ndarray]:
    """Composite Gauss–Legendre nodes and weights on ``[lo, hi]``: ``count`` panels of ``nodes``."""
    z, w = np.polynomial.legendre.leggauss(nodes)
    edges = np.linspace(lo, hi, count + 1)
    half = np.diff(edges)[:, None] / 2
    return ((edges[:-1, None] + half) + half * z).ravel(), (half * w).ravel()


@lru_cache(maxsize=64)
def basins_of(mixture: IsotropicMixture, eta: float) -> Basins:
    """The two basins of ``U_η`` of ``mixture`` (cached: the boundary is traced once)."""
    return Basins(mixture, eta)


def basin_boundary(mixture: IsotropicMixture, eta: float = 0.0) -> Optional[np.ndarray]:
    """Points on the boundary between the two basins of ``U_η`` of a 2-D mixture (for plots)."""
    return basins_of(mixture, float(eta)).boundary()
