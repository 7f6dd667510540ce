"""What every study shares: its errors, its option checks and a consistent output folder.

A study writes into a fresh temporary folder beside ``--out`` and moves it into place when it is
done, so ``--out`` always holds the files of one run: a run that fails or is killed leaves the
previous output untouched. An existing folder is replaced only if it holds nothing or the output
of an earlier run of the same command (marked by :data:`MARKER`), or with ``overwrite=True``;
anything else is refused, so that ``--out ~/Documents`` cannot wipe a user's files.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Optional

import torch

#: The file that marks a folder as a pyro-flat study's output (it holds the command's name).
MARKER = ".pyro-flat-output"


class StudyError(ValueError):
    """A bad setting of a study (printed as one line by the CLI)."""


def require_positive(option: str, value: float) -> None:
    """A ``StudyError`` naming the command-line ``option`` unless ``value`` is finite and > 0."""
    if isinstance(value, bool) or not (math.isfinite(value) and value > 0):
        raise StudyError(f"{option} must be > 0, got {value}")


def require_int(option: str, value: int, minimum: int) -> None:
    """A ``StudyError`` naming ``option`` unless ``value`` is an integer ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise StudyError(f"{option} must be an integer >= {minimum}, got {value}")


def _replaceable(out: Path, command: str) -> bool:
    if not any(out.iterdir()):
        return True
    marker = out / MARKER
    return marker.is_file() and marker.read_text().strip() == command


def check_output_dir(path: str, command: str, overwrite: bool = False) -> Path:
    """``path`` as a folder the study may (re)place; a ``StudyError`` that says why not."""
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise StudyError(f"--out {path} is a file; pass a directory (it is created if missing)")
    if out.is_dir() and not overwrite and not _replaceable(out, command):
        raise StudyError(f"--out {path} is not empty and is not the output of an earlier "
                         f"`pyro-flat {command}`; pass --overwrite to replace it, or another --out")
    return out


@contextlib.contextmanager
def staged_output(path: str, command: str, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder to write into; on success it replaces ``path`` in one move.

    On an exception the temporary folder is removed and ``path`` stays as it was.
    """
    out = check_output_dir(path, command, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        yield staging
        (staging / MARKER).write_text(command + "\n")
        old: Optional[Path] = None
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            out.replace(old / out.name)
        staging.replace(out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def torch_threads(num_threads: Optional[int]) -> Iterator[None]:
    """Run with ``torch.set_num_threads(num_threads)`` (``None``: unchanged), then restore."""
    before = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
