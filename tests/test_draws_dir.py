"""Draws streamed to disk (``MCMC(draws_dir=...)``): the same draws as in memory, in .npy files numpy reads
alone, and resident memory that does not grow with the draws."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import pyro
from pyro_flat import MCMC, SGHMC

from checkpoint_worker import data, model


def _run(**kwargs):
    pyro.set_rng_seed(1)
    mcmc = MCMC(SGHMC(model, step_size=1e-4), num_samples=200, warmup_steps=20, num_chains=3, thinning=2,
                disable_progbar=True, **kwargs)
    mcmc.run(*data(), batch_size=20)
    return mcmc


def test_streamed_draws_are_the_in_memory_ones_in_npy_files(tmp_path, monkeypatch):
    from pyro_flat import draws

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
