"""The momentum samplers against the Langevin ones: cost per iteration, and ESS per gradient on MNIST 7 vs 9.

1. Cost per iteration (pyro_flat.MCMC, eager and jit-compiled without the compile time, one thread) of SGHMC / SGLD and
   EntropySGHMC / EntropySGLD on Bayesian logistic regression with MNIST-shaped data (N = 12000,
   d = 784 + 1, minibatch 100), one chain and 128 vectorized chains. Target <= 1.1 for each ratio.
2. The MNIST 7-vs-9 study's own run (embedded data, dense preconditioner, 4 chains of 500 warm-up +
   5,000 iterations, every 5th kept): the smallest bulk ESS over θ's and θa's 1,570 coordinates, per
   gradient evaluation (warm-up and Hessian-vector products included), EntropySGHMC against
   EntropySGLD at the same budget and step size. No target: an honest comparison.

Run:  python benchmarks/bench_momentum.py [--iters 400] [--repeats 3] [--skip-ess]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("CI", "1")  # no progress bar: it would be timed too

import torch

import pyro
from bench_kernels import B, D, ETA, N, STEP, make_data  # the same problem as the Langevin kernels' benchmark
from pyro_flat import MCMC, SGHMC, SGLD, EntropySGHMC, EntropySGLD
from pyro_flat.models import logistic_regression as model


def seconds_per_iteration(kernel, chains: int, iters: int, X, y) -> float:
    mcmc = MCMC(kernel, num_samples=iters, warmup_steps=0, num_chains=chains, disable_progbar=True,
                chain_method="vectorized")
    start = time.perf_counter()
    mcmc.run(X, y)
    return (time.perf_counter() - start - kernel.compile_seconds) / iters  # compiling is a one-off cost


def cost_ratios(iters: int, repeats: int) -> None:
    X, y = make_data()
    torch.set_num_threads(1)
    pyro.set_rng_seed(0)
    kernels = {"SGLD": lambda jit: SGLD(model, step_size=STEP, jit_compile=jit),
               "SGHMC": lambda jit: SGHMC(model, step_size=STEP, jit_compile=jit),
               "EntropySGLD": lambda jit: EntropySGLD(model, eta=ETA, step_size=STEP, jit_compile=jit),
               "EntropySGHMC": lambda jit: EntropySGHMC(model, eta=ETA, step_size=STEP, jit_compile=jit)}
    print(f"Cost per iteration: logistic regression N={N} d={D}+1 B={B}, {iters} iterations, best of {repeats}, "
          "1 thread")
    for jit in (False, True):
        for chains in (1, 128):
            n = max(iters // (2 if chains > 1 else 1), 20)
            best = {name: float("inf") for name in kernels}
            for _ in range(repeats):  # interleaved: every kernel sees the same load drift
                for name, make in kernels.items():
                    best[name] = min(best[name], seconds_per_iteration(make(jit), chains, n, X, y))
            label = f"{'compiled' if jit else 'eager':<8s} {chains:>3d} chain(s)"
            for momentum, langevin in (("SGHMC", "SGLD"), ("EntropySGHMC", "EntropySGLD")):
                ratio = best[momentum] / best[langevin]
                verdict = "ok" if ratio <= 1.1 else "MISSED"
                print(f"  {label}: {momentum} {best[momentum] * 1e6:8.0f} us / {langevin} "
                      f"{best[langevin] * 1e6:8.0f} us = {ratio:4.2f}  {verdict} (target <= 1.1)")


def ess_per_gradient() -> None:
    from pyro_flat.datasets import load_mnist79
    from pyro_flat.experiments.configs import MNIST79Config
    from pyro_flat.experiments.mnist79.study import run_sampler
    import arviz as az

    X, y = load_mnist79(None, split="train")
    print("\nESS per gradient evaluation on MNIST 7 vs 9 (the study's run: dense metric, step 0.2, 4 chains x "
          "(500 + 5000) iterations, thin 5)")
    for name, momentum in (("entropy-sgld", None), ("entropy-sghmc", 0.5), ("entropy-sghmc", 0.9)):
        config = MNIST79Config(sampler=name, baseline=None, reference=None, momentum=momentum or 0.9,
                               progress=False, threads=1)
        run = run_sampler(name, config, X, y)
        idata = az.from_dict(posterior={k: v.numpy() for k, v in run.samples.items()})
        ess = az.ess(idata, method="bulk")
        min_ess = min(float(ess[k].min()) for k in ess.data_vars)
        rhat = az.rhat(idata)
        max_rhat = max(float(rhat[k].max()) for k in rhat.data_vars)
        grads = float(run.sample_stats["grad_evals"][0, -1])
        label = name + ("" if momentum is None else f", momentum {momentum}")
        print(f"  {label:<28s} min bulk ESS {min_ess:7.0f}, max R-hat {max_rhat:.4f}, {grads:.0f} gradients "
              f"per chain: {min_ess / (4 * grads) * 1000:6.2f} ESS per 1,000 gradients, {run.seconds:5.1f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    parser.add_argument("--skip-ess", action="store_true", help="only the cost per iteration")
    args = parser.parse_args()
    cost_ratios(args.iters, args.repeats)
    if not args.skip_ess:
        ess_per_gradient()


if __name__ == "__main__":
    main()
