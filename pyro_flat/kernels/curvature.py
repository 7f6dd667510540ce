r"""Curvature of a potential at the chains' points, turned into a covariance for a preconditioner
or an HMC metric.

Every function takes ``energy_fn``: a flat ``(C, D)`` tensor (one row per chain) to the ``(C,)``
energies, differentiable. The Hessian rows come from one reverse pass per coordinate through the
graph of the gradient (the chains' energies are summed: chain ``c``'s energy depends on row ``c``
only, so one pass gives every chain's row at once).

- :func:`hessian`: the exact ``(C, D, D)`` Hessian (``D`` reverse passes).
- :func:`hessian_diagonal`: its diagonal, exact up to :data:`EXACT_DIAGONAL_DIM` coordinates, else
  Hutchinson's estimate :math:`\mathrm{diag}(H) \approx \frac1S\sum_s v_s \odot H v_s` with
  Rademacher :math:`v_s` (``num_probes`` reverse passes).
- :func:`inverse_curvature` / :func:`inverse_diagonal`: :math:`|H|^{-1}`, the eigenvalues (or
  diagonal entries) in absolute value and floored at ``floor`` times the largest, so that a flat
  or non-convex direction gives a large but finite variance; :func:`absolute_curvature` is
  :math:`|H|` itself (floored alike), a precision.

>>> energy = lambda x: 0.5 * (x * x * torch.tensor([1.0, 100.0])).sum(-1)
>>> inverse_curvature(hessian(energy, torch.zeros(3, 2)))[0].diagonal()
tensor([1.0000, 0.0100])
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..chains.shard import chain_draw

EnergyFn = Callable[[torch.Tensor], torch.Tensor]
#: :func:`hessian_diagonal` forms the Hessian up to this dimension, Hutchinson's estimate above
EXACT_DIAGONAL_DIM = 1024
#: eigenvalues (diagonal entries) below this fraction of the largest are raised to it
FLOOR = 1e-6


def _gradient_graph(energy_fn: EnergyFn, x: torch.Tensor):
    x = x.detach().requires_grad_(True)
    energy = energy_fn(x)
    (grad,) = torch.autograd.grad(energy.sum(), x, create_graph=True)
    return x, grad


#: Hessian rows :func:`hessian` computes in one batched reverse pass
HESSIAN_ROWS_PER_PASS = 64


def hessian(energy_fn: EnergyFn, x: torch.Tensor) -> torch.Tensor:
    """The ``(C, D, D)`` Hessian of every chain's energy at its row of ``x`` ``(C, D)``.

    The rows come :data:`HESSIAN_ROWS_PER_PASS` at a time, from one reverse pass batched over unit
    vectors (``is_grads_batched``: autograd under ``vmap``); on ``pyro-flat mnist79``'s 785 weights
    that took 0.15 s against 0.93 s for one pass per row, with the same result to the last bit. A
    graph with an operation ``vmap`` cannot batch falls back to one pass per row."""
    with torch.enable_grad():
        x, grad = _gradient_graph(energy_fn, x)
        try:
            rows = _batched_rows(grad, x)
        except RuntimeError:  # an operation without a batching rule: one row at a time
            rows = [torch.autograd.grad(grad[:, i].sum(), x, retain_graph=True)[0].unsqueeze(1)
                    for i in range(x.shape[-1])]
    H = torch.cat(rows, 1).detach()
    return 0.5 * (H + H.mT)


def _batched_rows(grad: torch.Tensor, x: torch.Tensor) -> list:
    """Blocks ``(C, k, D)`` of the Hessian's rows, :data:`HESSIAN_ROWS_PER_PASS` per reverse pass."""
    num_chains, dim = x.shape
    blocks = []
    for start in range(0, dim, HESSIAN_ROWS_PER_PASS):
        rows = torch.arange(start, min(start + HESSIAN_ROWS_PER_PASS, dim), device=x.device)
        units = x.new_zeros(len(rows), num_chains, dim)
        units[torch.arange(len(rows), device=x.device), :, rows] = 1.0
        (block,) = torch.autograd.grad(grad, x, units, retain_graph=True, is_grads_batched=True)
        blocks.append(block.transpose(0, 1))
    return blocks


