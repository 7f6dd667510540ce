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


def test_overwrite_discards_an_earlier_runs_checkpoints_and_says_so_without_speaking_of_resume(tmp_path):
    out = str(tmp_path / "run")
    folder = checkpoint_folder(out)
    folder.mkdir()
    (folder / "sgld.ckpt").write_bytes(b"an earlier run's state")
    said = []
    with study_lock(Config(out, seed=1, overwrite=True)):
        assert study_checkpoints(Config(out, seed=1, overwrite=True), False, said.append) == folder
    assert [p.name for p in folder.iterdir()] == ["options.json"]
    assert len(said) == 1 and said[0].startswith("--overwrite: discarded") and str(folder) in said[0], said
    said.clear()
    with study_lock(Config(out)):  # options.json alone (a run stopped before its first checkpoint): nothing to
        study_checkpoints(Config(out), False, said.append)  # continue, so no refusal, and nothing said
    assert said == []


def _tree(folder: Path) -> Dict[str, tuple]:
    """Every file and folder under ``folder``: its bytes (a file's) and its modification time, by path."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


#: the mnist79 run of the test below: seconds, one sampler, a checkpoint at almost every iteration
TINY = ["--chains", "2", "--warmup", "50", "--num-samples", "50", "--thin", "1", "--no-progress", "--reference", "none",
        "--baseline", "none", "--checkpoint-every", "0.001"]


def test_pyro_flat_mnist79_killed_after_its_first_checkpoint_then_seed_1_without_resume_or_overwrite_is_refused(
        tmp_path, interrupt_study_at, monkeypatch, capsys):
    """Issue 72: the killed run's checkpoints were deleted, said in one line afterwards. Now the run is refused
    (exit 2) before it deletes or writes anything, saying where the unfinished run's checkpoints are, that --resume
    continues it and that --overwrite discards it; so is the same command with the same seed and no flag (it would
    have deleted them too). --resume then continues the run."""
    from pyro_flat.experiments.mnist79 import study as mnist79
    from pyro_flat.experiments.cli import main

    out = tmp_path / "X"
    interrupt_study_at(40)  # stopped in its warm-up, after its first checkpoints: --out never written
    assert main(["mnist79", *TINY, "--out", str(out)]) == 130
    folder = checkpoint_folder(str(out))
    assert (folder / "entropy-sgld.ckpt").is_file() and not out.exists()
    # what a SIGKILL leaves beside them: its lock file and its staging folder (its process gone)
    study_lock_file(str(out)).write_text("")
    staging = tmp_path / f".X.partial-{_dead_pid()}-abc"
    staging.mkdir()
    (staging / "half.png").write_bytes(b"half written")
    before = _tree(tmp_path)
    assert {".X.checkpoints.lock", ".X.checkpoints/entropy-sgld.ckpt", ".X.checkpoints/options.json"} <= set(before)
    capsys.readouterr()
    work = mnist79.across_ranks
    monkeypatch.setattr(mnist79, "across_ranks", lambda *a, **k: pytest.fail("the refused run started its work"))
    for seed, differs in ((["--seed", "1"], "(this command differs: --seed 1 here, 0 in the killed run)"),
                          ([], "the same command with --resume continues that run")):
        assert main(["mnist79", *TINY, *seed, "--out", str(out)]) == 2
        captured = capsys.readouterr()
        err = captured.err
        assert err.count("\n") == 1 and "Traceback" not in err and captured.out == "", err
        assert f"--out {out}: an unfinished run's checkpoints are in {folder} (entropy-sgld.ckpt)" in err, err
        assert differs in err and "--resume" in err, err
        assert "--overwrite discards its checkpoints and starts this run. Nothing was deleted or written" in err, err
        assert _tree(tmp_path) == before  # every file as it was: bytes and modification times
    monkeypatch.setattr(mnist79, "across_ranks", work)
    interrupt_study_at(10 ** 9)  # the same kernel (its class is in the checkpoint), never stopped now
    assert main(["mnist79", *TINY, "--resume", "--out", str(out)]) == 0
    assert f"--resume: continuing from {folder} (entropy-sgld.ckpt)" in capsys.readouterr().out
    assert (out / "report.json").is_file() and not folder.exists()


@pytest.mark.parametrize("command", ["mnist79", "images", "images-eta", "transfer"])
def test_every_study_refuses_a_new_run_over_an_unfinished_runs_checkpoints(tmp_path, monkeypatch, capsys, command):
    """The rule of the test above in every study that keeps checkpoints, before any work; --overwrite lets the run
    through (it discards them)."""
    from pyro_flat.experiments import output
    from pyro_flat.experiments.mnist79 import study as mnist79
    from pyro_flat.experiments.transfer import study as transfer
    from pyro_flat.experiments.cli import main
    from pyro_flat.experiments.registry import STUDIES
    from pyro_flat.experiments.resume import _run_options

    def no_work(*args, **kwargs):
        raise AssertionError("the refused run started its work")

    for module, name in ((mnist79, "across_ranks"), (output, "across_ranks"), (transfer, "study_output"),
                         (transfer, "pretrained_network")):  # images imports output's across_ranks when it runs
        monkeypatch.setattr(module, name, no_work)
    monkeypatch.setattr(transfer, "load_transfer_data", lambda config: None)  # read before the lock: not needed here
    out = tmp_path / "run"
    folder = checkpoint_folder(str(out))
    folder.mkdir()
    (folder / "options.json").write_text(json.dumps(_run_options(STUDIES[command].config(seed=0))))  # the study's
    (folder / "seed0-sgd.ckpt").write_bytes(b"an unfinished run's state")
    before = _tree(tmp_path)
    assert main([command, "--seed", "1", "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"an unfinished run's checkpoints are in {folder} (seed0-sgd.ckpt)" in err
    assert "(this command differs: --seed 1 here, 0 in the killed run)" in err, err  # the only difference
    assert "--resume" in err and "--overwrite discards" in err and err.count("\n") == 1, err
    assert _tree(tmp_path) == before
    with pytest.raises(AssertionError, match="the refused run started its work"):  # --overwrite: past the rule
        main([command, "--seed", "1", "--no-progress", "--overwrite", "--out", str(out)])


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


def test_a_run_killed_before_its_first_checkpoint_leaves_nothing_that_refuses_a_rerun(tmp_path):
    """A sampler's lock file (made when it starts) and a half-written temporary file (a kill during the first write)
    hold nothing to continue: a rerun is not refused for them; a checkpoint file is."""
    from pyro_flat.experiments.resume import unfinished_checkpoints

    folder = tmp_path / ".X.checkpoints"
    folder.mkdir()
    for name in ("options.json", "entropy-sgld.ckpt.lock", ".entropy-sgld.ckpt.4242.tmp"):
        (folder / name).write_text("")
    assert unfinished_checkpoints(folder) == []
    (folder / "entropy-sgld.ckpt").write_text("")
    assert unfinished_checkpoints(folder) == ["entropy-sgld.ckpt"]
