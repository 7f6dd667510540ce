r"""The Entropy-MCMC coupling :math:`\lVert\theta - \theta_a\rVert^2/(2\eta)`, written once.

Everything that adds the coupling calls :func:`coupling`: :class:`~pyro_flat.targets.CoupledPotential`
(the kernels' joint, per site), :func:`~pyro_flat.flat_potential` (a user's potential) and
:class:`~pyro_flat.EntropyHMC` (on its flat ``(chains, D)`` vectors). Its gradient is closed form:
:math:`\nabla_\theta = (\theta - \theta_a)/\eta = -\nabla_{\theta_a}`, so the twins need no autograd.
With ``batch_dims`` leading batch (chain) dimensions, every chain gets its own term: the squares
are summed over each site's own dimensions only (docs/theory.md, section 1).

>>> import torch
>>> terms = coupling([torch.tensor([[1.0, 1.0], [0.0, 2.0]])], eta=2.0, batch_dims=1)
>>> terms.energy, terms.distance, terms.grad_theta[0][1]
(tensor([0.5000, 1.0000]), tensor([1.4142, 2.0000]), tensor([0., 1.]))
"""

from __future__ import annotations

from typing import List, NamedTuple, Sequence

import torch


class CouplingTerms(NamedTuple):
    """The coupling's value, its gradient in θ per site (that in θa is its negative), and
    :math:`\\lVert\\theta - \\theta_a\\rVert` (one per chain)."""

    energy: torch.Tensor
    grad_theta: List[torch.Tensor]
    distance: torch.Tensor


def coupling(diffs: Sequence[torch.Tensor], eta: float, batch_dims: int = 0) -> CouplingTerms:
    r""":math:`\lVert\theta - \theta_a\rVert^2/(2\eta)` and :math:`(\theta - \theta_a)/\eta` from
    ``diffs`` :math:`= \theta - \theta_a`, one tensor per site, each with ``batch_dims`` leading
    batch dimensions that are kept (the energy has shape ``diffs[0].shape[:batch_dims]``)."""
    diffs = list(diffs)
    squares = [d.reshape(d.shape[:batch_dims] + (-1,)).square().sum(-1) for d in diffs]
    sq = squares[0] if len(squares) == 1 else torch.stack(squares).sum(0)
    return CouplingTerms(sq * (0.5 / eta), torch._foreach_div(diffs, eta), sq.sqrt())
