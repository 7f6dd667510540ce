"""Draws streamed to disk (``MCMC(draws_dir=...)``): the same draws as in memory, in .npy files numpy reads
alone, and resident memory that does not grow with the draws; and (issue 61) a folder as safe as a
checkpoint: names that stay inside it, no file replaced that the run did not write, one run at a time, a
checkpoint that continues only its own files, and a manifest that counts the complete rows."""

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import pyro
from pyro_flat import MCMC, SGHMC, SGLD
from pyro_flat.storage.draws_folder import DrawsDirError

from checkpoint_worker import data, model


def _run(**kwargs):
    pyro.set_rng_seed(1)
    mcmc = MCMC(SGHMC(model, step_size=1e-4), num_samples=200, warmup_steps=20, num_chains=3, thinning=2,
                disable_progbar=True, **kwargs)
    mcmc.run(*data(), batch_size=20)
    return mcmc


def test_streamed_draws_are_the_in_memory_ones_in_npy_files(tmp_path, monkeypatch):
    from pyro_flat.infer import draws

    monkeypatch.setattr(draws, "BLOCK_BYTES", 7 * 3 * 3 * 8)  # blocks of 7 draws: 100 = 14 blocks + 2
    in_memory, streamed = _run(), _run(draws_dir=tmp_path / "draws")
    want = in_memory.get_samples(group_by_chain=True)["w"]
    assert torch.equal(streamed.get_samples(group_by_chain=True)["w"], want)
    on_disk = np.load(tmp_path / "draws" / "w.npy")  # (draw, chain, 3), without pyro-flat
    np.testing.assert_array_equal(np.swapaxes(on_disk, 0, 1), want.numpy())
    assert streamed.kernel.partial_samples == []  # no second copy in the kernel
    assert streamed.summary() is None  # Pyro's summary prints; it works on the mapped draws


def test_resident_memory_does_not_grow_with_the_draws(tmp_path):
    """One chain of a 1,000,000-parameter quadratic, 200 draws (800 MB of float32 draws): the peak resident
    memory grows by less than 200 MB over the set-up's (134 MB measured, one 64 MB block and the step's
    tensors; the in-memory path grew by 4,082 MB), in a process of its own. glibc's malloc is told to return
    large blocks (MALLOC_MMAP_THRESHOLD_): with its default, growing threshold the freed 4 MB tensors of
    each step stay in its heap, and the peak grew by 469 MB with 200 draws, 179 MB with 20."""
    script = textwrap.dedent(f"""
        import resource, torch, pyro
        from pyro_flat import MCMC, SGLD
        kernel = SGLD(potential_fn=lambda p: 0.5 * (p["x"] ** 2).sum(-1), step_size=0.1)
        mcmc = MCMC(kernel, num_samples=200, warmup_steps=1, initial_params={{"x": torch.zeros(1_000_000)}},
                    draws_dir={str(tmp_path / "draws")!r}, disable_progbar=True)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        mcmc.run()
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        x = mcmc.get_samples()["x"]
        print((after - before) / 1024, tuple(x.shape), float(x[-1].var()))
    """)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    grown, shape, variance = out.stdout.split(" (")[0], out.stdout.split(" (")[1].split(")")[0], out.stdout.split()[-1]
    assert shape == "200, 1000000"
    assert float(grown) < 200, f"peak resident memory grew by {grown} MB for 800 MB of draws"
    assert abs(float(variance) - 1 / (1 - 0.05)) < 0.01  # the last draw's law: SGLD's N(0, 1/(1 - α/2))


def test_a_bad_draws_dir_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="draws_dir must be a folder path"):
        MCMC(SGHMC(model, step_size=1e-4), num_samples=10, draws_dir=3)
    with pytest.raises(ValueError, match="draws_dir= needs a pyro-flat kernel run by pyro-flat.s loop"):
        MCMC(SGHMC(model, step_size=1e-4), num_samples=10, num_chains=2, chain_method="sequential",
             draws_dir=tmp_path)


