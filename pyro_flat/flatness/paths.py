r"""Minimum-energy paths between two minima, and the curvature along them.

:func:`minimum_energy_path` finds a path of low loss between two points with the **nudged elastic
band** (NEB) and a **climbing image**, refined by **AutoNEB**'s insertion of pivots. K images
:math:`x_1 = \text{start}, \dots, x_K = \text{end}` (the ends fixed) move under

.. math::
    F_i = -\big(\nabla\ell(x_i) - (\nabla\ell(x_i)\cdot\tau_i)\,\tau_i\big)
          + k\,\big(\lVert x_{i+1}-x_i\rVert - \lVert x_i-x_{i-1}\rVert\big)\,\tau_i,

the loss gradient's part perpendicular to the path plus a spring along it (:math:`\tau_i` the
upwind tangent of Henkelman & Jónsson), while the highest image climbs,
:math:`F = -\nabla\ell + 2(\nabla\ell\cdot\tau)\tau`, to sit on the saddle. The images relax with
FIRE (Bitzek et al. 2006). AutoNEB then evaluates the loss halfway between neighbours and inserts a
pivot wherever it rises above both, and relaxes again: a path through an intermediate minimum
needs images on both of its barriers. Why NEB rather than the string method: the climbing image
puts one image exactly on the saddle, whose height is the barrier, and AutoNEB's insertion is
what Di Carlo et al. (and Draxler et al.) used on networks.

:func:`curvature_along_path` measures the top Hessian eigenvalue (Lanczos) and the trace
(Hutchinson, with its standard error) at every image, for a path or a straight line
(:func:`straight_path`), so both profiles share one figure (:func:`plot_path_profiles`).
:func:`~pyro_flat.flatness.path_dynamics.projected_dynamics` (its own module) runs SGD or SGLD
started on a path and reads the weights off as a position along it.

>>> import torch
>>> double_well = lambda x: (x[0] ** 2 - 1) ** 2 + 2 * x[1] ** 2
>>> path = minimum_energy_path(double_well, torch.tensor([-1.0, 0.0]), torch.tensor([1.0, 0.0]),
...                            num_points=9, step_size=0.05)
>>> [round(v, 3) for v in path.points[path.highest].tolist()], round(float(path.loss.max()), 3)
([0.0, 0.0], 1.0)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional, Tuple, Union

import numpy as np
import torch

from ..validation import (check_nonnegative_int, check_number, check_positive, check_positive_int, check_seed,
                          check_tensor)
from .loss import FlatLoss, LossFn, as_flat_loss
from .spectrum import top_eigenvalues
from .trace import hessian_trace

GradientFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class EnergyPath:
    """A path of images: ``points`` ``(K, d)`` (first row the start, last the end) and the
    ``loss`` ``(K,)`` there; for a relaxed path also whether it ``converged`` (the largest NEB
    force below ``tol``), that force and the iterations taken."""

    points: torch.Tensor
    loss: np.ndarray
    converged: bool = True
    max_force: float = 0.0
    iterations: int = 0
    kind: str = "minimum-energy path"

    @property
    def arc_length(self) -> np.ndarray:
        """Distance along the path from the start to each image."""
        steps = (self.points[1:] - self.points[:-1]).norm(dim=-1).double().cpu().numpy()
        return np.concatenate([[0.0], np.cumsum(steps)])

    @property
    def highest(self) -> int:
        """Index of the highest image (on a converged climbing-image path: the saddle)."""
        return int(np.argmax(self.loss))

    @property
    def barrier(self) -> float:
        """Height of the highest image above the higher of the two ends."""
        return float(self.loss.max() - max(self.loss[0], self.loss[-1]))

    def at(self, position: Union[float, torch.Tensor]) -> torch.Tensor:
        """The point at ``position`` in [0, 1] (fraction of the arc length) of the piecewise-linear path;
        a tensor of positions ``(...,)`` gives points ``(..., d)``."""
        try:
            position = torch.as_tensor(position, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"position must be a number or a tensor of numbers in [0, 1], got {position!r}.") from None
        if not bool(((position >= 0) & (position <= 1)).all()):
            raise ValueError(f"a position along the path lies in [0, 1], got {position.tolist()!r}.")
        knots = torch.as_tensor(self.arc_length / self.arc_length[-1])
        segment = torch.clamp(torch.searchsorted(knots, position, right=True) - 1, 0, len(knots) - 2)
        t = ((position - knots[segment]) / (knots[segment + 1] - knots[segment])).to(self.points)
        return self.points[segment] + t[..., None] * (self.points[segment + 1] - self.points[segment])

    def project(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The nearest point of the piecewise-linear path to each row of ``x`` ``(..., d)``: its
        position in [0, 1] and the distance to it, each ``(...,)`` (in float64)."""
        p = self.points.double()
        try:
            x = torch.as_tensor(x).to(p)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"x must be a tensor of points (..., d), got {type(x).__name__}.") from None
        if x.dim() == 0 or x.shape[-1] != p.shape[-1]:
            raise ValueError(f"x must be points (..., d) with d={p.shape[-1]} like the path's, got shape "
                             f"{tuple(x.shape)}.")
        a, seg = p[:-1], p[1:] - p[:-1]                                    # (K-1, d)
        seg_sq = (seg * seg).sum(-1)
        # |x - a - t seg|^2 = |x - a|^2 - 2 t (x - a).seg + t^2 |seg|^2, without a (..., K-1, d) tensor
        x_seg = x @ seg.T - (a * seg).sum(-1)                              # (x - a).seg
        t = (x_seg / seg_sq).clamp(0.0, 1.0)
        x_a = (x * x).sum(-1, keepdim=True) - 2 * x @ a.T + (a * a).sum(-1)
        dist_sq = (x_a - 2 * t * x_seg + t * t * seg_sq).clamp_min(0.0)
        best = dist_sq.argmin(-1, keepdim=True)
        s = torch.as_tensor(self.arc_length).to(p)
        position = (s[best] + t.gather(-1, best) * seg_sq[best].sqrt()) / s[-1]
        return position.squeeze(-1), dist_sq.gather(-1, best).squeeze(-1).sqrt()

    def plot(self, ax=None, *, label: Optional[str] = None, normalized: bool = True, **style):
        """Loss against arc length (divided by the total when ``normalized``)."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(5, 3.2))
        s = self.arc_length
        x = s / s[-1] if normalized else s
        ax.plot(x, self.loss, marker=".", label=label or self.kind, **style)
        ax.set_xlabel("arc length along the path (0: start, 1: end)" if normalized else "arc length")
        ax.set_ylabel("loss")
        return ax


def check_positive_number(name: str, value, example: str) -> float:
    check_number(name, value, example)
    return check_positive(name, value)


def check_callable(name: str, fn) -> None:
    if not callable(fn):
        raise TypeError(f"{name} must be a function of a (d,) tensor returning its gradient, got "
                        f"{type(fn).__name__} {name}={fn!r}.")


def checked_gradient(g, shape: torch.Size, what: str) -> torch.Tensor:
    """``gradient_fn``'s value, refused unless it is a tensor of the input's ``shape``."""
    if not torch.is_tensor(g):
        raise TypeError(f"gradient_fn must return a tensor of shape {tuple(shape)} like its input {what}, "
                        f"got {type(g).__name__}.")
    if g.shape != shape:
        raise ValueError(f"gradient_fn must return a tensor of shape {tuple(shape)} like its input {what}, "
                         f"got shape {tuple(g.shape)}.")
    return g


def check_path(path) -> None:
    if not isinstance(path, EnergyPath):
        raise TypeError(f"path must be an EnergyPath (from minimum_energy_path or straight_path), got "
                        f"{type(path).__name__}.")


def _point(name: str, value) -> torch.Tensor:
    """``start`` or ``end`` as a non-empty, finite, flat tensor."""
    x = check_tensor(name, value, "a 1-D tensor (a point of the parameter space)")
    if x.dim() != 1 or x.numel() == 0:
        raise ValueError(f"{name} must be a non-empty flat 1-D tensor, got shape {tuple(x.shape)}; pass e.g. "
                         "torch.tensor([x0]) for one parameter, or flatten the parameters "
                         "(torch.nn.utils.parameters_to_vector).")
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        i = int((~torch.isfinite(x)).nonzero()[0])
        raise ValueError(f"{name} must be finite, got {name}[{i}]={float(x[i])}: a path joins two points where the "
                         "loss is defined.")
    return x


def _start(start) -> torch.Tensor:
    x = _point("start", start)
    if not x.is_floating_point():
        raise TypeError(f"start must be a floating-point tensor, got dtype {x.dtype}; pass e.g. start.float().")
    return x


def _check_ends(loss: FlatLoss, end: torch.Tensor, num_points: int) -> torch.Tensor:
    end = _point("end", end).to(loss.params)
    if end.shape != loss.params.shape:
        raise ValueError(f"start and end must have the same shape, got {tuple(loss.params.shape)} "
                         f"and {tuple(end.shape)}.")
    check_positive_int("num_points", num_points, minimum=3, hint="It counts the two ends and at least one image.")
    if torch.equal(end, loss.params):
        raise ValueError("start and end are the same point: a path needs two distinct minima.")
    return end


def _losses(loss: FlatLoss, points: torch.Tensor, step: Optional[int] = None) -> np.ndarray:
    with torch.no_grad():
        values = np.array([float(loss(p)) for p in points])
    if not np.isfinite(values).all():
        bad = int(np.flatnonzero(~np.isfinite(values))[0])
        when = "" if step is None else f" at relaxation step {step}"
        raise ValueError(f"the loss is {values[bad]} at image {bad} of the path (of {len(values)}){when}: the path "
                         "crosses a region where the loss is not finite; move the ends, use fewer or more "
                         "images, or a smaller step_size.")
    return values


def straight_path(loss_fn: Union[FlatLoss, LossFn], start: torch.Tensor, end: torch.Tensor, *,
                  num_points: int = 16) -> EnergyPath:
    """The straight line from ``start`` to ``end`` (linear mode connectivity) as an :class:`EnergyPath`."""
    loss = as_flat_loss(loss_fn, _start(start))
    end = _check_ends(loss, end, num_points)
    t = torch.linspace(0.0, 1.0, num_points, dtype=loss.params.dtype, device=loss.params.device)
    points = (1 - t[:, None]) * loss.params + t[:, None] * end
    return EnergyPath(points, _losses(loss, points), kind="straight line")


def _tangents(points: torch.Tensor, energies: torch.Tensor) -> torch.Tensor:
    """Henkelman & Jónsson's upwind tangents of the interior images."""
    forward, backward = points[2:] - points[1:-1], points[1:-1] - points[:-2]
    e_prev, e, e_next = energies[:-2], energies[1:-1], energies[2:]
    up = (e_next > e) & (e > e_prev)
    down = (e_next < e) & (e < e_prev)
    d_max = torch.maximum((e_next - e).abs(), (e_prev - e).abs())
    d_min = torch.minimum((e_next - e).abs(), (e_prev - e).abs())
    higher_next = (e_next > e_prev)[:, None]
    mixed = torch.where(higher_next, forward * d_max[:, None] + backward * d_min[:, None],
                        forward * d_min[:, None] + backward * d_max[:, None])
    tangent = torch.where(up[:, None], forward, torch.where(down[:, None], backward, mixed))
    zero = tangent.norm(dim=-1) == 0  # equal energies: the plain bisection
    tangent = torch.where(zero[:, None], forward / forward.norm(dim=-1, keepdim=True).clamp_min(1e-30)
                          + backward / backward.norm(dim=-1, keepdim=True).clamp_min(1e-30), tangent)
    return tangent / tangent.norm(dim=-1, keepdim=True).clamp_min(1e-30)


