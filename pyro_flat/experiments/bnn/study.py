r"""The BNN study behind ``pyro-flat bnn``: every BNN family, plain and sharpness-aware, over seeds.

:func:`run_bnn_study` trains a :class:`~pyro_flat.models.BayesianMLP` (or, with ``network="cnn"``, a
:class:`~pyro_flat.models.BayesianCNN`) on some MNIST digits (the embedded data by default) with each
method of :mod:`.bnn_families` — the five families of "Flat Seeking BNNs" (SGLD, BBB, SWAG,
MC-dropout, deep ensembles), each with its sharpness-aware version,
and EntropySGLD, FlatSGLD and SA-BMA beside them — under **the same budget of gradient
evaluations** per trajectory, once per seed. For each fit it measures the Bayesian model average's
test accuracy, NLL and ECE, its out-of-distribution AUROC (predictive entropy on the held-out
digits), the same three metrics on test sets shifted by rotation and by additive noise at several
strengths (:mod:`pyro_flat.data.shift`), and the top Hessian eigenvalue and trace of the full-data
negative log-likelihood (prior excluded) at a few of its draws (:mod:`pyro_flat.flatness`). The
report (:mod:`.bnn_report`) gives every number as mean ± standard error over the seeds, compares
each sharpness-aware version with its baseline by the paired difference over seeds, and counts the
families for which the paper's claim holds beyond the error bars.
:func:`run_toy_study` runs the samplers on the 2-D sharp/flat energy, from the sharp mode.

>>> cfg = BNNConfig(grad_evals=100, num_draws=5, progress=False)
>>> cfg.iterations(2), cfg.in_digits, cfg.thinning(2), cfg.seeds  # 25 iterations after burn-in, 5 kept
(50, (0, 1, 2, 3, 4), 5, 3)
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from typing import Callable, Dict, List

import numpy as np
import torch

import pyro

from ... import flatness
from ...evaluation import metrics
from ...data.datasets import load_mnist_ood
from ...distributed import Ranks
from ...models.mixtures import sharp_flat_2d
from ...models.zoo import BayesianClassifier
from ...evaluation.predictive import bma_predict
from ...data.shift import shifted_test_sets
from .families import Fit, bnn_network, fit_method, loss_trend, make_bnn_kernel, network_text, sampler_label
from .report import findings, plot_families, plot_shift, report_markdown, row_text, summarize
from ..configs import BNN_SAMPLERS, BNNConfig
from ..output import across_ranks, hold_signals, seeds_over_ranks, threads_record


def row_label(fit: Fit, use: str) -> str:
    """The name of a fit's row: its method's, with θ or θa for EntropySGLD's two variables."""
    return fit.label if fit.uses == ("theta",) else f"{fit.label} {'θa' if use == 'aux' else 'θ'}"


def evaluate(fit: Fit, use: str, config: BNNConfig, data, shifted, seed: int) -> dict:
    """BMA accuracy, NLL, Brier, ECE and OOD AUROC of one fit's variable ``use``, the same metrics on
    each shifted test set (``shift``: a list over ``shifted``), and the top eigenvalue and trace of
    the training NLL at ``config.flatness_draws`` of its flatness points (without dropout)."""
    sets = [data.X_test, data.X_ood] + [images for _, _, images in shifted]
    with torch.no_grad():  # one pass over every test set: a dropout draw gives each image its own mask
        probs = bma_predict(fit.model, fit.samples, torch.cat(sets), use=use).split([len(x) for x in sets])
    row = {**metrics.classification_metrics(probs[0], data.y_test), "ood_auroc": metrics.ood_auroc(probs[0], probs[1])}
    row["shift"] = [{"kind": kind, "strength": strength, "accuracy": metrics.accuracy(p, data.y_test),
                     "nll": metrics.nll(p, data.y_test), "ece": metrics.ece(p, data.y_test)}
                    for (kind, strength, _), p in zip(shifted, probs[2:])]
    with fit.model.without_dropout():  # all the training images in one pass (7x faster than in minibatches)
        flat = flatness.flatness_at_samples(fit.model, fit.flat_points, data.X_train, data.y_train, use=use, k=1,
                                            num_probes=config.trace_probes, num_draws=config.flatness_draws,
                                            seed=seed, likelihood_only=True, batch_size=None)
    row.update(top_eigenvalue=float(flat["top_eigenvalues"][:, 0].mean()), trace=float(flat["trace"].mean()),
               flatness_draws=len(flat["trace"]))
    return row