def test_arviz_and_summary_read_a_subset_of_streamed_draws(tmp_path, monkeypatch, capsys):
    """to_arviz and summary on chosen sites and entries of memory-mapped draws; a selection that would not fit in
    memory is refused with the arguments that make it fit."""
    from pyro_flat import to_arviz, validation

    mcmc = _run(draws_dir=tmp_path / "draws")
    full = mcmc.get_samples(group_by_chain=True)["w"]  # (3 chains, 100 draws, 3)
    idata = to_arviz(mcmc, var_names=["w"], coordinates={"w": [2, 0]})
    assert list(idata.posterior.data_vars) == ["w"]
    np.testing.assert_array_equal(idata.posterior["w"].values, full[..., [2, 0]].numpy())
    sliced = to_arviz(mcmc.get_samples(group_by_chain=True), coordinates={"w": slice(1, 3)})
    np.testing.assert_array_equal(sliced.posterior["w"].values, full[..., 1:3].numpy())
    capsys.readouterr()
    mcmc.summary(var_names=["w"], coordinates={"w": [1]})
    table = capsys.readouterr().out
    assert "w[0]" in table and "w[1]" not in table and " b" not in table
    for bad, named in [(dict(var_names=["nope"]), "no site"), (dict(coordinates={"w": [3]}), r"in \[0, 3\)"),
                       (dict(var_names=["b"], coordinates={"w": [0]}), "no site")]:
        with pytest.raises(ValueError, match=named):
            to_arviz(mcmc, **bad)
    monkeypatch.setattr(validation, "machine_memory", lambda: 10_000)  # a machine of 10 kB
    with pytest.raises(ValueError, match=r"var_names / coordinates.*coordinates=\{site: indices\}"):
        to_arviz(mcmc)
    assert to_arviz(mcmc, var_names=["w"], coordinates={"w": [0]}).posterior["w"].shape == (3, 100, 1)


# ------------------------------------------------------------------ issue 61: draws_dir as safe as checkpoint=
WORKER = str(Path(__file__).with_name("draws_dir_worker.py"))


def _manifest(folder) -> dict:
    return json.loads((Path(folder) / "draws.json").read_text())


def _stamp(path) -> tuple:
    """A file's bytes and modification time: what a user's file must keep."""
    return Path(path).read_bytes(), os.stat(path).st_mtime_ns


def _points(sites, **kwargs):
    """A run on a standard normal whose sites have the given names (potential_fn: any name is a site)."""
    pyro.set_rng_seed(3)
    mcmc = MCMC(SGLD(potential_fn=lambda p: sum(0.5 * (v ** 2).sum(-1) for v in p.values()), step_size=0.1),
                num_samples=8, warmup_steps=2, num_chains=2, initial_params={s: torch.zeros(2, 3) for s in sites},
                disable_progbar=True, **kwargs)
    mcmc.run()
    return mcmc


def test_a_site_name_escapes_draws_dir(tmp_path):
    """Sites "../outside" and "layer/w": files inside the folder, named by the manifest; the user's outside.npy
    beside the folder is untouched, and each site's draws are its own."""
    users = tmp_path / "outside.npy"
    np.save(users, np.arange(5.0))
    before = _stamp(users)
    sites = ["../outside", "layer/w", "%2F", ".hidden", "fc.weight"]
    folder = tmp_path / "draws"
    draws = _points(sites, draws_dir=folder).get_samples(group_by_chain=True)
    assert _stamp(users) == before
    manifest = _manifest(folder)
    files = {s: manifest["sites"][s]["file"] for s in sites}
    assert files == {"../outside": "%2E.%2Foutside.npy", "layer/w": "layer%2Fw.npy", "%2F": "%252F.npy",
                     ".hidden": "%2Ehidden.npy", "fc.weight": "fc.weight.npy"}
    assert sorted(p.name for p in folder.iterdir()) == sorted([*files.values(), "draws.json"])  # no lock left
    reference = _points(sites).get_samples(group_by_chain=True)
    for site in sites:
        assert manifest["sites"][site]["shape"] == [8, 2, 3] and manifest["sites"][site]["dtype"] == "float32"
        on_disk = np.load(folder / files[site])  # (draw, chain, 3), without pyro-flat
        np.testing.assert_array_equal(np.swapaxes(on_disk, 0, 1), reference[site].numpy())
        assert torch.equal(draws[site], reference[site])
    assert len({d.sum().item() for d in draws.values()}) == len(sites)  # not one file written five times
    assert (manifest["rows"], manifest["num_samples"], manifest["complete"]) == (8, 8, True)


