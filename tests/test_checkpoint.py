"""Checkpoint and resume: a run killed with SIGKILL at a random moment and started again gives the draws
and statistics of the run that was never stopped, bit for bit; bad checkpoints are refused by name.

The kill tests start real processes (``tests/checkpoint_worker.py``): an uninterrupted run, a run killed
once or twice at random moments after its first checkpoint (with checkpoints every 20 ms many kills land
during a write), and the run started again on the same checkpoint file.
"""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import pyro
import pyro.distributions as dist
from pyro_flat import MCMC, SGLD, EntropySGLD
from pyro_flat.storage.checkpoint import CheckpointError, read_checkpoint

from checkpoint_worker import CASES, data, model

WORKER = str(Path(__file__).with_name("checkpoint_worker.py"))


def _run_worker(case, checkpoint, out, *extra, timeout=240):
    subprocess.run([sys.executable, WORKER, case, str(checkpoint), str(out), *map(str, extra)], check=True,
                   timeout=timeout)


def _done(checkpoint) -> int:
    """The step of the checkpoint on disk; -1 while there is none (the writer renames the old one aside first)."""
    try:
        return read_checkpoint(checkpoint)["done"]
    except (FileNotFoundError, CheckpointError):
        return -1


def _kill_after_first_checkpoint(case, checkpoint, out, seconds: float, *extra, after: int = 0):
    """Start the worker, wait for its first checkpoint (one at step ``after`` or later), SIGKILL it ``seconds``
    later; the checkpoint's step."""
    process = subprocess.Popen([sys.executable, WORKER, case, str(checkpoint), str(out), *map(str, extra)])
    try:
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline and _done(checkpoint) < after:
            time.sleep(0.005)
        time.sleep(seconds)
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait(timeout=30)
    return read_checkpoint(checkpoint)["done"]


#: the checkpoint step at which a case is killed, at once: the cyclical run's sampling-phase graph exists from step
#: 201 on (warm-up's 200, then its first draw), and a resumed run must build it, and the exploration graph, at their
#: first use, where the uninterrupted run reuses them (killed in the first cycle, steps 201-400, it rounded
#: otherwise; later kills did not show it)
KILL_AT = {"EntropySGLD, jit fx, thinning 4 (fused), cyclical": 205}


@pytest.mark.parametrize("case, kills", [
    # its data from a shuffling DataLoader, its draws in .npy files, killed twice
    ("SGLD, network fed by a DataLoader, streamed draws", 2),
    ("SGLD, dense preconditioner, cyclical", 1),
    ("EntropySGLD, jit fx, thinning 4 (fused), cyclical", 1),
    ("EntropySGHMC, diagonal preconditioner", 1),
    ("EntropyHMC, adaptation", 1),
    ("EntropySGHMC, jit fx, thinning 4 (fused), per-chain streams", 1),
    ("EntropySGLD, bf16 autocast", 1),
])
def test_a_run_killed_at_random_moments_resumes_to_the_uninterrupted_draws(tmp_path, case, kills):
    reference, resumed, checkpoint = tmp_path / "reference.pt", tmp_path / "resumed.pt", tmp_path / "run.ckpt"
    streamed = case.endswith(", streamed draws")  # the draws go to .npy files, the checkpoint counts them
    case = case.replace(", streamed draws", "")
    extra = [tmp_path / "draws"] if streamed else []
    _run_worker(case, "none", reference)
    rng = random.Random(f"{case}{streamed}")
    warmup, hmc = CASES[case]()[1], case.startswith("EntropyHMC")
    for _ in range(kills):
        # EntropyHMC: within the first 0.4 s, while it adapts (its warm-up takes several seconds)
        delay = 0.0 if case in KILL_AT else rng.uniform(0.0, 0.4 if hmc else 1.0)
        done = _kill_after_first_checkpoint(case, checkpoint, resumed, delay, *extra, after=KILL_AT.get(case, 0))
        assert not resumed.exists()  # killed before the end
        assert done >= KILL_AT.get(case, 0)
        if hmc:
            assert done < warmup, "the kill was meant to interrupt the warm-up's adaptation"
    _run_worker(case, checkpoint, resumed, *extra)
    want, got = torch.load(reference, weights_only=False), torch.load(resumed, weights_only=False)
    if streamed:  # the files themselves, read without pyro-flat
        for site, value in want["draws"].items():
            on_disk = np.load(tmp_path / "draws" / f"{site}.npy")
            np.testing.assert_array_equal(np.swapaxes(on_disk, 0, 1), value.numpy())
    for site, value in want["draws"].items():
        assert torch.equal(got["draws"][site], value), site
    assert set(got["stats"]) == set(want["stats"])
    for name, value in want["stats"].items():
        np.testing.assert_array_equal(got["stats"][name], value, err_msg=name)