def run_bnn_study(config: BNNConfig, *, log: Callable[[str], None] = print) -> dict:
    """Fit every method of ``config.methods`` at ``config.seeds`` seeds; write ``report.md``,
    ``report.json``, ``families.png``, ``shift.png`` and ``bma_vs_models.png`` to ``config.out``.
    Returns the report (on rank 0).

    Under ``torchrun`` the seeds are split over the ranks (the i-th seed on rank i mod R, each rank
    its share of the cores); every fit is the one-process fit of its seed, rank 0 gathers the rows
    and alone writes, and the report names the ranks and the backend."""
    config.validate()
    return across_ranks(config, lambda config, staging, ranks: _run_bnn_study(config, staging, log, ranks),
                        _follow, log)


def _follow(config: BNNConfig, ranks: Ranks) -> None:
    """A rank other than 0: fit its seeds and hand the rows to rank 0."""
    _fit_all_seeds(config, ranks, load_mnist_ood(config.data_dir, in_digits=config.in_digits), lambda text: None)


def _fit_all_seeds(config: BNNConfig, ranks: Ranks, data, log: Callable[[str], None]):
    """Every seed fitted and evaluated, the seeds split over the ranks
    (:func:`~.output.seeds_over_ranks`): ``(runs, ensembles)`` on rank 0, the rows in seed order with the
    first seed's BMA-by-size curves, ``None`` elsewhere."""
    model = bnn_network(config, data)
    shifted = shifted_test_sets(data.X_test, rotations=config.rotations, noise_sds=config.noise_sds, seed=config.seed)
    start = time.perf_counter()

    def fit_seed(seed: int):
        runs: List[dict] = []  # one row per fit and variable
        ensembles: Dict[str, dict] = {}
        for method in config.methods:
            fit = fit_method(method, config, model, data, seed)
            drop, drop_se = loss_trend(fit.records)
            for use in fit.uses:
                label = row_label(fit, use)
                row = {"label": label, "method": method, "seed": seed, "steps": fit.steps,
                       "grad_evals": fit.grad_evals, "seconds": fit.seconds, "loss_drop": drop,
                       "loss_drop_se": drop_se, **evaluate(fit, use, config, data, shifted, seed)}
                runs.append(row)
                log(f"seed {seed}: {row_text(row)}")
                if seed == config.seed and use == "theta":
                    ensembles[label] = bma_by_ensemble_size(fit.model, fit.samples, data.X_test, data.y_test)
        log(f"seed {seed} done ({time.perf_counter() - start:.0f} s in all)")
        return runs, ensembles

    return seeds_over_ranks(ranks, [config.seed + i for i in range(config.seeds)], fit_seed, "gathering the fits' rows")


def _run_bnn_study(config: BNNConfig, out, log: Callable[[str], None], ranks: Ranks) -> dict:
    data = load_mnist_ood(config.data_dir, in_digits=config.in_digits)
    num_weights = bnn_network(config, data).num_weights
    log(f"BNN on digits {data.in_digits}: {len(data.X_train)} training, {len(data.X_test)} test and "
        f"{len(data.X_ood)} out-of-distribution images (digits {data.ood_digits}); {len(config.methods)} methods x "
        f"{config.seeds} seeds, {config.grad_evals} gradient evaluations per trajectory; the network: "
        f"{network_text(asdict(config), num_weights)}")
    if ranks.distributed:
        log(f"{ranks.world_size} ranks (torch.distributed, {ranks.backend}): the seeds split over them, "
            f"{config.threads} thread(s) per rank; rank 0 gathers the rows and writes")
    runs, ensembles = _fit_all_seeds(config, ranks, data, log)
    report = {"config": asdict(config), "num_weights": num_weights, "threads": threads_record(),
              "n_train": len(data.X_train), "n_test": len(data.X_test), "n_ood": len(data.X_ood), "runs": runs,
              "ensembles": ensembles,
              "ranks": {"world_size": ranks.world_size, "backend": ranks.backend if ranks.distributed else None},
              **summarize(runs)}
    report["findings"] = findings(report)
    for text in report["findings"]:
        log(text)
    from ..plots import plot_bma_by_ensemble_size, save_figures

    hold_signals()  # the study is done: a Ctrl-C from here waits until the files are written

    save_figures({"families.png": plot_families(report), "shift.png": plot_shift(report),
                  "bma_vs_models.png": plot_bma_by_ensemble_size(ensembles, len(data.X_test))}, out)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=float))
    (out / "report.md").write_text(report_markdown(report))
    return report