def test_the_users_own_file_is_never_replaced(tmp_path):
    """A user's mu.npy in draws_dir: refused by name before any draw, overwrite_draws=True too; the file is as it
    was. Another run's draws: refused unless overwrite_draws=True (then replaced) or the same MCMC runs again."""
    folder = tmp_path / "mine"
    folder.mkdir()
    np.save(folder / "mu.npy", np.arange(5.0))
    before = _stamp(folder / "mu.npy")
    calls = []
    for overwrite in (False, True):
        with pytest.raises(DrawsDirError, match=r"already holds '.*mu\.npy', which no pyro-flat run wrote.*site "
                                                r"'mu'.*another draws_dir="):
            _points(["mu"], draws_dir=folder, overwrite_draws=overwrite, hook_fn=lambda *a: calls.append(a))
    assert calls == []  # refused before the first draw
    assert _stamp(folder / "mu.npy") == before
    assert sorted(p.name for p in folder.iterdir()) == ["mu.npy"]  # no manifest, no lock left behind
    _points(["nu"], draws_dir=folder)  # other sites: the user's file stays beside them
    assert _stamp(folder / "mu.npy") == before and "nu" in _manifest(folder)["sites"]

    earlier = tmp_path / "earlier"
    first = _points(["mu"], draws_dir=earlier)
    kept = _stamp(earlier / "mu.npy")
    with pytest.raises(DrawsDirError, match=r"holds the draws of another pyro-flat run \(8 of 8 rows, finished, "
                                            r"written by a run without a checkpoint.*overwrite_draws=True"):
        _points(["mu", "nu"], draws_dir=earlier)
    assert _stamp(earlier / "mu.npy") == kept
    first.run()  # the same MCMC object again: its own earlier run's files
    replaced = _points(["nu"], draws_dir=earlier, overwrite_draws=True)  # the earlier run's mu.npy goes with it
    assert sorted(p.name for p in earlier.iterdir()) == ["draws.json", "nu.npy"]
    assert list(_manifest(earlier)["sites"]) == ["nu"] and replaced.get_samples()["nu"].shape == (16, 3)


def _worker(folder, checkpoint, go, out, overwrite=False, seed=1, block_bytes=None):
    return [sys.executable, WORKER, str(folder), str(checkpoint or "none"), str(go), str(out), str(int(overwrite)),
            str(seed)] + ([] if block_bytes is None else [str(block_bytes)])


def _wait_for(condition, process, seconds=120):
    deadline = time.monotonic() + seconds
    while not condition():
        assert process.poll() is None, "the first run ended before the second started"
        assert time.monotonic() < deadline, "the first run did not start"
        time.sleep(0.02)


