"""A CNN as a flat posterior: EntropySGLD on a ``BayesianModule`` against hand-written steps on the same
network, and 4 vectorized chains against one, in one run (one thread).

The network: two 3x3 convolutions (16 and 32 channels) with BatchNorm, ReLU and 2x2 max-pooling, then a
1568-32-10 head (about 55k weights); 28x28 inputs, minibatch 128, 2,000 training images. Each time is
the seconds per iteration between two run lengths (the set-up cancels). Baselines:

- a plain ``torch.optim.SGD`` training step (forward, backward, update);
- a hand-written Entropy-MCMC step on the same network: that step plus the coupling
  :math:`(\\theta - \\theta_a)/\\eta`, θa's update and the Gaussian noise of both.

Targets: one chain of EntropySGLD <= 1.15x the hand-written step and <= 1.3x the SGD step; 4 vectorized
chains give >= 0.95x the chain-iterations per second of one chain alone (vectorizing costs nothing). The 4 chains run both
ways a ``BayesianModule`` offers (``networks="loop"``, the default on a CPU, and ``"vmap"``).

Run:  python benchmarks/bench_deep.py [--iterations 30]
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn

import pyro
from pyro_flat import MCMC, EntropySGLD
from pyro_flat.nn import BayesianModule

N, BATCH, ETA, STEP = 2000, 128, 0.1, 1e-6


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 7 * 7, 32), nn.ReLU(), nn.Linear(32, 10))


def per_iteration(run, short: int, long: int) -> float:
    """Seconds per iteration: (time of ``long`` - time of ``short``) / (long - short), after one untimed run."""
    run(short)
    times = []
    for iterations in (short, long):
        start = time.perf_counter()
        run(iterations)
        times.append(time.perf_counter() - start)
    return (times[1] - times[0]) / (long - short)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=30, help="iterations of the longer run of each")
    long = parser.parse_args().iterations
    short = max(long // 3, 2)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    X, y = torch.randn(N, 1, 28, 28), torch.randint(0, 10, (N,))
    weights = sum(p.numel() for p in cnn().parameters())

    def sgd(iterations: int) -> None:
        net = cnn().train()
        optimiser = torch.optim.SGD(net.parameters(), lr=1e-3, weight_decay=1e-4)
        for _ in range(iterations):
            idx = torch.randint(0, N, (BATCH,))
            optimiser.zero_grad()
            nn.functional.cross_entropy(net(X[idx]), y[idx]).backward()
            optimiser.step()

    def by_hand(iterations: int) -> None:
        net = cnn().train()
        params = list(net.parameters())
        aux = [p.detach().clone() for p in params]
        noise = math.sqrt(2 * STEP)
        for _ in range(iterations):
            idx = torch.randint(0, N, (BATCH,))
            loss = N * nn.functional.cross_entropy(net(X[idx]), y[idx]) + 0.5 * sum(p.square().sum() for p in params)
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, a, g in zip(params, aux, grads):
                    pull = (p - a) / ETA
                    p.add_(-STEP * (g + pull) + noise * torch.randn_like(p))
                    a.add_(STEP * pull + noise * torch.randn_like(a))

    def sampler(chains: int, networks: str = "auto"):
        def run(iterations: int) -> None:
            pyro.set_rng_seed(0)
            model = BayesianModule(cnn(), prior=1.0, networks=networks)
            mcmc = MCMC(EntropySGLD(model, eta=ETA, step_size=STEP), num_samples=iterations, warmup_steps=0,
                        num_chains=chains, disable_progbar=True)
            mcmc.run(X, y, batch_size=BATCH)
            assert chains == 1 or mcmc.chain_method == "vectorized"
        return run

    print(f"CNN of {weights:,} weights, minibatch {BATCH}, one thread; seconds per iteration ({short} and {long} "
          "iterations):")
    t_sgd = per_iteration(sgd, short, long)
    t_hand = per_iteration(by_hand, short, long)
    t_one = per_iteration(sampler(1), short, long)
    t_four = per_iteration(sampler(4, "loop"), short, long)
    t_vmap = per_iteration(sampler(4, "vmap"), short, long)
    print(f"  torch.optim.SGD step              {t_sgd * 1e3:8.1f} ms")
    print(f"  hand-written Entropy-MCMC step    {t_hand * 1e3:8.1f} ms")
    print(f"  EntropySGLD, 1 chain              {t_one * 1e3:8.1f} ms   {t_one / t_hand:.2f}x the hand-written "
          f"step (target <= 1.15x), {t_one / t_sgd:.2f}x the SGD step (target <= 1.3x)")
    for label, t in (("loop, the CPU's default", t_four), ("vmap", t_vmap)):
        print(f"  EntropySGLD, 4 vectorized chains, networks={label:24s} {t * 1e3:8.1f} ms   chain-iterations per "
              f"second {4 / t:.1f} against one chain's {1 / t_one:.1f}: {(4 / t) / (1 / t_one):.2f}x (target >= 0.95x)")


if __name__ == "__main__":
    main()
