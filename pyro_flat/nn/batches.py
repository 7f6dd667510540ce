r"""Data that arrive as batches (a ``DataLoader``) for a :class:`~pyro_flat.nn.BayesianModule`.

``model(Batches(loader))`` puts the model's data plate over the loader's ``N`` rows with its
batch size ``B``, so the likelihood of a batch counts :math:`N/B` times, as with in-memory data. The
plate's minibatch indices still come from the sampler (each chain its own, ``(C, B)``); a batch is
fetched from the loader for every new row of indices, and the same row gets the same batch back
(a kernel that evaluates one minibatch twice, or the check that chains batch correctly, sees the
same data). The indices' values are not used to pick rows: a shuffling loader picks them, so a
step's batch is a uniform draw without replacement within the loader's epoch, as
:class:`~pyro_flat.targets.EpochBatcher`'s are. ``C`` chains take ``C`` batches per step.

>>> import torch
>>> from torch.utils.data import DataLoader, TensorDataset
>>> data = Batches(DataLoader(TensorDataset(torch.randn(100, 3), torch.zeros(100)), batch_size=10,
...                           shuffle=True, drop_last=True))
>>> data.num_data, data.batch_size
(100, 10)
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from typing import Callable, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import torch

class RowMemo:
    """What was made for each row of minibatch indices, so that the same row gets the same back: a
    kernel that evaluates one minibatch twice (SAM's two gradients, the check that chains batch
    correctly, which takes chain ``c``'s row of the chains' indices) sees the same data.

    A row is known by where it lies in memory (its tensor's storage and offset), never by its values: reading
    them would wait on the device at every step, and inside a trace (``jit_compile``) would turn what was made
    into a constant of the graph. The sampler draws each minibatch as a new tensor, so a new step makes anew.
    The indices of the last ``calls`` calls are held, so that no new tensor can take their memory."""

    def __init__(self, calls: int = 2):
        self._calls: "deque[tuple]" = deque(maxlen=calls)  # (the rows keyed, {row's place: what was made})

    def rows(self, indices: torch.Tensor, make: Callable[[int], object]) -> List[object]:
        """For each row ``r`` of ``indices`` (``(B,)`` or ``(R, B)``): what ``make(r)`` gave the last time
        this row of this tensor (or of a view of it) came, or ``make(r)`` now."""
        rows = indices.reshape(-1, indices.shape[-1])
        current, out = {}, []
        for r, key in enumerate(_row_places(rows)):
            if key not in current:
                current[key] = next((c[key] for _, c in reversed(self._calls) if key in c), None)
                if current[key] is None:
                    current[key] = make(r)
            out.append(current[key])
        self._calls.append((rows, current))  # the keyed tensor itself (a copy where reshape had to copy), kept alive
        return out

    def state_dict(self) -> list:
        """Nothing: a row's place in memory means nothing to another process, and a checkpoint falls between
        steps, after which every minibatch is a new tensor."""
        return []

    def load_state_dict(self, calls: list) -> None:
        self._calls.clear()


def _row_places(rows: torch.Tensor) -> List[tuple]:
    """Where each row of the 2-d ``rows`` lies: its storage's address, offset, stride and length (metadata only)."""
    address, offset = rows.untyped_storage().data_ptr(), rows.storage_offset()
    step, stride = rows.stride()
    return [(rows.device, address, offset + r * step, stride, rows.shape[1]) for r in range(rows.shape[0])]


class Batches:
    """``(x, y)`` batches from ``loader`` (any re-iterable of pairs: a ``DataLoader``) on ``device``.

    :param loader: yields ``(x, y)`` pairs of ``batch_size`` rows; a new pass starts when one ends. Only a
        pass's last batch may be shorter (``drop_last=False``): it is skipped, so that every batch counts
        :math:`N/B` times.
    :param num_data: the number of rows ``N`` (default: ``len(loader.sampler)``, the rows a pass covers,
        else ``len(loader.dataset)``).
    :param batch_size: rows per batch (default ``loader.batch_size``).
    :param device: where the batches go (default: where they come).

    A checkpoint (``MCMC(checkpoint=...)``) holds the position in the current pass (:meth:`state_dict`).
    A loader with its own ``state_dict``/``load_state_dict`` (torchdata's ``StatefulDataLoader``) is
    restored by them; any other is replayed from the start of the pass with every random stream its order
    can come from as it was then (torch's, numpy's, Python's, and the ``generator`` of the loader and of
    its sampler), and the last batch replayed must be the one the checkpoint saw.
    """

    def __init__(self, loader: Iterable, *, num_data: Optional[int] = None, batch_size: Optional[int] = None,
                 device: Optional[torch.device] = None):
        dataset = getattr(loader, "dataset", None)
        sampler = getattr(loader, "sampler", None)  # a subset sampler covers fewer rows than the dataset
        if num_data is None and sampler is not None and hasattr(sampler, "__len__"):
            num_data = len(sampler)
        num_data = num_data if num_data is not None else (len(dataset) if dataset is not None else None)
        batch_size = batch_size if batch_size is not None else getattr(loader, "batch_size", None)
        for name, value in (("num_data", num_data), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Batches needs {name} (a positive integer, got {value!r}): pass {name}=..., or a "
                                 "DataLoader with a dataset and a batch_size.")
        if batch_size > num_data:
            raise ValueError(f"batch_size={batch_size} is larger than num_data={num_data}.")
        self.loader, self.num_data, self.batch_size, self.device = loader, num_data, batch_size, device
        #: a check of each ``(x, y)`` the loader yields, on the host before it moves to ``device`` (a
        #: :class:`~pyro_flat.nn.BayesianModule` sets it at its first batch to check the labels): no step waits
        #: on the device for it
        self.check_pairs: Optional[Callable[[torch.Tensor, torch.Tensor], None]] = None
        self._memo = RowMemo()
        self._iterator: Optional[Iterator] = None
        self._pass_start: Optional[dict] = None  # the random streams when the current pass began
        self._taken = 0  # items taken from the current pass
        self._last = None  # the last item taken (to check a replay against)

    def take(self, indices: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The batch of each row of ``indices`` (``(B,)`` or ``(C, B)``): ``x`` and ``y`` with the
        indices' leading dims."""
        if indices.shape[-1] != self.batch_size:
            raise ValueError(f"data from a loader come in batches of {self.batch_size}; this evaluation asks for "
                             f"{indices.shape[-1]} rows at once (a full-data pass: EntropyHMC, the flatness measures, "
                             "a prediction). Pass the data as tensors for those.")
        pairs = self._memo.rows(indices, lambda r: self._next_batch())
        x, y = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
        lead = tuple(indices.shape[:-1])
        return x.reshape(*lead, *x.shape[1:]), y.reshape(*lead, *y.shape[1:])

    # ------------------------------------------------------------------ the loader's passes
    def _next_batch(self) -> Tuple[torch.Tensor, torch.Tensor]:
        fresh = False  # whether the current pass began in this call
        while True:
            if self._iterator is None:
                if fresh:
                    raise ValueError(self._no_batch_message())
                self._start_pass()
                fresh = True
            item = self._pull()
            if item is None:  # the pass ended
                self._iterator = None
                continue
            x, y = item
            if x.shape[0] == self.batch_size:
                return (x, y) if self.device is None else (x.to(self.device, non_blocking=True),
                                                           y.to(self.device, non_blocking=True))
            if x.shape[0] > self.batch_size or self._pull() is not None:
                raise ValueError(
                    f"the loader yielded a batch of {x.shape[0]} rows where Batches expects batch_size="
                    f"{self.batch_size}: only a pass's last batch may be shorter (it is skipped), or the batches "
                    f"would not count N/B = {self.num_data}/{self.batch_size} times each. Give the loader a fixed "
                    "batch size (a DataLoader's batch_size=), or pass the batch_size it yields.")
            self._iterator = None  # a short last batch (drop_last=False): skipped, and a new pass

    def _start_pass(self) -> None:
        self._pass_start = None if _stateful(self.loader) else self._random_streams()
        self._iterator, self._taken = iter(self.loader), 0

    def _pull(self):
        """The next ``(x, y)`` of the current pass, checked, or ``None`` at its end."""
        try:
            item = next(self._iterator)
        except StopIteration:
            return None
        self._taken, self._last = self._taken + 1, item
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and all(torch.is_tensor(t) for t in item)):
            raise ValueError(f"the loader must yield (x, y) pairs of tensors; it yielded "
                             f"{type(item).__name__}{f' of {len(item)}' if isinstance(item, (tuple, list)) else ''}.")
        x, y = item
        if x.dim() == 0 or y.dim() == 0 or x.shape[0] != y.shape[0]:
            raise ValueError(f"the loader yielded x of shape {tuple(x.shape)} and y of shape {tuple(y.shape)}: "
                             "both need the batch's rows as their first dim, as many in each.")
        for name, t in (("x", x), ("y", y)):
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise ValueError(f"the loader yielded a batch whose {name} holds NaN or infinite values (item "
                                 f"{self._taken} of its pass); clean the dataset or the transform that makes them.")
        if self.check_pairs is not None:
            self.check_pairs(x, y)
        return x, y

    def _no_batch_message(self) -> str:
        if isinstance(self.loader, Iterator):
            return (f"the loader is exhausted: {type(self.loader).__name__} is a one-shot iterator, which Batches "
                    "cannot iterate again for a new pass. Pass a re-iterable: a DataLoader, or a list of (x, y).")
        return f"the loader gave no batch of {self.batch_size} rows in a whole pass."

    def _generators(self) -> List[torch.Generator]:
        """The ``torch.Generator`` objects the loader's order may come from: the loader's and its samplers'."""
        holders = [self.loader, getattr(self.loader, "sampler", None), getattr(self.loader, "batch_sampler", None),
                   getattr(getattr(self.loader, "batch_sampler", None), "sampler", None)]
        found: List[torch.Generator] = []
        for holder in holders:
            generator = getattr(holder, "generator", None)
            if isinstance(generator, torch.Generator) and all(generator is not g for g in found):
                found.append(generator)
        return found

    def _random_streams(self) -> dict:
        return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                "generators": [g.get_state() for g in self._generators()]}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """Where the loader stands: enough to continue with the batches of a run never stopped."""
        if isinstance(self.loader, Iterator):
            raise ValueError(f"checkpoint= cannot continue a run whose loader is a one-shot iterator "
                             f"({type(self.loader).__name__}): it cannot be iterated again to where it stood. Pass a "
                             "DataLoader, or a list of (x, y) batches.")
        state = {"memo": self._memo.state_dict(), "taken": self._taken, "started": self._iterator is not None}
        if _stateful(self.loader):
            return {**state, "loader": self.loader.state_dict()}
        return {**state, "pass_start": self._pass_start, "last": _digest(self._last) if self._taken else None}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`'s ``state``: the same pass, at the same batch."""
        self._memo.load_state_dict(state["memo"])
        self._iterator, self._taken = None, 0
        if "loader" in state:
            self.loader.load_state_dict(state["loader"])
            if state["started"]:
                self._iterator, self._taken = iter(self.loader), state["taken"]
            return
        if not state["started"]:
            return
        now = self._random_streams()
        try:
            _set_random_streams(state["pass_start"], self._generators())
            self._pass_start, self._iterator = state["pass_start"], iter(self.loader)
            for _ in range(state["taken"]):
                if self._pull() is None:
                    break
        finally:  # the run's own streams: the checkpoint sets them next
            _set_random_streams({**now, "generators": []}, [])
        if self._taken != state["taken"] or (state["last"] is not None and _digest(self._last) != state["last"]):
            raise ValueError(
                f"the loader did not give back the batches of the checkpoint's run (item {state['taken']} of the pass "
                "differs): its order or its batches depend on something a checkpoint cannot restore (a sampler that "
                "draws from its own random stream, augmentation in persistent workers, data that changed). Give the "
                "DataLoader a generator=torch.Generator().manual_seed(...), or use a loader with state_dict() "
                "(torchdata's StatefulDataLoader).")

    def fingerprint(self) -> dict:
        """What a checkpoint compares: the loader's kind, its rows and batch size, and its dataset."""
        dataset = getattr(self.loader, "dataset", self.loader if isinstance(self.loader, (list, tuple)) else None)
        return {"loader": type(self.loader).__qualname__, "num_data": self.num_data, "batch_size": self.batch_size,
                "sampler": type(getattr(self.loader, "sampler", None)).__qualname__, "dataset": dataset}

    def __repr__(self) -> str:
        return f"Batches({type(self.loader).__name__}, num_data={self.num_data}, batch_size={self.batch_size})"


def _stateful(loader) -> bool:
    """Whether ``loader`` saves its own position (torchdata's ``StatefulDataLoader``)."""
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


def _set_random_streams(state: dict, generators: List[torch.Generator]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    for generator, saved in zip(generators, state["generators"]):
        generator.set_state(saved)


def _digest(item) -> str:
    """A hash of an ``(x, y)`` item's bytes."""
    digest = hashlib.sha256()
    for t in item:
        t = t.detach().cpu().contiguous()
        digest.update(str((tuple(t.shape), t.dtype)).encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


__all__ = ["Batches", "RowMemo"]
