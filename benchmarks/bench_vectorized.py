"""Chain-iterations per second: vectorized chains against one chain, same run.

1. Bayesian logistic regression on MNIST 7 vs 9 shaped data (784 pixels + bias, the embedded 800
   training images), minibatch 100, EntropySGLD with eta = 0.01, 128 chains. Target: at least 30x
   the chain-iterations per second of a single chain.
2. The BNN study's network: a ``BayesianMLP`` 784-100-5 (79,005 weights) on the 2,000 embedded
   images of digits 0-4, minibatch 100, SGLD, 4 chains as one batched network, thinned to 20
   kept draws. Target: at least 1.5x (the step is dominated by the network, not by Python).

Run:  python benchmarks/bench_vectorized.py [--chains 128] [--iterations 300] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("CI", "1")

import torch  # noqa: E402

import pyro  # noqa: E402
from pyro_flat import MCMC, SGLD, EntropySGLD  # noqa: E402
from pyro_flat.datasets import load_mnist79, load_mnist_ood  # noqa: E402
from pyro_flat.models import BayesianMLP, logistic_regression  # noqa: E402


def timed_run(mcmc, chains: int, iterations: int, *args, **kwargs) -> tuple:
    """(chain-iterations per second, seconds, what ran) of ``mcmc.run(*args, **kwargs)``."""
    pyro.set_rng_seed(0)
    start = time.perf_counter()
    mcmc.run(*args, **kwargs)
    seconds = time.perf_counter() - start
    return chains * iterations / seconds, seconds, mcmc.chain_method


def chain_iterations_per_second(X, y, chains: int, iterations: int) -> tuple:
    kernel = EntropySGLD(logistic_regression, eta=0.01, step_size=5e-4, record_draws=False)
    mcmc = MCMC(kernel, iterations, 0, num_chains=chains, disable_progbar=True)
    return timed_run(mcmc, chains, iterations, X, y, batch_size=100, prior_scale=0.5)


def mlp_chain_iterations_per_second(data, chains: int, iterations: int) -> tuple:
    net = BayesianMLP(data.X_train.shape[1], [100], len(data.in_digits))
    mcmc = MCMC(SGLD(net, step_size=5e-5), iterations, 0, num_chains=chains, thinning=iterations // 20,
                chain_method="vectorized", disable_progbar=True)  # one chain: Pyro's driver
    return timed_run(mcmc, chains, iterations, data.X_train, data.y_train, batch_size=100)


def report(title, ones, manys, chains, target):
    one, one_s, _ = max(ones)
    many, many_s, method = max(manys)
    print(title)
    print(f"  1 chain                  {one:10.0f} chain-iterations/s  ({one_s:.1f} s)")
    print(f"  {chains} chains ({method}) {many:10.0f} chain-iterations/s  ({many_s:.1f} s)")
    ratio = many / one
    print(f"  ratio                    {ratio:10.1f}  {'ok' if ratio >= target else 'MISSED'} (target >= {target:g})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=128)
    parser.add_argument("--mlp-chains", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    X, y = load_mnist79(None, split="train")
    ones, manys = [], []
    for _ in range(args.repeats):  # alternate, keep the best of each: this machine is noisy
        ones.append(chain_iterations_per_second(X, y, 1, args.iterations * 4))
        manys.append(chain_iterations_per_second(X, y, args.chains, args.iterations))
    report(f"EntropySGLD, logistic regression d=785, N={len(X)}, minibatch 100, {args.threads} threads, "
           f"best of {args.repeats}", ones, manys, args.chains, 30)
    data = load_mnist_ood(None)
    ones, manys = [], []
    for _ in range(args.repeats):
        ones.append(mlp_chain_iterations_per_second(data, 1, args.iterations * 2))
        manys.append(mlp_chain_iterations_per_second(data, args.mlp_chains, args.iterations))
    report(f"SGLD, BayesianMLP 784-100-5 (79,005 weights), N={len(data.X_train)}, minibatch 100, "
           f"thinned to 20 draws, best of {args.repeats}", ones, manys, args.mlp_chains, 1.5)


if __name__ == "__main__":
    main()