def test_two_runs_sharing_one_draws_dir(tmp_path):
    """Two processes on one folder: the second is refused while the first runs (overwrite_draws=True or not),
    allowed after it ends; the first run's draws are its own, and this process reads them mid-run with numpy and
    json. A SIGKILLed run's lock blocks no one."""
    import draws_dir_worker

    folder, go = tmp_path / "draws", tmp_path / "go"
    first = subprocess.Popen(_worker(folder, tmp_path / "first.ckpt", go, tmp_path / "first.pt"),
                             stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (folder / "draws.json").exists(), first)
        second = subprocess.run(_worker(folder, None, go, tmp_path / "second.pt", overwrite=True, seed=2),
                                capture_output=True, text=True, timeout=120)
        assert second.returncode != 0 and "is in use by another running process" in second.stderr, second.stderr[-2000:]
        assert first.poll() is None, "the first run ended before the second was refused"
        mid_run = _manifest(folder)  # waiting at draw 40: its checkpoints flushed the rows before
        rows = np.array(np.load(folder / mid_run["sites"]["x"]["file"], mmap_mode="r")[: mid_run["rows"]])
        go.touch()
        assert first.wait(timeout=120) == 0, first.stderr.read()[-2000:]
    finally:
        first.kill()
        first.wait(timeout=30)
    own = draws_dir_worker.run(None)  # the same run in memory
    assert torch.equal(torch.load(tmp_path / "first.pt")["x"], own["x"])
    assert 0 < len(rows) <= 41 and not mid_run["complete"]
    np.testing.assert_array_equal(rows, own["x"].transpose(0, 1)[: len(rows)].numpy())
    np.testing.assert_array_equal(np.swapaxes(np.load(folder / "x.npy"), 0, 1), own["x"].numpy())
    subprocess.run(_worker(folder, None, go, tmp_path / "second.pt", overwrite=True, seed=2), check=True, timeout=120)
    assert torch.equal(torch.load(tmp_path / "second.pt")["x"], draws_dir_worker.run(None, seed=2)["x"])

    go.unlink()  # a run killed while it holds the folder: its lock dies with it
    earlier = _manifest(folder)["run"]
    killed = subprocess.Popen(_worker(folder, tmp_path / "run.ckpt", go, tmp_path / "killed.pt", overwrite=True))
    try:
        _wait_for(lambda: _manifest(folder)["run"] != earlier and _manifest(folder)["rows"] >= 30, killed)
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
    assert (folder / ".draws.lock").exists()  # left by the killed process, no longer locked
    go.touch()
    subprocess.run(_worker(folder, tmp_path / "run.ckpt", go, tmp_path / "killed.pt"), check=True, timeout=120)
    assert torch.equal(torch.load(tmp_path / "killed.pt")["x"], own["x"])  # continued to the same draws
    assert not (folder / ".draws.lock").exists()


def test_a_checkpoint_returns_another_runs_draws_or_zeros(tmp_path):
    """Run 1 (c1, d), run 2 (c2, d, another seed), run 1 again: run 1's own draws or a refusal, never run 2's;
    after `rm -r d` a finished checkpoint is refused, naming the missing files, never zeros."""
    from draws_dir_worker import run

    folder, c1, c2 = tmp_path / "d", tmp_path / "c1.ckpt", tmp_path / "c2.ckpt"
    first = run(folder, c1, seed=1)
    with pytest.raises(DrawsDirError, match="holds the draws of another pyro-flat run .*checkpoint='.*c1.ckpt'"):
        run(folder, c2, seed=2)
    assert torch.equal(run(folder, c1, seed=1)["x"], first["x"])  # its own draws back, without sampling
    second = run(folder, c2, seed=2, overwrite=True)  # asked for: run 1's draws are replaced
    assert not torch.equal(second["x"], first["x"])
    with pytest.raises(DrawsDirError, match="holds another run's draws .*c2.ckpt.*not those of the run the "
                                            "checkpoint '.*c1.ckpt' continues"):
        run(folder, c1, seed=1)
    np.testing.assert_array_equal(np.swapaxes(np.load(folder / "x.npy"), 0, 1), second["x"].numpy())  # untouched

    shutil.rmtree(folder)
    missing = re.escape(f"{folder / 'draws.json'}, {folder / 'x.npy'} are missing")
    with pytest.raises(DrawsDirError, match=missing + ".*Put them back") as refused:
        run(folder, c2, seed=2)
    assert f"the checkpoint {str(c2.resolve())!r} continues" in str(refused.value)
    assert not folder.exists()  # refused without making anything