def _neb_forces(points, energies, grads, spring: float, climbing: bool) -> torch.Tensor:
    tangent = _tangents(points, energies)
    along = (grads * tangent).sum(-1, keepdim=True)
    lengths = (points[1:] - points[:-1]).norm(dim=-1)
    springs = spring * (lengths[1:] - lengths[:-1])[:, None] * tangent
    forces = -(grads - along * tangent) + springs
    if climbing:
        top = int(torch.argmax(energies[1:-1]))
        forces[top] = -grads[top] + 2 * along[top] * tangent[top]
    return forces


def _value_and_gradient(loss: FlatLoss, gradient_fn: Optional[GradientFn]):
    """``x -> (loss, gradient)`` at one image: one forward and backward pass, or the loss and the
    user's (e.g. minibatch) gradient."""
    def evaluate(x: torch.Tensor):
        if gradient_fn is not None:
            with torch.no_grad():
                value = loss(x)
            return value.detach(), checked_gradient(gradient_fn(x), x.shape, "(one image)")
        x = x.detach().requires_grad_(True)
        value = loss.fn(x)
        return value.detach(), torch.autograd.grad(value, x)[0]

    return evaluate


def _relax(loss: FlatLoss, points: torch.Tensor, evaluate, *, spring: float, step_size: float,
           max_steps: int, tol: float, climb: bool, source: str):
    """FIRE on the interior images; returns the points, whether converged, the largest force, steps."""
    x = points[1:-1].clone()
    v = torch.zeros_like(x)
    dt, dt_max, alpha, since_negative = step_size, 10 * step_size, 0.1, 0
    max_move = 0.2 * float((points[-1] - points[0]).norm()) / (len(points) - 1)
    force_norm = float("inf")
    ends = torch.tensor(_losses(loss, points[[0, -1]]), dtype=x.dtype, device=x.device)  # fixed
    for step in range(1, max_steps + 1):
        full = torch.cat([points[:1], x, points[-1:]])
        values, grads = zip(*(evaluate(p) for p in x))
        energies = torch.cat([ends[:1], torch.stack(values).to(x.dtype), ends[1:]])
        if not bool(torch.isfinite(energies).all()):
            _losses(loss, full, step)  # raises the ValueError that names the image
        grads = torch.stack(grads)
        if not bool(torch.isfinite(grads).all()):
            i, j = (int(k) for k in (~torch.isfinite(grads)).nonzero()[0])
            raise ValueError(f"the gradient is {float(grads[i, j])} at image {i + 1} of the path (of {len(full)}) at "
                             f"relaxation step {step}, where the loss is finite ({float(energies[i + 1]):.6g}): "
                             f"{source}.")
        climbing = climb and step > max_steps // 10
        forces = _neb_forces(full, energies, grads, spring, climbing)
        force_norm = float(forces.norm(dim=-1).max())
        if climbing and force_norm < tol:
            return full, True, force_norm, step
        power = float((forces * v).sum())
        if power > 0:
            f_hat = forces / forces.norm().clamp_min(1e-30)
            v = (1 - alpha) * v + alpha * v.norm() * f_hat
            since_negative += 1
            if since_negative > 5:
                dt, alpha = min(1.1 * dt, dt_max), 0.99 * alpha
        else:
            v.zero_()
            dt, alpha, since_negative = 0.5 * dt, 0.1, 0
        v = v + dt * forces
        move = dt * v
        scale = (max_move / move.norm(dim=-1, keepdim=True).clamp_min(1e-30)).clamp(max=1.0)
        x = x + move * scale
    return torch.cat([points[:1], x, points[-1:]]), False, force_norm, max_steps


