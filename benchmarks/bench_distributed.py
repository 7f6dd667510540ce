"""Chains and gradients across ranks (torch.distributed, gloo), against one rank, same run.

1. Chain throughput: 8 chains of EntropySGLD on MNIST 7 vs 9 (the embedded 800 training images,
   784 pixels + bias, minibatch 100 per chain, eta = 0.01; compiled, 10 iterations per kept draw),
   split over 2 ranks of one thread each (``chain_method="distributed"``), against the same 8 chains
   in one rank of one thread, and in one process of two threads; the ceiling is two unrelated runs of
   4 chains at once. Target: at least 1.7x chain-iterations per second with 2 ranks against 1. Runs
   on this 2-core machine vary by up to 30% (one rank is slowed while the other is not), so each
   configuration runs ``--repeats`` times, in turn, and the medians are compared.
2. Data-parallel overhead: one SGLD chain at a global minibatch of 100, on 2 ranks that each hold
   half the images and draw 50 of them per step (``chain_method="data_parallel"``), against one rank
   that holds all of them (eager: a traced graph cannot all-reduce). Reported: time per iteration,
   and the share of it in all-reduce.

The sampling phase is timed (set-up, warm-up and compiling excluded; gathering the draws included); the
ranks start it together (a barrier), so that one rank's longer compile does not count as throughput.

Each configuration runs under ``torchrun`` (``python -m torch.distributed.run``) on localhost.

Run:  python benchmarks/bench_distributed.py [--iterations 3000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("CI", "1")


def _worker(kind: str, chains: int, iterations: int, out: str) -> None:
    """One rank's part; rank 0 writes ``{seconds, allreduce_seconds, ...}`` to ``out``."""
    import torch
    import torch.distributed as dist

    import pyro
    from pyro_flat import MCMC, SGLD, EntropySGLD
    from pyro_flat.datasets import load_mnist79
    from pyro_flat.distributed import init_from_env, shard_rows
    from pyro_flat.models import logistic_regression

    ranks = init_from_env()
    X, y = load_mnist79()
    allreduce = [0.0]
    if ranks.distributed:  # time every all-reduce (the data-parallel gradient and the error checks)
        original = dist.all_reduce

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                allreduce[0] += time.perf_counter() - start

        dist.all_reduce = timed
    if kind == "chains":  # compiled and fused (thinning 10): the per-chain work, not Python, dominates
        kernel = EntropySGLD(logistic_regression, eta=0.01, step_size=5e-4, record_draws=False, jit_compile=True)
        method, batch, thinning, warmup = ("distributed" if ranks.distributed else "vectorized"), 100, 10, 200
    else:
        kernel = SGLD(logistic_regression, step_size=5e-4, record_draws=False)
        method, batch, thinning, warmup = "data_parallel", 100 // ranks.world_size, 1, 50
        X, y = shard_rows(X, ranks.rank, ranks.world_size), shard_rows(y, ranks.rank, ranks.world_size)
    started, last = [], [0.0]

    def sampling_starts(kernel, params, stage, i):  # time the sampling phase: set-up and compiling excluded
        if stage == "Sample" and not started:
            if ranks.distributed:  # start together (one rank's longer compile is not throughput) through the
                failure = ranks.check(None)  # driver's own error check: a rank that raised meets it there
                if failure is not None:
                    raise failure
            allreduce[0] = 0.0
            started.append(time.perf_counter())
        last[0] = time.perf_counter()

    mcmc = MCMC(kernel, iterations, warmup, num_chains=chains, chain_method=method, thinning=thinning,
                disable_progbar=True, hook_fn=sampling_starts)
    pyro.set_rng_seed(0)
    mcmc.run(X, y, batch_size=batch, prior_scale=0.5)
    end = time.perf_counter()
    seconds, gather = end - started[0], end - last[0]  # the gathering of the draws included
    if ranks.is_main:
        with open(out, "w") as f:
            json.dump({"seconds": seconds, "gather_seconds": gather, "allreduce_seconds": allreduce[0], "ranks": ranks.world_size,
                       "threads": torch.get_num_threads(), "chain_method": mcmc.chain_method}, f)
    ranks.finish()


