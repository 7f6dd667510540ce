"""Cost per iteration of SGLD / EntropySGLD inside pyro.infer.MCMC against hand-written torch loops.

Bayesian logistic regression with MNIST-shaped data: N = 12000, d = 784 (+ bias), minibatch B = 100.
Every number is measured in this run; the ratios are what the targets refer to:

- EntropySGLD / SGLD (same path)                          target <= 1.25
- kernel in MCMC / hand-written loop doing the same update  target <= 3
- potential_fn path / hand-written loop                     target <= 3
- one thread / default threads (hand loop)                  informs the default

Run:  python benchmarks/bench_kernels.py [--iters 2000]
"""

from __future__ import annotations

import argparse
import math
import os
import time

os.environ.setdefault("CI", "1")  # no progress bar: it would be timed too

import torch

import pyro
from pyro.infer import MCMC
from pyro_flat import SGLD, EntropySGLD
from pyro_flat.targets import EpochBatcher
from pyro_flat.models import logistic_regression as model  # N(0, 1) prior, minibatch plate of B = 100

N, D, B = 12_000, 784, 100
STEP, ETA = 1e-6, 1e-2


def make_data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = (torch.rand(N, D, generator=g) < 0.2).float() * torch.rand(N, D, generator=g)
    w = torch.randn(D, generator=g) * 0.1
    y = torch.bernoulli(torch.sigmoid(X @ w), generator=g)
    return X, y


def log_joint(w, b, X, y, idx):
    logits = X.index_select(0, idx) @ w + b
    prior = -0.5 * (w.pow(2).sum() + b.pow(2))
    lik = -torch.nn.functional.binary_cross_entropy_with_logits(
        logits, y.index_select(0, idx), reduction="sum"
    )
    return prior + (N / B) * lik


def hand_loop(X, y, iters: int, entropy: bool) -> float:
    """The same update written directly: autograd gradient, epoch-shuffled minibatches."""
    w, b = torch.zeros(D), torch.zeros(())
    wa, ba = w.clone(), b.clone()
    noise = math.sqrt(2 * STEP)
    batches = EpochBatcher(N, B, X.device)  # epoch-shuffled minibatches, as the kernels draw them
    start = time.perf_counter()
    for _ in range(iters):
        idx = batches()
        w.requires_grad_(True), b.requires_grad_(True)
        U = -log_joint(w, b, X, y, idx)
        if entropy:
            U = U + ((w - wa).pow(2).sum() + (b - ba).pow(2)) / (2 * ETA)
        gw, gb = torch.autograd.grad(U, [w, b])
        with torch.no_grad():
            w_new = w - STEP * gw + noise * torch.randn_like(w)
            b_new = b - STEP * gb + noise * torch.randn_like(b)
            if entropy:
                wa = wa - STEP * (wa - w) / ETA + noise * torch.randn_like(wa)
                ba = ba - STEP * (ba - b) / ETA + noise * torch.randn_like(ba)
        w, b = w_new, b_new
    return (time.perf_counter() - start) / iters * 1e6


def mcmc_run(kernel, iters: int, *args, initial_params=None) -> float:
    mcmc = MCMC(kernel, num_samples=iters, warmup_steps=0, initial_params=initial_params,
                disable_progbar=True)
    start = time.perf_counter()
    mcmc.run(*args)
    return (time.perf_counter() - start) / iters * 1e6


def potential_factory(X, y):
    batches = EpochBatcher(N, B, X.device)

    def potential(p):
        return -log_joint(p["w"], p["b"], X, y, batches())

    return potential


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5, help="best of this many runs")
    iters = parser.parse_args().iters
    repeats = parser.parse_args().repeats
    X, y = make_data()
    default_threads = torch.get_num_threads()
    init = {"w": torch.zeros(D), "b": torch.zeros(())}  # one chain: no chain dimension

    torch.set_num_threads(default_threads)
    default_hand = min(hand_loop(X, y, iters, False) for _ in range(repeats))
    torch.set_num_threads(1)
    pyro.set_rng_seed(0)
    configs = {
        "hand SGLD": lambda: hand_loop(X, y, iters, False),
        "hand EntropySGLD": lambda: hand_loop(X, y, iters, True),
        "SGLD (model)": lambda: mcmc_run(SGLD(model, step_size=STEP), iters, X, y),
        "EntropySGLD (model)": lambda: mcmc_run(
            EntropySGLD(model, eta=ETA, step_size=STEP), iters, X, y),
        "SGLD (potential_fn)": lambda: mcmc_run(
            SGLD(potential_fn=potential_factory(X, y), step_size=STEP), iters,
            initial_params=init),
        "EntropySGLD (potential_fn)": lambda: mcmc_run(
            EntropySGLD(potential_fn=potential_factory(X, y), eta=ETA, step_size=STEP), iters,
            initial_params=init),
    }
    # Interleave the configurations and keep each one's best run: on a shared 2-core machine
    # the load drifts, and interleaving exposes every configuration to the same drift.
    results = {name: float("inf") for name in configs}
    for _ in range(repeats):
        for name, fn in configs.items():
            results[name] = min(results[name], fn())
    results["hand SGLD, default threads"] = default_hand

    print(f"Bayesian logistic regression N={N} d={D}+1 B={B}, {iters} iterations, best of {repeats}")
    print(f"threads: 1 (default would be {default_threads})\n")
    for name, us in results.items():
        print(f"  {name:<30s} {us:8.0f} us/iteration")
    ratios = [
        ("EntropySGLD / SGLD (model)", results["EntropySGLD (model)"] / results["SGLD (model)"], 1.25),
        ("EntropySGLD / SGLD (potential_fn)",
         results["EntropySGLD (potential_fn)"] / results["SGLD (potential_fn)"], 1.25),
        ("SGLD (model) / hand SGLD", results["SGLD (model)"] / results["hand SGLD"], 3.0),
        ("EntropySGLD (model) / hand EntropySGLD",
         results["EntropySGLD (model)"] / results["hand EntropySGLD"], 3.0),
        ("SGLD (potential_fn) / hand SGLD", results["SGLD (potential_fn)"] / results["hand SGLD"], 3.0),
        ("EntropySGLD (potential_fn) / hand EntropySGLD",
         results["EntropySGLD (potential_fn)"] / results["hand EntropySGLD"], 3.0),
        ("hand SGLD: 1 thread / default threads",
         results["hand SGLD"] / results["hand SGLD, default threads"], None),
    ]
    print()
    for name, ratio, target in ratios:
        verdict = "" if target is None else ("  ok" if ratio <= target else "  MISSED") + f" (target <= {target})"
        print(f"  {name:<46s} {ratio:5.2f}{verdict}")


if __name__ == "__main__":
    main()
