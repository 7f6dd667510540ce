"""Step time of the flat-seeking ELBOs against Pyro's Trace_ELBO, in one run, on the BNN of `pyro-flat bnn`.

A BayesianMLP 784-100-5 (79,005 weights) on 2,000 MNIST-shaped images, minibatch 100, Adam; one
thread. SAM_ELBO and SABMA_ELBO take two gradient evaluations per step, so the target is a ratio
<= 2.2 against Trace_ELBO with the same guide, measured in the same run, for AutoNormal; with
AutoLowRankMultivariateNormal (rank 10) SABMA_ELBO also solves with the guide's Fisher: target <= 3.
SWAG: AutoSWAG (rank 20, recording every iterate) trained by plain SGD against the same point-mass
fit without recording (Pyro's AutoLaplaceApproximation): target <= 1.2; SA-SWAG (SAM_ELBO): <= 2.2.

Run:  python benchmarks/bench_svi.py [--steps 200]
"""

from __future__ import annotations

import argparse
import time

import torch

import pyro
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoLaplaceApproximation, AutoLowRankMultivariateNormal, AutoNormal

from pyro_flat import SABMA_ELBO, SAM_ELBO, AutoSWAG
from pyro_flat.models import BayesianMLP

N, D, K, HIDDEN, B = 2000, 784, 5, 100, 100
TARGETS = {"AutoNormal": 2.2, "AutoLowRankMultivariateNormal": 3.0}
GUIDES = {"AutoNormal": lambda net: AutoNormal(net, init_scale=0.01),
          "AutoLowRankMultivariateNormal": lambda net: AutoLowRankMultivariateNormal(net, init_scale=0.01, rank=10),
          "AutoLaplaceApproximation": lambda net: AutoLaplaceApproximation(net),
          "AutoSWAG": lambda net: AutoSWAG(net, rank=20)}


def step_time(elbo, guide_name: str, X, y, steps: int, optim=None) -> float:
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    net = BayesianMLP(D, [HIDDEN], K)
    guide = GUIDES[guide_name](net)
    svi = SVI(net, guide, optim or pyro.optim.Adam({"lr": 1e-3}), elbo)
    for _ in range(10):  # warm-up: set the guide up, fill caches
        svi.step(X, y, batch_size=B)
    start = time.perf_counter()
    for _ in range(steps):
        svi.step(X, y, batch_size=B)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    X = torch.rand(N, D, generator=g) * (torch.rand(N, D, generator=g) < 0.2)
    y = torch.randint(0, K, (N,), generator=g)
    print(f"BayesianMLP {D}-{HIDDEN}-{K}, minibatch {B}, {args.steps} steps each, 1 thread")
    for guide_name, target in TARGETS.items():
        elbos = {"Trace_ELBO": Trace_ELBO(), "SAM_ELBO(rho=0.05)": SAM_ELBO(0.05),
                 "SABMA_ELBO(gamma=0.01)": SABMA_ELBO(0.01)}
        times = {name: step_time(elbo, guide_name, X, y, args.steps) for name, elbo in elbos.items()}
        base = times["Trace_ELBO"]
        print(f"{guide_name}:")
        for name, t in times.items():
            ratio = t / base
            verdict = "" if name == "Trace_ELBO" else (
                f"  (target <= {target:g}: {'met' if ratio <= target else 'MISSED'})")
            print(f"  {name:<24} {1e3 * t:7.2f} ms/step   {ratio:4.2f}x Trace_ELBO{verdict}")
    sgd = lambda: pyro.optim.SGD({"lr": 1e-4})  # noqa: E731
    runs = {"MAP, no recording (AutoLaplaceApproximation)": ("AutoLaplaceApproximation", Trace_ELBO(), None),
            "SWAG (AutoSWAG, rank 20)": ("AutoSWAG", Trace_ELBO(), 1.2),
            "SA-SWAG (AutoSWAG, SAM_ELBO(rho=0.05))": ("AutoSWAG", SAM_ELBO(0.05), 2.2)}
    times = {name: step_time(elbo, guide, X, y, args.steps, sgd()) for name, (guide, elbo, _) in runs.items()}
    base = times["MAP, no recording (AutoLaplaceApproximation)"]
    print("SGD on a point mass (MAP):")
    for name, t in times.items():
        target = runs[name][2]
        verdict = "" if target is None else f"  (target <= {target:g}: {'met' if t / base <= target else 'MISSED'})"
        print(f"  {name:<44} {1e3 * t:7.2f} ms/step   {t / base:4.2f}x plain SGD{verdict}")

if __name__ == "__main__":
    main()