def hessian_diagonal(energy_fn: EnergyFn, x: torch.Tensor, *, num_probes: int = 32,
                     generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """The ``(C, D)`` diagonal of the Hessian: exact for ``D <= EXACT_DIAGONAL_DIM``, else
    Hutchinson's unbiased estimate from ``num_probes`` Rademacher probes."""
    if x.shape[-1] <= EXACT_DIAGONAL_DIM:
        return hessian(energy_fn, x).diagonal(dim1=-2, dim2=-1)
    with torch.enable_grad():
        x, grad = _gradient_graph(energy_fn, x)
        total = torch.zeros_like(x)
        for _ in range(num_probes):
            v = (chain_draw(lambda s: torch.randint(0, 2, s, generator=generator), x.shape) * 2.0 - 1.0).to(x)
            (hv,) = torch.autograd.grad(grad, x, v, retain_graph=True)
            total += v * hv
    return (total / num_probes).detach()


def absolute_spectrum(H: torch.Tensor, floor: float = FLOOR):
    """``(magnitude, vectors)``: eigenvectors of ``H`` and its eigenvalues in absolute value, floored at
    ``floor`` of the largest (and at 1e-8); :func:`absolute_curvature` is ``vectors diag(magnitude) vectorsᵀ``."""
    eigenvalues, vectors = torch.linalg.eigh(H)
    magnitude = eigenvalues.abs()
    return torch.maximum(magnitude, (magnitude.amax(-1, keepdim=True) * floor).clamp(min=1e-8)), vectors


def _symmetric(matrix: torch.Tensor) -> torch.Tensor:
    return 0.5 * (matrix + matrix.mT)


def inverse_curvature(H: torch.Tensor, floor: float = FLOOR) -> torch.Tensor:
    r""":math:`|H|^{-1}` per chain, ``(C, D, D)``: eigenvalues in absolute value, floored at ``floor``
    of the largest (and at 1e-8), so the result is a covariance."""
    magnitude, vectors = absolute_spectrum(H, floor)
    return _symmetric((vectors / magnitude.unsqueeze(-2)) @ vectors.mT)


def absolute_curvature(H: torch.Tensor, floor: float = FLOOR, *, spectrum=None) -> torch.Tensor:
    r""":math:`|H|`, the precision whose inverse is :func:`inverse_curvature`, ``(C, D, D)``; from
    ``spectrum`` (:func:`absolute_spectrum`'s) when it is given."""
    magnitude, vectors = absolute_spectrum(H, floor) if spectrum is None else spectrum
    return _symmetric((vectors * magnitude.unsqueeze(-2)) @ vectors.mT)


#: a diagonal entry below this fraction of the median entry is raised to it (see :func:`inverse_diagonal`)
MEDIAN_FLOOR = 0.1


def inverse_diagonal(diagonal: torch.Tensor, floor: float = FLOOR, median_floor: float = MEDIAN_FLOOR) -> torch.Tensor:
    """``1 / |diagonal|`` per chain, ``(C, D)``, the entries floored as in :func:`inverse_curvature`
    and at ``median_floor`` times their median: a Hutchinson estimate of one entry can fall near 0
    by chance (its noise is the size of the row's off-diagonal mass), and an unfloored entry then
    gives that coordinate a step thousands of times too large (measured: a Bayesian MLP diverged
    within 15 steps of the first re-estimate without this floor)."""
    magnitude = diagonal.abs()
    lowest = torch.maximum((magnitude.amax(-1, keepdim=True) * floor).clamp(min=1e-8),
                           magnitude.median(-1, keepdim=True).values * median_floor)
    return 1.0 / torch.maximum(magnitude, lowest)
