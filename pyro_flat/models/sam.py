r"""SAM's ascent step (Foret et al., ICLR 2021), written once for every sharpness-aware method.

.. math:: \varepsilon^* = \rho\,\frac{g}{\lVert g\rVert}, \qquad g = \nabla \ell(\theta),

the first-order solution of :math:`\max_{\lVert\varepsilon\rVert\le\rho} \ell(\theta+\varepsilon)`.
The gradient is then taken at :math:`\theta + \varepsilon^*` on the same minibatch. The norm runs
over every site together, or per chain for vectorized chains (a leading chain dimension). Its users:
:class:`~pyro_flat.SASGLD` (and :class:`~pyro_flat.kernels.SAMSGD`, the sharpness-aware deep ensemble
members), :class:`~pyro_flat.SAM_ELBO` (SA-BBB, and with a point-mass guide SAM itself: SA-MC-dropout,
SA-SWAG).

>>> import torch
>>> eps = sam_perturbation({"w": torch.tensor([3.0, 4.0])}, rho=0.5)
>>> eps["w"]
tensor([0.3000, 0.4000])
>>> sam_perturbation({"w": torch.tensor([[3.0, 4.0], [0.0, 0.0]])}, rho=1.0, num_chains=2)["w"]
tensor([[0.6000, 0.8000],
        [0.0000, 0.0000]])
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional

import torch

from ..targets.layout import expand_like, per_chain_norm
from ..validation import check_number, check_positive


def check_sam_radius(name: str, value: float, owner: str, example: str = "0.05") -> float:
    """A SAM radius (or any sharpness ball's size): a positive finite float, else a ``ValueError``."""
    check_number(name, value, example)
    return check_positive(name, value, hint=f"It is the size of {owner}'s sharpness ball, e.g. {name}={example}.")


def sam_perturbation(grads: Mapping[str, torch.Tensor], rho: float,
                     num_chains: Optional[int] = None) -> Dict[str, torch.Tensor]:
    r"""SAM's perturbation :math:`\rho\, g/\lVert g\rVert` of each site (a constant, detached).

    :param grads: the loss's gradient by site.
    :param rho: the radius :math:`\rho > 0`.
    :param num_chains: ``None``: one norm over all sites; ``C``: one norm per chain, the tensors'
        leading dimension.
    :returns: the perturbation by site; zero where the gradient is zero.
    """
    grads = {name: g.detach() for name, g in grads.items()}
    norm = per_chain_norm(grads, num_chains)
    scale = torch.where(norm > 0, rho / norm.clamp_min(torch.finfo(norm.dtype).tiny), torch.zeros_like(norm))
    return {name: expand_like(scale, g) * g for name, g in grads.items()}


__all__ = ["sam_perturbation", "check_sam_radius"]
