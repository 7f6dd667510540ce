r"""Sharp/flat Gaussian mixtures, computed exactly: smoothing, critical points, basins of attraction.

A :class:`SharpFlatMixture` ``p(θ) = Σ_k w_k N(θ; μ_k, σ_k² I)`` has a sharp component (small
``σ_k``, high peak) and a flat one. Its flat posterior, the law of Entropy-MCMC's θa, is the
Gaussian smoothing

.. math:: p_\eta(\theta_a) = \int p(\theta)\, N(\theta_a; \theta, \eta I)\, d\theta
          = \sum_k w_k\, N(\theta_a; \mu_k, (\sigma_k^2 + \eta) I),

which keeps every component's *mass* ``w_k`` and lowers the sharp *peak*: beyond some η the flat
mode is the highest (:meth:`SharpFlatMixture.peak_crossover`).

The studies ask "which basin does a chain end in?". Here a basin is a **basin of attraction of the
energy** ``U_η = −log p_η``: the set of points from which gradient descent ends at that mode.
Every critical point of an isotropic mixture lies on the axis through the component means (the
gradient is a positive combination of ``μ_k − θ``), so the saddle between the modes is found by a
1-D search, and the boundary between the basins is the saddle's stable manifold. It is traced
once by integrating gradient *ascent* from the saddle (scipy's ``solve_ivp``; the manifold
attracts that flow, so the trace is stable); in polar coordinates ``(r, φ)`` around the saddle,
φ measured from the direction of the sharp mode, the sharp basin is the sector
``|φ| < φ_b(r)``. :meth:`SharpFlatMixture.in_flat_basin` classifies points with it, and
:meth:`SharpFlatMixture.flat_basin_mass` integrates any density over the flat basin exactly (up to
quadrature error, Gauss–Legendre in ``r`` and in each sector of ``φ``).

>>> m = sharp_flat_2d()
>>> [round(x, 2) for x in m.saddle().tolist()]          # the ridge between the two basins
[-1.27, -0.64]
>>> round(m.flat_basin_mass(), 3), round(m.flat_basin_mass(eta=1.0), 3)  # p and p_1 in U's basins
(0.7, 0.837)
>>> bool(m.in_flat_basin(torch.tensor([-1.0, -0.5]))), bool(m.in_flat_basin(torch.tensor([-1.5, -0.8])))
(True, False)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import torch

import pyro
import pyro.distributions as dist

from .validation import check_number

#: Gauss–Legendre nodes per radial panel and per angular sector of the basin quadrature.
RADIAL_NODES, ANGULAR_NODES = 8, 96


@dataclass(frozen=True)
class SharpFlatMixture:
    """A Gaussian mixture with a sharp mode and a flat one: ``p(θ) = Σ_k w_k N(θ; μ_k, σ_k² I)``.

    Its flat posterior is again a mixture, ``p * N(0, ηI) = Σ_k w_k N(θ; μ_k, (σ_k² + η) I)``:
    the weights stay, the sharp peak is smeared out. With a sharp mode that is higher but lighter
    than the flat one, the mode of ``p`` is the sharp one and, beyond :meth:`peak_crossover`, the
    mode of the flat posterior is the flat one.

    >>> m = sharp_flat_2d()
    >>> bool(m.log_prob(m.sharp_loc) > m.log_prob(m.flat_loc))            # the sharp peak is higher
    True
    >>> bool(m.log_prob(m.sharp_loc, eta=1.0) < m.log_prob(m.flat_loc, eta=1.0))  # but not once smoothed
    True
    """

    weights: Tuple[float, ...]
    locs: Tuple[Tuple[float, ...], ...]
    scales: Tuple[float, ...]

    def __post_init__(self):
        if len(self.weights) != 2 or len(self.locs) != 2 or len(self.scales) != 2:
            raise ValueError("SharpFlatMixture has exactly two components: give two weights, locs and scales.")
        if self.scales[0] == self.scales[1]:
            raise ValueError("SharpFlatMixture needs one sharp and one flat component: the scales must differ.")

    # ------------------------------------------------------------------ the densities
    @property
    def dim(self) -> int:
        return len(self.locs[0])

    @property
    def sharp_loc(self) -> torch.Tensor:
        return torch.tensor(self.locs[int(np.argmin(self.scales))])

    @property
    def flat_loc(self) -> torch.Tensor:
        return torch.tensor(self.locs[int(np.argmax(self.scales))])

    def component_scales(self, eta: float = 0.0) -> np.ndarray:
        """The components' standard deviations after smoothing by ``N(0, ηI)``: ``√(σ_k² + η)``."""
        eta = check_number("eta", eta, "1.0")
        if not (eta >= 0 and math.isfinite(eta)):
            raise ValueError(f"eta must be >= 0 and finite (0 is the unsmoothed mixture), got eta={eta!r}; "
                             "it is the smoothing variance, e.g. eta=1.0.")
        return np.sqrt(np.asarray(self.scales, dtype=float) ** 2 + eta)

    def distribution(self, eta: float = 0.0) -> dist.MixtureSameFamily:
        """The mixture, or with ``eta > 0`` its smoothing ``p * N(0, ηI)`` (the law of θa)."""
        scales = torch.tensor(self.component_scales(eta), dtype=torch.get_default_dtype())
        components = dist.Normal(torch.tensor(self.locs), scales[:, None].expand(-1, self.dim))
        return dist.MixtureSameFamily(dist.Categorical(torch.tensor(self.weights)), components.to_event(1))

    def log_prob(self, theta: torch.Tensor, eta: float = 0.0) -> torch.Tensor:
        return self.distribution(eta).log_prob(theta)

    def model(self) -> None:
        """The mixture as a Pyro model with one latent site ``"theta"`` (no data)."""
        pyro.sample("theta", self.distribution())

    # ------------------------------------------------------------------ critical points
    def critical_points(self, eta: float = 0.0) -> Dict[str, np.ndarray]:
        """The modes of ``p_η`` (sharp side first) and, when it has two, the saddle between them.

        Returns ``{"modes": (k, dim), "saddle": (dim,) or None}`` in float64: the roots of the
        derivative of ``log p_η`` along the axis from the sharp to the flat mean.
        """
        return _critical_points(self, float(eta))

    def saddle(self, eta: float = 0.0) -> Optional[torch.Tensor]:
        """The saddle of ``U_η = −log p_η`` between the two basins, or ``None`` once p_η is unimodal."""
        saddle = self.critical_points(eta)["saddle"]
        return None if saddle is None else torch.as_tensor(saddle)

    def barriers(self, eta: float = 0.0) -> Optional[Tuple[float, float]]:
        """``(U_η(saddle) − U_η(sharp mode), U_η(saddle) − U_η(flat mode))``: the energy a chain must
        climb to leave each basin; ``None`` once p_η is unimodal."""
        points = self.critical_points(eta)
        if points["saddle"] is None:
            return None
        log_p = _log_density(self, np.vstack([points["modes"], points["saddle"][None]]), eta)
        return float(log_p[0] - log_p[2]), float(log_p[1] - log_p[2])

    def highest_peak(self, eta: float = 0.0) -> str:
        """``"sharp"`` or ``"flat"``: the mode of ``p_η`` with the higher density (once p_η is
        unimodal, the side its only mode is on)."""
        modes = self.critical_points(eta)["modes"]
        if len(modes) == 1:
            return "sharp" if _axis_position(self, modes[0]) < 0.5 else "flat"
        log_p = _log_density(self, modes, eta)
        return "sharp" if log_p[0] > log_p[1] else "flat"

    def peak_crossover(self) -> float:
        """The η beyond which the flat mode of ``p_η`` is the highest (bisection on :meth:`highest_peak`)."""
        return _threshold(lambda eta: self.highest_peak(eta) == "flat")

    def unimodal_beyond(self) -> float:
        """The η beyond which ``p_η`` has a single mode (bisection on the saddle's existence)."""
        return _threshold(lambda eta: self.critical_points(eta)["saddle"] is None)

    # ------------------------------------------------------------------ basins of attraction
    def in_flat_basin(self, theta: torch.Tensor, eta: float = 0.0) -> torch.Tensor:
        """True where gradient descent on ``U_η = −log p_η`` from ``theta`` ends at the flat mode.

        ``theta`` has shape ``(..., dim)``. Once p_η is unimodal every point is in the flat basin.
        """
        x = np.asarray(torch.as_tensor(theta).detach().cpu(), dtype=float)
        if x.shape[-1:] != (self.dim,):
            raise ValueError(f"theta must have a last dimension of size {self.dim}, got shape {tuple(x.shape)}")
        flat = _basin(self, float(eta)).is_flat(x)
        return torch.as_tensor(flat, device=torch.as_tensor(theta).device)

    def flat_basin_mass(self, log_density: Optional[Callable[[np.ndarray], np.ndarray]] = None, *,
                        eta: float = 0.0, basin_eta: float = 0.0) -> float:
        r"""The exact share of a law in the flat basin of ``U_{basin_eta}``, by quadrature.

        .. math:: \frac{\int_{\text{flat basin}} q(\theta)\, d\theta}{\int q(\theta)\, d\theta}

        ``q`` is ``log_density`` (an unnormalised log-density on float64 arrays ``(n, dim)``),
        by default ``p_η``. Only ``dim`` 1 and 2 are integrated. The basins are those of
        ``basin_eta`` (default 0: the posterior's own energy, the question "where does gradient
        descent on −log p take this draw?").
        """
        if self.dim not in (1, 2):
            raise ValueError(f"flat_basin_mass integrates in 1 or 2 dimensions, this mixture has {self.dim}")
        q = log_density if log_density is not None else (lambda x: _log_density(self, x, eta))
        return _basin(self, float(basin_eta)).flat_share(q)

    def randomly_smoothed_log_density(self, sigma: float, nodes: int = 24) -> Callable[[np.ndarray], np.ndarray]:
        r"""``−E_ε U(θ + σε)``, ε ~ N(0, I): the unnormalised log-density FlatSGLD samples
        (Gauss–Hermite, ``nodes`` per dimension), to pass to :meth:`flat_basin_mass`."""
        if not sigma > 0:
            raise ValueError(f"sigma must be > 0, got {sigma!r}")
        z, w = np.polynomial.hermite_e.hermegauss(nodes)  # weight exp(-z^2/2)
        grids = np.meshgrid(*([z] * self.dim), indexing="ij")
        offsets = sigma * np.stack([g.ravel() for g in grids], -1)
        weights = np.prod(np.meshgrid(*([w] * self.dim), indexing="ij"), axis=0).ravel()
        weights = weights / weights.sum()

        def log_density(x: np.ndarray) -> np.ndarray:
            out = np.empty(len(x))
            for i in range(0, len(x), 4096):
                chunk = x[i:i + 4096, None, :] + offsets
                out[i:i + 4096] = _log_density(self, chunk, 0.0) @ weights
            return out

        return log_density


