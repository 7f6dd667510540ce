r"""Where a vectorized run keeps its draws: in memory, or streamed to ``.npy`` files as they are made.

:class:`DrawBuffers` preallocates one ``(draw, chain, ...)`` tensor per site in host memory (the draws
leave a GPU as they are made). :class:`DrawFiles` (``MCMC(..., draws_dir=DIR)``) writes them instead to
``DIR/SITE.npy``, one file per site in numpy's own format (``np.load(path, mmap_mode="r")`` or
``torch.from_numpy`` read it without pyro-flat), holding at most one block of draws in memory (about
:data:`BLOCK_BYTES`); at the end ``get_samples()`` gives memory-mapped tensors of those files. A
checkpoint of a streamed run records how many draws the files hold, not the draws.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Tuple

import numpy as np
import torch

from .checkpoint import CheckpointError

#: draws a :class:`DrawFiles` gathers in memory before it writes them (per all sites together)
BLOCK_BYTES = 64 * 2**20

Shapes = Dict[str, Tuple[Tuple[int, ...], torch.dtype]]


class DrawBuffers:
    """The draws in memory: ``{site: (num_samples, chains, ...)}`` tensors, filled row by row."""

    def __init__(self, shapes: Shapes, num_samples: int):
        self.draws = {n: torch.empty((num_samples,) + shape, dtype=dtype) for n, (shape, dtype) in shapes.items()}

    def put(self, i: int, values: Dict[str, torch.Tensor]) -> None:
        for name, value in values.items():
            self.draws[name][i].copy_(value)

    def for_checkpoint(self, kept: int) -> dict:
        """What a checkpoint holds of the first ``kept`` draws: the draws themselves."""
        return {n: v[:kept].clone() for n, v in self.draws.items()}

    def restore(self, saved: dict) -> None:
        for name, kept in saved.items():
            self.draws[name][:len(kept)].copy_(kept)

    def row(self, i: int) -> Dict[str, torch.Tensor]:
        """Draw ``i`` of every site, ``{site: (chains, ...)}``."""
        return {n: v[i] for n, v in self.draws.items()}

    def flush(self) -> None:
        """Nothing to write: the draws are in memory."""

    def tensors(self) -> Dict[str, torch.Tensor]:
        return self.draws


class DrawFiles:
    """The draws streamed to ``folder/SITE.npy`` (see the module): a row per draw, written a block at a time."""

    def __init__(self, folder, shapes: Shapes, num_samples: int, *, fresh: bool = True):
        self.folder, self.shapes, self.num_samples = Path(folder).expanduser(), shapes, num_samples
        self.folder.mkdir(parents=True, exist_ok=True)
        row_bytes = sum(int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
                        for shape, dtype in shapes.values())
        self.block = max(1, BLOCK_BYTES // max(row_bytes, 1))
        self.buffer = {n: torch.empty((self.block,) + shape, dtype=dtype) for n, (shape, dtype) in shapes.items()}
        self.written, self.pending = 0, 0  # rows on disk; rows in the buffer after them
        self.offsets = {}
        for name, (shape, dtype) in shapes.items():
            path = self.path(name)
            if fresh or not path.exists():  # the header of the whole array; rows are written into place
                np.lib.format.open_memmap(path, mode="w+", dtype=_numpy_dtype(dtype),
                                          shape=(num_samples,) + shape).flush()
            self.offsets[name] = self._data_offset(path, (num_samples,) + shape, dtype)

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.npy"

    def _data_offset(self, path: Path, shape, dtype) -> int:
        with open(path, "rb") as file:
            version = np.lib.format.read_magic(file)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            header = read(file)
            if tuple(header[0]) != tuple(shape) or header[2] != _numpy_dtype(dtype):
                raise CheckpointError(f"draws_dir file {str(path)!r} holds {header[2]} {tuple(header[0])}, not this "
                                      f"run's {_numpy_dtype(dtype)} {tuple(shape)}: pass another draws_dir= or delete it.")
            return file.tell()

    def put(self, i: int, values: Dict[str, torch.Tensor]) -> None:
        if i != self.written + self.pending:
            raise RuntimeError(f"draw {i} out of order (expected {self.written + self.pending})")
        for name, value in values.items():
            self.buffer[name][self.pending].copy_(value)
        self.pending += 1
        if self.pending == self.block:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows to their place in each file."""
        if not self.pending:
            return
        for name, (shape, dtype) in self.shapes.items():
            rows = self.buffer[name][: self.pending].contiguous().numpy()
            with open(self.path(name), "r+b") as file:
                file.seek(self.offsets[name] + self.written * rows[0].nbytes)
                file.write(rows.tobytes())
        self.written, self.pending = self.written + self.pending, 0

    def row(self, i: int) -> Dict[str, torch.Tensor]:
        """Draw ``i`` of every site (from the files; ``i`` below the rows written)."""
        return {n: torch.from_numpy(np.array(np.load(self.path(n), mmap_mode="r")[i])) for n in self.shapes}

    def for_checkpoint(self, kept: int) -> dict:
        """What a checkpoint holds: the folder and how many rows its files hold (all ``kept`` draws, flushed)."""
        self.flush()
        return {"draws_dir": str(self.folder), "kept": self.written}

    def restore(self, saved: dict) -> None:
        if "draws_dir" not in saved:
            raise CheckpointError("the checkpoint holds its draws itself, not in a draws_dir: resume it without "
                                  "draws_dir=, or start a new run.")
        self.written, self.pending = saved["kept"], 0

    def tensors(self) -> Dict[str, torch.Tensor]:
        """Memory-mapped ``(draw, chain, ...)`` tensors of the files (copy-on-write: the files stay as written)."""
        self.flush()
        return {name: torch.from_numpy(np.load(self.path(name), mmap_mode="c")) for name in self.shapes}


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty((), dtype=dtype).numpy().dtype


__all__ = ["DrawBuffers", "DrawFiles", "BLOCK_BYTES"]