def launch(kind: str, ranks: int, threads: int, chains: int, iterations: int) -> dict:
    """Run one configuration under torchrun; rank 0's measurements."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
                   "--master-port", str(_free_port()), __file__, "--worker", kind, "--chains", str(chains),
                   "--iterations", str(iterations), "--out", out]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "PASSIVE"}
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=900)
        with open(out) as f:
            return json.load(f)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spread(runs: list) -> str:
    return ", ".join(f"{r['seconds']:.2f}" for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=3000, help="post-warm-up iterations per chain")
    parser.add_argument("--chains", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each configuration of part 1 (medians)")
    parser.add_argument("--worker", choices=["chains", "data"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        return _worker(args.worker, args.chains if args.worker == "chains" else 1, args.iterations, args.out)

    n, c = args.iterations, args.chains
    print(f"1. chain throughput: {c} chains of EntropySGLD on MNIST 7 vs 9, {n} iterations each, minibatch 100 "
          f"per chain; median of {args.repeats} runs of each configuration, run in turn")
    names = ["1 rank, 1 thread", "1 rank, 2 threads", "2 ranks, 1 thread each", "ceiling"]
    runs = {name: [] for name in names}
    from concurrent.futures import ThreadPoolExecutor

    for _ in range(args.repeats):
        for name, (ranks, threads) in zip(names, [(1, 1), (1, 2), (2, 1)]):
            runs[name].append(launch("chains", ranks, threads, c, n))
        with ThreadPoolExecutor(2) as pool:  # the machine's ceiling: two unrelated runs of half the chains at once
            halves = [f.result() for f in [pool.submit(launch, "chains", 1, 1, c // 2, n) for _ in range(2)]]
        runs["ceiling"].append(max(halves, key=lambda h: h["seconds"]))
    seconds = {name: statistics.median(r["seconds"] for r in rs) for name, rs in runs.items()}
    base = c * n / seconds["1 rank, 1 thread"]
    for name in names[:3]:
        rate, r = c * n / seconds[name], runs[name][-1]
        print(f"   {name:24s} {seconds[name]:6.2f} s ({_spread(runs[name])})  {rate:8.0f} chain-iterations/s  {rate / base:4.2f}x  "
              f"({r['chain_method']}; last run: all-reduce {r['allreduce_seconds']:.2f} s, gathering the draws "
              f"{r['gather_seconds']:.2f} s)")
    ceiling = seconds["1 rank, 1 thread"] / seconds["ceiling"]
    print(f"   ceiling: two independent 1-rank runs of {c // 2} chains at once, {seconds['ceiling']:.2f} s "
          f"({_spread(runs['ceiling'])}): {ceiling:.2f}x")
    ratio = seconds["1 rank, 1 thread"] / seconds["2 ranks, 1 thread each"]
    print(f"   2 ranks against 1 rank: {ratio:.2f}x (target >= 1.7x: {'met' if ratio >= 1.7 else 'MISSED'}; "
          f"{ratio / ceiling:.0%} of the ceiling)")

    print(f"\n2. data-parallel overhead: 1 SGLD chain, global minibatch 100, {n} iterations")
    one, two = launch("data", 1, 1, 1, n), launch("data", 2, 1, 1, n)
    for name, r in (("1 rank (all 800 images)", one), ("2 ranks (400 images each)", two)):
        print(f"   {name:26s} {1e6 * r['seconds'] / n:7.1f} us/iteration, all-reduce "
              f"{100 * r['allreduce_seconds'] / r['seconds']:4.1f}% of it")
    print(f"   2 ranks against 1: {one['seconds'] / two['seconds']:.2f}x the iterations per second")


if __name__ == "__main__":
    main()
