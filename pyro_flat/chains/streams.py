r"""Per-chain random streams: chain ``g``'s numbers from a generator of its own (``random_streams="per_chain"``).

With the shared stream (:mod:`pyro_flat.chains`) each rank of a distributed run draws every chain's
numbers and keeps its own rows. Here chain ``g`` draws from a ``torch.Generator`` seeded from the run's
seed (which the kernel draws from the global stream at set-up, alike on every rank) and ``g``, so a
rank draws only its own chains' numbers, and chain ``g`` still gets the same numbers whatever the
split (one process included). That is what lets a network's chains scale over ranks
(``benchmarks/bench_distributed.py``). The draws of :mod:`pyro_flat.chains` come from them while
:func:`drawing_from` is in force; minibatch indices keep their own shared stream (a few numbers per
epoch). A compiled graph cannot hold a generator: :meth:`ChainStreams.recording` lists an iteration's
draws, :meth:`ChainStreams.draw` makes them before each call, and :meth:`ChainStreams.feeding` hands
them to the traced iteration.

>>> from pyro_flat.chains import chain_randn_like
>>> with drawing_from(ChainStreams(seed=7, chains=range(0, 4))):
...     full = chain_randn_like(torch.zeros(4, 3))
>>> with drawing_from(ChainStreams(seed=7, chains=range(2, 4))):   # another rank's half
...     half = chain_randn_like(torch.zeros(2, 3))
>>> bool((half == full[2:]).all())
True
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ContextManager, Dict, Iterator, List, NamedTuple, Optional, Sequence

import numpy as np
import torch

#: how vectorized chains draw their random numbers (see :class:`ChainStreams`)
RANDOM_STREAMS = ("shared", "per_chain")


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

    >>> streams = ChainStreams(seed=7, chains=range(2, 4))
    >>> numbers = streams.fill(torch.empty(2, 3))          # row c: chain 2 + c's next numbers
    >>> again = ChainStreams(seed=7, chains=range(2, 3)).fill(torch.empty(1, 3))
    >>> bool((numbers[0] == again[0]).all())
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
        """The seed, the chains and every generator's state: what a checkpoint needs to draw on exactly (by
        ``torch.device``, which a checkpoint read on another GPU maps to that one)."""
        return {"seed": self.seed, "chains": (self.chains.start, self.chains.stop),
                "states": {d: [g.get_state() for g in gens] for d, gens in self._generators.items()}}

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
        saved = self.state_dict()
        try:
            yield
        finally:
            self.load_state_dict(saved)


def _concrete(device: torch.device) -> torch.device:
    """``device`` with its index (``cuda`` is the current CUDA device)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


_STREAMS: ContextVar[Optional[ChainStreams]] = ContextVar("pyro_flat_chain_streams", default=None)


@contextmanager
def context_value(var: ContextVar, value: Any) -> Iterator[Any]:
    """``var`` holds ``value`` inside the block, and what it held before after it (also on an error)."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)


def drawing_from(streams: Optional[ChainStreams]) -> ContextManager[Optional[ChainStreams]]:
    """Draw the enclosed chains' random numbers from ``streams`` (``None``: the shared stream)."""
    return context_value(_STREAMS, streams)


def streams_for(x: torch.Tensor) -> Optional[ChainStreams]:
    """The streams in force if ``x``'s leading dimension is their chains."""
    streams = _STREAMS.get()
    return streams if streams is not None and x.dim() and x.shape[0] == streams.count else None


def random_state(params: Dict[str, torch.Tensor], streams: Optional["ChainStreams"] = None) -> tuple:
    """The random streams a graph call draws from: the global ones (the CPU's, and the CUDA device's in use)
    and the per-chain ``streams``, if any."""
    devices = {v.device for v in params.values() if v.device.type == "cuda"}
    return (torch.get_rng_state(), [(d, torch.cuda.get_rng_state(d)) for d in devices],
            None if streams is None else (streams, streams.state_dict()))


def restore_random_state(state: tuple) -> None:
    """Set the streams :func:`random_state` read back to that state."""
    cpu, cuda, streams = state
    torch.set_rng_state(cpu)
    for device, value in cuda:
        torch.cuda.set_rng_state(value, device)
    if streams is not None:
        streams[0].load_state_dict(streams[1])


__all__ = ["RANDOM_STREAMS", "check_random_streams", "chain_seed", "NoiseSpec", "ChainStreams", "context_value",
           "drawing_from", "streams_for", "random_state", "restore_random_state"]
