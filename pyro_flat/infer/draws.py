r"""Where a vectorized run keeps its draws: in memory, or streamed to ``.npy`` files as they are made.

:class:`DrawBuffers` preallocates one ``(draw, chain, ...)`` tensor per site in host memory (the draws
leave a GPU as they are made). :class:`DrawFiles` (``MCMC(..., draws_dir=DIR)``) writes them instead to one
``.npy`` file per site in ``DIR``, holding at most one block of draws in memory (about :data:`BLOCK_BYTES`);
at the end ``get_samples()`` gives memory-mapped tensors of those files. A checkpoint of a streamed run
records how many draws the files hold (and which run wrote them), not the draws. The folder's checks, lock
and ownership rules are :mod:`pyro_flat.storage.draws_folder`'s.

**The format**, readable with numpy and json alone, during a run too:

- ``DIR/draws.json``, the manifest: ``{"format": "pyro-flat draws", "version": 1, "run": ID,
  "checkpoint": PATH or null, "num_samples": N, "rows": R, "complete": BOOL, "sites": {SITE: {"file":
  NAME, "shape": [N, chains, ...], "dtype": "float32"}}}``.
- ``DIR/NAME``: site ``SITE``'s draws in numpy's format, ``(draw, chain, ...)``, the whole ``N`` rows from
  the start. Its first ``R`` rows are draws; the rest are not (zeros, or rows being written).
  ``NAME`` is the site's name made a safe file name (:func:`~pyro_flat.storage.draws_folder.site_file`:
  ``"fc.weight"`` gives ``fc.weight.npy``, ``"layer/w"`` gives ``layer%2Fw.npy``).
- The rows are written in blocks: when a block fills, at least every :data:`FLUSH_SECONDS` seconds,
  at each checkpoint and when the run ends or stops (an error, a Ctrl-C); each time they reach the disk
  (fsync) first, and ``R`` is raised after, in a manifest written whole (a temporary file renamed over
  it). So ``R`` never counts a row that is not complete; ``complete`` is true once all ``N`` are.

>>> import json, os, tempfile, numpy as np, torch
>>> from pyro_flat import MCMC, SGLD
>>> folder = os.path.join(tempfile.mkdtemp(), "draws")
>>> mcmc = MCMC(SGLD(potential_fn=lambda p: 0.5 * (p["x"] ** 2).sum(-1), step_size=0.1), num_samples=30,
...             initial_params={"x": torch.zeros(4, 2)}, num_chains=4, draws_dir=folder, disable_progbar=True)
>>> mcmc.run()
>>> manifest = json.load(open(os.path.join(folder, "draws.json")))      # without pyro-flat: numpy and json
>>> x = np.load(os.path.join(folder, manifest["sites"]["x"]["file"]), mmap_mode="r")[: manifest["rows"]]
>>> x.shape, manifest["complete"]
((30, 4, 2), True)
"""

from __future__ import annotations

import os
import time
from typing import Dict, Tuple

import numpy as np
import torch

from ..storage.draws_folder import DrawsDirError, DrawsFolder, site_file

