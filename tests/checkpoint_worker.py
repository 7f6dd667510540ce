"""A run that ``tests/test_checkpoint.py`` starts in a process of its own, kills and starts again.

``python tests/checkpoint_worker.py CASE CHECKPOINT|none OUT [DRAWS_DIR]``: runs ``CASE`` (seeded), with
checkpoints to ``CHECKPOINT`` every 20 ms (at the first draw after), its draws streamed to ``DRAWS_DIR`` if
given, and saves its draws and statistics to ``OUT``. Under ``torchrun`` (``RANK`` set) the chains are
split over the ranks (``chain_method="distributed"``, each iteration slowed by 1 ms so that a kill lands
mid-run) and rank 0 saves them.
"""

import os
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import pyro
from pyro_flat import MCMC, SGLD, EntropyHMC, EntropySGHMC, EntropySGLD, schedules, to_arviz
from pyro_flat.nn import BayesianModule, Batches

from linear_regression import data, model  # N = 400, D = 3


#: name -> (kernel, warm-up, draws, thinning, minibatch size)
CASES = {
    "SGLD": lambda: (SGLD(model, step_size=1e-4), 300, 3000, 1, 20),
    "SGLD, short": lambda: (SGLD(model, step_size=1e-4), 100, 3000, 1, 20),
    "SGLD, dense preconditioner, cyclical": lambda: (
        SGLD(model, preconditioner="dense", schedule=schedules.cyclical_cosine(num_steps=6000, num_cycles=6)),
        300, 3000, 1, 20),
    # a cosine schedule: the step changes at every iteration, a graph input; the exploration phases unfused
    "EntropySGLD, jit fx, thinning 4 (fused), cyclical": lambda: (
        EntropySGLD(model, eta=0.1, step_size=1e-4, jit_compile="fx",
                    schedule=schedules.cyclical_cosine(num_steps=6400, num_cycles=4)), 200, 3000, 4, 20),
    "EntropySGHMC, diagonal preconditioner": lambda: (
        EntropySGHMC(model, eta=0.1, preconditioner="diagonal", momentum=0.7), 300, 3000, 1, 20),
    "EntropyHMC, adaptation": lambda: (EntropyHMC(model, eta=0.1), 250, 100, 1, None),
    # each chain draws from its own generator (random_streams="per_chain"), whose state the checkpoint holds
    "EntropySGHMC, jit fx, thinning 4 (fused), per-chain streams": lambda: (
        EntropySGHMC(model, eta=0.1, momentum=0.7, step_size=1e-4, jit_compile="fx"), 200, 6000, 4, 20),
    "SGLD, short, per-chain streams": lambda: (SGLD(model, step_size=1e-4), 100, 3000, 1, 20),
    # mixed precision: the kernel's target wrapped in autocast, its setting in the checkpoint's fingerprint (this
    # model has no matrix product, so its numbers stay fp32: tests/test_mixed_precision.py checks the bf16 ones)
    "EntropySGLD, bf16 autocast": lambda: (EntropySGLD(model, eta=0.1, step_size=1e-4, autocast="bf16"), 200, 3000, 1,
                                           20),
    # a network whose data come from a shuffling DataLoader (torch's global stream): the checkpoint holds its place
    "SGLD, network fed by a DataLoader": lambda: (SGLD(BayesianModule(torch.nn.Linear(3, 2)), step_size=1e-4),
                                                  300, 3000, 1, 20),
}


def loader_data(batch_size: int) -> Batches:
    """``data()`` as two classes, from a shuffling ``DataLoader``."""
    X, y = data()
    dataset = TensorDataset(X.float(), (y > 0).long())
    return Batches(DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True))


def run(case: str, checkpoint, every: float = 0.02, draws_dir=None):
    pyro.set_rng_seed(11)  # first: a network's own weights (chain 0's start) come from torch's stream
    kernel, warmup, samples, thinning, batch_size = CASES[case]()
    ranks = {} if "RANK" not in os.environ else {
        "chain_method": "distributed", "hook_fn": lambda *_: time.sleep(1e-3)}
    streams = "per_chain" if case.endswith("per-chain streams") else "shared"
    mcmc = MCMC(kernel, num_samples=samples, warmup_steps=warmup, num_chains=3, thinning=thinning,
                disable_progbar=True, checkpoint=checkpoint, checkpoint_every=every, draws_dir=draws_dir,
                random_streams=streams, **ranks)
    if case.endswith("fed by a DataLoader"):
        mcmc.run(loader_data(batch_size))
    else:
        mcmc.run(*data(), batch_size=batch_size)
    if mcmc.rank != 0:
        return None
    stats = to_arviz(mcmc).sample_stats
    draws = {k: v.clone() for k, v in mcmc.get_samples(group_by_chain=True).items()}  # out of a draws_dir's files
    return {"draws": draws, "stats": {k: stats[k].values for k in stats.data_vars}}


if __name__ == "__main__":
    case, checkpoint, out = sys.argv[1:4]
    draws_dir = sys.argv[4] if len(sys.argv) > 4 else None
    result = run(case, None if checkpoint == "none" else checkpoint, draws_dir=draws_dir)
    if result is not None:
        torch.save(result, out)  # the process group pyro-flat made under torchrun ends at exit (atexit)
