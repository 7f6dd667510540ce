"""Seeded runs of every kernel, pinned: the draws and per-draw statistics that a refactoring must
leave unchanged.

``python tests/pinned_draws.py`` writes ``tests/data/pinned_draws.json`` from the code as it is;
``python tests/pinned_draws.py --compare`` checks the code against that file bit for bit (on the
machine that wrote it); ``test_pinned_draws.py`` checks it to 1e-9 relative in float64, which
survives another CPU's summation order but not a changed random stream or update rule.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable, Dict

import torch

import pyro
import pyro.distributions as dist

PINNED = Path(__file__).parent / "data" / "pinned_draws.json"


def _data(n: int = 40, d: int = 3):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.bernoulli(torch.sigmoid(X @ torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64)), generator=g)
    return X, y


def model(X, y, batch_size=10):
    """Logistic regression with a positive scale site (a transform) and a subsampled plate."""
    d = X.shape[-1]
    with pyro.plate("features", d, dim=-1):
        w = pyro.sample("w", dist.Normal(torch.zeros((), dtype=X.dtype), 1.0))
    s = pyro.sample("s", dist.LogNormal(torch.zeros((), dtype=X.dtype), 0.5))
    with pyro.plate("data", X.shape[0], subsample_size=batch_size, dim=-1) as idx:
        logits = (X[idx] * w.unsqueeze(-2)).sum(-1) * s  # idx: (B,), or per chain (C, B)
        pyro.sample("y", dist.Bernoulli(logits=logits), obs=y[idx])


def _quadratic(params):
    x = params["x"]
    return 0.5 * (x * torch.tensor([1.0, 4.0], dtype=x.dtype)).mul(x).sum(-1)


def _cases() -> Dict[str, Callable]:
    from pyro_flat import (MCMC, SASGLD, SGD, SGHMC, SGLD, EntropyHMC, EntropySGHMC, EntropySGLD, FlatSGLD,
                           LocalEntropySGD, LocalEntropySGLD)
    from pyro_flat.kernels import SAMSGD

    def run(kernel, chains=1, warmup=10, samples=12, thinning=1, batch_size=10, minibatches="per_chain"):
        mcmc = MCMC(kernel, num_samples=samples, warmup_steps=warmup, num_chains=chains, thinning=thinning,
                    disable_progbar=True, minibatches=minibatches)
        mcmc.run(*_data(), batch_size=batch_size)
        return mcmc

    def potential(kernel, chains=1):
        start = {"x": torch.tensor([1.0, -1.0], dtype=torch.float64).expand(chains, 2).clone()}
        mcmc = MCMC(kernel, num_samples=12, warmup_steps=10, num_chains=chains, disable_progbar=True,
                    initial_params=start if chains > 1 else {"x": start["x"][0]})
        mcmc.run()
        return mcmc

    return {
        "SGLD": lambda: run(SGLD(model, step_size=0.01)),
        "SGLD, 3 vectorized chains": lambda: run(SGLD(model, step_size=0.01), chains=3),
        "SGLD, 3 vectorized chains, shared minibatches": lambda: run(SGLD(model, step_size=0.01), chains=3,
                                                                     minibatches="shared"),
        "SGLD, 2 sequential chains": lambda: _sequential(SGLD(model, step_size=0.01)),
        "SGLD, jit fx": lambda: run(SGLD(model, step_size=0.01, jit_compile="fx"), chains=2),
        "SGD": lambda: run(SGD(model, step_size=0.01)),
        "EntropySGLD": lambda: run(EntropySGLD(model, eta=0.5, step_size=0.01), chains=2),
        "EntropySGLD, thinning 3": lambda: run(EntropySGLD(model, eta=0.5, step_size=0.01), thinning=3),
        "EntropySGLD, dense block": lambda: run(
            EntropySGLD(model, eta=0.5, preconditioner="dense", coupling_metric="block"), chains=2),
        "EntropySGLD, dense joint": lambda: run(
            EntropySGLD(model, eta=0.5, preconditioner="dense", coupling_metric="joint")),
        "EntropySGLD, dense pulled": lambda: run(EntropySGLD(model, eta=0.5, preconditioner="dense"), chains=2),
        "EntropySGLD, diagonal pull 0.5": lambda: run(
            EntropySGLD(model, eta=0.5, preconditioner="diagonal", coupling_metric=0.5), chains=2),
        "EntropySGLD, jit fx": lambda: run(EntropySGLD(model, eta=0.5, step_size=0.01, jit_compile="fx"),
                                           chains=2),
        "EntropySGLD, jit fx, thinning 3 (fused)": lambda: run(
            EntropySGLD(model, eta=0.5, step_size=0.01, jit_compile="fx"), chains=2, thinning=3, samples=24),
        "EntropySGLD, potential_fn": lambda: potential(
            EntropySGLD(potential_fn=_quadratic, eta=0.5, step_size=0.05), chains=2),
        "SGHMC": lambda: run(SGHMC(model, step_size=0.01)),
        "SGHMC, friction, 3 vectorized chains": lambda: run(SGHMC(model, step_size=0.01, friction=2.0), chains=3),
        "SGHMC, jit fx, thinning 3 (fused)": lambda: run(SGHMC(model, step_size=0.01, jit_compile="fx"), chains=2,
                                                         thinning=3, samples=24),
        "EntropySGHMC": lambda: run(EntropySGHMC(model, eta=0.5, step_size=0.01, momentum=0.8), chains=2),
        "EntropySGHMC, dense pulled": lambda: run(EntropySGHMC(model, eta=0.5, preconditioner="dense")),
        "LocalEntropySGLD": lambda: run(LocalEntropySGLD(model, eta=0.5, step_size=0.01, num_inner_steps=3)),
        "LocalEntropySGD": lambda: run(LocalEntropySGD(model, eta=0.5, step_size=0.01, num_inner_steps=3),
                                       chains=2),
        "SASGLD": lambda: run(SASGLD(model, step_size=0.01, rho=0.05), chains=2),
        "SAMSGD": lambda: run(SAMSGD(model, step_size=0.01, rho=0.05), chains=2),
        "FlatSGLD": lambda: run(FlatSGLD(model, step_size=0.01, sigma=0.05)),
        "EntropyHMC": lambda: run(EntropyHMC(model, eta=0.5, step_size=0.1, num_steps=4), batch_size=None),
        "EntropyHMC, 2 vectorized chains": lambda: run(
            EntropyHMC(model, eta=0.5, step_size=0.1, num_steps=4, adapt_step_size=False), chains=2, warmup=4,
            batch_size=None),
        "EntropyHMC, NUTS, Gibbs aux": lambda: run(EntropyHMC(model, eta=0.5, use_nuts=True, aux_update="gibbs"),
                                                   samples=6, batch_size=None),
        "EntropyHMC, potential_fn": lambda: potential(EntropyHMC(potential_fn=_quadratic, eta=0.5, step_size=0.2,
                                                                 num_steps=3, adapt_step_size=False)),
    }


def _sequential(kernel):
    from pyro_flat import MCMC

    mcmc = MCMC(kernel, num_samples=8, warmup_steps=5, num_chains=2, chain_method="sequential",
                disable_progbar=True)
    mcmc.run(*_data())
    return mcmc


def pinned_runs() -> Dict[str, Dict[str, list]]:
    """Every case's draws (grouped by chain) and ``sample_stats``, as nested lists."""
    from pyro_flat import to_arviz

    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    out = {}
    try:
        for name, case in _cases().items():
            pyro.set_rng_seed(0)
            mcmc = case()
            record = {f"draw {k}": v.tolist() for k, v in sorted(mcmc.get_samples(group_by_chain=True).items())}
            stats = to_arviz(mcmc).sample_stats
            record.update({f"stat {k}": stats[k].values.tolist() for k in sorted(stats.data_vars)})
            out[name] = record
    finally:
        torch.set_default_dtype(default)
    return out


if __name__ == "__main__":
    runs = pinned_runs()
    if "--compare" in sys.argv:
        pinned = json.loads(PINNED.read_text())
        changed = [name for name in pinned if runs.get(name) != pinned[name]]
        print("bit-identical" if not changed and set(runs) == set(pinned) else f"changed: {changed}")
        sys.exit(1 if changed else 0)
    PINNED.parent.mkdir(exist_ok=True)
    PINNED.write_text(json.dumps(runs, indent=None, sort_keys=True))
    print(f"wrote {PINNED} ({len(runs)} cases)")
