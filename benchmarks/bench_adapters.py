"""Low-rank adapters as the flat posterior: EntropySGLD on the adapters of a network against fine-tuning the
same adapters with ``torch.optim.SGD``, in one run (one thread).

The network is ``benchmarks/bench_deep.py``'s CNN (two 3x3 convolutions with BatchNorm, a 1568-32-10 head,
about 55k weights), its base frozen, rank-``r`` adapters (:func:`pyro_flat.nn.low_rank_adapters`) on every
convolution and linear layer; 28x28 inputs, minibatch 128, 2,000 images. Each time is the seconds per
iteration between two run lengths (the set-up cancels); the sampler keeps one draw per run. Baselines:

- SGD on the adapters: ``torch.optim.SGD`` over the LoRA factors only (forward, backward, update);
- SGD on the whole network (the cost of full fine-tuning, for scale).

Target (issue 63): one chain of EntropySGLD on the adapters <= 1.15x the SGD step on the same adapters.

Run:  python benchmarks/bench_adapters.py [--iterations 40] [--rank 4] [--threads 1]
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import pyro
from pyro_flat import MCMC, EntropySGLD
from pyro_flat.nn import BayesianModule, low_rank_adapters

from bench_deep import BATCH, N, STEP, cnn, per_iteration


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=40, help="iterations of the longer run of each")
    parser.add_argument("--rank", type=int, default=4, help="the adapters' rank")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    short, long = args.iterations // 4, args.iterations
    torch.manual_seed(0)
    X, y = torch.randn(N, 1, 28, 28), torch.randint(0, 10, (N,))
    base = cnn()
    adapted = low_rank_adapters(base, rank=args.rank)
    factors = sum(p.numel() for p in adapted.parameters() if p.requires_grad)

    def sgd(network: nn.Module):
        def run(iterations: int) -> None:
            net = network.train()
            optimiser = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=1e-3)
            for _ in range(iterations):
                idx = torch.randint(0, N, (BATCH,))
                optimiser.zero_grad()
                nn.functional.cross_entropy(net(X[idx]), y[idx]).backward()
                optimiser.step()
        return run

    def sampler(iterations: int) -> None:
        pyro.set_rng_seed(0)
        model = BayesianModule(adapted, prior=1.0)
        mcmc = MCMC(EntropySGLD(model, eta=0.1, step_size=STEP), num_samples=iterations, warmup_steps=0,
                    thinning=iterations, disable_progbar=True)
        mcmc.run(X, y, batch_size=BATCH)

    print(f"CNN of {sum(p.numel() for p in base.parameters()):,} weights, rank-{args.rank} adapters of {factors:,} "
          f"weights, minibatch {BATCH}, {args.threads} CPU thread(s); seconds per iteration ({short} and {long} "
          "iterations):")
    t_adapters = per_iteration(sgd(adapted), short, long)
    t_full = per_iteration(sgd(cnn()), short, long)
    t_sampler = per_iteration(sampler, short, long)
    print(f"  SGD on the adapters            {t_adapters * 1e3:8.2f} ms   1.00x")
    print(f"  SGD on the whole network       {t_full * 1e3:8.2f} ms   {t_full / t_adapters:.2f}x")
    print(f"  EntropySGLD on the adapters    {t_sampler * 1e3:8.2f} ms   {t_sampler / t_adapters:.2f}x  "
          f"(target <= 1.15x: {'met' if t_sampler / t_adapters <= 1.15 else 'not met'})")


if __name__ == "__main__":
    main()
