"""EntropyHMC against Pyro's NUTS on ``flat_posterior(model)``: minimum ESS per second, same run.

Bayesian logistic regression on MNIST 7 vs 9 (784 pixels + bias, N = 2000 images of the official
test set in ``../shared/data/mnist``, else the 1,000 embedded ones), prior N(0, 1), eta = 0.01.
Both samplers target the same joint over (w, b, w_aux, b_aux), draw the same number of samples
after the same warm-up, and are scored by the smallest ArviZ bulk ESS over the 785 coordinates of
theta and, separately, of theta_a, divided by the wall time (warm-up included). NumPyro's NUTS on
the same joint is added when ``numpyro`` imports.

Run:  python benchmarks/bench_hmc.py [--draws 100] [--warmup 100] [--chains 2]  (about 10 minutes)
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("CI", "1")

import arviz as az  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import pyro  # noqa: E402
from pyro.infer import NUTS  # noqa: E402
from pyro_flat import MCMC, EntropyHMC, flat_posterior  # noqa: E402
from pyro_flat.datasets import load_mnist79  # noqa: E402
from pyro_flat.models import logistic_regression  # noqa: E402

ETA, PRIOR_SCALE = 0.01, 1.0


def load_data(n: int = 2000):
    try:
        X, y = load_mnist79("../shared/data/mnist", split="test")
    except (OSError, ValueError):
        X, y = load_mnist79(None, split="train")
        X2, y2 = load_mnist79(None, split="test")
        X, y = torch.cat([X, X2]), torch.cat([y, y2])
    return X[:n], y[:n]


def min_ess(samples: dict, names, method: str = "bulk") -> float:
    """Smallest ESS over every coordinate of ``names``; bulk ESS is capped at the number of draws
    (antithetic chains report more, which would reward anti-correlation rather than mixing)."""
    arrays = {k: samples[k].reshape(samples[k].shape[:2] + (-1,)).cpu().numpy() for k in names}
    ess = az.ess(az.from_dict(posterior=arrays), method=method)
    draws = next(iter(arrays.values())).shape[0] * next(iter(arrays.values())).shape[1]
    return min(float(min(ess[k].min() for k in names)), float(draws))


def score(label: str, samples: dict, seconds: float, extra: str = "") -> dict:
    theta, aux = min_ess(samples, ["w", "b"]), min_ess(samples, ["w_aux", "b_aux"])
    tail = min_ess(samples, ["w", "b", "w_aux", "b_aux"], "tail")
    print(f"  {label:34s} {seconds:7.1f} s  min ESS θ {theta:6.1f} θa {aux:6.1f} (tail {tail:6.1f})  "
          f"ESS/s θ {theta / seconds:6.3f} θa {aux / seconds:6.3f}  {extra}")
    return {"theta": theta / seconds, "aux": aux / seconds, "tail": tail / seconds}


def run_entropy_hmc(X, y, draws, warmup, chains):
    kernel = EntropyHMC(logistic_regression, eta=ETA, aux_update="joint", full_mass="hessian")
    mcmc = MCMC(kernel, draws, warmup, num_chains=chains, disable_progbar=True)
    pyro.set_rng_seed(0)
    start = time.perf_counter()
    mcmc.run(X, y, batch_size=None, prior_scale=PRIOR_SCALE)
    seconds = time.perf_counter() - start
    steps = int(kernel._last_stats["n_steps"][0])
    acc = np.mean([float(torch.as_tensor(d["acceptance rate"]).mean()) for d in mcmc._diagnostics])
    return score(f"EntropyHMC joint ({mcmc.chain_method})", mcmc.get_samples(group_by_chain=True),
                 seconds, f"[{steps} leapfrog steps, acc {acc:.2f}]")


def run_pyro_nuts(X, y, draws, warmup, chains):
    kernel = NUTS(flat_posterior(logistic_regression, eta=ETA))
    mcmc = pyro.infer.MCMC(kernel, draws, warmup, num_chains=chains, disable_progbar=True)
    pyro.set_rng_seed(0)
    start = time.perf_counter()
    mcmc.run(X, y, batch_size=None, prior_scale=PRIOR_SCALE)
    seconds = time.perf_counter() - start
    return score("Pyro NUTS on flat_posterior", mcmc.get_samples(group_by_chain=True), seconds)


def run_numpyro_nuts(X, y, draws, warmup, chains):
    try:
        import jax
        import jax.numpy as jnp
        import numpyro
        import numpyro.distributions as ndist
        from numpyro.infer import MCMC as NMCMC, NUTS as NNUTS
    except ImportError:
        print("  NumPyro NUTS                        (numpyro not installed: skipped)")
        return None
    Xj, yj = jnp.asarray(X.numpy()), jnp.asarray(y.numpy())

    def model():
        w = numpyro.sample("w", ndist.Normal(0.0, PRIOR_SCALE).expand([X.shape[1]]).to_event(1))
        b = numpyro.sample("b", ndist.Normal(0.0, PRIOR_SCALE))
        numpyro.sample("w_aux", ndist.Normal(w, ETA ** 0.5).to_event(1))
        numpyro.sample("b_aux", ndist.Normal(b, ETA ** 0.5))
        numpyro.sample("y", ndist.Bernoulli(logits=Xj @ w + b), obs=yj)

    mcmc = NMCMC(NNUTS(model), num_warmup=warmup, num_samples=draws, num_chains=chains,
                 chain_method="sequential", progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(0))
    seconds = time.perf_counter() - start
    samples = {k: torch.as_tensor(np.asarray(v)) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    return score("NumPyro NUTS (incl. JIT compile)", samples, seconds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--skip-pyro", action="store_true", help="only EntropyHMC (and NumPyro)")
    args = parser.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    X, y = load_data()
    print(f"logistic regression, N={len(X)}, d={X.shape[1] + 1}, eta={ETA}; {args.chains} chains x "
          f"({args.warmup} warm-up + {args.draws} draws)")
    ours = run_entropy_hmc(X, y, args.draws, args.warmup, args.chains)
    numpyro_score = run_numpyro_nuts(X, y, args.draws, args.warmup, args.chains)
    if not args.skip_pyro:
        pyro_score = run_pyro_nuts(X, y, args.draws, args.warmup, args.chains)
        for key, label in (("theta", "θ"), ("aux", "θa"), ("tail", "tail")):
            ratio = ours[key] / pyro_score[key]
            print(f"  EntropyHMC / Pyro NUTS, ESS/s of {label:4s}   {ratio:7.2f}  "
                  f"{'ok' if ratio >= 5 else 'MISSED'} (target >= 5)")
    if numpyro_score:
        for key, label in (("theta", "θ"), ("aux", "θa"), ("tail", "tail")):
            ratio = ours[key] / numpyro_score[key]
            print(f"  EntropyHMC / NumPyro NUTS, ESS/s of {label:4s} {ratio:7.2f}  (goal >= 1)")


if __name__ == "__main__":
    main()
