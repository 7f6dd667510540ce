"""Effective samples per second on the MNIST 7-vs-9 job: preconditioned against plain EntropySGLD
and against EntropyHMC, all measured in this run.

Bayesian logistic regression on the embedded split (800 images, 784 pixels + bias, prior sd 0.5),
η = 0.01, 4 vectorized chains, one thread. Each sampler's score is the **minimum** ArviZ bulk ESS
over every coordinate of θ and θa, divided by its wall time (warm-up and adaptation included):

- EntropySGLD, dense preconditioner (the job's default): step 0.2, 500 + 10,000 iterations, thin 5;
- EntropySGLD, plain: step 5e-4 (stable below 2/8,000, the largest curvature), 1,000 + 6,000 its, thin 10;
- EntropyHMC (full batch, Hessian metric): 250 warm-up + 800 draws.

Targets: preconditioned >= 50x plain, and >= EntropyHMC.

Run:  python benchmarks/bench_mnist79.py
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("CI", "1")


import torch  # noqa: E402

import pyro  # noqa: E402
from pyro_flat import MCMC, EntropyHMC, EntropySGLD, to_arviz  # noqa: E402
from pyro_flat.diagnostics import diagnostics_table  # noqa: E402
from pyro_flat.datasets import load_mnist79  # noqa: E402
from pyro_flat.models import logistic_regression  # noqa: E402

ETA, CHAINS, PRIOR_SCALE = 0.01, 4, 0.5

SAMPLERS = {
    "EntropySGLD, dense, pulled metric (the main job's; θ pulled by θa)": (
        lambda: EntropySGLD(logistic_regression, eta=ETA, step_size=0.2, preconditioner="dense"),
        dict(num_samples=5_000, warmup_steps=500, thinning=5), 100),
    "EntropySGLD, dense, joint metric (θ ignores θa)": (
        lambda: EntropySGLD(logistic_regression, eta=ETA, step_size=0.2, preconditioner="dense",
                            coupling_metric="joint"),
        dict(num_samples=5_000, warmup_steps=500, thinning=5), 100),
    "EntropySGLD, plain": (
        lambda: EntropySGLD(logistic_regression, eta=ETA, step_size=5e-4),
        dict(num_samples=6_000, warmup_steps=1_000, thinning=10), 100),
    "EntropyHMC (Hessian metric)": (
        lambda: EntropyHMC(logistic_regression, eta=ETA, full_mass="hessian"),
        dict(num_samples=800, warmup_steps=250), None),
}


def measure(make, settings, batch_size, X, y):
    pyro.set_rng_seed(0)
    mcmc = MCMC(make(), num_chains=CHAINS, disable_progbar=True, **settings)
    start = time.perf_counter()
    mcmc.run(X, y, batch_size=batch_size, prior_scale=PRIOR_SCALE)
    seconds = time.perf_counter() - start
    table = diagnostics_table(to_arviz(mcmc))  # unrounded R-hat
    return seconds, float(table["ess_bulk"].min()), float(table["r_hat"].max())


def main():
    torch.set_num_threads(1)
    X, y = load_mnist79(None, split="train")
    print(f"MNIST 7 vs 9, {len(X)} images, eta {ETA}, {CHAINS} chains, 1 thread; min over the 1,570 "
          "coordinates of θ and θa")
    print(f"  {'sampler':64} {'seconds':>8} {'min ESS bulk':>13} {'max R-hat':>10} {'ESS/s':>9}")
    rate = {}
    for name, (make, settings, batch_size) in SAMPLERS.items():
        seconds, ess, rhat = measure(make, settings, batch_size, X, y)
        rate[name] = ess / seconds
        print(f"  {name:64} {seconds:8.1f} {ess:13.0f} {rhat:10.4f} {rate[name]:9.2f}")
    pre, joint, plain, hmc = rate.values()
    print()
    print(f"  preconditioned / plain EntropySGLD   {pre / plain:8.1f}x   target >= 50   "
          f"{'ok' if pre >= 50 * plain else 'MISSED'}")
    print(f"  preconditioned / EntropyHMC          {pre / hmc:8.2f}x   target >= 1    "
          f"{'ok' if pre >= hmc else 'MISSED'}")
    print(f"  pulled / joint metric (price of the pull) {pre / joint:7.2f}x")


if __name__ == "__main__":
    main()
