"""Issue 26's data-loss cases: ``--out`` is checked before any work, never replaced by a stub, and
nothing is left behind by Ctrl-C, SIGTERM or SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import arviz as az
import pytest

from pyro_flat.experiments import mnist79, output, paths, synthetic2d
from pyro_flat.experiments.cli import main
from pyro_flat.experiments.output import MARKER, remove_stale_staging, staged_output
from pyro_flat.kernels import EntropySGLD

SMALL = ["--chains", "2", "--warmup", "200", "--num-samples", "300", "--thin", "1", "--no-progress",
         "--reference", "none"]
FILES = ("samples.nc", "summary.csv", "bma_vs_iterations.png", "reliability.png", "trace.png", "rank.png",
         "weights.png", "report.md", "report.json")


def earlier_run(out: Path, command: str = "mnist79") -> dict:
    """A folder that looks like a complete earlier run; returns its files' contents."""
    out.mkdir(parents=True)
    (out / MARKER).write_text(command + "\n")
    for name in FILES:
        (out / name).write_text(f"earlier {name}")
    return snapshot(out)


def snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def leftovers(parent: Path) -> list:
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name)


def interrupt_at(monkeypatch, iteration: int) -> None:
    """EntropySGLD of the study raises KeyboardInterrupt at ``iteration`` (warm-up is 200)."""
    class Interrupted(EntropySGLD):
        def sample(self, params):
            if self._iteration == iteration:
                raise KeyboardInterrupt
            return super().sample(params)

    make = mnist79.make_study_kernel
    monkeypatch.setattr(mnist79, "make_study_kernel", lambda name, c, model: (
        Interrupted(model, eta=c.eta, step_size=c.step_size, preconditioner=c.preconditioner)
        if name == "entropy-sgld" else make(name, c, model)))


def test_ctrl_c_in_the_warmup_leaves_an_earlier_run_untouched(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    before = earlier_run(out)
    interrupt_at(monkeypatch, 50)
    assert main(["mnist79", *SMALL, "--out", str(out)]) == 130
    assert snapshot(out) == before and leftovers(tmp_path) == []
    assert "before the first draw" in capsys.readouterr().out


def test_ctrl_c_after_two_draws_replaces_it_with_a_complete_folder(tmp_path, monkeypatch):
    out = tmp_path / "run"
    earlier_run(out)
    interrupt_at(monkeypatch, 202)
    assert main(["mnist79", *SMALL, "--out", str(out)]) == 130
    for name in FILES:
        assert (out / name).stat().st_size > 0 and not (out / name).read_bytes().startswith(b"earlier"), name
    assert az.from_netcdf(str(out / "samples.nc")).posterior["w"].shape == (2, 2, 784)
    report = json.loads((out / "report.json").read_text())
    assert report["interrupted"] and report["interrupted_by"] == "Ctrl-C"
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("command, module, work", [
    ("synthetic2d", synthetic2d, "run_synthetic2d"), ("paths", paths, "_run_path_study")])
def test_bad_out_is_refused_before_any_work(tmp_path, monkeypatch, capsys, command, module, work):
    def no_work(*args, **kwargs):
        raise AssertionError("the study ran before --out was checked")

    monkeypatch.setattr(module, work, no_work)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main([command, "--out", str(a_file), "--no-progress"]) == 2
    assert "is a file; pass a directory" in capsys.readouterr().err
    other = tmp_path / "other"
    earlier_run(other, command="mnist79")  # another study's output
    assert main([command, "--out", str(other), "--no-progress"]) == 2
    assert f"is not the output of an earlier `pyro-flat {command}`" in capsys.readouterr().err
    assert (other / "report.md").read_text() == "earlier report.md"


def test_an_out_that_cannot_be_written_is_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    """Tests run as root in CI, where chmod does not stop writes: the permission is faked."""
    out = tmp_path / "locked" / "run"
    real_access = os.access
    monkeypatch.setattr(output.os, "access", lambda p, mode: False if "locked" in str(p) else real_access(p, mode))
    (tmp_path / "locked").mkdir()
    monkeypatch.setattr(mnist79, "_run_mnist79", lambda *a: (_ for _ in ()).throw(AssertionError("ran")))
    assert main(["mnist79", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "no permission to write in" in err and "locked" in err and err.count("\n") == 1


def test_a_staging_folder_that_cannot_be_created_is_one_line(tmp_path, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(output.tempfile, "mkdtemp", refuse)
    monkeypatch.setattr(mnist79, "_run_mnist79", lambda *a: (_ for _ in ()).throw(AssertionError("ran")))
    assert main(["mnist79", "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "cannot create a folder beside it (Permission denied)" in err and err.count("\n") == 1


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_folders_left_by_a_killed_run_are_removed_by_the_next(tmp_path):
    out = tmp_path / "run"
    before = earlier_run(out)
    pid = dead_pid()
    stale = tmp_path / f".run.partial-{pid}-abc"
    stale.mkdir()
    (stale / "half.png").write_text("x")
    alive = tmp_path / f".run.partial-{os.getpid()}-xyz"  # a run in progress (this process): kept
    alive.mkdir()
    someone_else = tmp_path / ".other.partial-1-abc"  # another --out's: not ours
    someone_else.mkdir()
    with staged_output(str(out), "mnist79") as staging:
        (staging / "new.txt").write_text("new")
    assert not stale.exists() and alive.exists() and someone_else.exists()
    assert (out / "new.txt").read_text() == "new" and snapshot(out) != before


def test_a_run_killed_in_the_middle_of_the_swap_gets_its_previous_output_back(tmp_path):
    out = tmp_path / "run"
    before = earlier_run(out)
    old = tmp_path / f".run.old-{dead_pid()}-abc"
    old.mkdir()
    out.replace(old / "run")  # killed after the first move of the swap, before the second
    assert remove_stale_staging(out) == [old]
    assert snapshot(out) == before and not old.exists()


def test_sigterm_cleans_up_and_never_leaves_a_stub(tmp_path):
    """A real process, terminated during its run: exit 143, no staging folder left, and --out either
    untouched (no draw yet) or a complete folder of the partial run."""
    out = tmp_path / "run"
    before = earlier_run(out)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "pyro_flat", "mnist79", "--out", str(out), "--no-progress",
                             "--reference", "none", "--baseline", "none", "--chains", "2", "--warmup", "100",
                             "--num-samples", "100000", "--thin", "1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any(".partial-" in p.name for p in tmp_path.iterdir()):  # the run has started
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        time.sleep(8)  # into the sampling
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, stderr
    assert leftovers(tmp_path) == []
    if snapshot(out) != before:
        for name in FILES:
            assert (out / name).stat().st_size > 0, name
        assert json.loads((out / "report.json").read_text())["interrupted_by"] == "SIGTERM"