def minimum_energy_path(loss_fn: Union[FlatLoss, LossFn], start: torch.Tensor, end: torch.Tensor, *,
                        num_points: int = 16, spring: float = 1.0, step_size: float = 1e-2,
                        max_steps: int = 2000, tol: float = 1e-3, climbing: bool = True,
                        insertion_rounds: int = 2, max_points: Optional[int] = None,
                        gradient_fn: Optional[GradientFn] = None) -> EnergyPath:
    r"""A minimum-energy path from ``start`` to ``end``: NEB with a climbing image, refined by AutoNEB.

    :param loss_fn: ``(d,) tensor -> scalar`` or a :class:`~pyro_flat.flatness.FlatLoss` (a Pyro
        model's full-data potential, an ``nn.Module``'s loss).
    :param num_points: images of the first band, the two ends included.
    :param spring: the spring constant k between neighbours (in the loss's units per squared
        distance; about the loss's curvature keeps the images evenly spaced).
    :param step_size: FIRE's initial time step (it adapts up to 10x); no image moves more than a
        fifth of the initial spacing per step.
    :param tol: converged when the largest NEB force (climbing image included) is below it.
    :param insertion_rounds: AutoNEB rounds; each inserts a pivot halfway between the neighbours
        where the loss there rises above both, then relaxes again (up to ``max_points`` images,
        default ``2 * num_points``).
    :param gradient_fn: ``(d,) -> (d,)`` gradient to use instead of the full one (e.g. a
        minibatch estimate for large data; the losses that pick the climbing image stay full).
    """
    loss = as_flat_loss(loss_fn, _start(start))
    end = _check_ends(loss, end, num_points)
    spring, step_size, tol = (check_positive_number(name, value, example) for name, value, example in
                              (("spring", spring, "1.0"), ("step_size", step_size, "1e-2"), ("tol", tol, "1e-3")))
    max_steps = check_positive_int("max_steps", max_steps, hint="It caps the relaxation steps, e.g. max_steps=2000.")
    insertion_rounds = check_nonnegative_int("insertion_rounds", insertion_rounds,
                                             hint="0 relaxes the first band only (plain NEB).")
    max_points = 2 * num_points if max_points is None else check_positive_int(
        "max_points", max_points, minimum=num_points,
        hint=f"It caps the images AutoNEB may reach from num_points={num_points} (equal: none inserted).")
    if gradient_fn is not None:
        check_callable("gradient_fn", gradient_fn)
    source = ("gradient_fn returned it; make gradient_fn finite wherever the loss is" if gradient_fn is not None
              else "loss_fn is not differentiable there (e.g. sqrt or norm at 0); smooth it, or pass gradient_fn")
    evaluate = _value_and_gradient(loss, gradient_fn)
    path = straight_path(loss, loss.params, end, num_points=num_points).points
    total_steps = 0
    for round_ in range(insertion_rounds + 1):
        path, converged, force, steps = _relax(loss, path, evaluate, spring=spring, step_size=step_size,
                                               max_steps=max_steps, tol=tol, climb=climbing, source=source)
        total_steps += steps
        if round_ == insertion_rounds or len(path) >= max_points:
            break
        mids = 0.5 * (path[1:] + path[:-1])
        ends = _losses(loss, path)
        rise = _losses(loss, mids) - np.maximum(ends[1:], ends[:-1])
        where = [i for i in np.argsort(-rise) if rise[i] > 0][: max_points - len(path)]
        if not where:
            break
        pieces = []
        for i in range(len(path)):
            pieces.append(path[i:i + 1])
            if i in where:
                pieces.append(mids[i:i + 1])
        path = torch.cat(pieces)
    if not converged:
        warnings.warn(f"minimum_energy_path did not converge: the largest NEB force is {force:.3g} > tol "
                      f"{tol:g} after {max_steps} steps; raise max_steps or step_size, or loosen tol.",
                      RuntimeWarning, stacklevel=2)
    return EnergyPath(path.detach(), _losses(loss, path), converged, force, total_steps)


