"""Minibatch indices for a target's subsampled plates.

:class:`EpochBatcher` shuffles one plate's indices once per epoch; :class:`Minibatches` holds a
target's batchers, one per subsampled ``pyro.plate(..., subsample_size=B)``, and is the one object
every minibatch comes from: a target's :meth:`~pyro_flat.targets.Target.draw_indices` asks it, and
so may a kernel that needs two gradients on the same data. :meth:`Minibatches.scripted` makes it
hand out given minibatches for a while (what a trace needs to see each draw as a graph input)
without touching the target.

For ``C`` vectorized chains each batcher may draw per-chain minibatches: ``(C, B)`` indices, row
``c`` from chain ``c``'s own epoch permutation (``EpochBatcher(num_chains=C)``). Chains that share
no minibatch share no gradient noise, so they are independent draws of one chain's law, which is
what R-hat and ESS assume; chains that share one minibatch per step are not.

>>> batches = Minibatches({"data": EpochBatcher(6, 3, torch.device("cpu"))})
>>> with batches.scripted() as script:
...     first, second = batches.draw(), batches.draw()
>>> script.count, first["data"].tolist()
(2, [0, 1, 2])
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional

import torch

from ..chains.shard import chain_draw


class EpochBatcher:
    """Minibatch indices without replacement within an epoch, reshuffled every epoch.

    Each batch is a uniformly random subset of ``range(size)``, so ``N/B`` times its log-likelihood
    is an unbiased estimate of the full one. One permutation per epoch instead of per step, from a
    random stream of the batcher's own (:attr:`generator`, seeded from the global one when the
    batcher is made), so that drawing several minibatches ahead changes nothing. With
    ``num_chains=C`` every call gives ``(C, B)`` indices, each chain its own permutation (chains
    that share no minibatch are independent draws of one chain's law); else ``(B,)``.

    >>> batches = EpochBatcher(6, 3, torch.device("cpu"), num_chains=2)
    >>> first, second = batches(), batches()
    >>> torch.cat([first, second], 1).sort(1).values.tolist()
    [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]]
    """

    def __init__(self, size: int, batch_size: int, device: torch.device, num_chains: Optional[int] = None):
        self.size, self.batch_size, self.device = size, batch_size, torch.device(device)
        self.num_chains = num_chains
        self._perm = torch.empty(0 if num_chains is None else (num_chains, 0), dtype=torch.long, device=device)
        self._pos = 0
        # a stream of its own, seeded from the global one: the minibatches do not depend on when
        # they are drawn relative to the kernel's noise (a fused graph draws k at once)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(torch.randint(0, 2**62, ())))

    def _shuffle(self) -> torch.Tensor:
        if self.num_chains is None:
            return torch.randperm(self.size, device=self.device, generator=self.generator)
        # under a chain shard: the full (C, N) draw's own rows, so a chain's minibatches do not depend on the split
        uniforms = chain_draw(lambda s: torch.rand(s, device=self.device, generator=self.generator),
                              (self.num_chains, self.size))
        return uniforms.argsort(-1)

    def state_dict(self) -> dict:
        """Where the stream stands: the epoch's permutation, the position in it and the generator's state."""
        return {"perm": self._perm, "pos": self._pos, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self._perm, self._pos = state["perm"].to(self.device), state["pos"]
        self.generator.set_state(state["generator"])

    def __call__(self) -> torch.Tensor:
        if self._pos + self.batch_size > self._perm.shape[-1]:
            self._perm = self._shuffle()
            self._pos = 0
        batch = self._perm[..., self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        return batch.contiguous()  # a (C, B) slice is not; a traced graph assumes the layout it saw


class Script:
    """The minibatches :meth:`Minibatches.scripted` hands out, and how many were asked for."""

    def __init__(self, fixed: Dict[str, torch.Tensor], given: Optional[List[Dict[str, torch.Tensor]]]):
        self.fixed, self.given, self.count = fixed, given, 0

    def next(self) -> Dict[str, torch.Tensor]:
        self.count += 1
        return self.fixed if self.given is None else self.given[self.count - 1]


class Minibatches:
    """A target's subsampled plates, ``{plate: EpochBatcher}``; empty for a full-batch target."""

    def __init__(self, batchers: Optional[Dict[str, EpochBatcher]] = None):
        self.batchers: Dict[str, EpochBatcher] = dict(batchers or {})
        self._script: Optional[Script] = None

    def __bool__(self) -> bool:
        return bool(self.batchers)

    @property
    def plates(self) -> List[str]:
        return list(self.batchers)

    def state_dict(self) -> Dict[str, dict]:
        """Every plate's :meth:`EpochBatcher.state_dict`: what a checkpoint needs to draw the same minibatches."""
        return {name: batcher.state_dict() for name, batcher in self.batchers.items()}

    def load_state_dict(self, state: Dict[str, dict]) -> None:
        if set(state) != set(self.batchers):
            raise ValueError(f"the checkpoint's subsampled plates {sorted(state)} are not the model's "
                             f"{sorted(self.batchers)}.")
        for name, batcher in self.batchers.items():
            batcher.load_state_dict(state[name])

    def draw(self) -> Dict[str, torch.Tensor]:
        """A fresh minibatch of every subsampled plate (or the script's next one)."""
        if self._script is not None:
            return self._script.next()
        return {name: batcher() for name, batcher in self.batchers.items()}

    def fixed(self) -> Dict[str, torch.Tensor]:
        """The first ``B`` indices of every subsampled plate (for deterministic comparisons); with
        per-chain batchers ``(C, B)`` indices, chain ``c``'s moved along by ``c`` minibatches, so
        that a model that gives every chain the same data is told apart."""
        fixed = {}
        for name, b in self.batchers.items():
            first = torch.arange(b.batch_size, device=b.device)
            if b.num_chains is not None:
                shifts = torch.arange(b.num_chains, device=b.device).unsqueeze(-1) * b.batch_size
                first = (first + shifts) % b.size
            fixed[name] = first
        return fixed

    def for_chain(self, indices: Dict[str, torch.Tensor], chain: int) -> Dict[str, torch.Tensor]:
        """Chain ``chain``'s own minibatch out of ``indices`` (what one chain's target evaluates)."""
        return {name: (idx[chain] if self.batchers[name].num_chains is not None else idx)
                for name, idx in indices.items()}

    def shifted(self, plate: str, indices: torch.Tensor, shift: int) -> torch.Tensor:
        """``indices`` of ``plate`` moved along by ``shift`` minibatches: another valid minibatch,
        for comparisons and for tracing several draws as distinct inputs."""
        return (indices + shift * indices.shape[-1]) % self.batchers[plate].size

    @contextmanager
    def scripted(self, given: Optional[List[Dict[str, torch.Tensor]]] = None) -> Iterator[Script]:
        """While open, :meth:`draw` hands out ``given`` in order (the :meth:`fixed` batch each time
        when ``None``) and counts the calls: how a trace learns how many minibatches an iteration
        draws, and sees each one as an input."""
        previous, self._script = self._script, Script(self.fixed(), given)
        try:
            yield self._script
        finally:
            self._script = previous


__all__ = ["EpochBatcher", "Minibatches", "Script"]
