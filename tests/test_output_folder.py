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

from pyro_flat.experiments import output, plots
from pyro_flat.experiments.mnist79 import study as mnist79
from pyro_flat.experiments.paths import study as paths
from pyro_flat.experiments.synthetic2d import study as synthetic2d
from pyro_flat.experiments.cli import main
from pyro_flat.experiments.output import MARKER, remove_stale_staging, staged_output

SMALL = ["--chains", "2", "--warmup", "200", "--num-samples", "300", "--thin", "1", "--no-progress",
         "--reference", "none"]
# For the tests that check the folder and not the draws: a run of seconds.
TINY = ["--chains", "2", "--warmup", "50", "--num-samples", "50", "--thin", "1", "--no-progress", "--reference", "none"]
FILES = ("samples.nc", "summary.csv", "bma_vs_iterations.png", "reliability.png", "trace.png", "rank.png",
         "weights.png", "report.md", "report.json")


def earlier_run(out: Path, command: str = "mnist79") -> dict:
    """A folder that looks like a complete earlier run; returns its files' contents."""
    out.mkdir(parents=True)
    (out / MARKER).write_text("\n".join([command, *FILES]) + "\n")  # the command, then the files it wrote
    for name in FILES:
        (out / name).write_text(f"earlier {name}")
    return snapshot(out)


def snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def leftovers(parent: Path) -> list:
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name)


def test_ctrl_c_in_the_warmup_leaves_an_earlier_run_untouched(tmp_path, interrupt_study_at, capsys):
    out = tmp_path / "run"
    before = earlier_run(out)
    interrupt_study_at(50)
    assert main(["mnist79", *SMALL, "--out", str(out)]) == 130
    assert snapshot(out) == before and leftovers(tmp_path) == []
    assert "before the first draw" in capsys.readouterr().out


def test_ctrl_c_after_two_draws_replaces_it_with_a_complete_folder(tmp_path, interrupt_study_at):
    out = tmp_path / "run"
    earlier_run(out)
    interrupt_study_at(52)
    assert main(["mnist79", *TINY, "--out", str(out)]) == 130
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
        time.sleep(4)  # into the sampling
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


# ----------------------------------------------------------------------------- the stress round
def test_a_file_the_user_added_to_an_earlier_run_keeps_the_folder_from_being_replaced(tmp_path, capsys):
    out = tmp_path / "run"
    with staged_output(str(out), "mnist79") as staging:
        (staging / "report.md").write_text("run 1")
    assert (out / MARKER).read_text().split() == ["mnist79", "report.md"]  # what the run wrote
    with staged_output(str(out), "mnist79") as staging:  # an earlier run alone: replaced
        (staging / "report.md").write_text("run 2")
    (out / "my_notes.txt").write_text("precious")
    assert main(["mnist79", "--out", str(out), "--no-progress"]) == 2
    assert "holds files that run did not write" in capsys.readouterr().err
    assert (out / "my_notes.txt").read_text() == "precious" and (out / "report.md").read_text() == "run 2"


def test_a_user_file_in_a_folder_marked_by_an_older_version_is_never_deleted(tmp_path, capsys):
    """Older pyro-flat versions wrote a marker naming the command alone: it does not say which files
    that run wrote, so a file the user added must keep the folder from being replaced."""
    out = tmp_path / "run"
    out.mkdir()
    (out / MARKER).write_text("mnist79\n")  # the old format: no file list
    (out / "report.md").write_text("earlier report.md")
    (out / "notes.txt").write_text("precious")
    before = snapshot(out)
    assert main(["mnist79", *SMALL, "--out", str(out)]) == 2
    assert "holds files that run did not write); pass --overwrite" in capsys.readouterr().err
    assert snapshot(out) == before and leftovers(tmp_path) == []
    with pytest.raises(output.StudyError, match="holds files that run did not write"):
        with staged_output(str(out), "mnist79") as staging:
            (staging / "report.md").write_text("run 2")
    assert snapshot(out) == before


