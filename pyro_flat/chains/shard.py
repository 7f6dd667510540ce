r"""Which chains a process runs, and random numbers that do not depend on it.

Vectorized chains draw their random numbers as one ``(C, ...)`` tensor per operation. When the
``C`` chains are split over ranks (:class:`ChainShard`: rank ``r`` runs chains ``start..stop-1``),
each rank still draws the full ``(C, ...)`` tensor from the same random stream and keeps its own
rows. Chain ``c`` then gets the same numbers whatever the number of ranks, and the draws of ``R``
ranks equal those of one process up to floating-point round-off. The price is drawing ``R`` times
the noise a rank needs: small next to a gradient of logistic regression, a fifth of an MLP's iteration.

**Per-chain streams** (:class:`~pyro_flat.chains.streams.ChainStreams`, ``MCMC(...,
random_streams="per_chain")``) remove that price: under :func:`~pyro_flat.chains.streams.drawing_from`
the draws below come from each chain's own generator (:mod:`pyro_flat.chains.streams`).

The kernels draw through :func:`chain_randn_like`, :func:`chain_randn_like_each` and
:func:`chain_rand_like`, and the few decisions
that read several chains at once (the shortest step size, whether every chain is done) through
:func:`chains_min` and :func:`chains_all`. Outside :func:`sharded` and ``drawing_from`` they are
plain torch calls.

>>> shard = ChainShard(total=4, start=2, stop=4)
>>> _ = torch.manual_seed(0)
>>> full = torch.randn(4, 3)
>>> _ = torch.manual_seed(0)
>>> with sharded(shard):
...     mine = chain_randn_like(torch.zeros(2, 3))
>>> bool((mine == full[2:]).all())
True
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, List, Optional, Sequence

import torch

from .streams import context_value, streams_for



@dataclass(frozen=True)
class ChainShard:
    """Chains ``start, ..., stop - 1`` of ``total``, run by this process; ``group`` is the process group
    over which decisions that read every chain are reduced (``None``: the default group)."""

    total: int
    start: int
    stop: int
    group: Any = None

    @property
    def count(self) -> int:
        return self.stop - self.start

    @classmethod
    def split(cls, total: int, rank: int, world_size: int, group: Any = None) -> "ChainShard":
        """Rank ``rank``'s contiguous block of ``total`` chains; the first ``total % world_size`` ranks
        get one more.

        >>> [ChainShard.split(5, r, 2).count for r in range(2)]
        [3, 2]
        """
        if total < world_size:
            raise ValueError(f"num_chains={total} chains cannot be split over {world_size} ranks: every rank "
                             f"needs at least one. Pass num_chains >= {world_size}, or run fewer processes.")
        base, extra = divmod(total, world_size)
        start = rank * base + min(rank, extra)
        return cls(total, start, start + base + (rank < extra), group)

    def rows(self, full: torch.Tensor) -> torch.Tensor:
        """This shard's rows of a ``(total, ...)`` tensor."""
        return full[self.start: self.stop]


_SHARD: ContextVar[Optional[ChainShard]] = ContextVar("pyro_flat_chain_shard", default=None)


def current_shard() -> Optional[ChainShard]:
    """The :class:`ChainShard` in force, or ``None`` (every chain is in this process)."""
    return _SHARD.get()


def shard_of(count: int) -> Optional[ChainShard]:
    """The shard in force if ``count`` chains are its chains (a leading dimension of ``count`` is this
    process's chains), else ``None``: the one rule every helper below applies."""
    shard = _SHARD.get()
    return shard if shard is not None and shard.count == count else None


def sharded(shard: Optional[ChainShard]) -> ContextManager[Optional[ChainShard]]:
    """Run the enclosed chains as ``shard`` of a larger set (``None``: no change)."""
    return context_value(_SHARD, shard)


def chain_draw(draw: Callable[[Sequence[int]], torch.Tensor], shape: Sequence[int]) -> torch.Tensor:
    """``draw(shape)`` for a ``(C, ...)`` shape of this process's chains: under a shard, the full
    ``(total, ...)`` draw's rows of this shard, so that each chain's numbers do not depend on the split."""
    shard = shard_of(shape[0]) if len(shape) else None
    if shard is None:
        return draw(tuple(shape))
    return shard.rows(draw((shard.total, *shape[1:])))


def chain_randn_like(x: torch.Tensor) -> torch.Tensor:
    """``torch.randn_like(x)`` for a ``(C, ...)`` tensor of chains (see :func:`chain_draw`), drawn in
    ``x``'s logical order whatever its memory layout: ``randn_like`` fills memory in storage order, so
    a channels-last ``x`` (inductor lays out convolution weights so inside a compiled graph) would give
    each element another number than the eager run does."""
    streams = streams_for(x)
    if streams is not None:
        return streams.fill(torch.empty_like(x, memory_format=torch.contiguous_format))
    if _SHARD.get() is None:  # the hot path of one process: nothing to decide
        return torch.randn_like(x, memory_format=torch.contiguous_format)
    return chain_draw(lambda s: torch.randn(s, dtype=x.dtype, device=x.device), x.shape)


