"""Checkpoints of runs fed by a loader (:class:`pyro_flat.nn.Batches`): a run stopped at any iteration and
started again with a new loader object, as a new process would make, continues to the draws of the run
never stopped, bit for bit; a loader whose position cannot be restored is refused by name.

The stop is a ``KeyboardInterrupt`` from the run's hook with a checkpoint after every iteration (the
SIGKILL loop of a loader run is in ``tests/test_checkpoint.py``).
"""

import random

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pyro
import pyro.distributions as dist
from pyro_flat import MCMC, SGLD
from pyro_flat.storage.checkpoint import CheckpointError
from pyro_flat.nn import BayesianModule, Batches

N, B, D = 64, 16, 3


def _dataset(rows=N):
    g = torch.Generator().manual_seed(5)
    X = torch.randn(rows, D, generator=g)
    return TensorDataset(X, (X[:, 0] > 0).long())


class ListLoader:
    """A loader that saves its own position (as torchdata's ``StatefulDataLoader`` does)."""

    def __init__(self, dataset):
        self.dataset, self.batch_size, self.position, self.epoch = dataset, B, 0, 0

    def __iter__(self):
        order = torch.randperm(N, generator=torch.Generator().manual_seed(self.epoch))
        while self.position < N // B:
            rows = order[self.position * B:(self.position + 1) * B]
            self.position += 1
            yield self.dataset[rows]
        self.position, self.epoch = 0, self.epoch + 1

    def state_dict(self):
        return {"position": self.position, "epoch": self.epoch}

    def load_state_dict(self, state):
        self.position, self.epoch = state["position"], state["epoch"]


