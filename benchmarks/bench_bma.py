"""Bayesian model averaging over many draws: ``bma_predict`` in blocks of draws against one draw at a
time, in one run.

The tour's model (docs/tour.md: a 5-feature logistic regression with a subsampled plate), θ and θa draws, 1,000
test points, one thread. ``bma_predict`` runs a model that broadcasts over a leading dimension of its
latents on blocks of draws (``pyro_flat.predictive.BLOCK_ELEMENTS`` probabilities a block); setting
that to 1 gives the one-draw-at-a-time loop it replaced. Target: >= 20x, the same averages within
float32 round-off.

Run:  python benchmarks/bench_bma.py [--draws 2000]
"""

from __future__ import annotations

import argparse
import time

import torch

import pyro
import pyro.distributions as dist
import pyro_flat
import pyro_flat.predictive as predictive


def model(X, y=None):
    with pyro.plate("features", X.shape[1]):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
    with pyro.plate("data", X.shape[0], subsample_size=100) as idx:
        logits = (X[idx] * w.unsqueeze(-2)).sum(-1)
        pyro.sample("y", dist.Bernoulli(logits=logits), obs=None if y is None else y[idx])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=2000, help="θ draws (as many θa draws again)")
    draws_per_site = parser.parse_args().draws
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(1000, 5, generator=g)
    draws = {"w": torch.randn(draws_per_site, 5, generator=g), "w_aux": torch.randn(draws_per_site, 5, generator=g)}
    start = time.perf_counter()
    blocks = pyro_flat.bma_predict(model, draws, X)
    fast = time.perf_counter() - start
    default, predictive.BLOCK_ELEMENTS = predictive.BLOCK_ELEMENTS, 1
    try:
        start = time.perf_counter()
        one_by_one = pyro_flat.bma_predict(model, draws, X)
        slow = time.perf_counter() - start
    finally:
        predictive.BLOCK_ELEMENTS = default
    print(f"bma_predict, {2 * draws_per_site:,} draws (θ and θa) on {len(X):,} points, one thread:")
    print(f"  one draw at a time  {slow:8.3f} s   1.00x")
    print(f"  in blocks of draws  {fast:8.3f} s   {slow / fast:.0f}x faster (target >= 20x); "
          f"max |difference| {float((blocks - one_by_one).abs().max()):.1e}")


if __name__ == "__main__":
    main()
