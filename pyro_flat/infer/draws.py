r"""Where a vectorized run keeps its draws: in memory, or streamed to ``.npy`` files as they are made.

:class:`DrawBuffers` preallocates one ``(draw, chain, ...)`` tensor per site in host memory (the draws
leave a GPU as they are made). :class:`DrawFiles` (``MCMC(..., draws_dir=DIR)``) writes them instead to one
``.npy`` file per site in ``DIR``, holding at most one block of draws in memory (about :data:`BLOCK_BYTES`);
at the end ``get_samples()`` gives memory-mapped tensors of those files. A checkpoint of a streamed run
records how many draws the files hold (and which run wrote them), not the draws. The folder's checks, lock
and ownership rules are :mod:`pyro_flat.storage.draws_folder`'s.

**The format** (version 2), readable with numpy and json alone, during a run too:

- ``DIR/draws.json``, the manifest: ``{"format": "pyro-flat draws", "version": 2, "run": ID,
  "checkpoint": PATH or null, "num_samples": N, "rows": R, "complete": BOOL, "sites": {SITE: {"file":
  NAME, "shape": [N, chains, ...], "dtype": "float32", "sha256": [[START, STOP, HEX], ...]}}}``.
- ``DIR/NAME``: site ``SITE``'s draws in numpy's format, ``(draw, chain, ...)``, the whole ``N`` rows from
  the start. Its first ``R`` rows are draws; the rest are not (zeros, or rows being written).
  ``NAME`` is the site's name made a safe file name (:func:`~pyro_flat.storage.draws_folder.site_file`:
  ``"fc.weight"`` gives ``fc.weight.npy``, ``"layer/w"`` gives ``layer%2Fw.npy``).
- The rows are written in blocks: when a block fills, at least every :data:`FLUSH_SECONDS` seconds,
  at each checkpoint and when the run ends or stops (an error, a Ctrl-C); each time they reach the disk
  (fsync) first, and ``R`` is raised after, in a manifest written whole (a temporary file renamed over
  it). So ``R`` never counts a row that is not complete; ``complete`` is true once all ``N`` are.
- ``sha256``: the checksums of the rows, a block of rows at a time: ``[START, STOP, HEX]`` is
  ``hashlib.sha256`` of the bytes of rows ``START`` to ``STOP - 1`` as the file holds them
  (``x[START:STOP].tobytes()``), hashed once, as they were written. The blocks of a site follow each other
  from row 0 to row ``R``; a block grows by the rows of each write until it holds about
  :data:`BLOCK_BYTES` of draws (all sites together), then the next one starts: a few entries per GB. A run
  that continues a checkpoint checks every block of every site first, and refuses a file whose rows
  changed on disk by name (:meth:`DrawFiles._verify`), changing nothing. Version 1 (pyro-flat before the
  checksums) is the same without ``sha256``: such a folder is continued unchecked, with a warning, and
  stays version 1.

>>> import hashlib, json, os, tempfile, numpy as np, torch
>>> from pyro_flat import MCMC, SGLD
>>> folder = os.path.join(tempfile.mkdtemp(), "draws")
>>> mcmc = MCMC(SGLD(potential_fn=lambda p: 0.5 * (p["x"] ** 2).sum(-1), step_size=0.1), num_samples=30,
...             initial_params={"x": torch.zeros(4, 2)}, num_chains=4, draws_dir=folder, disable_progbar=True)
>>> mcmc.run()
>>> manifest = json.load(open(os.path.join(folder, "draws.json")))      # without pyro-flat: numpy and json
>>> x = np.load(os.path.join(folder, manifest["sites"]["x"]["file"]), mmap_mode="r")[: manifest["rows"]]
>>> x.shape, manifest["complete"]
((30, 4, 2), True)
>>> [(start, stop) for start, stop, sha256 in manifest["sites"]["x"]["sha256"]]
[(0, 30)]
>>> all(hashlib.sha256(x[start:stop].tobytes()).hexdigest() == sha256
...     for start, stop, sha256 in manifest["sites"]["x"]["sha256"])
True
"""

from __future__ import annotations

import hashlib
import os
import time
import warnings
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from ..storage.draws_folder import VERSION, DrawsDirError, DrawsFolder, site_file