def test_a_reader_during_a_run_sees_only_complete_rows_and_knows_how_many(tmp_path, monkeypatch):
    """With numpy and json alone, mid-run: the manifest's rows are complete draws (flushed every FLUSH_SECONDS,
    though the block holds all 60); after a Ctrl-C the manifest says which rows are draws."""
    from pyro_flat.infer import draws
    from draws_dir_worker import run

    monkeypatch.setattr(draws, "FLUSH_SECONDS", 0.02)
    folder, seen = tmp_path / "d", []

    def reader(kernel, params, phase, i):
        time.sleep(0.005)
        if phase == "Sample":
            manifest = _manifest(folder)
            x = np.load(folder / manifest["sites"]["x"]["file"], mmap_mode="r")
            seen.append((i, manifest["rows"], np.array(x[: manifest["rows"]])))

    whole = run(folder, hook_fn=reader)["x"].transpose(0, 1).numpy()
    assert all(rows <= i + 1 for i, rows, _ in seen) and 0 < seen[30][1] < 60
    for _, rows, x in seen:
        np.testing.assert_array_equal(x, whole[:rows])

    def interrupt(kernel, params, phase, i):
        if phase == "Sample" and i == 37:
            raise KeyboardInterrupt
    monkeypatch.setattr(draws, "FLUSH_SECONDS", 3600.0)  # nothing written before the interruption
    stopped = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        run(stopped, hook_fn=interrupt)
    manifest = _manifest(stopped)
    assert (manifest["rows"], manifest["complete"]) == (38, False)  # draws 0-37 (the hook runs after a draw's put)
    np.testing.assert_array_equal(np.load(stopped / "x.npy")[:38], whole[:38])
    assert not (stopped / ".draws.lock").exists()


def test_an_empty_a_file_or_a_read_only_draws_dir_is_refused_up_front(tmp_path, monkeypatch):
    kernel = SGHMC(model, step_size=1e-4)
    with pytest.raises(ValueError, match="draws_dir='' names no folder .*working folder"):
        MCMC(kernel, num_samples=10, draws_dir="")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="draws_dir='.*notes.txt' is a file, not a folder"):
        MCMC(kernel, num_samples=10, draws_dir=tmp_path / "notes.txt")
    with pytest.raises(ValueError, match="cannot be made: '.*notes.txt' is a file"):
        MCMC(kernel, num_samples=10, draws_dir=tmp_path / "notes.txt" / "draws")
    with pytest.raises(ValueError, match="overwrite_draws must be True or False"):
        MCMC(kernel, num_samples=10, draws_dir=tmp_path / "d", overwrite_draws="yes")
    assert (tmp_path / "notes.txt").read_text() == "mine"

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.access(locked, os.W_OK):  # root ignores permissions: take the mode bits as they are
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: real(p, mode) and not (
            mode & os.W_OK and not os.stat(p).st_mode & 0o200))
    try:
        for path in (locked, locked / "new" / "draws"):
            with pytest.raises(ValueError, match="cannot be written \\('.*locked' is read-only\\)"):
                MCMC(kernel, num_samples=10, draws_dir=path)
        from draws_dir_worker import run  # a read-only file of an unfinished run that a checkpoint continues

        def interrupt(kernel, params, phase, i):
            time.sleep(0.005)  # checkpoints every 20 ms: some before the interruption
            if phase == "Sample" and i == 20:
                raise KeyboardInterrupt
        with pytest.raises(KeyboardInterrupt):
            run(tmp_path / "d", tmp_path / "run.ckpt", hook_fn=interrupt)
        (tmp_path / "d" / "x.npy").chmod(0o400)
        with pytest.raises(DrawsDirError, match="'.*x.npy' cannot be written \\(read-only\\)"):
            run(tmp_path / "d", tmp_path / "run.ckpt")
    finally:
        locked.chmod(0o700)


# ------------------------------------------------------------------ issue 72: checksums of the streamed rows
def _flip(path, row: int, byte: int) -> None:
    """One byte of row ``row`` of a .npy file of (draw, ...) rows, inverted in place (as a bad disk would)."""
    x = np.load(path, mmap_mode="r")
    at = x.offset + row * x[0].nbytes + byte
    data = bytearray(Path(path).read_bytes())
    data[at] ^= 0xFF
    Path(path).write_bytes(bytes(data))


def _files(*paths) -> dict:
    return {str(p): Path(p).read_bytes() for p in paths}


