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

from collections import deque
from typing import Callable, Iterable, List, Optional, Tuple

import torch

class RowMemo:
    """What was made for each row of minibatch indices, so that the same row gets the same back: a
    kernel that evaluates one minibatch twice (SAM's two gradients, the check that chains batch
    correctly) sees the same data. Only the rows of the last ``calls`` calls are kept."""

    def __init__(self, calls: int = 2):
        self._calls: "deque[dict]" = deque(maxlen=calls)

    def rows(self, indices: torch.Tensor, make: Callable[[int], object]) -> List[object]:
        """For each row ``r`` of ``indices`` (``(B,)`` or ``(R, B)``): what ``make(r)`` gave the last time
        this row of values came, or ``make(r)`` now."""
        rows = indices.reshape(-1, indices.shape[-1]).detach().cpu().numpy()
        current, out = {}, []
        for r, row in enumerate(rows):
            key = row.tobytes()
            if key not in current:
                current[key] = next((c[key] for c in reversed(self._calls) if key in c), None)
                if current[key] is None:
                    current[key] = make(r)
            out.append(current[key])
        self._calls.append(current)
        return out


class Batches:
    """``(x, y)`` batches from ``loader`` (any re-iterable of pairs: a ``DataLoader``) on ``device``.

    :param loader: yields ``(x, y)`` pairs of ``batch_size`` rows; a new pass starts when one ends.
    :param num_data: the number of rows ``N`` (default: ``len(loader.sampler)``, the rows a pass covers,
        else ``len(loader.dataset)``).
    :param batch_size: rows per batch (default ``loader.batch_size``); a shorter last batch is skipped.
    :param device: where the batches go (default: where they come).
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
        self._iterator = None
        self._memo = RowMemo()

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

    def _next_batch(self) -> Tuple[torch.Tensor, torch.Tensor]:
        for _ in range(2):  # the rest of this pass, then a new one
            if self._iterator is None:
                self._iterator = iter(self.loader)
            for item in self._iterator:
                if not (isinstance(item, (tuple, list)) and len(item) == 2 and all(torch.is_tensor(t) for t in item)):
                    raise ValueError(f"the loader must yield (x, y) pairs of tensors; it yielded "
                                     f"{type(item).__name__}{f' of {len(item)}' if isinstance(item, (tuple, list)) else ''}.")
                x, y = item
                if x.shape[0] != self.batch_size or y.shape[0] != self.batch_size:
                    continue  # a short last batch (drop_last=False): skipped, so every batch counts N/B
                if self.device is not None:
                    x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
                return x, y
            self._iterator = None
        raise ValueError(f"the loader gave no batch of {self.batch_size} rows in a whole pass.")

    def __repr__(self) -> str:
        return f"Batches({type(self.loader).__name__}, num_data={self.num_data}, batch_size={self.batch_size})"


__all__ = ["Batches", "RowMemo"]
