"""Studies that survive a kill: their samplers' checkpoints beside ``--out``, and ``--resume``.

Each sampler of a study writes its checkpoints (:mod:`pyro_flat.storage.checkpoint`) into ``.NAME.checkpoints/``
beside ``--out``, with the study's options in ``options.json``; ``--resume`` continues a killed run from
them and refuses other options. A run with neither ``--resume`` nor ``--overwrite`` into an ``--out`` whose
unfinished run left checkpoints there (a run killed, stopped or failed after its first checkpoint; with this
run's options or others) is refused before it deletes or writes anything (:func:`refuse_unfinished_run`):
``--resume`` continues that run, ``--overwrite`` discards its checkpoints. The same rule for every study, here.

One run at a time: a study runs inside :func:`study_lock`, which holds ``.NAME.checkpoints.lock`` beside
``--out`` (:func:`pyro_flat.storage.locks.exclusive_lock`) from before it touches the checkpoints until it
has removed them at the end, so a second run into the same ``--out`` (with ``--resume`` or without) is
refused and removes nothing while the first one runs. The operating system drops the lock when its process
ends, however it ends (a SIGKILL too): a killed run never blocks the ``--resume`` that continues it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Set

from ..storage.locks import exclusive_lock
from .output import StudyError, check_output_dir


#: options that do not change a study's results: --resume may change them
RUN_ONLY_OPTIONS = ("resume", "progress", "threads", "out", "overwrite", "checkpoint_every")

#: the lock files :func:`study_lock` holds in this process (:func:`study_checkpoints` runs only under one)
_HELD: Set[Path] = set()


def checkpoint_folder(out: str) -> Path:
    """Where a study keeps its samplers' checkpoints: beside ``--out`` (``.NAME.checkpoints/``), so that ``--out``
    holds one run's files and a run killed before its first draw leaves it as it was."""
    out = Path(out).expanduser()
    return out.parent / f".{out.name}.checkpoints"


def study_lock_file(out: str) -> Path:
    """The file :func:`study_lock` locks: ``.NAME.checkpoints.lock`` beside ``--out``, outside the checkpoint
    folder, which a run removes while it holds the lock."""
    folder = checkpoint_folder(out)
    return (folder.parent / f"{folder.name}.lock").absolute()


def _other_rank() -> bool:
    """A rank other than 0 of a run under ``torchrun``: rank 0 holds the lock for the whole run."""
    from ..distributed.group import launched_by_torchrun

    return launched_by_torchrun() and int(os.environ["RANK"]) != 0


@contextlib.contextmanager
def study_lock(config) -> Iterator[None]:
    """Hold ``config.out``'s checkpoints for this run, from before :func:`study_checkpoints` until the run has
    removed them (or kept them for ``--resume``): a ``StudyError`` naming ``--out``, and nothing removed, when
    another run holds them. Released however the block ends (an error, Ctrl-C); a killed run's lock dies with it.
    ``--out`` is checked first (:func:`~.output.check_output_dir`), so an unusable one is said as before; once the
    lock is held, an unfinished run's checkpoints without ``--resume`` or ``--overwrite`` are refused
    (:func:`refuse_unfinished_run`), the folder and the lock file left as they were."""
    if _other_rank():
        yield
        return
    check_output_dir(config.out, config.COMMAND, config.overwrite)
    path = study_lock_file(config.out)
    busy = (f"--out {config.out} is in use by another run (its checkpoints in {checkpoint_folder(config.out)} are "
            "left as they are): wait until it ends, or pass another --out")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = path.exists()  # a killed run's lock file: a refused run leaves it as it found it
        lock = exclusive_lock(path, busy, StudyError)
    except OSError as err:
        raise StudyError(f"--out {config.out}: cannot create {path.name} beside it ({err.strerror or err}); "
                         "pass an --out you can write") from err
    try:  # under the lock: a running run's checkpoints are the busy message's, not an unfinished run's
        refuse_unfinished_run(config)
    except StudyError:
        if lock is not None:
            lock.close(remove=not kept)
        raise
    _HELD.add(path)
    try:
        yield
    finally:
        _HELD.discard(path)
        if lock is not None:
            lock.close(remove=True)


