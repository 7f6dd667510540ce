r"""The loss (and the Hessian trace) along a straight line between two points, and in random
directions of given norm around one point: interpolation and perturbation curves.

.. math:: \text{interpolation: } t \mapsto \ell\big((1-t)\,\theta_0 + t\,\theta_1\big), \qquad
          \text{perturbation: } r \mapsto \mathbb E_{u \sim \mathrm{Unif}(S^{d-1})}\,\ell(\theta + r u).

A barrier on the line between two draws says they sit in different basins; curvature that grows
along the path is the "entropic confinement" of Di Carlo et al. A flat point's perturbation curve
rises slowly with :math:`r` (for a quadratic, by :math:`r^2 \operatorname{tr}H / (2d)`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np
import torch

from .loss import FlatLoss, LossFn, as_flat_loss
from .probes import seeded_generator
from .trace import hessian_trace

__all__ = ["Curve", "interpolation_curve", "perturbation_curve"]


@dataclass(frozen=True)
class Curve:
    """A loss curve: positions ``x``, the ``loss`` there (mean over directions for a perturbation
    curve, with ``loss_stderr``) and, if asked for, the Hessian ``trace`` with ``trace_stderr``.

    :ivar kind: ``"interpolation"`` (``x`` is ``t``, 0 at the start, 1 at the end) or
        ``"perturbation"`` (``x`` is the radius).
    """

    kind: str
    x: np.ndarray
    loss: np.ndarray
    loss_stderr: Optional[np.ndarray] = None
    trace: Optional[np.ndarray] = None
    trace_stderr: Optional[np.ndarray] = None

    def plot(self, ax=None, *, quantity: str = "loss", label: Optional[str] = None, **style):
        """Plot ``quantity`` (``"loss"`` or ``"trace"``) against ``x``, with ±2 stderr bands."""
        import matplotlib.pyplot as plt

        if quantity not in ("loss", "trace"):
            raise ValueError(f"quantity must be 'loss' or 'trace', got {quantity!r}.")
        y = self.loss if quantity == "loss" else self.trace
        err = self.loss_stderr if quantity == "loss" else self.trace_stderr
        if y is None:
            raise ValueError("this curve has no Hessian traces: pass trace_probes >= 2 when computing it.")
        if ax is None:
            _, ax = plt.subplots(figsize=(5, 3.2))
        (line,) = ax.plot(self.x, y, label=label, **style)
        if err is not None:
            ax.fill_between(self.x, y - 2 * err, y + 2 * err, color=line.get_color(), alpha=0.2)
        ax.set_xlabel("t (start to end)" if self.kind == "interpolation" else "perturbation norm r")
        ax.set_ylabel("loss" if quantity == "loss" else "Hessian trace")
        return ax


def _traces(loss: FlatLoss, points: torch.Tensor, trace_probes: int, seed):
    if not trace_probes:
        return None, None
    estimates = [hessian_trace(loss.at(p), num_probes=trace_probes, seed=seed) for p in points]
    return np.array([e.value for e in estimates]), np.array([e.stderr for e in estimates])


def interpolation_curve(loss_fn: Union[FlatLoss, LossFn], start: torch.Tensor, end: torch.Tensor, *,
                        num_points: int = 21, margin: float = 0.0, trace_probes: int = 0,
                        seed: Optional[int] = 0) -> Curve:
    """The loss along :math:`(1-t)\\,` ``start`` :math:`+\\, t\\,` ``end``, ``t`` from ``-margin``
    to ``1 + margin``; with ``trace_probes >= 2`` also the Hutchinson trace at every point.

    >>> import torch
    >>> c = interpolation_curve(lambda x: (x ** 2).sum(), torch.tensor([-1., 0.]),
    ...                         torch.tensor([1., 0.]), num_points=3)
    >>> c.loss.tolist()
    [1.0, 0.0, 1.0]
    """
    loss = as_flat_loss(loss_fn, torch.as_tensor(start))
    end = torch.as_tensor(end).to(loss.params)
    if end.shape != loss.params.shape:
        raise ValueError(f"start and end must have the same shape, got {tuple(loss.params.shape)} "
                         f"and {tuple(end.shape)}.")
    t = torch.linspace(-margin, 1.0 + margin, int(num_points), dtype=torch.float64)
    points = (1 - t[:, None]).to(end) * loss.params + t[:, None].to(end) * end
    with torch.no_grad():
        values = np.array([float(loss(p)) for p in points])
    trace, trace_se = _traces(loss, points, trace_probes, seed)
    return Curve("interpolation", t.numpy(), values, None, trace, trace_se)


def perturbation_curve(loss_fn: Union[FlatLoss, LossFn], params: Optional[torch.Tensor] = None,
                       radii: Sequence[float] = tuple(np.linspace(0.0, 1.0, 11)), *,
                       num_directions: int = 10, seed: Optional[int] = 0) -> Curve:
    """The loss at ``params + r u`` for random unit directions ``u``, averaged over
    ``num_directions`` directions (the same directions at every radius), with standard errors.

    >>> import torch
    >>> c = perturbation_curve(lambda x: (x ** 2).sum(), torch.zeros(5), radii=[0., 2.])
    >>> [round(float(v), 6) for v in c.loss]
    [0.0, 4.0]
    """
    loss = as_flat_loss(loss_fn, params)
    if num_directions < 1:
        raise ValueError(f"num_directions must be >= 1, got {num_directions}.")
    u = torch.randn(num_directions, loss.dim, generator=seeded_generator(seed), dtype=torch.float64)
    u = (u / u.norm(dim=1, keepdim=True)).to(loss.params)
    radii = np.asarray(radii, dtype=np.float64)
    values = np.zeros((len(radii), num_directions))
    with torch.no_grad():
        for i, r in enumerate(radii):
            for j in range(num_directions):
                values[i, j] = float(loss(loss.params + float(r) * u[j]))
    stderr = values.std(1, ddof=1) / math.sqrt(num_directions) if num_directions > 1 else None
    return Curve("perturbation", radii, values.mean(1), stderr)