def test_damaged_rows_of_a_killed_runs_draws_dir_are_refused_by_name(tmp_path, monkeypatch):
    """Issue 72: a run with checkpoint= and draws_dir= killed (SIGKILL) mid-run; one byte of a random complete
    row of x.npy damaged on disk; the same run again is refused, naming the site, the file, the damaged rows and
    the fix, with every file's bytes as they were (a manifest whose checksums were edited too). The byte put
    back, the same run again equals the uninterrupted run bit for bit, and its manifest's checksums hold."""
    import draws_dir_worker
    from pyro_flat.infer import draws

    block = 5 * 24  # blocks of 5 rows (a row: 3 chains x 2 float32)
    monkeypatch.setattr(draws, "BLOCK_BYTES", block)
    folder, checkpoint, go = tmp_path / "d", tmp_path / "run.ckpt", tmp_path / "go"
    killed = subprocess.Popen(_worker(folder, checkpoint, go, tmp_path / "killed.pt", block_bytes=block))
    try:  # it waits at draw 40 for `go`: killed between draws 30 and 41
        _wait_for(lambda: checkpoint.exists() and (folder / "draws.json").exists()
                  and _manifest(folder)["rows"] >= 30, killed)
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
    manifest, x = _manifest(folder), folder / "x.npy"
    assert manifest["version"] == 2 and not manifest["complete"]
    blocks = manifest["sites"]["x"]["sha256"]
    assert blocks[0][0] == 0 and blocks[-1][1] == manifest["rows"] and len(blocks) >= 4  # blocks of 5 to 9 rows
    rng = random.Random(72)
    row, byte = rng.randrange(manifest["rows"]), rng.randrange(24)
    start, stop = next(b[:2] for b in blocks if b[0] <= row < b[1])
    _flip(x, row, byte)
    before = _files(folder / "draws.json", x, checkpoint)
    with pytest.raises(DrawsDirError) as refused:
        draws_dir_worker.run(folder, checkpoint)
    said = str(refused.value)
    assert f"{str(x)!r} (site 'x'): rows {start} to {stop - 1} are not the bytes this run wrote" in said, said
    assert "restore the file" in said and f"delete the folder and the checkpoint {str(checkpoint.resolve())!r}" in said
    assert _files(folder / "draws.json", x, checkpoint) == before  # the refusal changed nothing
    assert sorted(p.name for p in folder.iterdir()) == ["draws.json", "x.npy"]

    edited = json.loads(before[str(folder / "draws.json")])  # a checksum taken out by hand: not checkable
    edited["sites"]["x"]["sha256"].pop(1)
    (folder / "draws.json").write_text(json.dumps(edited))
    with pytest.raises(DrawsDirError, match="checksums of site 'x' in .*draws.json' are not those pyro-flat writes"):
        draws_dir_worker.run(folder, checkpoint)
    (folder / "draws.json").write_bytes(before[str(folder / "draws.json")])

    _flip(x, row, byte)  # restored: the run continues to the uninterrupted run's draws
    resumed = draws_dir_worker.run(folder, checkpoint)["x"]
    assert torch.equal(resumed, draws_dir_worker.run(None)["x"])
    manifest = _manifest(folder)
    assert (manifest["rows"], manifest["complete"]) == (60, True)
    on_disk = np.load(x, mmap_mode="r")
    for begin, end, sha256 in manifest["sites"]["x"]["sha256"]:
        assert hashlib.sha256(on_disk[begin:end].tobytes()).hexdigest() == sha256


