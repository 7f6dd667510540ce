r"""The transfer study behind ``pyro-flat transfer``: few-shot Bayesian transfer learning from a pre-trained ResNet,
with flat and non-flat posteriors over its last block, its low-rank adapters or its head.

A residual network is pre-trained on some classes (digits 0-4; CIFAR-100's 0-49), cached in ``--out``
(:mod:`.transfer_pretrain`). For each number of shots ``k`` and each seed, ``k`` images of each new class are drawn
and every method of :mod:`.transfer_fits` starts from the same pre-trained network with a new zero head. Each is
scored by its Bayesian model average on the new classes' test images: accuracy, NLL, ECE and Brier; accuracy on the
corrupted test images (5 kinds x 5 severities); out-of-distribution AUROC by predictive entropy, held-out images of
the pre-training classes being the OOD set; its cost in gradient evaluations and seconds; and whether it converged
(its training NLL at the end of its last cosine cycle within ``converged_within`` of the cycle before's).
:mod:`.transfer_report` counts SA-BMA's two claims over the seeds by paired t-tests at the t critical value.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from ...evaluation import metrics
from ...evaluation.predictive import bma_predict
from ..images.data import study_device
from ..output import hold_signals, study_output, threads_record
from ..resume import checkpoint_folder, study_checkpoints, study_lock
from .config import TRANSFER_METHODS, TransferConfig
from .data import TransferData, load_transfer_data
from .fits import LABELS, TransferFit, fit_method, make_task
from ...storage.draws_folder import write_atomically
from .pretrain import pretrained_network, task_network


def model_average_draws(fit: TransferFit) -> Dict[str, torch.Tensor]:
    """The draws of ``fit``'s model average under the model's site names: θ's, and for Entropy-MCMC θa's too (the
    paper averages both)."""
    theta = {k: v for k, v in fit.samples.items() if not k.endswith("_aux")}
    if "aux" not in fit.uses:
        return theta
    return {k: torch.cat([v, fit.samples[k + "_aux"]]) for k, v in theta.items()}


def training_nll(fit: TransferFit, X: torch.Tensor, y: torch.Tensor) -> List[float]:
    """The training NLL per image at the end of each cycle (θ's point; BatchNorm statistics of the shots)."""
    out = []
    with torch.no_grad():
        for c in range(len(next(iter(fit.cycle_ends.values())))):
            point = {k: fit.cycle_ends[k][c][None] for k in fit.model.shapes}
            out.append(metrics.nll(bma_predict(fit.model, point, X, batchnorm_data=X), y))
    return out


def score(fit: TransferFit, data: TransferData, X: torch.Tensor, y: torch.Tensor, within: float) -> dict:
    """The model average's metrics on the test, corrupted and out-of-distribution images, and the convergence rule."""
    device = X.device
    sets = [data.X_test] + list(data.corrupted.values()) + [data.X_ood]
    images = torch.cat(sets).to(device)
    with torch.no_grad():
        probs = (fit.predict(images) if fit.predict is not None else
                 bma_predict(fit.model, model_average_draws(fit), images, batchnorm_data=X)).cpu()
    parts = list(probs.split([len(s) for s in sets]))
    row = metrics.classification_metrics(parts[0], data.y_test)
    row.pop("ece_mass", None)
    by_severity: Dict[int, List[float]] = {}
    for (kind, severity), p in zip(data.corrupted, parts[1:-1]):
        by_severity.setdefault(severity, []).append(metrics.accuracy(p, data.y_corrupted))
    row["corrupted_accuracy"] = [float(np.mean(by_severity[s])) for s in sorted(by_severity)]
    row["corrupted_accuracy_mean"] = float(np.mean(row["corrupted_accuracy"]))
    row["ood_auroc"] = metrics.ood_auroc(parts[0], parts[-1])
    row["ood_aupr"] = metrics.ood_aupr(parts[0], parts[-1])
    row["draws"] = int(next(iter(model_average_draws(fit).values())).shape[0])
    if fit.cycle_ends is not None:
        cycles = training_nll(fit, X, y)
        change = abs(cycles[-1] - cycles[-2]) if len(cycles) > 1 else float("inf")
        row.update(train_nll=cycles[-1], train_nll_cycles=cycles, train_nll_change=change, converged=change <= within)
    return row


def _kept_sgd(folder: Path, key: str, task, config: TransferConfig) -> TransferFit:
    """``sgd-block``'s fit of a task, read back from the checkpoint folder (Laplace starts from it)."""
    from .fits import bayesian_part

    samples = torch.load(folder / f"{key}-sgd-block.pt", map_location=task.X.device, weights_only=True)
    return TransferFit("sgd-block", bayesian_part("sgd-block", task, config), samples["samples"], None,
                       int(samples["grad_evals"]), float(samples["seconds"]))


def _fit_task(config: TransferConfig, data: TransferData, pretrained: torch.nn.Module, k: int, seed: int,
              device: torch.device, log: Callable[[str], None], folder: Optional[Path] = None) -> List[dict]:
    """Every method's row at ``k`` shots and ``seed``; each finished fit's row is kept in ``folder`` (the study's
    checkpoints), from where ``--resume`` reads it instead of fitting again."""
    X, y = (t.to(device) for t in data.shots(k, seed))
    task = make_task(config, X, y, task_network(pretrained, data.num_classes), data.num_classes, seed)
    rows, fits = [], {}
    key = f"shots{k}-seed{seed}"
    for method in [m for m in TRANSFER_METHODS if m in config.methods]:  # sgd-block before laplace-head
        done = None if folder is None else folder / f"{key}-{method}.json"
        if done is not None and done.exists():  # --resume: this fit finished before the run was stopped
            rows.append(json.loads(done.read_text()))
            log(f"{k} shots, seed {seed}, {LABELS[method]}: kept from the stopped run")
            continue
        sgd = fits.get("sgd-block")
        if method == "laplace-head" and sgd is None:
            sgd = _kept_sgd(folder, key, task, config)
        fit = fit_method(method, task, config, sgd=sgd)
        fits[method] = fit
        row = {"method": method, "label": LABELS[method], "shots": k, "seed": seed, "grad_evals": fit.grad_evals,
               "seconds": fit.seconds, "parameters": sum(int(np.prod(s)) for s in fit.model.shapes.values()),
               **fit.extra, **score(fit, data, X, y, config.converged_within)}
        if method == "laplace-head":  # it converged as the SGD fit it starts from did
            sgd_row = next(r for r in rows if r["method"] == "sgd-block")
            row.update({key: sgd_row[key] for key in ("train_nll", "train_nll_cycles", "train_nll_change", "converged")})
        rows.append(row)
        if done is not None:  # the row (and SGD's network, which Laplace starts from), then its file is complete
            if method == "sgd-block":
                write_atomically(folder / f"{key}-sgd-block.pt", lambda file: torch.save(
                    {"samples": fit.samples, "grad_evals": fit.grad_evals, "seconds": fit.seconds}, file))
            write_atomically(done, lambda file: file.write(json.dumps(row, default=float).encode()))
        log(f"{k} shots, seed {seed}, {row['label']}: accuracy {row['accuracy']:.4f}, NLL {row['nll']:.4f}, ECE "
            f"{row['ece']:.4f}, corrupted {row['corrupted_accuracy_mean']:.4f}, OOD AUROC {row['ood_auroc']:.3f}; "
            f"{'converged' if row['converged'] else 'NOT converged'} (training NLL {row['train_nll']:.4f}, "
            f"{row['train_nll_change']:.2g} from the cycle before); {fit.grad_evals} gradients, {fit.seconds:.1f} s")
    return rows


def run_transfer_study(config: TransferConfig, *, log: Callable[[str], None] = print) -> dict:
    """Pre-train (or read the cache), fit every method at every number of shots and seed, and write
    ``report.md``, ``report.json``, ``transfer.png`` and ``pretrained.pt`` to ``config.out``. Returns the report."""
    from ..plots import save_figures
    from .report import claims, plot_transfer, report_markdown, summarize

    config.validate()
    start = time.perf_counter()
    data = load_transfer_data(config)
    device = study_device(config.device)
    p = config.protocol()
    with study_lock(config), study_output(config, log) as staging:
        folder = study_checkpoints(config, False, log)
        log(f"transfer: {data.source}; pre-training classes {list(data.pretrain_classes)} ({len(data.X_pretrain):,} "
            f"images), new classes {list(data.new_classes)} ({len(data.X_pool):,} to draw shots from, "
            f"{len(data.X_test):,} test images); {p['network']} on {device}")
        batch_sizes = {k: min(int(p["batch_size"]), k * data.num_classes) for k in config.shots}
        for k, used in batch_sizes.items():
            if used < int(p["batch_size"]):
                log(f"--batch-size {p['batch_size']} is above the {used} training images of {k} shots: using the "
                    f"full batch ({used})")
        if config.seeds < 2:
            log("one seed: the claims need two or more to be tested (--seeds)")
        pretrained, record = pretrained_network(config, data, staging, device, log, kept=folder)
        rows = []
        try:
            for k in config.shots:
                for seed in range(config.seed, config.seed + config.seeds):
                    rows += _fit_task(config, data, pretrained, k, seed, device, log, folder)
        except KeyboardInterrupt:
            log(f"the fits done so far are kept in {folder}: the same command with --resume continues the run")
            raise
        report = {"config": asdict(config), "protocol": p, "threads": threads_record(), "device": str(device),
                  "batch_size_used": {str(k): v for k, v in batch_sizes.items()},
                  "data": {"source": data.source, "pretrain_images": len(data.X_pretrain), "pool": len(data.X_pool),
                           "test": len(data.X_test), "ood": len(data.X_ood), "corruptions": data.corruption_source,
                           "pretrain_classes": list(data.pretrain_classes), "new_classes": list(data.new_classes)},
                  "pretrained": record, "rows": rows, "summary": summarize(rows), "claims": claims(rows),
                  "seconds": time.perf_counter() - start}
        for claim in report["claims"]:
            log(f"claim ({claim['shots']} shots, {claim['metric']}): {claim['claim']}: {claim['verdict']}")
        hold_signals()  # the study is done: a Ctrl-C from here waits until the files are written
        save_figures({"transfer.png": plot_transfer(report)}, staging)
        (staging / "report.json").write_text(json.dumps(report, indent=2, default=float))
        (staging / "report.md").write_text(report_markdown(report))
    shutil.rmtree(checkpoint_folder(config.out), ignore_errors=True)  # the run is complete: its fits are in --out
    log(f"wrote {config.out} ({report['seconds']:.0f} s)")
    return report


__all__ = ["run_transfer_study", "score", "training_nll", "model_average_draws"]
