r"""One run at a time on a file or folder: an exclusive ``fcntl.flock`` on a lock file.

The operating system drops the lock when its process ends, however it ends (a SIGKILL too), so a killed
run never leaves a stale lock behind. A lock may remove its file when it is released
(``remove=True``): whoever locks checks, once it holds the lock, that the file it locked is still the one
at the path (a run that locked a file removed under it tries again), so two runs never both hold one.

>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "run.lock")
>>> lock = exclusive_lock(path, "busy")
>>> exclusive_lock(path, "in use by another run")
Traceback (most recent call last):
...
pyro_flat.storage.locks.LockBusy: in use by another run
>>> lock.close(remove=True); os.path.exists(path)
False
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Type


class LockBusy(ValueError):
    """The lock is held by another running process."""


class FileLock:
    """An exclusive lock held on ``path`` (see the module); :meth:`close` lets another run take it."""

    def __init__(self, path: Path, handle):
        self.path, self._handle = path, handle

    def close(self, remove: bool = False) -> None:
        """Release the lock; with ``remove``, remove its file first (while it is still held)."""
        if self._handle is None:
            return
        if remove:
            try:
                self.path.unlink()
            except OSError:
                pass
        self._handle.close()
        self._handle = None


def exclusive_lock(path, busy: str, error: Type[Exception] = LockBusy) -> Optional[FileLock]:
    """Lock ``path`` (made if missing) for this process, or raise ``error(busy)`` at once if another holds it
    (``None`` where ``fcntl`` is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on Linux or macOS
        return None
    path = Path(path)
    while True:
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise error(busy) from None
        try:
            here, held = os.stat(path), os.fstat(handle.fileno())
            if (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino):
                return FileLock(path, handle)
        except FileNotFoundError:
            pass
        handle.close()  # its holder removed the file as it let go: lock the one at the path now


__all__ = ["exclusive_lock", "FileLock", "LockBusy"]
