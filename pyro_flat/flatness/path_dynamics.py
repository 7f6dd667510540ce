r"""Dynamics started on a minimum-energy path, read off as a position along it.

:func:`projected_dynamics` runs SGD or SGLD from a point of an
:class:`~pyro_flat.flatness.EnergyPath`, in the full weight space or constrained to the path, and
records the nearest path point of each chain (Di Carlo et al.'s projected dynamics): noise should
drive the weights back toward the ends, where the curvature across the path is low.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..validation import check_number, check_positive_int
from .paths import (EnergyPath, GradientFn, check_callable, check_path, check_positive_number, check_seed,
                    checked_gradient)


@dataclass(frozen=True)
class PathDynamics:
    """Where dynamics started on a path went: at each recorded iteration ``steps`` ``(T,)``, the
    ``position`` along the path (in [0, 1]) of the nearest path point to each chain, and the
    ``distance`` from the path, both ``(T, C)``. ``diverged`` is True when a chain's weights became
    non-finite (the record stops at the last finite state)."""

    steps: np.ndarray
    position: np.ndarray
    distance: np.ndarray
    step_size: float
    temperature: float
    diverged: bool = False

    @property
    def to_nearer_end(self) -> np.ndarray:
        """Distance along the path (as a fraction of its length) to the nearer end, ``(T, C)``:
        falling means drifting back toward an endpoint."""
        return np.minimum(self.position, 1.0 - self.position)

    def plot(self, ax=None, *, label: Optional[str] = None, color=None):
        """The chains' positions against the iteration (thin lines) and their mean (thick)."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(5, 3.2))
        ax.plot(self.steps, self.position, color=color, alpha=0.25, lw=0.7)
        ax.plot(self.steps, self.position.mean(axis=1), color=color, lw=2, label=label)
        ax.set(xlabel="iteration", ylabel="position along the path (0: start, 1: end)", ylim=(-0.02, 1.02))
        return ax


