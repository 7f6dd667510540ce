"""Studies that survive a kill: their samplers' checkpoints beside ``--out``, and ``--resume``.

Each sampler of a study writes its checkpoints (:mod:`pyro_flat.checkpoint`) into ``.NAME.checkpoints/``
beside ``--out``, with the study's options in ``options.json``; ``--resume`` continues a killed run from
them and refuses other options; a run without it starts them afresh.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional

from .output import StudyError


#: options that do not change a study's results: --resume may change them
RUN_ONLY_OPTIONS = ("resume", "progress", "threads", "out", "overwrite", "checkpoint_every")


def checkpoint_folder(out: str) -> Path:
    """Where a study keeps its samplers' checkpoints: beside ``--out`` (``.NAME.checkpoints/``), so that ``--out``
    holds one run's files and a run killed before its first draw leaves it as it was."""
    out = Path(out).expanduser()
    return out.parent / f".{out.name}.checkpoints"


def study_checkpoints(config, distributed: bool, log: Callable[[str], None] = print) -> Optional[Path]:
    """The folder for this run's checkpoints (``None`` across ranks): with ``--resume`` the killed run's, kept;
    otherwise emptied, so that an old run's checkpoints never continue into a new one."""
    folder = checkpoint_folder(config.out)
    if distributed:
        if config.resume:
            raise StudyError("--resume continues a run of one process; runs across torchrun's ranks write no "
                             "checkpoints yet")
        return None
    # as JSON has them (a tuple of --methods reads back as a list)
    options = json.loads(json.dumps({k: v for k, v in asdict(config).items() if k not in RUN_ONLY_OPTIONS}, default=str))
    record = folder / "options.json"
    if config.resume:
        found = sorted(p.name for p in folder.glob("*.ckpt")) if folder.is_dir() else []
        if found and record.exists():
            saved = json.loads(record.read_text())
            changed = [f"--{k.replace('_', '-')} {options.get(k)!r} here, {saved.get(k)!r} in the killed run"
                       for k in sorted(set(saved) | set(options)) if saved.get(k) != options.get(k)]
            if changed:
                raise StudyError(f"--resume: the killed run had other options: {'; '.join(changed)}. Run it again with "
                                 "its options, or without --resume to start a new run")
        log(f"--resume: continuing from {folder} ({', '.join(found)})" if found else
            f"--resume: no checkpoints in {folder} (the last run completed, or stopped before its first checkpoint): "
            "starting from the beginning")
    elif folder.exists():
        log(f"removed the checkpoints of an earlier, unfinished run in {folder} (--resume continues such a run)")
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(options, default=str))
    return folder


__all__ = ["checkpoint_folder", "study_checkpoints", "RUN_ONLY_OPTIONS"]
