r"""Sharp/flat Gaussian mixtures, computed exactly: smoothing, critical points, basins of attraction.

A :class:`SharpFlatMixture` ``p(θ) = Σ_k w_k N(θ; μ_k, σ_k² I)`` has a sharp component (small
``σ_k``, high peak) and a flat one. Its flat posterior, the law of Entropy-MCMC's θa, is the
Gaussian smoothing

.. math:: p_\eta(\theta_a) = \int p(\theta)\, N(\theta_a; \theta, \eta I)\, d\theta
          = \sum_k w_k\, N(\theta_a; \mu_k, (\sigma_k^2 + \eta) I),

which keeps every component's *mass* ``w_k`` and lowers the sharp *peak*: beyond some η the flat
mode is the highest (:meth:`SharpFlatMixture.peak_crossover`).

The studies ask "which basin does a chain end in?". Here a basin is a **basin of attraction of the
energy** ``U_η = −log p_η``: the set of points from which gradient descent ends at that mode,
computed exactly in :mod:`pyro_flat.models.mixture_basins` (the saddle by a 1-D search on the axis
through the means, the boundary by tracing the saddle's stable manifold).
:meth:`SharpFlatMixture.in_flat_basin` classifies points with it, and
:meth:`SharpFlatMixture.flat_basin_mass` integrates any density over the flat basin exactly (up to
quadrature error).

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
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import torch

import pyro
import pyro.distributions as dist

from .mixture_basins import (ANGULAR_NODES, RADIAL_NODES, axis_position, basin_boundary, basins_of,
                             critical_points_on_axis)
from ..validation import check_number


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
        return critical_points_on_axis(self, float(eta))

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
            return "sharp" if axis_position(self, modes[0]) < 0.5 else "flat"
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
        flat = basins_of(self, float(eta)).is_flat(x)
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
        return basins_of(self, float(basin_eta)).flat_share(q)

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


# The density and thresholds in η, in float64 numpy
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


__all__ = ["SharpFlatMixture", "sharp_flat_1d", "sharp_flat_2d", "flat_density_curves",
           # from pyro_flat.models.mixture_basins, where they moved
           "basin_boundary", "RADIAL_NODES", "ANGULAR_NODES"]
