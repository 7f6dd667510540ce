r"""Which chains a process runs, and random numbers that do not depend on it.

Vectorized chains draw their random numbers as one ``(C, ...)`` tensor per operation. When the
``C`` chains are split over ranks (:class:`ChainShard`: rank ``r`` runs chains ``start..stop-1``),
each rank still draws the full ``(C, ...)`` tensor from the same random stream and keeps its own
rows. Chain ``c`` then gets the same numbers whatever the number of ranks, and the draws of ``R``
ranks equal those of one process up to floating-point round-off. The price is drawing ``R`` times
the noise a rank needs: small next to a gradient of logistic regression, a fifth of an MLP's iteration.

**Per-chain streams** (:class:`ChainStreams`, ``MCMC(..., random_streams="per_chain")``) remove that
price: chain ``g`` draws from a generator of its own, seeded from the run's seed (which the kernel draws
from the global stream at set-up, alike on every rank) and ``g``, so a rank draws only its own chains'
numbers, and chain ``g`` still gets the same numbers whatever the split (one process included). That
is what lets a network's chains scale over ranks (``benchmarks/bench_distributed.py``). They are drawn
while :func:`drawing_from` is in force; minibatch indices keep their own shared stream (a few numbers
per epoch).

The kernels draw through :func:`chain_randn_like`, :func:`chain_randn_like_each` and
:func:`chain_rand_like`, and the few decisions
that read several chains at once (the shortest step size, whether every chain is done) through
:func:`chains_min` and :func:`chains_all`. Outside :func:`sharded` and :func:`drawing_from` they are
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
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence

import numpy as np
import torch

#: how vectorized chains draw their random numbers (see :class:`ChainStreams`)
RANDOM_STREAMS = ("shared", "per_chain")


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


@contextmanager
def sharded(shard: Optional[ChainShard]) -> Iterator[Optional[ChainShard]]:
    """Run the enclosed chains as ``shard`` of a larger set (``None``: no change)."""
    token = _SHARD.set(shard)
    try:
        yield shard
    finally:
        _SHARD.reset(token)


def check_random_streams(random_streams: str) -> str:
    """``random_streams`` must name a scheme of :data:`RANDOM_STREAMS`."""
    if not isinstance(random_streams, str) or random_streams not in RANDOM_STREAMS:
        near = str(random_streams).strip().lower().replace("-", "_").replace(" ", "_")
        hint = f" Did you mean {near!r}?" if isinstance(random_streams, str) and near in RANDOM_STREAMS else ""
        raise ValueError(f"random_streams must be 'shared' (one random stream for all chains, the default) or "
                         f"'per_chain' (a stream per chain: a rank of a distributed run draws only its own chains' "
                         f"numbers), got {random_streams!r}.{hint}")
    return random_streams


def chain_seed(seed: int, chain: int) -> int:
    """The 64-bit seed of chain ``chain``'s stream in a run of seed ``seed`` (numpy's ``SeedSequence``,
    so that nearby chains and seeds give unrelated streams)."""
    words = np.random.SeedSequence([int(seed), int(chain)]).generate_state(2, np.uint32)
    return (int(words[0]) << 32 | int(words[1])) & (2**63 - 1)


class NoiseSpec(NamedTuple):
    """One draw from the chains' streams: its shape, dtype, device and kind (``"normal"`` or ``"uniform"``)."""

    shape: tuple
    dtype: torch.dtype
    device: torch.device
    kind: str