def _small_run(path, **changes):
    settings = dict(num_samples=10, warmup_steps=5, step_size=1e-4, data=data())
    settings.update(changes)
    pyro.set_rng_seed(2)
    mcmc = MCMC(SGLD(model, step_size=settings["step_size"]), num_samples=settings["num_samples"],
                warmup_steps=settings["warmup_steps"], num_chains=2, disable_progbar=True, checkpoint=path,
                checkpoint_every=3600)
    mcmc.run(*settings["data"])
    return mcmc


def _torchrun_worker(case, checkpoint, out, kill_after=None, timeout=120):
    """The worker under ``torchrun`` on 2 ranks, in a session of its own; with ``kill_after``, SIGKILL to the whole
    session that many seconds after both ranks' second checkpoints (as a pre-emption kills a job). (code, output)"""
    from ranks import free_port, kill_tree

    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
               str(free_port()), WORKER, case, str(checkpoint), str(out)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, env={**os.environ, "PYRO_FLAT_DIST_TIMEOUT": "60"})
    try:
        if kill_after is not None:
            # both ranks' second checkpoints (each keeps its first as .previous): a kill then leaves two to continue from
            files = [checkpoint.with_name(f"run.rank{r}{kind}.ckpt") for r in range(2) for kind in ("", ".previous")]
            deadline = time.monotonic() + timeout
            while not all(f.exists() for f in files) and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(kill_after)
            kill_tree(process.pid)
        output, _ = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:  # torchrun's workers run in sessions of their own: none may outlive the test
            kill_tree(process.pid)
            process.wait()
    return process.returncode, output


def test_chains_across_two_ranks_killed_together_resume_from_the_iteration_every_rank_holds(tmp_path):
    """torchrun, 2 ranks, SIGKILL to both at a random moment; then rank 1's newest checkpoint is taken away (its
    write, as if killed halfway): the ranks continue from the previous one, which every rank holds, and give
    the uninterrupted run's draws bit for bit. With no file at all on rank 1 the resume is refused. The chains
    draw from per-chain streams: each rank's file holds its own chains' generators."""
    import shutil

    reference, resumed, checkpoint = tmp_path / "reference.pt", tmp_path / "resumed.pt", tmp_path / "run.ckpt"
    code, output = _torchrun_worker("SGLD, short, per-chain streams", "none", reference)
    assert code == 0, output
    code, output = _torchrun_worker("SGLD, short, per-chain streams", checkpoint, resumed,
                                    kill_after=random.Random(3).uniform(0.3, 0.9))
    assert not resumed.exists(), "killed before the end"
    rank1, previous1 = tmp_path / "run.rank1.ckpt", tmp_path / "run.rank1.previous.ckpt"
    dones = [read_checkpoint(tmp_path / f"run.rank{r}.ckpt")["done"] for r in range(2)]
    assert dones[0] == dones[1] and previous1.exists(), "every rank writes after the same iteration, keeping one"
    backup = tmp_path / "backup"
    backup.mkdir()
    for f in (rank1, previous1):
        shutil.move(f, backup / f.name)
    code, output = _torchrun_worker("SGLD, short, per-chain streams", checkpoint, resumed)
    assert code != 0 and "rank(s) [1] have none" in output, output
    shutil.move(backup / previous1.name, rank1)  # rank 1 holds only the older checkpoint
    code, output = _torchrun_worker("SGLD, short, per-chain streams", checkpoint, resumed)
    assert code == 0, output
    want, got = torch.load(reference, weights_only=False), torch.load(resumed, weights_only=False)
    for site, value in want["draws"].items():
        assert torch.equal(got["draws"][site], value), site
    for name, value in want["stats"].items():
        np.testing.assert_array_equal(got["stats"][name], value, err_msg=name)


def test_a_finished_runs_checkpoint_gives_its_draws_back_without_sampling(tmp_path):
    path = tmp_path / "run.ckpt"
    first = _small_run(path)
    assert read_checkpoint(path)["done"] == 15  # written at the end, whatever checkpoint_every says
    calls, kernel = [], SGLD(model, step_size=1e-4)
    kernel.sample = lambda params: pytest.fail("a finished run's checkpoint made an iteration")
    pyro.set_rng_seed(99)  # another seed: said; the draws come from the checkpoint, not from sampling
    again = MCMC(kernel, num_samples=10, warmup_steps=5, num_chains=2, disable_progbar=True, checkpoint=path,
                 hook_fn=lambda kernel, params, stage, i: calls.append((stage, i)))
    with pytest.warns(RuntimeWarning, match="started from other random streams"):
        again.run(*data())
    assert calls == [("Sample", i) for i in range(10)]  # the restored draws, handed to the hook
    for site, value in first.get_samples(group_by_chain=True).items():
        assert torch.equal(again.get_samples(group_by_chain=True)[site], value)


