r"""The folder of a run's streamed draws (``MCMC(..., draws_dir=DIR)``): its checks, its lock, its manifest,
and whose files it holds. The files' format is :mod:`pyro_flat.infer.draws`'s.

- **Names.** Site ``s`` goes to ``DIR/site_file(s)``: the name with every character outside
  ``[A-Za-z0-9._-]`` percent-encoded (its UTF-8 bytes as ``%XX``, ``%`` itself too) and a leading ``.`` as
  ``%2E``, then ``.npy``: ``"layer/w"`` gives ``layer%2Fw.npy``, ``"../outside"`` gives
  ``%2E.%2Foutside.npy``. So every site has a file of its own in ``DIR`` itself, never hidden, never
  outside; a name over 200 characters encoded keeps 150 and a hash (``~`` then 16 hex digits).
- **Checks up front** (:func:`check_draws_dir`, when ``MCMC`` is made): a folder path, not ``""`` (the
  working folder), not an existing file, and writable (or makeable).
- **One run at a time.** A run holds ``DIR/.draws.lock`` (:func:`pyro_flat.storage.locks.exclusive_lock`, as a
  checkpoint does) from its start to its end: another run on ``DIR`` is refused meanwhile; the lock dies
  with its process (a SIGKILL too) and its file goes when the run ends.
- **Nothing that is not the run's own is replaced.** A file at a site's path that no pyro-flat run wrote
  (not in ``DIR/draws.json``) is refused by name, always, before any draw. A folder with another run's
  draws (its manifest) is refused too, unless that is unambiguous: the same ``MCMC`` object's earlier
  ``run``, a run given the ``checkpoint=`` path that wrote them where that file no longer exists (deleted
  to start over, or the run was killed before its first checkpoint), or ``overwrite_draws=True``. Then the
  earlier run's files (those its manifest lists) are removed and new ones written. A run that continues
  a checkpoint continues only its own files: those of the run id the checkpoint holds, all present.
- **What it reads back is what it wrote.** The manifest (version 2) keeps the SHA-256 of every block of rows
  written; a run that continues a checkpoint checks every block of every site before it goes on, and
  refuses a file whose rows changed on disk by name, changing nothing
  (:meth:`pyro_flat.infer.draws.DrawFiles._verify`). A version-1 folder (no checksums) is continued
  unchecked, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from pathlib import Path
from typing import BinaryIO, Callable, Optional, Set

from .locks import exclusive_lock

#: the manifest of a draws folder, and its lock (hidden: no site's file starts with a dot)
MANIFEST, LOCK = "draws.json", ".draws.lock"
FORMAT, VERSION = "pyro-flat draws", 2
_SAFE = re.compile(r"[A-Za-z0-9._-]")


class DrawsDirError(ValueError):
    """A ``draws_dir`` this run cannot write into, or whose files are not this run's."""


def site_file(site: str) -> str:
    """The file name of ``site`` in a draws folder (see the module).

    >>> site_file("fc.weight"), site_file("layer/w"), site_file("../outside")
    ('fc.weight.npy', 'layer%2Fw.npy', '%2E.%2Foutside.npy')
    """
    name = "".join(c if _SAFE.fullmatch(c) else "".join(f"%{b:02X}" for b in c.encode()) for c in site)
    if name.startswith("."):
        name = "%2E" + name[1:]
    if len(name) > 200:
        name = name[:150] + "~" + hashlib.sha256(site.encode()).hexdigest()[:16]
    return (name or "%") + ".npy"


