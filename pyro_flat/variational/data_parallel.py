r"""Flat-seeking SVI across ranks: each rank holds a shard of the data, gradients are summed.

With the data split into shards, one per rank, the ELBO's loss is a sum over ranks,

.. math:: L(\phi) = \sum_r \Big( \mathbb E_q[-\log p(D_r \mid \theta)] + \tfrac1R\,\mathrm{KL}(q_\phi \,\|\, p) \Big),

so each rank weighs its latent sites (prior and guide densities) by :math:`1/R`
(:class:`ShareLatents`) and the sum of the ranks' gradients is the gradient of :math:`L`. The
sharpness-aware ELBOs need it twice per step: the ascent direction (SAM's :math:`\nabla\ell`,
SA-BMA's :math:`\nabla_\phi L`) is summed before it is used, so every rank takes the same step to
the same worst point, and the descent gradient is summed before the optimizer's step, so the
variational parameters stay identical on every rank. Each rank's minibatch is the same for both
evaluations (:class:`~pyro_flat.variational.SameMinibatch`): together they are the step's global
minibatch. Every rank must draw the same guide sample: seed every rank alike (``pyro.set_rng_seed``)
and give the shards the same size, so that the random streams stay in step.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
from pyro import poutine
from pyro.poutine.messenger import Messenger

from ..distributed import Ranks, init_from_env


class ShareLatents(Messenger):
    """Scale every latent (unobserved) sample site's log-density by ``weight`` (``1/R``); the
    likelihood of the rank's shard keeps its own."""

    def __init__(self, weight: float):
        super().__init__()
        self.weight = weight

    def _pyro_sample(self, msg) -> None:
        if not msg["is_observed"] and self.weight != 1.0:
            msg["scale"] = msg["scale"] * self.weight


def ranks_for(data_parallel: bool) -> Optional[Ranks]:
    """The group a data-parallel ELBO sums over (joined from torchrun's environment), or ``None``."""
    if not data_parallel:
        return None
    ranks = init_from_env()
    return ranks if ranks.distributed else None


def sum_over_ranks(tensors: List[torch.Tensor], ranks: Optional[Ranks], what: str) -> List[torch.Tensor]:
    """Each tensor summed over the ranks (:meth:`~pyro_flat.distributed.Ranks.all_sum`); unchanged
    without ``ranks``."""
    return tensors if ranks is None else ranks.all_sum(tensors, what)


def sum_gradients(params: Dict[str, torch.Tensor], loss: float, ranks: Optional[Ranks]) -> float:
    """The ``.grad`` of every parameter (``{name: tensor}``), and the loss, summed over the ranks in place;
    the global loss. The parameters are packed in the order of their names, the same on every rank."""
    if ranks is None:
        return loss
    params = [params[name] for name in sorted(params) if params[name].grad is not None]
    loss_tensor = torch.tensor([loss], dtype=params[0].grad.dtype if params else torch.float64,
                               device=params[0].grad.device if params else None)
    summed = sum_over_ranks([*(p.grad for p in params), loss_tensor], ranks, "summing the gradient across ranks")
    for p, g in zip(params, summed):
        p.grad.copy_(g)
    return float(summed[-1])


def traced_params(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` and the unconstrained parameters it touched, ``{name: tensor}`` (what
    ``SVI.step`` optimizes)."""
    with poutine.trace(param_only=True) as capture:
        value = fn(*args, **kwargs)
    return value, {name: site["value"].unconstrained() for name, site in capture.trace.nodes.items()}


__all__ = ["ShareLatents", "ranks_for", "sum_over_ranks", "sum_gradients", "traced_params"]