#: draws a :class:`DrawFiles` gathers in memory before it writes them (per all sites together)
BLOCK_BYTES = 64 * 2**20
#: the longest a :class:`DrawFiles` holds draws before it writes them (seconds)
FLUSH_SECONDS = 2.0
#: bytes read at a time when a resumed run checks its files
READ_BYTES = 16 * 2**20
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
    module): a row per draw, written a block at a time, each block's SHA-256 in the manifest. New files for a
    new run; for a run that continues a checkpoint (``folder.resume``), the run's own files, checked."""

    def __init__(self, folder: DrawsFolder, shapes: Shapes, num_samples: int):
        self.folder, self.shapes, self.num_samples = folder, shapes, num_samples
        self.row_bytes = {n: int(np.prod(shape, dtype=np.int64)) * _numpy_dtype(dtype).itemsize
                          for n, (shape, dtype) in shapes.items()}
        self.block = max(1, min(num_samples, BLOCK_BYTES // max(sum(self.row_bytes.values()), 1)))
        self.buffer = {n: torch.empty((self.block,) + shape, dtype=dtype) for n, (shape, dtype) in shapes.items()}
        self.written, self.pending = 0, 0  # rows on disk; rows in the buffer after them
        # the checksums: the closed blocks' [start, stop, hex], and the open block's hash from row `opened` on
        # (None: a version-1 folder continued, without checksums)
        self.sealed: Dict[str, List[list]] = {n: [] for n in shapes}
        self.hashes: Optional[dict] = {n: hashlib.sha256() for n in shapes}
        self.opened = 0
        sites = {n: {"file": site_file(n), "shape": [num_samples, *shape], "dtype": _numpy_dtype(dtype).name}
                 for n, (shape, dtype) in shapes.items()}
        if folder.resume is None:
            self._create(sites)
            self.offsets = self._offsets()
        else:
            self._reopen(sites)
        self.flushed_at = time.monotonic()

    def path(self, name: str):
        return self.folder.file(name)

    def _offsets(self) -> Dict[str, int]:
        return {n: self._data_offset(self.path(n), (self.num_samples,) + shape, dtype, self.row_bytes[n])
                for n, (shape, dtype) in self.shapes.items()}

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
        folder.update({"format": "pyro-flat draws", "version": VERSION, "run": folder.run,
                       "checkpoint": folder.checkpoint, "num_samples": self.num_samples, "rows": 0, "complete": False,
                       "sites": {n: {**s, "sha256": []} for n, s in sites.items()}})
        for name, (shape, dtype) in self.shapes.items():  # the header of the whole array; rows go into place
            np.lib.format.open_memmap(self.path(name), mode="w+", dtype=_numpy_dtype(dtype),
                                      shape=(self.num_samples,) + shape).flush()

    def _reopen(self, sites: dict) -> None:
        """The files of the run a checkpoint continues: this configuration's, holding the rows it counts, and
        (version 2) the rows its manifest's checksums say, every block (:meth:`_verify`). Nothing is written
        before all is checked."""
        folder, kept = self.folder, self.folder.resume["kept"]
        manifest, fix = folder.manifest, "start a new run (delete the checkpoint, or pass another checkpoint=)"
        version = manifest.get("version")
        if version not in (1, VERSION):
            raise DrawsDirError(f"draws_dir={str(folder.path)!r}: its manifest {str(folder.manifest_path)!r} has "
                                f"version {version!r}, and this pyro-flat reads versions 1 and {VERSION}; continue "
                                f"the run with the pyro-flat that wrote it, or {fix}.")
        listed = {n: {k: v for k, v in s.items() if k != "sha256"} for n, s in manifest["sites"].items()}
        if listed != sites or manifest.get("num_samples") != self.num_samples:
            raise DrawsDirError(f"draws_dir={str(folder.path)!r}: its manifest {str(folder.manifest_path)!r} lists "
                                f"other sites or shapes than this run's ({sites}); {fix}.")
        if manifest.get("rows", -1) < kept:
            raise DrawsDirError(f"draws_dir={str(folder.path)!r} holds {manifest.get('rows')} complete rows, fewer "
                                f"than the {kept} the checkpoint counts; {fix}.")
        for name in self.shapes if kept < self.num_samples else ():  # a finished run's files are only read
            if not os.access(self.path(name), os.W_OK):
                raise DrawsDirError(f"draws_dir file {str(self.path(name))!r} cannot be written (read-only); make "
                                    f"it writable to continue the run, or {fix}.")
        self.offsets = self._offsets()
        if version == 1:
            self.hashes = None
            warnings.warn(f"draws_dir={str(folder.path)!r} was written by an earlier pyro-flat (manifest version 1), "
                          f"which kept no checksums: its first {kept} rows are continued unchecked, and the rest of "
                          "the run is written without checksums too (the folder stays version 1). To have every "
                          "row checked, start a new run (delete the folder and the checkpoint).", stacklevel=2)
        else:
            self._verify(kept)
        self.written = kept
        self._count()  # the rows after these are written again

    def _verify(self, kept: int) -> None:
        """Every block of rows the manifest has a checksum of, in every site's file, read back and hashed: a file
        whose rows are not those written is refused by name (its first damaged rows), before anything is
        written. Then the checksums go on from row ``kept``: the block that holds it is opened again at its
        start (its rows read once more), those after it are dropped (their rows are written again)."""
        folder, rows = self.folder, self.folder.manifest["rows"]
        damaged, blocks = [], {}
        for name in self.shapes:
            recorded = folder.manifest["sites"][name].get("sha256")
            first = next(iter(blocks.values()), recorded)  # every site's blocks are the same rows
            if not _well_formed(recorded, rows) or [b[:2] for b in recorded] != [b[:2] for b in first]:
                raise DrawsDirError(
                    f"draws_dir={str(folder.path)!r}: the checksums of site {name!r} in {str(folder.manifest_path)!r} "
                    f"are not those pyro-flat writes (blocks [start, stop, sha256] from row 0 to its {rows} rows): "
                    f"the manifest was changed after the run wrote it, so the draws of {str(self.path(name))!r} "
                    "cannot be checked. Restore draws.json to continue the run, or start over: delete the folder "
                    f"and the checkpoint{folder._named()}.")
            blocks[name] = recorded
            for start, stop, sha256 in recorded:
                if self._hash(name, start, stop).hexdigest() != sha256:
                    damaged.append(f"{str(self.path(name))!r} (site {name!r}): rows {start} to {stop - 1}")
                    break
        if damaged:
            raise DrawsDirError(
                f"draws_dir={str(folder.path)!r}: the draws of {'; '.join(damaged)} are not the bytes this run wrote "
                f"there: their SHA-256 differs from the one {str(folder.manifest_path)!r} recorded with them, so "
                "the file was changed on disk since (a bad disk, or a program that wrote into it). Nothing was "
                "changed and no draw is returned. To continue the run, restore the file (from a copy); to start "
                f"over, delete the folder and the checkpoint{folder._named()}.")
        for name, recorded in blocks.items():
            before = [b for b in recorded if b[0] < kept]
            last = before[-1] if before else None
            if last is None or (last[1] == kept and last[1] - last[0] >= self.block):
                self.sealed[name], self.opened = before, kept
            else:  # kept falls in this block (or ends it, not full): it grows from its start again
                self.sealed[name], self.opened = before[:-1], last[0]
                self.hashes[name] = self._hash(name, last[0], kept)

    def _hash(self, name: str, start: int, stop: int):
        """The SHA-256 of rows ``start`` to ``stop - 1`` of site ``name``'s file, as the disk holds them."""
        digest, left = hashlib.sha256(), (stop - start) * self.row_bytes[name]
        with open(self.path(name), "rb") as file:
            file.seek(self.offsets[name] + start * self.row_bytes[name])
            while left > 0:
                chunk = file.read(min(left, READ_BYTES))
                if not chunk:
                    break
                digest.update(chunk)
                left -= len(chunk)
        return digest

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
        """Write the buffered rows to their place in each file, to the disk, then count them in the manifest,
        with their checksums (the rows' bytes hashed once, as they are written)."""
        self.flushed_at = time.monotonic()
        if self.pending:
            written = {}
            for name in self.shapes:  # every site's rows on the disk first ...
                data = self.buffer[name][: self.pending].contiguous().numpy().tobytes()
                with open(self.path(name), "r+b") as file:
                    file.seek(self.offsets[name] + self.written * self.row_bytes[name])
                    file.write(data)
                    file.flush()
                    os.fsync(file.fileno())
                written[name] = data
            # ... then hashed and counted together: a flush that fails part-way (a full disk, Ctrl-C) hashes nothing,
            # and its retry writes and hashes the same rows once
            if self.hashes is not None:
                for name, data in written.items():
                    self.hashes[name].update(data)
            self.written, self.pending = self.written + self.pending, 0
        self._count()

    def _count(self) -> None:
        """The manifest's count of complete rows and their checksums, if they are not these (written after the
        rows themselves); a block that holds :data:`BLOCK_BYTES` of draws is closed after."""
        manifest, changes = self.folder.manifest, {}
        if (manifest["rows"], manifest["complete"]) != (self.written, self.written == self.num_samples):
            changes.update(rows=self.written, complete=self.written == self.num_samples)
        if self.hashes is not None:
            sites = {n: {**manifest["sites"][n], "sha256": self._checksums(n)} for n in self.shapes}
            if sites != manifest["sites"]:
                changes["sites"] = sites
        if changes:
            self.folder.update(**changes)
        if self.hashes is not None and self.written - self.opened >= self.block:
            for name in self.shapes:
                self.sealed[name] = self._checksums(name)
                self.hashes[name] = hashlib.sha256()
            self.opened = self.written

    def _checksums(self, name: str) -> List[list]:
        """Site ``name``'s blocks ``[start, stop, sha256]``: the closed ones, and the open one's rows so far."""
        opened = [[self.opened, self.written, self.hashes[name].copy().hexdigest()]] if self.written > self.opened \
            else []
        return self.sealed[name] + opened

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


def _well_formed(blocks, rows: int) -> bool:
    """Whether ``blocks`` are ``[start, stop, sha256]`` entries that follow each other from row 0 to ``rows``."""
    if not isinstance(blocks, list):
        return False
    end = 0
    for block in blocks:
        if not (isinstance(block, list) and len(block) == 3 and all(type(b) is int for b in block[:2])
                and isinstance(block[2], str) and block[0] == end and block[1] > end):
            return False
        end = block[1]
    return end == rows


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty((), dtype=dtype).numpy().dtype


__all__ = ["DrawBuffers", "DrawFiles", "BLOCK_BYTES", "FLUSH_SECONDS"]