def check_draws_dir(draws_dir, overwrite_draws: bool = False) -> Optional[Path]:
    """``draws_dir`` as a path (``None``: draws in memory) once it is known to be a folder this process can
    write or make (and ``overwrite_draws`` a bool)."""
    if not isinstance(overwrite_draws, bool):
        raise ValueError(f"overwrite_draws must be True or False, got {overwrite_draws!r}.")
    if draws_dir is None:
        return None
    if not isinstance(draws_dir, (str, os.PathLike)):
        raise ValueError(f"draws_dir must be a folder path (str or pathlib.Path), got {type(draws_dir).__name__}.")
    if os.fspath(draws_dir) == "":
        raise ValueError("draws_dir='' names no folder (the draws would go into the working folder); pass a folder "
                         "of their own, e.g. draws_dir='draws'.")
    path = Path(draws_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"draws_dir={str(draws_dir)!r} is a file, not a folder; pass a folder path (a new or empty "
                         f"folder, e.g. {str(path.with_name(path.name + '-draws'))!r}).")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"draws_dir={str(draws_dir)!r} cannot be made: {str(existing)!r} is a file; pass a folder "
                         "path.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"draws_dir={str(draws_dir)!r} cannot be written ({str(existing)!r} is read-only); point it "
                         "at a writable folder.")
    return path


