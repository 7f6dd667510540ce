"""What every study shares: its errors, its option checks and a consistent output folder.

A study writes into a fresh temporary folder beside ``--out`` (``.NAME.partial-PID-*``) and moves
it into place when it is done, so ``--out`` always holds the files of one run: a run that fails,
is interrupted before it has anything to write, or is killed leaves the previous output untouched.
An existing folder is replaced only if it holds nothing or the output of an earlier run of the
same command (marked by :data:`MARKER`), or with ``overwrite=True``; anything else is refused, so
that ``--out ~/Documents`` cannot wipe a user's files. ``--out`` is checked (kind, owner, write
permission) before any work. SIGTERM is turned into :class:`Terminated` (a ``KeyboardInterrupt``)
while a study runs, so it cleans up as Ctrl-C does; once the work is done and only the files are
being written, both wait until the output is in place (:func:`hold_signals`); the folders a SIGKILL leaves behind are
removed by the next run into the same ``--out`` (and a previous run caught half-way through the
final swap is put back).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
from contextvars import ContextVar
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

#: The file that marks a folder as a pyro-flat study's output: the command's name on its first
#: line, then the names of the files the run wrote (a folder holding any other file is not replaced).
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


class Terminated(KeyboardInterrupt):
    """SIGTERM received while a study runs: handled as Ctrl-C (the draws made so far are kept)."""


def require_seed(value: int) -> None:
    """A ``StudyError`` naming ``--seed`` unless it is an integer torch and numpy accept (0..2³²-1)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2 ** 32:
        raise StudyError(f"--seed must be an integer from 0 to 2**32 - 1, got {value}")


def require_memory(option: str, num_bytes: float, share: float = 0.5) -> None:
    """A ``StudyError`` naming ``option`` when a run would keep more than ``share`` of this machine's
    memory (``num_bytes``, estimated before any work): :func:`pyro_flat.validation.check_memory`."""
    from ..validation import check_memory  # imports no torch

    try:
        check_memory(option, num_bytes, share=share)
    except ValueError as err:
        raise StudyError(str(err)) from None


def _replaceable(out: Path, command: str) -> bool:
    """Empty, or an earlier run of ``command`` holding only the files it wrote.

    A marker written by an older pyro-flat names the command alone, not the files that run wrote:
    nothing then says which files are the study's, so such a folder counts as holding files the run
    did not write unless the marker is all it holds (``--overwrite`` replaces it)."""
    if not any(out.iterdir()):
        return True
    marker = out / MARKER
    if not marker.is_file():
        return False
    try:
        lines = marker.read_text().split("\n")
    except (OSError, UnicodeDecodeError):  # unreadable: not provably ours
        return False
    if lines[0].strip() != command:
        return False
    written = {line for line in lines[1:] if line}
    return {p.name for p in out.iterdir()} <= written | {MARKER}


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_output_dir(path: str, command: str, overwrite: bool = False) -> Path:
    """``path`` as a folder the study may (re)place; a ``StudyError`` that says why not. Called before any work:
    a file, a folder of other files, and a folder (or parent) the user may not write are refused at once."""
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise StudyError(f"--out {path} is a file; pass a directory (it is created if missing)")
    cwd = Path.cwd().resolve()
    if out.resolve() == cwd or out.resolve() in cwd.parents:
        raise StudyError(f"--out {path!r} is the current folder or one of its parents, which a run cannot "
                         "replace; pass a new folder's name, e.g. --out pyro-flat-out/run1")
    if out.is_dir() and not overwrite and not _replaceable(out, command):
        raise StudyError(f"--out {path} is not empty and is not the output of an earlier "
                         f"`pyro-flat {command}` (or holds files that run did not write); pass --overwrite "
                         "to replace it, or another --out")
    parent = _nearest_existing(out.parent.absolute())
    if not parent.is_dir():
        raise StudyError(f"--out {path}: {parent} is a file, not a directory; pass another --out")
    for folder in ([out] if out.is_dir() else []) + [parent]:
        if not os.access(folder, os.W_OK | os.X_OK):
            raise StudyError(f"--out {path}: no permission to write in {folder}; pass an --out you can "
                             "write (the run's folder is created beside it and moved into place)")
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale_staging(out: Path) -> List[Path]:
    """Remove the staging folders an earlier run into ``out`` left when it was killed; returns them.

    A folder ``.NAME.partial-PID-*`` or ``.NAME.old-PID-*`` is stale when process PID is gone. A
    stale ``.old-`` folder holds the previous output when the kill came between the two moves of
    the final swap: if ``out`` is missing it is put back, not removed.
    """
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.(partial|old)-(\d+)-")
    removed = []
    if not out.parent.is_dir():
        return removed
    for folder in out.parent.iterdir():
        match = pattern.match(folder.name)
        if not (match and folder.is_dir()) or _pid_alive(int(match.group(2))):
            continue
        kept = folder / out.name
        if match.group(1) == "old" and kept.is_dir() and not out.exists():
            kept.replace(out)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