def curvature_along_path(loss_fn: Union[FlatLoss, LossFn], path: EnergyPath, *, num_probes: int = 30,
                         seed: Optional[int] = 0, tol: float = 1e-3) -> Dict[str, np.ndarray]:
    """Top Hessian eigenvalue (Lanczos) and Hutchinson trace ± standard error at every image.

    Returns ``{"arc_length", "position" (0 to 1), "loss", "top_eigenvalue", "trace", "trace_stderr"}``.
    """
    check_path(path)
    tol, seed = check_positive_number("tol", tol, "1e-3"), check_seed(seed)
    loss = as_flat_loss(loss_fn, path.points[0])
    top, trace, stderr = [], [], []
    for point in path.points:
        here = loss.at(point)
        top.append(top_eigenvalues(here, k=1, tol=tol, seed=seed)[0])
        estimate = hessian_trace(here, num_probes=num_probes, seed=seed)
        trace.append(estimate.value)
        stderr.append(estimate.stderr)
    s = path.arc_length
    return {"arc_length": s, "position": s / s[-1], "loss": path.loss, "top_eigenvalue": np.array(top),
            "trace": np.array(trace), "trace_stderr": np.array(stderr)}


def plot_path_profiles(profiles: Mapping[str, Mapping[str, np.ndarray]]):
    """Loss, top Hessian eigenvalue and trace (±2 standard errors) against the position along each
    path (0: start, 1: end); ``profiles[label]`` from :func:`curvature_along_path`."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for i, (label, p) in enumerate(profiles.items()):
        color = f"C{i}"
        axes[0].plot(p["position"], p["loss"], ".-", color=color, label=label)
        axes[1].plot(p["position"], p["top_eigenvalue"], ".-", color=color, label=label)
        axes[2].plot(p["position"], p["trace"], ".-", color=color, label=label)
        axes[2].fill_between(p["position"], p["trace"] - 2 * p["trace_stderr"], p["trace"] + 2 * p["trace_stderr"],
                             color=color, alpha=0.2)
    for ax, title in zip(axes, ("loss", "top Hessian eigenvalue", "Hessian trace (band: ±2 s.e.)")):
        ax.set(xlabel="position along the path (arc length, 0: start, 1: end)", ylabel=title, title=title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


__all__ = ["EnergyPath", "minimum_energy_path", "straight_path", "curvature_along_path",
           "plot_path_profiles"]