@pytest.mark.parametrize("out", ["", ".", ".."])
def test_the_current_folder_cannot_be_out(tmp_path, monkeypatch, capsys, out):
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    assert main(["mnist79", "--out", out, "--no-progress"]) == 2
    assert "is the current folder or one of its parents" in capsys.readouterr().err
    assert leftovers(tmp_path) == leftovers(tmp_path / "cwd") == []


def test_the_output_folder_follows_the_umask(tmp_path):
    umask = os.umask(0o022)
    try:
        with staged_output(str(tmp_path / "run"), "mnist79") as staging:
            (staging / "a.txt").write_text("x")
    finally:
        os.umask(umask)
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o755  # not mkdtemp's 0700


def test_ctrl_c_while_the_files_are_written_waits_for_them(tmp_path, monkeypatch):
    """The draws are made: a Ctrl-C during the figures must not throw them away."""
    out = tmp_path / "run"
    earlier_run(out)
    trace = plots.plot_trace_panels

    def interrupted_trace(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the files are written
        return trace(*args, **kwargs)

    monkeypatch.setattr(plots, "plot_trace_panels", interrupted_trace)
    assert main(["mnist79", *TINY, "--baseline", "none", "--out", str(out)]) == 130
    for name in FILES:
        assert not (out / name).read_bytes().startswith(b"earlier"), name
    assert not json.loads((out / "report.json").read_text())["interrupted"]  # every draw was made
    assert leftovers(tmp_path) == []


def test_an_interrupted_report_gives_the_draws_kept(tmp_path, interrupt_study_at):
    interrupt_study_at(80)
    out = tmp_path / "run"
    assert main(["mnist79", *TINY, "--out", str(out)]) == 130
    report = json.loads((out / "report.json").read_text())
    assert report["draws_per_chain"] == {"entropy-sgld": 30}
    assert "(Ctrl-C): the files hold the draws made before it stopped, per chain: entropy-sgld 30" in \
        (out / "report.md").read_text()


@pytest.mark.parametrize("args, needle", [
    (["mnist79", "--reference", "bogus"], "--reference 'bogus': the reference must be exact: entropy-hmc or none"),
    (["mnist79", "--seed", "-1"], "--seed must be an integer from 0 to 2**32 - 1, got -1"),
    (["synthetic2d", "--seed", str(2 ** 40)], "--seed must be an integer from 0 to 2**32 - 1"),
    (["paths", "--seed", "-3"], "--seed must be an integer from 0 to 2**32 - 1"),
    (["bnn", "--seed", "-3"], "--seed must be an integer from 0 to 2**32 - 1"),
    (["mnist79", "--chains", "10000000"], "--chains x --num-samples / --thin: the run would keep about"),
    (["mnist79", "--num-samples", "1000000000000"], "--chains x --num-samples / --thin: the run would keep about"),
    (["bnn", "--num-chains", "-1"], "--num-chains must be an integer >= 1, got -1"),
    (["bnn", "--seeds", "0"], "--seeds must be an integer >= 1, got 0"),
    (["bnn", "--grad-evals", "10"], "--grad-evals must be an integer >= 16, got 10"),
    (["bnn", "--dropout", "1"], "--dropout must lie in [0, 1), got 1.0"),
    (["bnn", "--noise-sds", "-0.1"], "--noise-sds must be >= 0, got -0.1"),
    (["mnist79", "--step-size", "1e6", "--chains", "2", "--warmup", "20", "--num-samples", "40", "--thin", "1",
      "--reference", "none", "--baseline", "none"], "diverged at iteration 0"),
])
def test_bad_values_found_by_the_stress_run_are_one_line(tmp_path, capsys, args, needle):
    assert main([*args, "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err
    assert leftovers(tmp_path) == [] and not (tmp_path / "o").exists()


@pytest.mark.parametrize("load, expected", [(0.3, None), (1.2, None), (1.6, 1), (5.0, 1)])
def test_threads_drop_to_one_on_a_busy_machine(monkeypatch, load, expected):
    """``threads=None``: torch's default on an idle 2-core machine, one thread (and a line that
    says so) once its cores are taken."""
    monkeypatch.setattr(output.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(output.os, "getloadavg", lambda: (load, load, load))
    threads, why = output.auto_threads()
    assert threads == expected
    assert ("busy" in why and "--threads" in why) if expected else why == ""


def test_study_output_runs_with_the_config_threads_and_restores_them(tmp_path, monkeypatch):
    import torch

    from pyro_flat.experiments.configs import PathConfig

    monkeypatch.setattr(output.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    monkeypatch.setattr(output.os, "cpu_count", lambda: 2)
    before, lines = torch.get_num_threads(), []
    with output.study_output(PathConfig(out=str(tmp_path / "run")), lines.append):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before and len(lines) == 1 and "busy" in lines[0]
    with output.study_output(PathConfig(out=str(tmp_path / "run"), threads=2), lines.append):
        assert torch.get_num_threads() == 2
    assert len(lines) == 1  # an explicit count is not announced


def test_a_reader_that_stops_reading_costs_no_files(tmp_path):
    """``pyro-flat mnist79 ... | head -1``: the pipe closes after the first line; the finished run
    must still write every file and exit 0 (it used to exit 1 on the next print, files thrown away)."""
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # each line reaches the pipe at once, as on a terminal
    proc = subprocess.Popen([sys.executable, "-m", "pyro_flat", "mnist79", "--out", str(out), "--no-progress",
                             "--reference", "none", "--baseline", "none", "--chains", "2", "--warmup", "20",
                             "--num-samples", "20", "--thin", "1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline()  # the first line (the data, or that the machine is busy)
        proc.stdout.close()  # as `head -1` does: every later print meets a closed pipe
        stderr = proc.stderr.read()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert "Broken pipe" not in stderr and "Traceback" not in stderr, stderr
    for name in FILES:
        assert (out / name).stat().st_size > 0, name
    assert leftovers(tmp_path) == []


def test_a_full_disk_while_writing_the_draws_is_one_line_and_keeps_out(tmp_path, monkeypatch, capsys):
    """The disk filled up while samples.nc was written: h5py's tracebacks, then a segfault (exit 139)."""
    import errno

    out = tmp_path / "run"
    before = earlier_run(out)

    def full(idata, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(mnist79, "write_netcdf", full)
    assert main(["mnist79", *TINY, "--baseline", "none", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"the disk is full: writing samples.nc for --out {out} failed (No space left on device)" in err
    assert snapshot(out) == before and leftovers(tmp_path) == []


def test_hdf5_failing_to_write_the_draws_does_not_crash_the_process(tmp_path):
    """A real write failure inside HDF5 (a file-size limit stands in for the full disk: the same failed
    write(2)): one line and exit 1, where writing through h5py crashed the interpreter (exit 139)."""
    resource = pytest.importorskip("resource")

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, resource.RLIM_INFINITY))  # samples.nc needs more

    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "pyro_flat", "mnist79", "--out", str(out), "--no-progress",
                           "--reference", "none", "--baseline", "none", "--chains", "2", "--warmup", "20",
                           "--num-samples", "20", "--thin", "1"],
                          capture_output=True, text=True, timeout=300, preexec_fn=small_files)
    assert proc.returncode == 1, proc.stderr[-3000:]
    *before, last = proc.stderr.strip().splitlines()
    assert "samples.nc" in last and "--out left as it was" in last, proc.stderr[-3000:]
    # the sampler's checkpoint hits the limit first: said (a warning and its source line), and the run goes on
    assert "could not be written" in before[0] and len(before) == 2, proc.stderr[-3000:]
    assert not out.exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("threads, load, count, why", [
    (None, 5.0, 1, "the machine is busy"), (None, 0.0, None, "torch's count"), (2, 5.0, 2, "set by --threads")])
def test_the_report_records_the_threads_that_ran_and_why(tmp_path, monkeypatch, threads, load, count, why):
    """A busy machine drops a study to one thread, which changes its draws: the report says so (it
    recorded threads: null)."""
    import torch

    from pyro_flat.experiments.configs import MNIST79Config

    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    before = torch.get_num_threads()
    config = MNIST79Config(out=str(tmp_path / "o"), threads=threads)
    with output.study_output(config, log=lambda text: None):
        record = output.threads_record()
    assert record["count"] == (before if count is None else count) and why in record["why"]
    assert torch.get_num_threads() == before and output.threads_record()["why"] == ""
