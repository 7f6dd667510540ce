r"""Data-parallel targets: each rank holds a shard of the data, the potential is the sum over ranks.

With the data split into shards :math:`D_1, \dots, D_R`, one per rank, the potential is

.. math:: U(z) = \sum_{r=1}^{R} U_r(z), \qquad
          U_r(z) = -\log p(D_r \mid z) - \tfrac{1}{R}\,\log p(z) - \tfrac1R \log\lvert\det J\rvert,

so each rank evaluates its shard's likelihood (on its own minibatch of its shard, scaled by Pyro's
plate as :math:`N_r/B_r`) and a :math:`1/R` share of the prior, and one all-reduce sums energy and
gradient. Every rank then holds the same :math:`U` and :math:`\nabla U`; with the noise drawn from
one random stream on every rank, the chains' states stay bit-identical across ranks. A minibatch
drawn as :math:`B_r` points from each shard is a stratified minibatch of the whole data: the
estimate stays unbiased, and its noise is the sum of the shards' noises.

:class:`DataParallelTarget` wraps the target of one shard. Its :meth:`~DataParallelTarget.evaluate`
sums energy and gradient in one all-reduce; its energy alone (:meth:`~DataParallelTarget.__call__`,
:meth:`~DataParallelTarget.full_data`) is differentiable to any order through a pair of conjugate
operations (Megatron-LM's): the sum over ranks, whose derivative is the identity, and the identity
on the input, whose derivative is the sum over ranks; Hessians and Hessian-vector products of
:math:`U` come out whole on every rank.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

import torch

from ..errors import OtherRankFailed
from ..targets import Params, Target
from ..targets.protocol import Evaluation, TargetBase
from .group import Ranks


class _SumOverRanks(torch.autograd.Function):
    """Forward: the sum of ``x`` over ranks. Backward: the identity (each rank's share is its own)."""

    @staticmethod
    def forward(ctx, x, ranks):
        import torch.distributed as dist

        y = x.clone()
        ranks.collective("summing the energy across ranks", dist.all_reduce, y)
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _SharedInput(torch.autograd.Function):
    """Forward: the identity. Backward: the sum of the gradient over ranks (differentiable again)."""

    @staticmethod
    def forward(ctx, x, ranks):
        ctx.ranks = ranks
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _SumOverRanks.apply(grad, ctx.ranks), None


class DataParallelTarget(TargetBase):
    """The target of all shards, from this rank's ``local`` target (see the module docstring).

    ``local`` must count its latent terms with weight ``1/R`` (``ModelPotential(latent_weight=1/R)``;
    a ``potential_fn`` returns its shard's share itself). Its minibatches are re-seeded per rank, so
    that the shards' minibatches are independent.
    """

    coupling = None
    is_compiled = False

    def __init__(self, local, ranks: Ranks):
        self.local, self.ranks = local, ranks
        self.local_energy: Optional[torch.Tensor] = None  # this shard's last energy (see nonfinite_ranks)
        self.sites, self.num_chains = local.sites, local.num_chains
        self.subsampled_plates, self.batches = local.subsampled_plates, local.batches
        for batcher in self.batches.batchers.values():
            seed = batcher.generator.initial_seed()
            batcher.generator.manual_seed((seed + 0x9E3779B97F4A7C15 * (ranks.rank + 1)) % 2**63)

    @property
    def transforms(self) -> Dict[str, torch.distributions.Transform]:
        return self.local.transforms

    def initial_params(self, overrides: Optional[Params] = None) -> Params:
        """Rank 0's initial point, on every rank."""
        params = self.local.initial_params(overrides)
        names = sorted(params)
        return dict(zip(names, self.ranks.broadcast([params[n] for n in names], "sharing the initial point")))

    def evaluate(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None) -> Evaluation:
        """Energy and gradient summed over the shards in one all-reduce; the statistics are this rank's."""
        energy, grads, stats = self.local.evaluate(params, indices)
        self.local_energy = energy
        names = list(grads)
        energy, *summed = self.ranks.all_sum([energy, *(grads[n] for n in names)], "summing the gradient across ranks")
        return Evaluation(energy, dict(zip(names, summed)), stats)

    def nonfinite_ranks(self) -> List[int]:
        """The ranks whose own shard's energy was not finite at the last :meth:`evaluate` (a collective:
        every rank calls it), to name the shard behind a non-finite sum."""
        energy = self.local_energy
        mine = energy is not None and not bool(torch.isfinite(energy).all())
        flags = self.ranks.all_objects(mine, "finding the data shard whose energy is not finite")
        return [rank for rank, bad in enumerate(flags) if bad]

    def __call__(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None) -> torch.Tensor:
        """The energy of all shards, differentiable (the gradient is summed over ranks)."""
        shared = {k: _SharedInput.apply(v, self.ranks) for k, v in params.items()}
        return _SumOverRanks.apply(self.local(shared, indices), self.ranks)

    def full_data(self, params: Params, *, likelihood_only: bool = False) -> torch.Tensor:
        """The potential on all the data of all shards, differentiable (see :meth:`__call__`).
        ``likelihood_only``: the negative log-likelihood alone."""
        shared = {k: _SharedInput.apply(v, self.ranks) for k, v in params.items()}
        return _SumOverRanks.apply(self.local.full_data(shared, likelihood_only=likelihood_only), self.ranks)


class DataParallelShards:
    """How a kernel's target spans the ranks of a data-parallel run (the kernel's side of it is
    :class:`~pyro_flat.kernels.protocol.DataParallelism`): each rank builds its shard's target, all
    learn whether one failed, their sites must agree, and :class:`DataParallelTarget` sums them.
    ``pyro_flat.MCMC(..., chain_method="data_parallel")`` hands one to the kernel."""

    def __init__(self, ranks: Ranks):
        self.ranks = ranks
        self.target: Optional[DataParallelTarget] = None  # the last one assembled (inside an Entropy joint too)

    def assemble(self, build: Callable[[int], Target], who: str) -> Target:
        """The target of all shards from this rank's ``build(R)``, for kernel ``who``."""
        ranks = self.ranks
        self.target = None
        try:
            local, error = build(ranks.world_size), None
        except Exception as err:
            local, error = None, err
        failure = ranks.check(error)
        if failure is not None:
            raise failure from error
        ranks.agree(f"{who}'s data-parallel target",
                    {"latent sites": {n: tuple(s.shape) for n, s in local.sites.items()},
                     "subsampled plates": {p: b for p, (_, b) in local.subsampled_plates.items()}})
        self.target = DataParallelTarget(local, ranks)
        return self.target

    def check_start(self, who: str, num_chains: Optional[int]) -> None:
        """The summed energy at the initial point is not finite: when some ranks' own shards gave it, those
        ranks raise an error that names them, and the others :class:`~pyro_flat.errors.OtherRankFailed`,
        so that every rank reports the failing shard's rank (not rank 0 and its initial point). Every rank
        comes here together: the summed energy is the same on all of them."""
        shards = self.target
        if shards is None or not self.ranks.distributed:
            return
        failing = shards.nonfinite_ranks()
        if not failing:  # the shards' energies are finite, their sum is not
            return
        rank = self.ranks.rank
        if rank not in failing:
            raise OtherRankFailed(f"rank {failing[0]}'s data shard gave a non-finite potential energy")
        local = shards.local_energy.reshape(-1)
        bad = ~torch.isfinite(local)
        where = "" if num_chains is None else f" of chain {int(bad.nonzero()[0, 0])}"
        also = [str(r) for r in failing if r != rank]
        others = f"so is that of rank {', '.join(also)}" if also else "the other ranks' shards give finite energies"
        raise ValueError(
            f"{who}: the potential energy of rank {rank}'s data shard at the initial point{where} is "
            f"{float(local[bad][0])} ({others}): rank {rank}'s data overflow or are invalid under the model there. "
            "Check that shard's data (extreme or malformed values), or pass other initial_params or init_strategy.")


def shard_rows(data: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous block of the rows of ``data`` (the first ``N % R`` ranks get one more):
    the shard a rank holds in a data-parallel run.

    >>> [shard_rows(torch.arange(5), r, 2).tolist() for r in range(2)]
    [[0, 1, 2], [3, 4]]
    """
    base, extra = divmod(data.shape[0], world_size)
    start = rank * base + min(rank, extra)
    return data[start: start + base + (rank < extra)]


__all__ = ["DataParallelTarget", "DataParallelShards", "shard_rows"]
