"""One study run at a time on an ``--out``: a running study holds its checkpoints (:func:`study_lock`), a second
run into the same ``--out`` is refused and removes nothing, and a killed run's lock does not block its ``--resume``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, Dict

import pytest

from pyro_flat.experiments.output import StudyError
from pyro_flat.experiments.resume import checkpoint_folder, study_checkpoints, study_lock, study_lock_file

#: seconds the holder may take to start (it imports pyro_flat), and the most it ever lives
START_TIMEOUT = 60
HOLDER_LIFETIME = 120


@dataclass
class Config:
    """The fields of a study's config that :func:`study_lock` and :func:`study_checkpoints` read."""

    out: str
    resume: bool = False
    seed: int = 0
    overwrite: bool = False
    COMMAND: ClassVar[str] = "mnist79"


#: a run of the study, as far as its checkpoints go: it takes the lock, writes a checkpoint, says so, then runs on
HOLDER = """
import json, sys, time
sys.path.insert(0, sys.argv[3])
from pyro_flat.experiments.resume import study_checkpoints, study_lock
from test_study_resume_lock import Config

config = Config(**json.loads(sys.argv[1]))
with study_lock(config):
    folder = study_checkpoints(config, False, lambda text: None)
    (folder / "sgld.ckpt").write_bytes(b"the running run's state \\x00\\x01")
    print("holding", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _snapshot(folder: Path) -> Dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _start_holder(config: Config) -> subprocess.Popen:
    """A process that holds ``config``'s study lock (through :func:`study_lock`, as a study does) until it is
    killed, or for at most :data:`HOLDER_LIFETIME` seconds; returned once it holds it."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER, json.dumps(asdict(config)), str(HOLDER_LIFETIME),
                                str(Path(__file__).parent)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(START_TIMEOUT)
    if not lines or lines[0].strip() != "holding":
        process.kill()
        _, err = process.communicate(timeout=30)
        pytest.fail(f"the process holding the lock did not start: {lines} {err[-2000:]}")
    return process


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.communicate(timeout=30)


def test_a_second_run_is_refused_while_one_runs_and_a_killed_runs_lock_does_not_block(tmp_path):
    out = str(tmp_path / "same")
    folder = checkpoint_folder(out)
    holder = _start_holder(Config(out))
    try:
        before = _snapshot(folder)
        assert set(before) == {"options.json", "sgld.ckpt"}
        for other in (Config(out, seed=1), Config(out, resume=True), Config(out, resume=True, seed=1)):
            said = []
            with pytest.raises(StudyError) as refused:
                with study_lock(other):
                    study_checkpoints(other, False, said.append)
            message = str(refused.value)
            assert message.startswith(f"--out {out} ") and "another run" in message and "another --out" in message
            assert "wait" in message and "\n" not in message
            assert said == []  # it never got as far as the checkpoints
            assert _snapshot(folder) == before  # byte for byte
        assert holder.poll() is None  # the first run runs on
        holder.send_signal(signal.SIGKILL)  # the first run is killed: the operating system drops its lock
        holder.wait(timeout=30)
    finally:
        _stop(holder)
    assert _snapshot(folder) == before
    said = []
    with study_lock(Config(out, resume=True)):  # --resume continues the killed run
        assert study_checkpoints(Config(out, resume=True), False, said.append) == folder
    assert said == [f"--resume: continuing from {folder} (sgld.ckpt)"] and _snapshot(folder) == before
    assert not study_lock_file(out).exists()  # released, and its file gone


def test_a_new_run_that_clears_an_earlier_runs_checkpoints_does_not_speak_of_resume(tmp_path):
    out = str(tmp_path / "run")
    folder = checkpoint_folder(out)
    folder.mkdir()
    (folder / "sgld.ckpt").write_bytes(b"an earlier run's state")
    said = []
    with study_lock(Config(out, seed=1)):
        assert study_checkpoints(Config(out, seed=1), False, said.append) == folder
    assert [p.name for p in folder.iterdir()] == ["options.json"]
    assert len(said) == 1 and not said[0].startswith("--resume") and str(folder) in said[0], said
    said.clear()
    with study_lock(Config(out)):  # nothing to clear: nothing said
        study_checkpoints(Config(out), False, said.append)
    assert said == []


@pytest.mark.parametrize("stop", [RuntimeError("a failed run"), KeyboardInterrupt()])
def test_the_lock_is_released_however_the_run_ends(tmp_path, stop):
    out = str(tmp_path / "run")
    with pytest.raises(type(stop)):
        with study_lock(Config(out)):
            study_checkpoints(Config(out), False, lambda text: None)
            raise stop
    assert not study_lock_file(out).exists()
    with study_lock(Config(out, resume=True)):  # taken again at once
        assert study_checkpoints(Config(out, resume=True), False, lambda text: None) == checkpoint_folder(out)


def test_checkpoints_are_touched_only_under_the_lock(tmp_path):
    out = str(tmp_path / "run")
    folder = checkpoint_folder(out)
    folder.mkdir()
    (folder / "sgld.ckpt").write_bytes(b"state")
    with pytest.raises(RuntimeError, match="study_lock"):
        study_checkpoints(Config(out), False, lambda text: None)
    assert _snapshot(folder) == {"sgld.ckpt": b"state"}


def test_an_unusable_out_is_said_before_the_lock_is_made(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(StudyError, match="is a file"):
        with study_lock(Config(str(tmp_path / "file"))):
            pass
    assert sorted(os.listdir(tmp_path)) == ["file"]
