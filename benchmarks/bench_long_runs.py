"""What checkpoints cost a long run, and what resuming costs.

The MNIST 7-vs-9 study's run (EntropySGLD, dense metric, 4 vectorized chains, embedded data, one thread):

1. the same seeded run without checkpoints and with one every ``--every`` seconds (default 2, so that a
   short run writes many): the extra time per write, and the share of a run's time at one checkpoint
   every 30 s (the issue's target: <= 2%) when a write costs what it cost at the end of this run;
2. the same run with its draws streamed to ``.npy`` files (``draws_dir``) against in memory (target <= 5%);
3. resuming: ``run()`` on the finished run's checkpoint (set-up, reading the file, restoring) against the
   set-up alone (a run of one draw without checkpoint).

Run:  python benchmarks/bench_long_runs.py [--samples 6000] [--every 2]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("CI", "1")  # no progress bar: it would be timed too

import torch

import pyro
from pyro_flat import MCMC
from pyro_flat.datasets import load_mnist79
from pyro_flat.experiments.configs import MNIST79Config
from pyro_flat.experiments.mnist79.study import make_study_kernel
from pyro_flat.models import logistic_regression


def timed_run(samples: int, checkpoint=None, every: float = 30.0, warmup: int = 500, draws_dir=None):
    X, y = load_mnist79(None, split="train")
    kernel = make_study_kernel("entropy-sgld", MNIST79Config(), logistic_regression)
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, num_samples=samples, warmup_steps=warmup, num_chains=4, thinning=5, disable_progbar=True,
                checkpoint=checkpoint, checkpoint_every=every, draws_dir=draws_dir)
    start = time.perf_counter()
    mcmc.run(X, y, batch_size=100, prior_scale=0.5)
    return time.perf_counter() - start, mcmc


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=6000, help="iterations after warm-up (thinned by 5)")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between checkpoints in the timed run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "run.ckpt")

    plain, _ = timed_run(args.samples)
    writes = []
    from pyro_flat.storage import checkpoint as checkpoint_module

    original = checkpoint_module.write_checkpoint

    def counted(target, payload, *args, **kwargs):  # time every write of the run
        start = time.perf_counter()
        original(target, payload, *args, **kwargs)
        writes.append(time.perf_counter() - start)

    checkpoint_module.write_checkpoint = counted
    try:
        with_checkpoints, _ = timed_run(args.samples, path, args.every)
    finally:
        checkpoint_module.write_checkpoint = original
    size = os.path.getsize(path)
    last = writes[-1]
    print(f"EntropySGLD on MNIST 7 vs 9: 4 chains x (500 + {args.samples}) iterations, thin 5, 1 thread")
    print(f"  without checkpoints      {plain:7.2f} s")
    print(f"  checkpoint every {args.every:g} s   {with_checkpoints:7.2f} s ({len(writes)} writes, "
          f"{(with_checkpoints - plain) / plain * 100:+.1f} %: {sum(writes):.2f} s writing)")
    print(f"  last write: {last * 1e3:.0f} ms for {size / 1e6:.1f} MB; at one checkpoint every 30 s that is "
          f"{last / 30 * 100:.2f} % of the run's time (target <= 2 %)")

    streamed, _ = timed_run(args.samples, draws_dir=os.path.join(folder, "draws"))
    print(f"  draws streamed to .npy files {streamed:7.2f} s ({(streamed - plain) / plain * 100:+.1f} % against in "
          "memory; target <= 5 %)")

    setup_only, _ = timed_run(5, warmup=0)  # the set-up and one draw (5 iterations)
    resumed, _ = timed_run(args.samples, path, args.every)  # the finished checkpoint: restore, no sampling
    print(f"  resuming the finished run: {resumed:.2f} s, against {setup_only:.2f} s for the set-up alone "
          f"(+{resumed - setup_only:.2f} s to read and restore)")


if __name__ == "__main__":
    main()