# Geometry, in float64 numpy
# ----------------------------------------------------------------------------------------------


def _threshold(holds: Callable[[float], bool]) -> float:
    """The smallest η >= 0 from which ``holds(η)`` is true, for a property that stays true once it holds."""
    if holds(0.0):
        return 0.0
    lo, hi = 0.0, 1.0
    while not holds(hi):
        lo, hi = hi, 2 * hi
        if hi > 1e6:
            raise ValueError("the property never holds for η up to 1e6")
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if holds(mid) else (mid, hi)
    return 0.5 * (lo + hi)


def _log_density(mixture: SharpFlatMixture, x: np.ndarray, eta: float) -> np.ndarray:
    """``log p_η(x)`` for ``x`` of shape ``(..., dim)``."""
    s = mixture.component_scales(eta)
    d2 = ((np.asarray(x, dtype=float)[..., None, :] - np.asarray(mixture.locs, dtype=float)) ** 2).sum(-1)
    terms = np.log(mixture.weights) - d2 / (2 * s ** 2) - mixture.dim * np.log(s * np.sqrt(2 * np.pi))
    top = terms.max(-1)
    return top + np.log(np.exp(terms - top[..., None]).sum(-1))


def _grad_log_density(mixture: SharpFlatMixture, x: np.ndarray, eta: float) -> np.ndarray:
    s = mixture.component_scales(eta)
    locs = np.asarray(mixture.locs, dtype=float)
    d = locs - np.asarray(x, dtype=float)[..., None, :]
    terms = np.log(mixture.weights) - (d ** 2).sum(-1) / (2 * s ** 2) - mixture.dim * np.log(s)
    r = np.exp(terms - terms.max(-1, keepdims=True))
    r = r / r.sum(-1, keepdims=True)
    return ((r / s ** 2)[..., None] * d).sum(-2)