class _Signals:
    """What the study's signal handlers do: raise at once, or (once the work is done and the files
    are being written) remember the signal until the output is in place."""

    holding = False
    received: Optional[int] = None  # a signal held while writing, for the exit code


def hold_signals() -> None:
    """From now until the output is in place, Ctrl-C and SIGTERM wait: the run's work is done and
    only its files are being written, so stopping now would throw the finished draws away."""
    _Signals.holding = True


def held_signal() -> Optional[int]:
    """The signal (``signal.SIGINT`` or ``signal.SIGTERM``) held while the last output was written."""
    return _Signals.received


@contextlib.contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """Within the block, SIGINT raises ``KeyboardInterrupt`` and SIGTERM :class:`Terminated`, unless
    :func:`hold_signals` was called (main thread only; the previous handlers are restored after)."""
    _Signals.holding, _Signals.received = False, None
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if _Signals.holding:
            _Signals.received = signum
            print(f"pyro-flat: {signal.Signals(signum).name} received while the files are written: "
                  "finishing them first", file=sys.stderr)
            return
        raise Terminated(f"terminated by signal {signum}") if signum == signal.SIGTERM else KeyboardInterrupt

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        _Signals.holding = False
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def staged_output(path: str, command: str, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder to write into; on success it replaces ``path`` in one move.

    On an exception (Ctrl-C and SIGTERM included) the temporary folder is removed and ``path``
    stays as it was. Enter it before the study's work: it checks ``path`` first.
    """
    out = check_output_dir(path, command, overwrite)
    remove_stale_staging(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-{os.getpid()}-", dir=out.parent))
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp's 0700 would outlive the run: the user's umask instead
    except OSError as err:
        raise StudyError(f"--out {path}: cannot create a folder beside it ({err.strerror or err}); "
                         "pass an --out you can write") from err
    try:
        with signals_as_interrupt():
            yield staging
            _publish(staging, out, command)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _publish(staging: Path, out: Path, command: str) -> None:
    """Move ``staging`` to ``out`` (the previous ``out`` aside, then deleted), never half-done: it
    runs inside :func:`signals_as_interrupt` with the signals held."""
    written = sorted(p.name for p in staging.iterdir())
    (staging / MARKER).write_text("\n".join([command, *written]) + "\n")
    old: Optional[Path] = None
    hold_signals()  # the two moves below are never interrupted between them
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-{os.getpid()}-", dir=out.parent))
        out.replace(old / out.name)
    staging.replace(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


#: why the study in progress runs on its thread count (:func:`study_output` sets it; :func:`threads_record` reads it)
_THREADS_WHY: ContextVar[str] = ContextVar("pyro_flat_threads_why", default="")


@contextlib.contextmanager
def study_output(config, log: Callable[[str], None] = print) -> Iterator[Path]:
    """:func:`staged_output` for a study's config (``out``, ``COMMAND``, ``overwrite``), run with
    torch's thread count set to ``config.threads``; ``None`` is :func:`auto_threads`' choice (said
    through ``log`` when it is one thread). :func:`threads_record` says inside which count ran and why."""
    threads, why = config.threads, "set by --threads (under torchrun: each rank's share of the machine's cores)"
    if threads is None:
        threads, busy = auto_threads()
        why = busy or "torch's count in this process, by default one per core"
        if busy:
            log(busy)
    with staged_output(config.out, config.COMMAND, config.overwrite) as staging, torch_threads(threads):
        token = _THREADS_WHY.set(why)
        try:
            yield staging
        finally:
            _THREADS_WHY.reset(token)


def threads_record() -> dict:
    """``{"count", "why"}``: the torch threads the study in progress runs on (inside :func:`study_output`),
    for its report: a busy machine drops a study to one thread, which changes its draws."""
    import torch

    return {"count": torch.get_num_threads(), "why": _THREADS_WHY.get()}


#: a machine whose 1-minute load average is at least its core count minus this is busy (its cores are taken)
BUSY_LOAD_MARGIN = 0.5


def auto_threads() -> Tuple[Optional[int], str]:
    """One thread on a busy machine (1-minute load average at least the core count minus
    :data:`BUSY_LOAD_MARGIN`), else ``None`` (torch's default, one per core), and the sentence that
    says so.

    Waiting OpenMP threads spin: under load a run on all cores slows down many times (see
    :class:`~pyro_flat.experiments.study_config.StudyConfig`), one on a single thread hardly at all."""
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):  # not POSIX: no load average
        return None, ""
    if cores > 1 and load >= cores - BUSY_LOAD_MARGIN:
        return 1, (f"the machine is busy (load average {load:.1f} on {cores} cores): running on one thread, "
                   "which suffers least from the load (--threads N to choose)")
    return None, ""


def seeds_over_ranks(ranks, seeds: Sequence[int], fit_seed: Callable[[int], Tuple[list, dict]],
                     what: str) -> Optional[Tuple[list, dict]]:
    """``fit_seed(seed) -> (rows, extras)`` for this rank's ``seeds`` (the i-th on rank i mod R); on rank 0 every seed's
    rows in the order of ``seeds``, and their extras merged (``None`` elsewhere). A raising rank makes all raise."""
    mine, error = [], None  # (position in seeds, result)
    try:
        for i, seed in enumerate(seeds):
            if i % ranks.world_size == ranks.rank:
                mine.append((i, fit_seed(seed)))
    except Exception as err:
        if not ranks.distributed:
            raise
        error = err
    failure = ranks.check(error)
    if failure is not None:
        raise failure
    gathered = ranks.gather(mine, what)
    results = None if gathered is None else [r for _, r in sorted((p for rank in gathered for p in rank), key=lambda p: p[0])]
    return None if results is None else ([row for rows, _ in results for row in rows],
                                         {k: v for _, extras in results for k, v in extras.items()})


def across_ranks(config, lead: Callable, follow: Callable, log: Callable[[str], None] = print):
    """Run a study on this process's rank of ``torchrun``'s group, or alone: what rank 0 and the other
    ranks each do, written once for every study.

    Rank 0 (or the only process) runs ``lead(config, staging, ranks)``, which writes the study's
    files into ``staging``: the fresh folder that replaces ``config.out`` once ``lead`` returns
    (:func:`study_output`); it logs what it wrote and returns ``lead``'s report. The other ranks
    wait until that folder is usable (an unusable ``--out`` stops them with rank 0's error), run
    ``follow(config, ranks)``, their share of the work, on ``config.threads`` torch threads, write
    nothing and return ``{"rank": rank}``. Under ``torchrun`` each rank gets its share of the cores
    (:func:`per_rank_threads`); every rank leaves the group at the end, at once if it raised."""
    from ..distributed import init_from_env

    ranks = init_from_env()
    try:
        if ranks.distributed:
            config = per_rank_threads(config)
        if ranks.is_main:
            result = _lead(config, ranks, lead, log)
        else:
            _follow(config, ranks, follow)
            result = {"rank": ranks.rank}
    except BaseException:
        ranks.finish(wait=False)
        raise
    ranks.finish()
    return result


def _lead(config, ranks, lead: Callable, log: Callable[[str], None]):
    """Rank 0: :func:`study_output` around ``lead``; once the folder is usable the other ranks are
    told to start, and an error before that (``--out`` not usable) stops them with it."""
    ready = False
    try:
        with study_output(config, log) as staging:
            ready = True
            if ranks.distributed:
                ranks.check(None)  # the output folder is usable: the other ranks start
            report = lead(config, staging, ranks)
    except Exception as err:
        if ranks.distributed and not ready:
            ranks.check(err)
        raise
    out = Path(config.out).expanduser()
    log(f"wrote {out}: {', '.join(sorted(p.name for p in out.iterdir() if p.name != MARKER))}")
    return report


def _follow(config, ranks, follow: Callable) -> None:
    """A rank other than 0: ``follow`` once rank 0's output folder is ready, or rank 0's error."""
    failure = ranks.check(None)
    if failure is not None:
        raise failure
    with torch_threads(config.threads):
        follow(config, ranks)


def per_rank_threads(config):
    """``config`` with each of the ranks on this machine given its share of the cores (unless
    ``--threads`` says otherwise)."""
    from dataclasses import replace

    if config.threads is not None:
        return config
    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    return replace(config, threads=max(1, (os.cpu_count() or 1) // local))


@contextlib.contextmanager
def torch_threads(num_threads: Optional[int]) -> Iterator[None]:
    """Run with ``torch.set_num_threads(num_threads)`` (``None``: unchanged), then restore."""
    import torch  # here, so that the CLI's option checks do not import it

    before = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