@pytest.mark.parametrize("changes, named", [
    (dict(num_samples=20), "num_samples: 20 here, 10 in the checkpoint"),
    (dict(step_size=2e-4), "SGLD.step_size: 0.0002 here, 0.0001 in the checkpoint"),
    (dict(data=(data()[0], data()[1] + 1)), "args\\[1\\]: "),
])
def test_a_checkpoint_of_another_configuration_is_refused_and_names_the_difference(tmp_path, changes, named):
    path = tmp_path / "run.ckpt"
    _small_run(path)
    with pytest.raises(CheckpointError, match=named.replace("(", "\\(")):
        _small_run(path, **changes)


def test_another_kernel_is_refused(tmp_path):
    path = tmp_path / "run.ckpt"
    _small_run(path)
    mcmc = MCMC(EntropySGLD(model, eta=0.1, step_size=1e-4), num_samples=10, warmup_steps=5, num_chains=2,
                disable_progbar=True, checkpoint=path)
    with pytest.raises(CheckpointError, match="kernel: 'EntropySGLD' here, 'SGLD' in the checkpoint"):
        mcmc.run(*data())


def test_a_changed_model_is_refused_even_under_the_same_name(tmp_path):
    """The model is compared by its code and what it captures, not by its name: data in a closure, a default."""
    path = tmp_path / "run.ckpt"
    X, y = data()

    def make(labels, scale=1.0):
        def closure_model(X):
            w = pyro.sample("w", dist.Normal(torch.zeros(3, dtype=X.dtype), scale).to_event(1))
            with pyro.plate("data", X.shape[0], subsample_size=20) as idx:
                pyro.sample("y", dist.Normal((X[idx] * w).sum(-1), 1.0), obs=labels[idx])
        return closure_model

    def run(m):
        pyro.set_rng_seed(0)
        MCMC(SGLD(m, step_size=1e-4), num_samples=5, warmup_steps=2, num_chains=2, checkpoint=path,
             disable_progbar=True).run(X)

    run(make(y))
    run(make(y))  # the same closure again: continues (here, gives the finished run back)
    for other in (make(-y), make(y, scale=0.5)):
        with pytest.raises(CheckpointError, match="model: "):
            run(other)


def test_one_checkpoint_file_serves_one_run_at_a_time(tmp_path):
    from pyro_flat.storage.checkpoint import Checkpointer

    path = tmp_path / "run.ckpt"
    holder = Checkpointer(path, 60.0, {})
    try:
        with pytest.raises(CheckpointError, match="is in use by another running process"):
            _small_run(path)
    finally:
        holder.close()
    _small_run(path)  # released
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.ckpt"]  # and no lock file left beside it