LOADERS = {
    "shuffled, seeded generator": lambda: DataLoader(_dataset(), batch_size=B, shuffle=True,
                                                    generator=torch.Generator().manual_seed(0)),
    "shuffled, global stream": lambda: DataLoader(_dataset(), batch_size=B, shuffle=True),
    "short last batch skipped": lambda: DataLoader(_dataset(N + 6), batch_size=B, shuffle=True),
    "two worker processes": lambda: DataLoader(_dataset(), batch_size=B, shuffle=True, num_workers=2),
    "own state_dict": lambda: ListLoader(_dataset()),
    "a list of batches": lambda: [_dataset()[i * B:(i + 1) * B] for i in range(N // B)],
}


class Stop(Exception):
    pass


def _run(path, make_loader, stop_at=None):
    """Seeded SGLD on a network fed by the loader, 3 chains, 30 draws after 10 warm-up steps, a checkpoint
    after every iteration; ``stop_at``: the run is stopped by an exception at that iteration."""
    def hook(kernel, params, stage, i):
        if stop_at is not None and kernel.iteration >= stop_at:
            raise Stop
    pyro.set_rng_seed(3)
    torch.manual_seed(3)
    mcmc = MCMC(SGLD(BayesianModule(nn.Linear(D, 2)), step_size=1e-3), num_samples=30, warmup_steps=10,
                num_chains=3, checkpoint=path, checkpoint_every=1e-9, disable_progbar=True, hook_fn=hook)
    loader = make_loader()
    mcmc.run(Batches(loader, num_data=N if isinstance(loader, list) else None, batch_size=B))
    return mcmc.get_samples(group_by_chain=True)


@pytest.mark.parametrize("kind", list(LOADERS))
def test_a_run_fed_by_a_loader_stopped_and_started_again_gives_the_uninterrupted_draws(tmp_path, kind):
    reference = _run(tmp_path / "reference.ckpt", LOADERS[kind])
    for stop_at in (7, 23):  # in warm-up, and in the sampling phase in the middle of a pass
        with pytest.raises(Stop):
            _run(tmp_path / "run.ckpt", LOADERS[kind], stop_at=stop_at)
    resumed = _run(tmp_path / "run.ckpt", LOADERS[kind])
    for name, value in reference.items():
        assert torch.equal(resumed[name], value), name


def _step(k):
    """The minibatch indices of step ``k``: a row of its own (the same row twice gets the same batch back)."""
    return torch.full((B,), k)


class PrivateShuffle:
    """A loader that shuffles from a stream of its own that no checkpoint sees."""

    def __init__(self):
        self.dataset, self.batch_size, self.random = _dataset(), B, random.Random()

    def __iter__(self):
        rows = list(range(N))
        self.random.shuffle(rows)
        for i in range(N // B):
            yield self.dataset[torch.tensor(rows[i * B:(i + 1) * B])]


def test_a_loader_whose_order_cannot_be_replayed_is_refused_at_resume(tmp_path):
    with pytest.raises(Stop):
        _run(tmp_path / "run.ckpt", PrivateShuffle, stop_at=15)
    with pytest.raises(ValueError, match="did not give back the batches of the checkpoint's run.*generator="):
        _run(tmp_path / "run.ckpt", PrivateShuffle)


def test_a_one_shot_generator_is_refused_before_the_run_and_named_when_exhausted(tmp_path):
    def once():
        yield from (_dataset()[i * B:(i + 1) * B] for i in range(N // B))

    mcmc = MCMC(SGLD(BayesianModule(nn.Linear(D, 2)), step_size=1e-3), num_samples=5, warmup_steps=0,
                checkpoint=tmp_path / "run.ckpt", disable_progbar=True)
    with pytest.raises(ValueError, match="one-shot iterator \\(generator\\): it cannot be iterated again"):
        mcmc.run(Batches(once(), num_data=N, batch_size=B))
    assert list(tmp_path.iterdir()) == []
    data = Batches(once(), num_data=N, batch_size=B)
    for step in range(N // B):
        data.take(_step(step))
    with pytest.raises(ValueError, match="the loader is exhausted: generator is a one-shot iterator"):
        data.take(_step(N // B))


def test_uneven_batches_are_refused_not_skipped():
    """Batches of 16, 10, 16 and 22 rows: skipping the 10 and the 22 would leave half the rows unused."""
    X, y = _dataset().tensors
    cuts = [0, 16, 26, 42, 64]
    data = Batches([(X[a:b], y[a:b]) for a, b in zip(cuts, cuts[1:])], num_data=64, batch_size=16)
    data.take(_step(0))
    with pytest.raises(ValueError, match="a batch of 10 rows where Batches expects batch_size=16"):
        data.take(_step(1))
    short_last = Batches([(X[:16], y[:16]), (X[16:26], y[16:26])], num_data=26, batch_size=16)
    for step in range(3):  # the short last batch of each pass is skipped: every batch is the first
        x, _ = short_last.take(_step(step))
        assert torch.equal(x, X[:16])


def test_nan_in_a_loaders_batch_is_named():
    X, y = _dataset().tensors
    X = X.clone()
    X[20, 1] = float("nan")
    data = Batches(DataLoader(TensorDataset(X, y), batch_size=B))
    data.take(_step(0))
    with pytest.raises(ValueError, match="x holds NaN or infinite values \\(item 2 of its pass\\)"):
        data.take(_step(1))


def test_a_run_across_ranks_is_not_started_over_on_one_process(tmp_path):
    """The files of a 2-rank run, and a run of one process on the same ``checkpoint=``: refused, not ignored."""
    for rank in range(2):
        (tmp_path / f"run.rank{rank}.ckpt").write_bytes(b"rank's checkpoint")
    with pytest.raises(CheckpointError, match="across 2 ranks.*torchrun --nproc_per_node 2"):
        _run(tmp_path / "run.ckpt", LOADERS["a list of batches"])
    assert (tmp_path / "run.rank1.ckpt").read_bytes() == b"rank's checkpoint"


def test_fewer_or_more_ranks_than_the_checkpoints_are_refused(tmp_path):
    from pyro_flat.distributed.driver import refuse_other_world_sizes

    path = tmp_path / "run.ckpt"
    path.write_bytes(b"one process's checkpoint")
    with pytest.raises(CheckpointError, match="run of one process: continue it without torchrun"):
        refuse_other_world_sizes(path, 2)
    path.unlink()
    for rank in range(3):
        (tmp_path / f"run.rank{rank}.ckpt").write_bytes(b"")
    (tmp_path / "run.rank2.previous.ckpt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="across 3 ranks, and this run has 2"):
        refuse_other_world_sizes(path, 2)
    refuse_other_world_sizes(path, 3)  # its own files


PRIOR_SCALE = 1.0


def global_scale_model(X, y):
    w = pyro.sample("w", dist.Normal(torch.zeros(D), PRIOR_SCALE).to_event(1))
    with pyro.plate("data", X.shape[0], subsample_size=B) as idx:
        pyro.sample("y", dist.Bernoulli(logits=(X[idx] * w).sum(-1)), obs=y[idx].float())


def test_a_module_level_constant_the_model_reads_is_part_of_the_fingerprint(tmp_path):
    global PRIOR_SCALE
    X, y = _dataset().tensors

    def run():
        pyro.set_rng_seed(0)
        MCMC(SGLD(global_scale_model, step_size=1e-3), num_samples=3, warmup_steps=1, num_chains=2,
             checkpoint=tmp_path / "run.ckpt", disable_progbar=True).run(X, y)

    run()
    run()  # unchanged: the finished run back
    PRIOR_SCALE = 0.5
    try:
        with pytest.raises(CheckpointError, match="model: .*PRIOR_SCALE"):
            run()
    finally:
        PRIOR_SCALE = 1.0


def test_ctrl_c_writes_the_iterations_checkpoint_then_stops_and_the_rerun_continues(tmp_path):
    """SIGINT (Ctrl-C) in the middle of a run whose checkpoints are an hour apart: the run finishes the
    iteration, writes its checkpoint, raises KeyboardInterrupt; started again it gives the draws of the run
    never stopped. Before, the stop lost everything since the last timed checkpoint."""
    import os
    import signal

    from pyro_flat.storage.checkpoint import read_checkpoint

    def run(path, interrupt_at=None):
        def hook(kernel, params, stage, i):
            if kernel.iteration == interrupt_at:
                os.kill(os.getpid(), signal.SIGINT)  # as a Ctrl-C arrives, during the run
        pyro.set_rng_seed(3)
        mcmc = MCMC(SGLD(BayesianModule(nn.Linear(D, 2)), step_size=1e-3), num_samples=30, warmup_steps=10,
                    num_chains=3, checkpoint=path, checkpoint_every=3600, disable_progbar=True, hook_fn=hook)
        mcmc.run(*_dataset().tensors, batch_size=B)
        return mcmc.get_samples(group_by_chain=True)

    reference = run(tmp_path / "reference.ckpt")
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "run.ckpt", interrupt_at=17)
    assert read_checkpoint(tmp_path / "run.ckpt")["done"] == 17
    assert signal.getsignal(signal.SIGINT) is handler  # the handler of before is back
    resumed = run(tmp_path / "run.ckpt")
    for name, value in reference.items():
        assert torch.equal(resumed[name], value), name