def study_checkpoints(config, distributed: bool, log: Callable[[str], None] = print) -> Optional[Path]:
    """The folder for this run's checkpoints (``None`` across ranks): with ``--resume`` the killed run's, kept;
    otherwise emptied (an unfinished run's checkpoints only with ``--overwrite``: :func:`study_lock` refused the
    run without it), so that an old run's checkpoints never continue into a new one. Runs inside
    :func:`study_lock` (``with study_lock(config):``), so that it never touches a running run's checkpoints."""
    folder = checkpoint_folder(config.out)
    if distributed:
        if config.resume:
            raise StudyError("--resume continues a run of one process; runs across torchrun's ranks write no "
                             "checkpoints yet")
        return None
    if study_lock_file(config.out) not in _HELD:
        raise RuntimeError("study_checkpoints(config) runs inside `with study_lock(config):`, which keeps other "
                           "runs away from the checkpoints")
    options = _run_options(config)
    record = folder / OPTIONS_FILE
    if config.resume:
        found = unfinished_checkpoints(folder)
        if found and record.exists():
            changed = _changed_options(json.loads(record.read_text()), options)
            if changed:
                raise StudyError(f"--resume: the killed run had other options: {'; '.join(changed)}. Run it again with "
                                 "its options, or with --overwrite instead of --resume to discard it and start a new run")
        log(f"--resume: continuing from {folder} ({', '.join(found)})" if found else
            f"--resume: no checkpoints in {folder} (the last run completed, or stopped before its first checkpoint): "
            "starting from the beginning")
    elif folder.exists():
        found = unfinished_checkpoints(folder)  # options.json alone: nothing to continue
        if found:  # --overwrite (refuse_unfinished_run let it through)
            log(f"--overwrite: discarded the checkpoints an earlier, unfinished run left in {folder} "
                f"({_names(found)})")
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(options, default=str))
    return folder


#: the file of a study's options in its checkpoint folder (written by :func:`study_checkpoints`)
OPTIONS_FILE = "options.json"


def _run_options(config) -> dict:
    """The options of ``config`` that change a study's results, as JSON has them (a tuple reads back as a list)."""
    return json.loads(json.dumps({k: v for k, v in asdict(config).items() if k not in RUN_ONLY_OPTIONS}, default=str))


def _changed_options(saved: dict, options: dict) -> List[str]:
    """``--seed 1 here, 0 in the killed run`` for each option of ``options`` other than in ``saved``."""
    return [f"--{k.replace('_', '-')} {options.get(k)!r} here, {saved.get(k)!r} in the killed run"
            for k in sorted(set(saved) | set(options)) if saved.get(k) != options.get(k)]


def _names(found: List[str], shown: int = 6) -> str:
    return ", ".join(found[:shown]) + (f" and {len(found) - shown} more" if len(found) > shown else "")


def unfinished_checkpoints(folder: Path) -> List[str]:
    """The names of the files an unfinished run left in its checkpoint ``folder`` (sorted). Not counted, since they
    hold nothing to continue: ``options.json`` (written before any work), a checkpoint's lock file (made when its
    sampler starts, left by a kill) and a half-written temporary file (a kill during the first write)."""
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir()
                  if p.name != OPTIONS_FILE and not p.name.endswith((".lock", ".tmp")))


def refuse_unfinished_run(config) -> None:
    """A ``StudyError`` when ``config.out``'s checkpoint folder holds an unfinished run's checkpoints (a run killed,
    stopped or failed after its first checkpoint) and ``config`` has neither ``resume`` nor ``overwrite``: a new run
    would otherwise delete them. It says where they are, that ``--resume`` continues that run (with that run's
    options, named when they differ) and that ``--overwrite`` discards them. Every study's rule, checked by
    :func:`study_lock` before the run deletes or writes anything."""
    if getattr(config, "resume", False) or getattr(config, "overwrite", False):
        return
    folder = checkpoint_folder(config.out)
    found = unfinished_checkpoints(folder)
    if not found:
        return
    try:
        changed = _changed_options(json.loads((folder / OPTIONS_FILE).read_text()), _run_options(config))
    except (OSError, ValueError, AttributeError):  # no options.json, or not one of ours: nothing to compare
        changed = None
    if changed:
        shown = "; ".join(changed[:4]) + (f"; and {len(changed) - 4} more" if len(changed) > 4 else "")
        resume = f"--resume with that run's options continues it (this command differs: {shown})"
    else:
        resume = "the same command with --resume continues that run"
    raise StudyError(f"--out {config.out}: an unfinished run's checkpoints are in {folder} ({_names(found)}): it was "
                     f"killed, stopped or failed before its end; {resume}, and --overwrite discards its checkpoints "
                     "and starts this run. Nothing was deleted or written")


def checkpoint_study_error(config, err: Exception) -> StudyError:
    """A checkpoint's error (:class:`~pyro_flat.storage.checkpoint.CheckpointError`) as one line: it names ``--resume``
    only when the run was given it."""
    return StudyError(f"--resume: {err}" if config.resume else str(err))


__all__ = ["checkpoint_folder", "study_checkpoints", "study_lock", "study_lock_file", "checkpoint_study_error",
           "refuse_unfinished_run", "unfinished_checkpoints", "RUN_ONLY_OPTIONS"]