def write_atomically(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """``write(file)`` into a temporary file in ``path``'s folder, flushed to disk, then renamed over ``path``: a
    reader finds the whole file or none."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()


def write_json(path: Path, content: dict) -> None:
    """``content`` to ``path`` atomically (:func:`write_atomically`)."""
    write_atomically(path, lambda file: file.write(json.dumps(content, indent=1).encode()))


class DrawsFolder:
    """``path`` held for one run (see the module): locked, checked, its manifest read (``manifest``, ``None``
    if there is none). ``resume``: the draws entry of the checkpoint this run continues (``None``: a new run);
    ``checkpoint``: the run's checkpoint path; ``own_runs``: the run ids the same ``MCMC`` wrote before (this
    run's is added)."""

    def __init__(self, path: Path, *, resume: Optional[dict] = None, checkpoint: Optional[Path] = None,
                 overwrite: bool = False, own_runs: Optional[Set[str]] = None):
        self.path, self.resume, self._lock = Path(path), resume, None
        self.checkpoint = None if checkpoint is None else str(Path(checkpoint).resolve())
        self.manifest_path = self.path / MANIFEST
        if resume is not None:
            self._check_checkpoint_entry()
            if not self.path.exists():  # nothing to lock: refused, naming the files
                self.manifest = None
                self._check_own_files()
        made = not self.path.exists()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise DrawsDirError(f"draws_dir={str(path)!r} cannot be made ({err}); pass a writable folder.") from None
        self._lock = exclusive_lock(
            self.path / LOCK, f"draws_dir={str(path)!r} is in use by another running process; two runs in one folder "
            "would overwrite each other's draws. Give each run its own draws_dir= folder.", DrawsDirError)
        try:
            for stale in self.path.glob(f".{MANIFEST}.*.tmp"):  # a manifest's write killed halfway (the lock is ours)
                stale.unlink()
            self.manifest = self._read_manifest()
            if resume is not None:
                self._check_own_files()
            elif self.manifest is not None and not (overwrite or self.manifest.get("run") in (own_runs or ())
                                                    or self._started_over()):
                raise DrawsDirError(
                    f"draws_dir={str(path)!r} holds the draws of another pyro-flat run ({self._describe()}; see "
                    f"{str(self.manifest_path)!r}): a new run would replace them. Pass another draws_dir= (a new or "
                    "empty folder), continue that run with its checkpoint=, or pass overwrite_draws=True to replace "
                    "them.")
        except BaseException:
            self.close()
            if made:
                _remove_if_empty(self.path)
            raise
        self.run = self.manifest["run"] if resume is not None else uuid.uuid4().hex
        if own_runs is not None:
            own_runs.add(self.run)

    def file(self, site: str) -> Path:
        return self.path / site_file(site)

    def _read_manifest(self) -> Optional[dict]:
        if not self.manifest_path.exists():
            return None
        try:
            manifest = json.loads(self.manifest_path.read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            manifest = None
        if not _is_manifest(manifest):
            raise DrawsDirError(f"draws_dir={str(self.path)!r} holds {str(self.manifest_path)!r}, which is not a "
                                "pyro-flat draws manifest; pyro-flat never replaces files it did not write. Pass "
                                "another draws_dir= (a new or empty folder).")
        return manifest

    def _describe(self) -> str:
        m = self.manifest
        state = "finished" if m.get("complete") else "unfinished"
        by = f"checkpoint={m['checkpoint']!r}" if m.get("checkpoint") else "a run without a checkpoint"
        return f"{m.get('rows')} of {m.get('num_samples')} rows, {state}, written by {by}"

    def _named(self) -> str:
        return "" if self.checkpoint is None else f" {self.checkpoint!r}"

    def _started_over(self) -> bool:
        """The manifest's run had this run's checkpoint path, where no checkpoint is now: it cannot be continued."""
        return self.checkpoint is not None and self.manifest.get("checkpoint") == self.checkpoint \
            and not Path(self.checkpoint).exists()

    def _check_checkpoint_entry(self) -> None:
        if "draws_dir" not in self.resume:
            raise DrawsDirError("the checkpoint holds its draws itself, not in a draws_dir: resume it without "
                                "draws_dir=, or start a new run.")
        if "run" not in self.resume:
            raise DrawsDirError(f"the checkpoint's draws are in draws_dir={str(self.path)!r}, but it was written by "
                                "an earlier pyro-flat that did not record which files are its own; start a new run "
                                "(delete the checkpoint, or pass another checkpoint=).")

    def _check_own_files(self) -> None:
        """The files of the checkpoint's run are all here, and they are that run's (see the module)."""
        files = [MANIFEST] + list(self.resume.get("files", []))
        missing = [str(self.path / f) for f in files if not (self.path / f).exists()]
        fix = "start a new run: delete the checkpoint, or pass another checkpoint= (and another draws_dir=)"
        if missing:
            raise DrawsDirError(f"draws_dir={str(self.path)!r}: the checkpoint{self._named()} continues a run whose "
                                f"first {self.resume['kept']} draws were written there, but {', '.join(missing)} "
                                f"{'is' if len(missing) == 1 else 'are'} missing (deleted or moved). Put them back "
                                f"to continue it, or {fix}.")
        if self.manifest.get("run") != self.resume["run"]:
            raise DrawsDirError(f"draws_dir={str(self.path)!r} holds another run's draws ({self._describe()}), not "
                                f"those of the run the checkpoint{self._named()} continues: another run replaced them, "
                                f"so the draws it counts are gone. To sample again, {fix}.")

    def update(self, manifest: Optional[dict] = None, **changes) -> None:
        """Write the manifest (``manifest``, or the one held with ``changes``) atomically."""
        self.manifest = {**(self.manifest if manifest is None else manifest), **changes}
        write_json(self.manifest_path, self.manifest)

    def close(self, files=None) -> None:
        """Write what ``files`` (a :class:`~pyro_flat.infer.draws.DrawFiles`) hold, then let another run use the folder
        (the lock's file goes)."""
        try:
            if files is not None:
                files.flush()
        finally:
            if self._lock is not None:
                self._lock.close(remove=True)
                self._lock = None


def _is_manifest(manifest) -> bool:
    """Whether ``manifest`` is a pyro-flat draws manifest, whose files are plain names in the folder."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return False
    sites = manifest.get("sites") if isinstance(manifest.get("sites"), dict) else {None: None}
    files = [s.get("file") if isinstance(s, dict) else None for s in sites.values()]
    return isinstance(manifest.get("rows"), int) and all(
        isinstance(f, str) and f == os.path.basename(f) and not f.startswith(".") for f in files)


def _remove_if_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


__all__ = ["DrawsFolder", "DrawsDirError", "check_draws_dir", "site_file", "MANIFEST", "write_atomically", "write_json"]