#: draws a :class:`DrawFiles` gathers in memory before it writes them (per all sites together)
BLOCK_BYTES = 64 * 2**20
#: the longest a :class:`DrawFiles` holds draws before it writes them (seconds)
FLUSH_SECONDS = 2.0
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
    """The draws streamed to the files of ``folder`` (a :class:`~pyro_flat.storage.draws_folder.DrawsFolder`; see the
    module): a row per draw, written a block at a time. New files for a new run; for a run that continues a
    checkpoint (``folder.resume``), the run's own files, checked."""

    def __init__(self, folder: DrawsFolder, shapes: Shapes, num_samples: int):
        self.folder, self.shapes, self.num_samples = folder, shapes, num_samples
        row_bytes = {n: int(np.prod(shape, dtype=np.int64)) * _numpy_dtype(dtype).itemsize
                     for n, (shape, dtype) in shapes.items()}
        self.block = max(1, min(num_samples, BLOCK_BYTES // max(sum(row_bytes.values()), 1)))
        self.buffer = {n: torch.empty((self.block,) + shape, dtype=dtype) for n, (shape, dtype) in shapes.items()}
        self.written, self.pending = 0, 0  # rows on disk; rows in the buffer after them
        sites = {n: {"file": site_file(n), "shape": [num_samples, *shape], "dtype": _numpy_dtype(dtype).name}
                 for n, (shape, dtype) in shapes.items()}
        if folder.resume is None:
            self._create(sites)
        else:
            self._reopen(sites)
        self.offsets = {n: self._data_offset(self.path(n), (num_samples,) + shape, dtype, row_bytes[n])
                        for n, (shape, dtype) in shapes.items()}
        self.flushed_at = time.monotonic()

    def path(self, name: str):
        return self.folder.file(name)

    def _create(self, sites: dict) -> None:
        """New files, after refusing any file at their paths that no pyro-flat run wrote, and removing those of
        the earlier run that the folder says this run replaces."""
        folder, earlier = self.folder, self.folder.manifest
        listed = {folder.path / s["file"] for s in earlier["sites"].values()} if earlier else set()
        for name in self.shapes:
            path = self.path(name)
            if os.path.lexists(path) and path not in listed:
                raise DrawsDirError(
                    f"draws_dir={str(folder.path)!r} already holds {str(path)!r}, which no pyro-flat run wrote there "
                    f"(it is not in {str(folder.manifest_path)!r}): this run's site {name!r} would replace it. Pass "
                    "another draws_dir= (a new or empty folder); pyro-flat never replaces files it did not write.")
        locked = [str(p) for p in sorted(listed) if os.path.lexists(p) and not os.access(p, os.W_OK)]
        if locked:
            raise DrawsDirError(f"draws_dir={str(folder.path)!r}: this run would replace the earlier run's draws, but "
                                f"{', '.join(locked)} {'is' if len(locked) == 1 else 'are'} read-only (kept on purpose?). "
                                f"Make {'it' if len(locked) == 1 else 'them'} writable (chmod u+w) to replace "
                                f"{'it' if len(locked) == 1 else 'them'}, or pass another draws_dir= (a new or "
                                "empty folder).")
        for path in listed:  # the earlier run's files (its manifest lists them): this run replaces that run
            if os.path.lexists(path):
                path.unlink()
        folder.update({"format": "pyro-flat draws", "version": 1, "run": folder.run, "checkpoint": folder.checkpoint,
                       "num_samples": self.num_samples, "rows": 0, "complete": False, "sites": sites})
        for name, (shape, dtype) in self.shapes.items():  # the header of the whole array; rows go into place
            np.lib.format.open_memmap(self.path(name), mode="w+", dtype=_numpy_dtype(dtype),
                                      shape=(self.num_samples,) + shape).flush()

    def _reopen(self, sites: dict) -> None:
        """The files of the run a checkpoint continues: this configuration's, holding the rows it counts."""
        folder, kept = self.folder, self.folder.resume["kept"]
        manifest, fix = folder.manifest, "start a new run (delete the checkpoint, or pass another checkpoint=)"
        if manifest.get("sites") != sites or manifest.get("num_samples") != self.num_samples:
            raise DrawsDirError(f"draws_dir={str(folder.path)!r}: its manifest {str(folder.manifest_path)!r} lists "
                                f"other sites or shapes than this run's ({sites}); {fix}.")
        if manifest.get("rows", -1) < kept:
            raise DrawsDirError(f"draws_dir={str(folder.path)!r} holds {manifest.get('rows')} complete rows, fewer "
                                f"than the {kept} the checkpoint counts; {fix}.")
        for name in self.shapes if kept < self.num_samples else ():  # a finished run's files are only read
            if not os.access(self.path(name), os.W_OK):
                raise DrawsDirError(f"draws_dir file {str(self.path(name))!r} cannot be written (read-only); make "
                                    f"it writable to continue the run, or {fix}.")
        self.written = kept
        self._count()  # the rows after these are written again

    def _data_offset(self, path, shape, dtype, row_bytes: int) -> int:
        with open(path, "rb") as file:
            version = np.lib.format.read_magic(file)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            header = read(file)
            if tuple(header[0]) != tuple(shape) or header[2] != _numpy_dtype(dtype):
                raise DrawsDirError(f"draws_dir file {str(path)!r} holds {header[2]} {tuple(header[0])}, not this "
                                    f"run's {_numpy_dtype(dtype)} {tuple(shape)}: pass another draws_dir=.")
            offset = file.tell()
        if os.path.getsize(path) < offset + shape[0] * row_bytes:
            raise DrawsDirError(f"draws_dir file {str(path)!r} is truncated: it is shorter than its {shape[0]} rows; "
                                "start a new run (delete the checkpoint, or pass another checkpoint=).")
        return offset

    def put(self, i: int, values: Dict[str, torch.Tensor]) -> None:
        if i != self.written + self.pending:
            raise RuntimeError(f"draw {i} out of order (expected {self.written + self.pending})")
        for name, value in values.items():
            self.buffer[name][self.pending].copy_(value)
        self.pending += 1
        if self.pending == self.block or time.monotonic() - self.flushed_at >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows to their place in each file, to the disk, then count them in the manifest."""
        self.flushed_at = time.monotonic()
        if self.pending:
            for name in self.shapes:
                rows = self.buffer[name][: self.pending].contiguous().numpy()
                with open(self.path(name), "r+b") as file:
                    file.seek(self.offsets[name] + self.written * rows[0].nbytes)
                    file.write(rows.tobytes())
                    file.flush()
                    os.fsync(file.fileno())
            self.written, self.pending = self.written + self.pending, 0
        self._count()

    def _count(self) -> None:
        """The manifest's count of complete rows, if it is not this one (written after the rows themselves)."""
        counted = (self.written, self.written == self.num_samples)
        if (self.folder.manifest["rows"], self.folder.manifest["complete"]) != counted:
            self.folder.update(rows=counted[0], complete=counted[1])

    def row(self, i: int) -> Dict[str, torch.Tensor]:
        """Draw ``i`` of every site (from the files; ``i`` below the rows written)."""
        return {n: torch.from_numpy(np.array(np.load(self.path(n), mmap_mode="r")[i])) for n in self.shapes}

    def for_checkpoint(self, kept: int) -> dict:
        """What a checkpoint holds: the folder, how many rows its files hold (all ``kept`` draws, flushed),
        the run that wrote them and their names."""
        self.flush()
        return {"draws_dir": str(self.folder.path), "kept": self.written, "run": self.folder.run,
                "files": sorted(site_file(n) for n in self.shapes)}

    def restore(self, saved: dict) -> None:
        """Nothing more to do: the files were opened after the checkpoint's rows, checked to be this run's."""

    def tensors(self) -> Dict[str, torch.Tensor]:
        """Memory-mapped ``(draw, chain, ...)`` tensors of the files (copy-on-write: the files stay as written)."""
        self.flush()
        return {name: torch.from_numpy(np.load(self.path(name), mmap_mode="c")) for name in self.shapes}


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty((), dtype=dtype).numpy().dtype


__all__ = ["DrawBuffers", "DrawFiles", "BLOCK_BYTES", "FLUSH_SECONDS"]
