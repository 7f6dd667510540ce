"""The ``pyro-flat`` command line.

``pyro-flat demo`` runs Entropy-MCMC (EntropySGLD) and SGLD on a Bayesian logistic regression with
minibatches, prints the ArviZ summary and the Bayesian-model-averaged test metrics for θ, θa and
both, and writes the draws (netCDF), a trace plot and a short report to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import torch

import pyro
import pyro.distributions as dist


class UserError(Exception):
    """A problem with the command line: printed as one line, exit code 2."""


def logistic_regression(X: torch.Tensor, y: Optional[torch.Tensor] = None, batch_size: int = 100):
    """Bayesian logistic regression, w ~ N(0, I), b ~ N(0, 1), with a subsampled data plate."""
    w = pyro.sample("w", dist.Normal(torch.zeros(X.shape[1], dtype=X.dtype), 1.0).to_event(1))
    b = pyro.sample("b", dist.Normal(torch.zeros((), dtype=X.dtype), 1.0))
    with pyro.plate("data", X.shape[0], subsample_size=min(batch_size, X.shape[0])) as idx:
        logits = X.index_select(0, idx) @ w + b
        pyro.sample("y", dist.Bernoulli(logits=logits), obs=None if y is None else y.index_select(0, idx))


def synthetic_logistic_data(n_train: int, n_test: int, dim: int, seed: int):
    """Correlated Gaussian features, sparse true weights, labels from the logistic model."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(dim, dim, generator=g) / dim**0.5
    X = torch.randn(n_train + n_test, dim, generator=g) @ (torch.eye(dim) + mix)
    w = torch.zeros(dim)
    w[: max(1, dim // 4)] = torch.randn(max(1, dim // 4), generator=g) * 2
    y = torch.bernoulli(torch.sigmoid(X @ w + 0.5), generator=g)
    return (X[:n_train], y[:n_train]), (X[n_train:], y[n_train:])


def _out_dir(path: str) -> Path:
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {path} is a file; pass a directory (it is created if missing)")
    out.mkdir(parents=True, exist_ok=True)
    return out


def run_demo(args: argparse.Namespace) -> dict:
    from pyro.infer import MCMC

    import arviz as az
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from . import EntropySGLD, SGLD, bma_predict, metrics, to_arviz

    if args.eta <= 0:
        raise UserError(f"--eta must be > 0, got {args.eta}")
    if args.step_size <= 0:
        raise UserError(f"--step-size must be > 0, got {args.step_size}")
    if args.chains < 1 or args.num_samples < 1 or args.warmup < 0:
        raise UserError("--chains and --num-samples must be >= 1 and --warmup >= 0")
    out = _out_dir(args.out)
    torch.set_num_threads(1)  # faster for models of this size (benchmarks/bench_kernels.py)
    pyro.set_rng_seed(args.seed)
    (X, y), (X_test, y_test) = synthetic_logistic_data(args.n_train, 1000, args.dim, args.seed)
    print(f"Bayesian logistic regression: {args.n_train} training points, d = {args.dim}, "
          f"minibatch {args.batch_size}; eta = {args.eta}, step size = {args.step_size}")

    report = {}
    for name, kernel in [
        ("EntropySGLD", EntropySGLD(logistic_regression, eta=args.eta, step_size=args.step_size)),
        ("SGLD", SGLD(logistic_regression, step_size=args.step_size)),
    ]:
        mcmc = MCMC(kernel, num_samples=args.num_samples, warmup_steps=args.warmup,
                    num_chains=args.chains)
        start = time.perf_counter()
        mcmc.run(X, y, batch_size=args.batch_size)
        seconds = time.perf_counter() - start
        idata = to_arviz(mcmc)
        samples = mcmc.get_samples()
        uses = ["theta", "aux", "both"] if name == "EntropySGLD" else ["theta"]
        report[name] = {
            "seconds": round(seconds, 2),
            "bma": {u: metrics.classification_metrics(
                bma_predict(logistic_regression, samples, X_test, use=u, batch_size=args.batch_size),
                y_test) for u in uses},
        }
        summary = az.summary(idata, var_names=["b", "w"] + (["w_aux"] if name == "EntropySGLD" else []))
        report[name]["max_rhat"] = float(summary["r_hat"].max())
        report[name]["min_ess_bulk"] = float(summary["ess_bulk"].min())
        print(f"\n{name}: {seconds:.1f} s")
        print(summary.head(12).to_string())
        for u, m in report[name]["bma"].items():
            print(f"  BMA over {u:>5}: " + ", ".join(f"{k} {v:.4f}" for k, v in m.items()))
        if name == "EntropySGLD":
            idata.to_netcdf(str(out / "entropy_sgld.nc"))
            axes = az.plot_trace(idata, var_names=["b", "b_aux"], compact=True)
            axes[0, 0].figure.suptitle("EntropySGLD: bias b (θ) and its guiding twin b_aux (θa)")
            axes[0, 0].figure.tight_layout()
            axes[0, 0].figure.savefig(out / "trace.png", dpi=100)
            plt.close("all")

    (out / "report.json").write_text(json.dumps(report, indent=2))
    (out / "report.md").write_text(
        "# pyro-flat demo\n\n"
        f"Bayesian logistic regression, {args.n_train} points, d = {args.dim}, eta = {args.eta}, "
        f"step size = {args.step_size}, {args.chains} chain(s) x {args.num_samples} draws.\n\n"
        "| sampler | draws used | accuracy | NLL | Brier | ECE |\n|---|---|---|---|---|---|\n"
        + "".join(
            f"| {k} | {u} | {m['accuracy']:.4f} | {m['nll']:.4f} | {m['brier']:.4f} | {m['ece']:.4f} |\n"
            for k, r in report.items() for u, m in r["bma"].items()
        )
        + "\nFiles: `entropy_sgld.nc` (ArviZ netCDF: θ and θa draws, sample stats), "
        "`trace.png`, `report.json`.\n"
    )
    print(f"\nwrote {out / 'entropy_sgld.nc'}, {out / 'trace.png'}, {out / 'report.md'}")
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyro-flat", description="Flatness-seeking Bayesian inference with Pyro")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="EntropySGLD vs SGLD on a minibatched logistic regression")
    demo.add_argument("--eta", type=float, default=0.01, help="coupling variance η (default 0.01)")
    demo.add_argument("--step-size", type=float, default=5e-4, help="Langevin step α (default 5e-4)")
    demo.add_argument("--num-samples", type=int, default=int(os.environ.get("PYRO_FLAT_DEMO_SAMPLES", 1500)))
    demo.add_argument("--warmup", type=int, default=500)
    demo.add_argument("--chains", type=int, default=2)
    demo.add_argument("--n-train", type=int, default=2000)
    demo.add_argument("--dim", type=int, default=20)
    demo.add_argument("--batch-size", type=int, default=100)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--out", default="pyro-flat-out", help="output directory (default pyro-flat-out)")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            run_demo(args)
    except (UserError, ValueError) as err:
        print(f"pyro-flat: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