class ChainStreams:
    r"""One random stream per chain: chain ``g`` of a run (numbered among all its chains) draws from a
    ``torch.Generator`` seeded with :func:`chain_seed` ``(seed, g)``, one per device it draws on.

    A process holds the streams of its ``chains`` only, so a rank draws :math:`C/R` chains' numbers,
    not :math:`C`; chain ``g``'s numbers depend on ``seed`` and ``g`` alone, not on the split.

    >>> streams = ChainStreams(seed=7, chains=range(0, 4))
    >>> with drawing_from(streams):
    ...     full = chain_randn_like(torch.zeros(4, 3))
    >>> with drawing_from(ChainStreams(seed=7, chains=range(2, 4))):   # another rank's half
    ...     half = chain_randn_like(torch.zeros(2, 3))
    >>> bool((half == full[2:]).all())
    True
    """

    def __init__(self, seed: int, chains: range):
        self.seed, self.chains = int(seed), chains
        self._generators: Dict[torch.device, List[torch.Generator]] = {}
        self._recorded: Optional[List[NoiseSpec]] = None  # see recording()
        self._given: Optional[Iterator[torch.Tensor]] = None  # see feeding()

    @property
    def count(self) -> int:
        return len(self.chains)

    def generators(self, device: torch.device) -> List[torch.Generator]:
        """The chains' generators on ``device``, made at their seeds the first time."""
        device = _concrete(device)
        found = self._generators.get(device)
        if found is None:
            found = self._generators[device] = [torch.Generator(device=device).manual_seed(chain_seed(self.seed, g))
                                                for g in self.chains]
        return found

    def state_dict(self) -> dict:
        """The seed, the chains and every generator's state: what a checkpoint needs to draw on exactly."""
        return {"seed": self.seed, "chains": (self.chains.start, self.chains.stop),
                "states": {str(d): [g.get_state() for g in gens] for d, gens in self._generators.items()}}

    def load_state_dict(self, state: dict) -> None:
        if (state["seed"], tuple(state["chains"])) != (self.seed, (self.chains.start, self.chains.stop)):
            raise ValueError(f"these random streams are chains {self.chains.start}..{self.chains.stop - 1} of seed "
                             f"{self.seed}; the saved ones are chains {state['chains'][0]}..{state['chains'][1] - 1} "
                             f"of seed {state['seed']}.")
        self._generators.clear()
        for device, states in state["states"].items():
            for generator, saved in zip(self.generators(torch.device(device)), states):
                generator.set_state(saved)

    def fill(self, out: torch.Tensor, kind: str = "normal") -> torch.Tensor:
        """Fill ``out`` (``(count, ...)``, contiguous) row by row, row ``c`` from chain ``c``'s stream:
        standard normal numbers (``kind="normal"``) or uniform on ``[0, 1)`` (``"uniform"``). Inside
        :meth:`feeding`, the next given tensor instead (a compiled graph's input)."""
        if self._given is not None:
            given = next(self._given, None)
            if given is None or tuple(given.shape) != tuple(out.shape):
                raise RuntimeError(f"a {kind} draw of shape {tuple(out.shape)} was made where the traced iteration "
                                   f"made {'none' if given is None else 'one of shape ' + str(tuple(given.shape))}")
            return given
        if self._recorded is not None:
            self._recorded.append(NoiseSpec(tuple(out.shape), out.dtype, out.device, kind))
        for row, generator in zip(out, self.generators(out.device)):
            if kind == "normal":
                row.normal_(generator=generator)
            else:
                row.uniform_(generator=generator)
        return out


    def draw(self, specs: Sequence[NoiseSpec]) -> List[torch.Tensor]:
        """The draws ``specs`` describe, in order (what :meth:`recording` saw an iteration make)."""
        return [self.fill(torch.empty(s.shape, dtype=s.dtype, device=s.device), s.kind) for s in specs]

    @contextmanager
    def recording(self) -> Iterator[List[NoiseSpec]]:
        """Draw as usual, and list each draw's :class:`NoiseSpec` in the list yielded."""
        self._recorded = recorded = []
        try:
            yield recorded
        finally:
            self._recorded = None

    @contextmanager
    def feeding(self, tensors: Sequence[torch.Tensor]) -> Iterator[None]:
        """Hand out ``tensors``, in order, instead of drawing: a traced graph takes the chains' numbers as
        inputs (a graph cannot hold a ``torch.Generator``), drawn before each call by :meth:`draw`."""
        self._given = iter(tensors)
        try:
            yield
        finally:
            self._given = None

    @contextmanager
    def forked(self) -> Iterator[None]:
        """Leave the streams where they were after the enclosed draws (as ``torch.random.fork_rng``)."""
        saved = {d: [g.get_state() for g in gens] for d, gens in self._generators.items()}
        try:
            yield
        finally:
            self._generators = {d: gens for d, gens in self._generators.items() if d in saved}
            for device, states in saved.items():
                for generator, state in zip(self._generators[device], states):
                    generator.set_state(state)


def _concrete(device: torch.device) -> torch.device:
    """``device`` with its index (``cuda`` is the current CUDA device)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


_STREAMS: ContextVar[Optional[ChainStreams]] = ContextVar("pyro_flat_chain_streams", default=None)


@contextmanager
def drawing_from(streams: Optional[ChainStreams]) -> Iterator[Optional[ChainStreams]]:
    """Draw the enclosed chains' random numbers from ``streams`` (``None``: the shared stream)."""
    token = _STREAMS.set(streams)
    try:
        yield streams
    finally:
        _STREAMS.reset(token)


def current_streams() -> Optional[ChainStreams]:
    """The :class:`ChainStreams` in force, or ``None`` (the shared stream)."""
    return _STREAMS.get()


def _streams_for(x: torch.Tensor) -> Optional[ChainStreams]:
    """The streams in force if ``x``'s leading dimension is their chains."""
    streams = _STREAMS.get()
    return streams if streams is not None and x.dim() and x.shape[0] == streams.count else None


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
    streams = _streams_for(x)
    if streams is not None:
        return streams.fill(torch.empty_like(x, memory_format=torch.contiguous_format))
    if _SHARD.get() is None:  # the hot path of one process: nothing to decide
        return torch.randn_like(x, memory_format=torch.contiguous_format)
    return chain_draw(lambda s: torch.randn(s, dtype=x.dtype, device=x.device), x.shape)


def chain_randn_like_each(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """:func:`chain_randn_like` of each tensor. On a GPU they are drawn as one vector, one kernel launch
    instead of one per tensor (for a network's dozens of weight tensors, most of the noise's cost), and
    each result is a view of it, tensor after tensor, in logical order; under a shard the vector holds
    every chain's numbers, so a chain's do not depend on the split. With per-chain streams
    (:func:`drawing_from`), on any device, each chain draws all its tensors' numbers at once. On the CPU, where a call costs
    microseconds, they are drawn one tensor after another: the numbers of :func:`chain_randn_like`, so
    seeded CPU runs keep their draws.

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
    streams = _streams_for(first)
    if streams is not None and all(_streams_for(t) is streams and t.dtype == first.dtype and t.device == first.device
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
    streams = _streams_for(x)
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


__all__ = ["ChainShard", "current_shard", "shard_of", "sharded", "RANDOM_STREAMS", "check_random_streams", "chain_seed",
           "NoiseSpec", "ChainStreams", "drawing_from", "current_streams", "chain_draw", "chain_randn_like",
           "chain_randn_like_each", "chain_rand_like", "chain_indices", "owns", "global_chain", "chains_average",
           "chains_min", "chains_all"]