def test_lock_files_are_not_left_behind_a_refused_run(tmp_path):
    """A user's text file given as ``checkpoint=`` is refused, and nothing (no ``notes.txt.lock``) is left."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    with pytest.raises(CheckpointError, match="is not a pyro-flat checkpoint"):
        _small_run(notes)
    assert notes.read_text() == "my notes" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_folder_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is a folder; pass a file path in it"):
        MCMC(SGLD(model, step_size=1e-4), num_samples=10, checkpoint=tmp_path)


@pytest.mark.parametrize("damage, named", [
    (lambda b: b[: len(b) // 2], "is truncated"),
    (lambda b: b[:-40] + bytes(x ^ 0xFF for x in b[-40:]), "is corrupt"),
    (lambda b: b"PK\x03\x04" + b[4:], "is not a pyro-flat checkpoint"),
    (lambda b: b"", "is not a pyro-flat checkpoint"),
])
def test_a_damaged_checkpoint_is_refused_not_replaced_by_a_new_run(tmp_path, damage, named):
    path = tmp_path / "run.ckpt"
    _small_run(path)
    path.write_bytes(damage(path.read_bytes()))
    before = path.read_bytes()
    with pytest.raises(CheckpointError, match=f"checkpoint '{path}' {named}.*delete it to start a new run"):
        _small_run(path)
    assert path.read_bytes() == before  # left for the user to look at


def test_a_write_killed_halfway_leaves_the_previous_checkpoint_whole(tmp_path):
    """A kill during a write leaves the temporary file beside the checkpoint, never in its place."""
    path = tmp_path / "run.ckpt"
    first = _small_run(path)
    (tmp_path / ".run.ckpt.12345.tmp").write_bytes(path.read_bytes()[:100])
    again = _small_run(path)
    assert torch.equal(again.get_samples()["w"], first.get_samples()["w"])


@pytest.mark.parametrize("kwargs, named", [
    (dict(checkpoint_every=0), "checkpoint_every must be a positive number of seconds, got 0"),
    (dict(checkpoint_every=-5.0), "checkpoint_every must be a positive number"),
    (dict(checkpoint_every=float("nan")), "checkpoint_every must be a positive number"),
    (dict(checkpoint_every=True), "checkpoint_every must be a positive number"),
    (dict(checkpoint=3), "checkpoint must be a file path"),
    (dict(chain_method="sequential"), "checkpoint= needs a pyro-flat kernel run by pyro-flat.s loop"),
])
def test_bad_checkpoint_arguments_are_refused_by_name(tmp_path, kwargs, named):
    settings = dict(checkpoint=tmp_path / "run.ckpt", checkpoint_every=60.0)
    settings.update(kwargs)
    with pytest.raises(ValueError, match=named):
        MCMC(SGLD(model, step_size=1e-4), num_samples=10, warmup_steps=5, num_chains=2, **settings)


def test_a_missing_or_read_only_folder_is_refused(tmp_path):
    with pytest.raises(ValueError, match="the folder .* does not exist"):
        MCMC(SGLD(model, step_size=1e-4), num_samples=10, checkpoint=tmp_path / "nowhere" / "run.ckpt")
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):  # root ignores permissions: nothing to test
            pytest.skip("this user can write to read-only folders")
        with pytest.raises(ValueError, match="cannot be written \\(read-only\\)"):
            MCMC(SGLD(model, step_size=1e-4), num_samples=10, checkpoint=folder / "run.ckpt")
    finally:
        folder.chmod(0o700)


def test_a_model_that_falls_back_to_pyros_driver_says_checkpoint_needs_vectorized_chains(tmp_path):
    def scalar_only(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        pyro.sample("y", dist.Normal(float(mu), 1.0), obs=y)  # float(): not batched over chains

    mcmc = MCMC(SGLD(scalar_only, step_size=1e-3), num_samples=5, warmup_steps=2, num_chains=2,
                disable_progbar=True, checkpoint=tmp_path / "run.ckpt")
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="checkpoint= and draws_dir= need the chains vectorized"):
        mcmc.run(torch.tensor(0.5))


def test_the_mnist79_study_killed_and_run_again_with_resume_writes_the_uninterrupted_runs_results(tmp_path):
    """``pyro-flat mnist79 --resume`` after a SIGKILL: the same draws, statistics and BMA metrics as the run
    never stopped, and the checkpoints beside ``--out`` are removed once the run is complete."""
    import arviz as az
    import json

    # One sampler: the kill lands in it (its first checkpoint within 50 ms, the kill at most 1.5 s later, and it
    # samples for seconds); a baseline would start afresh after the resume, which the test does not need.
    args = [sys.executable, "-m", "pyro_flat", "mnist79", "--num-samples", "300", "--warmup", "50", "--chains", "2",
            "--thin", "1", "--reference", "none", "--baseline", "none", "--no-progress", "--checkpoint-every", "0.05",
            "--threads", "1"]
    # the uninterrupted run writes no checkpoint on the way (--checkpoint-every is not part of a run's settings;
    # writing one every 50 ms cost a fifth of its time): its results are those of a run that was never stopped
    subprocess.run([*args, "--checkpoint-every", "3600", "--out", str(tmp_path / "whole")], check=True,
                   capture_output=True, timeout=300)
    process = subprocess.Popen([*args, "--out", str(tmp_path / "killed")], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    checkpoints = tmp_path / ".killed.checkpoints"
    try:
        deadline = time.monotonic() + 120
        # the first checkpoint file, not the options.json written before it: on a loaded machine the run can take
        # longer than the random wait to write one, and a --resume with nothing to continue rightly starts over
        while not (checkpoints.is_dir() and any(checkpoints.glob("*.ckpt"))) and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(random.Random(0).uniform(0.0, 1.5))
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait(timeout=30)
    assert not (tmp_path / "killed").exists() and any(checkpoints.glob("*.ckpt"))
    other = subprocess.run([*args, "--out", str(tmp_path / "killed"), "--resume", "--seed", "1"], capture_output=True,
                           text=True, timeout=300)  # another seed would mix two runs in one report
    assert other.returncode == 2 and "--seed 1 here, 0 in the killed run" in other.stderr, other.stderr[-2000:]
    resumed = subprocess.run([*args, "--out", str(tmp_path / "killed"), "--resume"], capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "--resume: continuing from" in resumed.stdout
    want, got = (az.from_netcdf(tmp_path / name / "samples.nc") for name in ("whole", "killed"))
    for group in ("posterior", "sample_stats"):
        for var in getattr(want, group).data_vars:
            np.testing.assert_array_equal(getattr(got, group)[var].values, getattr(want, group)[var].values)
    reports = [json.loads((tmp_path / name / "report.json").read_text()) for name in ("whole", "killed")]
    assert reports[0]["bma"] == reports[1]["bma"] and reports[0]["diagnostics"] == reports[1]["diagnostics"]
    assert not checkpoints.exists()