def _docs_reader() -> str:
    """The reader's lines of docs/api.md's draws-folder example (after its "# a reader's check" line)."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    block = text[text.index("**Checking a draws folder with numpy and json alone.**"):]
    block = block[block.index("```python\n") + len("```python\n"):]
    block = block[: block.index("```")]
    return block[block.index("# a reader's check of the checksums:"):]


def test_a_reader_with_numpy_and_json_alone_checks_a_finished_draws_dir(tmp_path, monkeypatch):
    """Issue 72: the format page's reader (numpy, json and hashlib, in a process without torch or pyro-flat)
    checks every block of a finished run's folder (5 sites, blocks of 3 rows), and stops at a damaged byte."""
    from pyro_flat.infer import draws

    monkeypatch.setattr(draws, "BLOCK_BYTES", 3 * 5 * 24)  # blocks of 3 rows: 8 = 3 + 3 + 2
    folder = tmp_path / "draws"
    sites = ["../outside", "layer/w", "%2F", ".hidden", "fc.weight"]
    _points(sites, draws_dir=folder)
    manifest = _manifest(folder)
    assert manifest["version"] == 2
    assert all([b[:2] for b in manifest["sites"][s]["sha256"]] == [[0, 3], [3, 6], [6, 8]] for s in sites)
    reader = _docs_reader()
    assert len(reader.strip().splitlines()) == 6  # the comment and five lines
    script = ("import hashlib, json, os, sys\nimport numpy as np\nfolder = sys.argv[1]\n" + reader
              + "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pyro', 'pyro_flat')))\n")
    checked = subprocess.run([sys.executable, "-c", script, str(folder)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0 and checked.stdout.strip() == "[]", checked.stderr[-2000:]
    _flip(folder / "layer%2Fw.npy", 4, 7)
    damaged = subprocess.run([sys.executable, "-c", script, str(folder)], capture_output=True, text=True, timeout=60)
    assert damaged.returncode != 0 and "AssertionError: layer/w: rows 3-5 damaged" in damaged.stderr, damaged.stderr


def test_a_version_1_draws_dir_without_checksums_is_continued_unchecked_with_a_warning(tmp_path):
    """Issue 72: a folder of pyro-flat before the checksums (manifest version 1, no "sha256"), of a run stopped by
    a Ctrl-C: continued to the uninterrupted run's draws, with a warning that its rows are not checked; it stays
    version 1."""
    from draws_dir_worker import run

    def interrupt(kernel, params, phase, i):
        time.sleep(0.005)  # checkpoints every 20 ms: some before the interruption
        if phase == "Sample" and i == 20:
            raise KeyboardInterrupt

    folder, checkpoint = tmp_path / "d", tmp_path / "run.ckpt"
    with pytest.raises(KeyboardInterrupt):
        run(folder, checkpoint, hook_fn=interrupt)
    manifest = _manifest(folder)
    manifest["version"] = 1
    for entry in manifest["sites"].values():
        del entry["sha256"]
    (folder / "draws.json").write_text(json.dumps(manifest, indent=1))
    with pytest.warns(UserWarning, match=r"manifest version 1\), which kept no checksums: its first \d+ rows are "
                                         r"continued unchecked"):
        resumed = run(folder, checkpoint)["x"]
    assert torch.equal(resumed, run(None)["x"])
    manifest = _manifest(folder)
    assert (manifest["version"], manifest["rows"], manifest["complete"]) == (1, 60, True)
    assert all("sha256" not in entry for entry in manifest["sites"].values())


def test_a_flush_that_fails_part_way_hashes_no_row_and_its_retry_hashes_each_once(tmp_path, monkeypatch):
    """A full disk at the second site's fsync, then the retry a run's end makes (its folder's close): every recorded
    checksum holds the rows on disk (before, the first site's rows were hashed twice, and a resume refused the
    run as damaged)."""
    from pyro_flat.infer import draws as streamed
    from pyro_flat.storage.draws_folder import DrawsFolder

    folder = DrawsFolder(tmp_path / "draws")
    files = streamed.DrawFiles(folder, {"a": ((2,), torch.float32), "b": ((3,), torch.float32)}, 10)
    for i in range(3):
        files.put(i, {"a": torch.randn(2), "b": torch.randn(3)})
    real, calls = os.fsync, []

    def full_disk_once(fd):
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(fd)

    monkeypatch.setattr(os, "fsync", full_disk_once)
    with pytest.raises(OSError, match="No space"):
        files.flush()
    monkeypatch.setattr(os, "fsync", real)
    files.flush()
    manifest = json.loads((tmp_path / "draws" / "draws.json").read_text())
    assert manifest["rows"] == 3
    for site in ("a", "b"):
        rows = np.load(tmp_path / "draws" / manifest["sites"][site]["file"], mmap_mode="r")
        for start, stop, digest in manifest["sites"][site]["sha256"]:
            assert hashlib.sha256(rows[start:stop].tobytes()).hexdigest() == digest, (site, start, stop)