def projected_dynamics(path: EnergyPath, gradient_fn: GradientFn, *, start: float, step_size: float,
                       num_steps: int, temperature: float = 0.0, num_chains: int = 1,
                       seed: Optional[int] = 0, constrained: bool = False, vectorized: bool = False,
                       record_every: int = 1) -> PathDynamics:
    r"""SGD (``temperature=0``) or SGLD started on a path, read off as a position along it
    (Di Carlo et al.'s projected dynamics).

    The chains start at the point ``start`` (a position in [0, 1]) of the piecewise-linear path
    :math:`x(s)` and move in the full space,

    .. math:: x \leftarrow x - \alpha\, g(x) + \sqrt{2\alpha T}\,\xi,

    with ``gradient_fn`` giving :math:`g` (a minibatch gradient carries its own noise: pass one per
    batch size to compare them). Each recorded state is projected on the path
    (:meth:`EnergyPath.project`): noise that meets curvature rising away from the ends, across the
    path, pushes the chains back toward the ends even where the loss along the path is flat, the
    entropic force :math:`-\partial_s \tfrac{T}{2}\sum_i \log \lambda_i(s)`.

    With ``constrained=True`` the state is the arc length :math:`s` itself and the chains move along
    the path only, :math:`s \leftarrow s - \alpha\, g(x(s)) \cdot \tau(s) + \sqrt{2\alpha T}\,\xi`,
    kept in :math:`[0, L]` (:math:`\tau` the direction of the segment): they feel the loss along the
    path but no curvature across it.

    :param seed: the seed of the chains' noise (default 0); ``None``: one drawn from torch's global random stream,
        which that draw advances as any draw does, never reseeding it (a script seeded with ``torch.manual_seed``
        gives the same run again).
    :param vectorized: ``gradient_fn`` takes all chains at once, ``(C, d) -> (C, d)``; otherwise it
        is called once per chain with ``(d,)``.
    :param record_every: record every this many iterations (and the first and last).

    >>> import torch
    >>> from pyro_flat.flatness import straight_path
    >>> line = straight_path(lambda x: (x ** 2).sum(), torch.tensor([-1.0]), torch.tensor([1.0]), num_points=5)
    >>> run = projected_dynamics(line, lambda x: 2 * x, start=0.9, step_size=0.1, num_steps=50)
    >>> round(float(run.position[-1, 0]), 3)    # SGD slides to the minimum in the middle
    0.5
    """
    check_path(path)
    check_callable("gradient_fn", gradient_fn)
    if not 0.0 <= check_number("start", start, "0.5") <= 1.0:
        raise ValueError(f"start is a position along the path in [0, 1], got {start!r}.")
    if not (math.isfinite(check_number("temperature", temperature, "0.01")) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0: SGD), got temperature={temperature!r}.")
    start, step_size, temperature = float(start), check_positive_number("step_size", step_size, "1e-2"), float(temperature)
    num_steps, num_chains, record_every = (check_positive_int(name, value) for name, value in (
        ("num_steps", num_steps), ("num_chains", num_chains), ("record_every", record_every)))
    seed = check_seed(seed)
    points = path.points
    generator = torch.Generator(device=points.device)
    # seed=None: a seed drawn from the global stream, which advances it as any draw does (torch.seed() would
    # reseed the global CPU and CUDA streams under the caller): a script seeded with torch.manual_seed repeats
    generator.manual_seed(int(torch.randint(0, 2**62, ())) if seed is None else seed)
    noise_scale = math.sqrt(2 * step_size * temperature)
    finite_gradient = [True]  # whether the last gradient was finite: says why a chain diverged

    def gradients(x: torch.Tensor) -> torch.Tensor:
        if vectorized:
            g = checked_gradient(gradient_fn(x), x.shape, "(all chains, vectorized=True)")
        else:
            g = torch.stack([checked_gradient(gradient_fn(xi), xi.shape, "(one chain)") for xi in x])
        finite_gradient[0] = torch.isfinite(g).all()  # read only if a chain diverges: no sync per step
        return g.detach()

    if constrained:
        s_knots = torch.as_tensor(path.arc_length, dtype=points.dtype, device=points.device)
        length = float(s_knots[-1])
        directions = (points[1:] - points[:-1]) / (s_knots[1:] - s_knots[:-1])[:, None]
        s = torch.full((num_chains,), start * length, dtype=points.dtype, device=points.device)

        def advance():
            nonlocal s
            segment = torch.clamp(torch.searchsorted(s_knots, s, right=True) - 1, 0, len(directions) - 1)
            x = points[segment] + (s - s_knots[segment])[:, None] * directions[segment]
            drift = (gradients(x) * directions[segment]).sum(-1)
            noise = torch.randn(num_chains, generator=generator, dtype=points.dtype, device=points.device)
            s = torch.clamp(s - step_size * drift + noise_scale * noise, 0.0, length)
            return torch.isfinite(s).all()

        def record():
            return (s / length).double().cpu().numpy(), np.zeros(num_chains)
    else:
        x = path.at(start).expand(num_chains, -1).clone()

        def advance():
            nonlocal x
            x = x - step_size * gradients(x)
            if noise_scale > 0:
                x = x + noise_scale * torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
            return torch.isfinite(x).all()

        def record():
            position, distance = path.project(x)
            return position.cpu().numpy(), distance.cpu().numpy()

    steps, positions, distances = [0], *([v] for v in record())
    diverged = False
    for k in range(1, num_steps + 1):
        if not advance():
            diverged = True
            why, fix = (("non-finite weights", "Lower") if bool(finite_gradient[0]) else
                        ("gradient_fn returned a non-finite gradient at finite weights", "Check gradient_fn, or lower"))
            warnings.warn(f"projected_dynamics diverged at iteration {k} ({why}); the record stops "
                          f"at iteration {steps[-1]}. {fix} step_size (now {step_size:g}).", RuntimeWarning,
                          stacklevel=2)
            break
        if k % record_every == 0 or k == num_steps:
            steps.append(k)
            for store, value in zip((positions, distances), record()):
                store.append(value)
    return PathDynamics(np.array(steps), np.stack(positions), np.stack(distances), step_size, temperature,
                        diverged)


__all__ = ["PathDynamics", "projected_dynamics"]