def bma_by_ensemble_size(model: BayesianClassifier, samples: dict, X: torch.Tensor, y: torch.Tensor) -> dict:
    """Test accuracy and NLL of the average of the first m draws' probabilities, m = 1..S."""
    num_layers = len(model.layers)
    with torch.no_grad():
        probs = torch.stack([
            torch.softmax(model.logits(X, [(samples[f"layers.{l}.weight"][s], samples[f"layers.{l}.bias"][s])
                                           for l in range(num_layers)]), -1)
            for s in range(len(samples["layers.0.weight"]))])
        running = probs.cumsum(0) / torch.arange(1, len(probs) + 1)[:, None, None]
    return {"models": list(range(1, len(probs) + 1)),
            "accuracy": [metrics.accuracy(p, y) for p in running],
            "nll": [metrics.nll(p, y) for p in running]}


def run_toy_study(config: BNNConfig, *, log: Callable[[str], None] = print) -> dict:
    """The samplers on the 2-D sharp/flat energy (:func:`~pyro_flat.mixtures.sharp_flat_2d`),
    ``toy_chains`` vectorized chains each, all started at the sharp mode, same gradient budget.

    Reports, over the second half of the run, the share of draws in the **flat basin of U = −log p**
    (:meth:`~pyro_flat.mixtures.SharpFlatMixture.in_flat_basin`: gradient descent from the draw
    ends at the flat mode), and the mean top Hessian eigenvalue of the energy at the final states
    (the sharp mode's is 44, the flat one's 1.6). ``pyro-flat synthetic2d`` is the full study.
    """
    from ...convergence.runner import run_ensemble

    mixture = sharp_flat_2d()
    potential = lambda p: -mixture.log_prob(p["theta"])  # noqa: E731
    energy = lambda x: -mixture.log_prob(x)  # noqa: E731
    rows, finals = [], {}
    log(f"toy 2-D energy: {config.toy_chains} chains of each sampler from the sharp mode, "
        f"{config.toy_grad_evals} gradient evaluations each ...")
    for key in BNN_SAMPLERS:
        name = sampler_label(key)
        start = time.perf_counter()
        kernel = make_bnn_kernel(key, config, potential, toy=True)
        iterations = config.iterations(kernel.grads_per_iteration, toy=True)
        marks = list(range(iterations // 2, iterations + 1, max(1, iterations // 100)))
        pyro.set_rng_seed(config.seed)
        states = run_ensemble(kernel, mixture.sharp_loc, config.toy_chains, marks, progress_bar=False)
        for site, label in (("theta", name if name != "EntropySGLD" else "EntropySGLD θ"),
                            ("theta_aux", "EntropySGLD θa")):
            if site not in states[marks[-1]]:
                continue
            flat_by_mark = torch.stack([mixture.in_flat_basin(states[k][site]).double() for k in marks])
            flat = flat_by_mark.mean()
            # chains are independent, draws of one chain are not: the error comes from per-chain means
            flat_se = float(flat_by_mark.mean(0).std()) / math.sqrt(config.toy_chains)
            final = states[marks[-1]][site]
            top = np.mean([flatness.hessian_eigenvalues(energy, x.double())[0] for x in final[:100]])
            rows.append({"sampler": label, "iterations": iterations, "flat_basin": float(flat),
                         "flat_basin_se": flat_se, "top_eigenvalue": float(top)})
            finals[label] = final.numpy()
            log(f"toy {label}: {100 * float(flat):.0f}% of draws in the flat basin of U, "
                f"mean top eigenvalue {top:.1f} ({time.perf_counter() - start:.1f} s)")
    return {"rows": rows, "figure": _toy_figure(mixture, finals, rows)}


def _toy_figure(mixture, finals, rows):
    from ..plots import plot_basin_endpoints

    shares = [{"label": r["sampler"], "share": r["flat_basin"], "se": r["flat_basin_se"], "exact": None}
              for r in rows]
    return plot_basin_endpoints(mixture, {label: final[None] for label, final in finals.items()}, shares,
                                paths_shown=0, start="the sharp mode")



__all__ = ["BNNConfig", "BNN_SAMPLERS", "run_bnn_study", "run_toy_study", "bma_by_ensemble_size", "evaluate",
           "row_label", "make_bnn_kernel", "sampler_label"]