def _axis(mixture: SharpFlatMixture) -> Tuple[np.ndarray, np.ndarray]:
    """The sharp mean and the vector from it to the flat mean."""
    sharp = np.asarray(mixture.locs[int(np.argmin(mixture.scales))], dtype=float)
    flat = np.asarray(mixture.locs[int(np.argmax(mixture.scales))], dtype=float)
    return sharp, flat - sharp


def _axis_position(mixture: SharpFlatMixture, x: np.ndarray) -> float:
    start, direction = _axis(mixture)
    return float((x - start) @ direction / (direction @ direction))


@lru_cache(maxsize=64)
def _critical_points(mixture: SharpFlatMixture, eta: float) -> Dict[str, np.ndarray]:
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


class _Basins:
    """The two basins of ``U_η``, as the sector ``|φ| < φ_b(r)`` around the saddle (sharp side)."""

    def __init__(self, mixture: SharpFlatMixture, eta: float):
        self.mixture, self.eta = mixture, eta
        points = mixture.critical_points(eta)
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
def _basin(mixture: SharpFlatMixture, eta: float) -> _Basins:
    return _Basins(mixture, eta)


def basin_boundary(mixture: SharpFlatMixture, eta: float = 0.0) -> Optional[np.ndarray]:
    """Points on the boundary between the two basins of ``U_η`` of a 2-D mixture (for plots)."""
    return _basin(mixture, float(eta)).boundary()