def chain_randn_like_each(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """:func:`chain_randn_like` of each tensor. On a GPU they are drawn as one vector, one kernel launch
    instead of one per tensor (for a network's dozens of weight tensors, most of the noise's cost), and
    each result is a view of it, tensor after tensor, in logical order; under a shard the vector holds
    every chain's numbers, so a chain's do not depend on the split. On the CPU, where a call costs
    microseconds, they are drawn one tensor after another: the numbers of :func:`chain_randn_like`, so
    seeded CPU runs keep their draws. With per-chain streams (``drawing_from``), on any device, each
    chain draws all its tensors' numbers at once.

    >>> _ = torch.manual_seed(0)
    >>> a, b = chain_randn_like_each([torch.zeros(2, 3), torch.zeros(2)])
    >>> _ = torch.manual_seed(0)
    >>> bool((a == torch.randn(2, 3)).all() and (b == torch.randn(2)).all())
    True
    """
    tensors = list(tensors)
    if not tensors:
        return []
    first, shard = tensors[0], _SHARD.get()
    streams = streams_for(first)
    if streams is not None and all(streams_for(t) is streams and t.dtype == first.dtype and t.device == first.device
                                   for t in tensors):
        # per-chain streams: one draw per chain of all its tensors' numbers, on any device
        sizes = [math.prod(t.shape[1:]) for t in tensors]
        rows = streams.fill(torch.empty(streams.count, sum(sizes), dtype=first.dtype, device=first.device))
        return [part.view(t.shape) for part, t in zip(rows.split(sizes, dim=1), tensors)]
    if first.device.type == "cpu" or any(t.dtype != first.dtype or t.device != first.device for t in tensors) or (
            shard is not None and any(t.dim() == 0 or shard_of(t.shape[0]) is None for t in tensors)):
        return [chain_randn_like(t) for t in tensors]
    shapes = [t.shape if shard is None else (shard.total, *t.shape[1:]) for t in tensors]
    sizes = [math.prod(s) for s in shapes]
    flat = torch.randn(sum(sizes), dtype=first.dtype, device=first.device)
    views = [part.view(s) for part, s in zip(flat.split(sizes), shapes)]
    return views if shard is None else [shard.rows(v) for v in views]


def chain_rand_like(x: torch.Tensor) -> torch.Tensor:
    """``torch.rand_like(x)`` for a ``(C, ...)`` tensor of chains, in ``x``'s logical order (see
    :func:`chain_randn_like`)."""
    streams = streams_for(x)
    if streams is not None:
        return streams.fill(torch.empty_like(x, memory_format=torch.contiguous_format), "uniform")
    if _SHARD.get() is None:
        return torch.rand_like(x, memory_format=torch.contiguous_format)
    return chain_draw(lambda s: torch.rand(s, dtype=x.dtype, device=x.device), x.shape)


def chain_indices(count: int) -> range:
    """The chain numbers, out of all the shard's chains, whose random draws a loop over ``count``
    chains must make to keep the stream in step: ``range(total)`` under a shard, else ``range(count)``.
    Keep the ones :func:`owns` says are this process's."""
    shard = shard_of(count)
    return range(count) if shard is None else range(shard.total)


def owns(chain: int, count: int) -> bool:
    """Whether ``chain`` (of :func:`chain_indices`) is one of this process's ``count`` chains."""
    shard = shard_of(count)
    return chain < count if shard is None else shard.start <= chain < shard.stop


def global_chain(chain: int, count: int) -> int:
    """Chain ``chain`` of this process's ``count`` chains, numbered among all the chains of the run."""
    shard = shard_of(count)
    return chain if shard is None else shard.start + chain


def _all_reduce(value: torch.Tensor, op) -> torch.Tensor:
    import torch.distributed as dist

    shard = _SHARD.get()
    if shard is None or not dist.is_available() or not dist.is_initialized():
        return value
    value = value.clone()
    dist.all_reduce(value, op=op, group=shard.group)
    return value


def chains_average(mean: torch.Tensor, count: int) -> torch.Tensor:
    """An average over this process's ``count`` chains made the average over every chain of every rank
    (the same on every rank); unchanged in one process."""
    import torch.distributed as dist

    shard = shard_of(count)
    if shard is None:
        return mean
    return _all_reduce(mean * count, dist.ReduceOp.SUM) / shard.total


def chains_min(x: torch.Tensor) -> torch.Tensor:
    """The smallest entry of ``x`` over every chain of every rank (a 0-dim tensor)."""
    import torch.distributed as dist

    return _all_reduce(x.amin().reshape(()), dist.ReduceOp.MIN)


def chains_all(flag: torch.Tensor) -> bool:
    """Whether ``flag`` (a boolean tensor over this process's chains) holds for every chain of every rank."""
    import torch.distributed as dist

    return bool(_all_reduce(flag.all().to(torch.int32).reshape(()), dist.ReduceOp.MIN))


__all__ = ["ChainShard", "current_shard", "shard_of", "sharded", "chain_draw", "chain_randn_like",
           "chain_randn_like_each", "chain_rand_like", "chain_indices", "owns", "global_chain", "chains_average",
           "chains_min", "chains_all"]