# The mixtures of the studies
# ----------------------------------------------------------------------------------------------


def sharp_flat_2d() -> SharpFlatMixture:
    """The 2-D energy of the paper's figures: a sharp mode near (-2, -1), a flat one near (2, 1).

    The sharp mode holds 30% of the mass with sd 0.15, the flat one 70% with sd 0.8: the sharp
    peak is about 12 times higher, yet smoothing by η above :meth:`~SharpFlatMixture.peak_crossover`
    (0.44) makes the flat mode the higher one.
    """
    return SharpFlatMixture(weights=(0.3, 0.7), locs=((-2.0, -1.0), (2.0, 1.0)), scales=(0.15, 0.8))


def sharp_flat_1d() -> SharpFlatMixture:
    """A 1-D sharp mode at -1.5 (sd 0.2, 30%) and a flat one at +1.5 (sd 1, 70%)."""
    return SharpFlatMixture(weights=(0.3, 0.7), locs=((-1.5,), (1.5,)), scales=(0.2, 1.0))


def flat_density_curves(mixture: SharpFlatMixture, etas: Sequence[float], grid: torch.Tensor
                        ) -> Dict[float, torch.Tensor]:
    """Densities of p(θ) (key 0.0) and of p(θa) = p * N(0, η) for each η on a 1-D ``grid``."""
    if mixture.dim != 1:
        raise ValueError(f"flat_density_curves needs a 1-D mixture, got dim {mixture.dim}")
    return {float(eta): mixture.log_prob(grid[:, None], eta=eta).exp() for eta in (0.0, *etas)}


__all__ = ["SharpFlatMixture", "sharp_flat_1d", "sharp_flat_2d", "flat_density_curves", "basin_boundary"]
