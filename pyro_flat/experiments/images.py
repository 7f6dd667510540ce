r"""The image study behind ``pyro-flat images``: Entropy-MCMC against its baselines on a residual network.

Each method of :data:`~.images_config.IMAGE_METHODS` trains the same network (a
:class:`~pyro_flat.nn.BayesianModule` of a ResNet with BatchNorm) on the same data, once per seed,
under the same budget of gradient evaluations, and is scored by its Bayesian model average: test
accuracy, NLL, ECE and Brier; accuracy on corrupted test sets at five severities
(:mod:`pyro_flat.corruptions`, or CIFAR-10-C's files); out-of-distribution AUROC and AUPR by
predictive entropy (held-out digits, or SVHN's test set); the top Hessian eigenvalue and trace of
the training NLL at its last draw; the loss along the straight line between two draws of different
cycles. :mod:`.images_report` compares Entropy-MCMC with every other method by paired t-tests over
the seeds.

**The paper's protocol in pyro-flat's terms.** The paper trains on the mean minibatch loss
:math:`f` with learning rate :math:`\ell`, weight decay :math:`w`, temperature :math:`T` and coupling
:math:`\lVert\theta-\theta_a\rVert^2/(2\eta)` added to the negative log posterior :math:`U = N f`
plus the prior, pyro-flat's potential. So with :math:`N` training images: step size
:math:`\alpha = \ell/N`; a Normal prior of precision :math:`N w` on every weight (sd
:math:`1/\sqrt{N w}`); :math:`\eta` and the temperature as published (the noise
:math:`\sqrt{2\ell T/N}` is :math:`\sqrt{2\alpha T}`). θa's step toward θ is then
:math:`\alpha/\eta = \ell/(N\eta)` of the gap, 0.025 on CIFAR-10 (stable below 2). Where pyro-flat differs: its cosine cycles' exploration phase is
noise-free (the paper injects noise at every step), and θa has no prior of its own (weight decay
acts on θ only). The optimisers (SGD, SAM, Entropy-SGD) run one cosine cycle and give their last
iterate; the samplers run ``cycles`` cycles and keep ``draws_per_cycle`` draws from the last
``draw_epochs`` epochs of each. Every method makes the same number of gradient evaluations:
Entropy-SGD and Entropy-SGLD make ``inner_steps`` per outer step and SAM two per step, so they make
that many times fewer steps (the paper gives every method the same epochs instead).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

import pyro

from .. import flatness, metrics, schedules
from ..checkpoint import CheckpointError
from ..kernels import make_kernel
from ..mcmc import MCMC
from ..nn import BayesianModule, ResNet, random_crop_flip, resnet18
from ..predictive import bma_predict
from .images_config import OPTIMISERS, ImagesConfig
from .images_data import ImageData, first_of_each_class, load_image_data, study_device
from .output import StudyError, hold_signals, seeds_over_ranks, threads_record
from .resume import checkpoint_folder, study_checkpoints

#: the kernel of each method (names of :data:`pyro_flat.kernels.KERNELS`)
METHOD_KERNELS = {"sgd": "sgd", "entropy-sgd": "local-entropy-sgd", "sam": "sam-sgd", "sgld": "sgld",
                  "entropy-sgld": "local-entropy-sgld", "emcmc": "entropy-sgld"}
METHOD_LABELS = {"sgd": "SGD", "entropy-sgd": "Entropy-SGD", "sam": "SAM", "sgld": "SGLD",
                 "entropy-sgld": "Entropy-SGLD", "emcmc": "Entropy-MCMC"}


def network(name: str, channels: int, classes: int) -> torch.nn.Module:
    """``tiny-resnet`` (one stage of one block, 4 channels), ``small-resnet`` (three stages of one block, 8, 16
    and 32 channels) or ``resnet18``."""
    if name == "resnet18":
        return resnet18(num_classes=classes, in_channels=channels)
    blocks, width = ((1,), 4) if name == "tiny-resnet" else ((1, 1, 1), 8)
    return ResNet(blocks=blocks, width=width, in_channels=channels, num_classes=classes)


@dataclass
class Fit:
    """One method's run at one seed: its draws ``{site: (draws, ...)}`` and what it cost."""

    method: str
    model: BayesianModule
    samples: Dict[str, torch.Tensor]
    iterations: int
    grad_evals: int
    seconds: float
    #: of ``seconds``, the time spent tracing and compiling the iteration (``--jit``)
    compile_seconds: float = 0.0
    #: what compiled its iterations: ``"inductor"``, ``"fx"`` (the traced graph, also where inductor failed its
    #: check), or ``None``
    compiled: Optional[str] = None

    @property
    def uses(self) -> Tuple[str, ...]:
        return ("theta", "aux", "both") if self.method == "emcmc" else ("theta",)


def scaled_protocol(config: ImagesConfig, num_train: int) -> Dict[str, float]:
    """The protocol in pyro-flat's scale (see the module's text): step size, prior sd, η and iterations."""
    p = config.protocol()
    per_epoch = math.ceil(num_train / p["batch_size"])
    return {"step_size": p["lr"] / num_train, "prior_sd": 1.0 / math.sqrt(num_train * p["weight_decay"]),
            "eta": p["eta"], "temperature": p["temperature"], "iterations_per_epoch": per_epoch,
            "iterations": p["epochs"] * per_epoch, "batch_size": p["batch_size"]}


def fit_method(method: str, config: ImagesConfig, data: ImageData, seed: int,
               checkpoint: Optional[Path] = None) -> Fit:
    """Train ``method`` from the network's own initial weights (seeded) on ``data``; ``checkpoint``: the file of
    the fit's checkpoints (every ``config.checkpoint_every`` seconds), which it continues from when it holds one."""
    p, scaled = config.protocol(), scaled_protocol(config, len(data.X_train))
    # gradient evaluations per step: every method makes the same number of them in all
    inner = config.inner_steps if method in ("entropy-sgd", "entropy-sgld") else 2 if method == "sam" else 1
    steps = scaled["iterations"] // inner
    torch.manual_seed(seed)
    net = network(p["network"], data.X_train.shape[1], data.num_classes).to(data.X_train.device)
    model = BayesianModule(net, prior=scaled["prior_sd"], transform=random_crop_flip if p["augment"] else None)
    settings = {"step_size": scaled["step_size"], "jit_compile": False if config.jit == "off" else config.jit}
    if method in ("entropy-sgd", "entropy-sgld", "emcmc"):
        settings["eta"] = scaled["eta"]
    if method in ("entropy-sgd", "entropy-sgld"):
        settings["num_inner_steps"] = inner
    if method in ("sgld", "entropy-sgld", "emcmc"):
        settings["temperature"] = scaled["temperature"]
    if method == "sam":
        settings["rho"] = config.rho
    if method in OPTIMISERS:  # one cosine decay, the last iterate kept
        schedule = schedules.cyclical_cosine(num_steps=steps, num_cycles=1, exploration=1 - 1 / steps)
        num_samples, thinning = 1, 1
    else:
        cycle = steps // p["cycles"]
        sampled = max(config.draws_per_cycle, (p["draw_epochs"] * scaled["iterations_per_epoch"]) // inner)
        sampled -= sampled % config.draws_per_cycle
        schedule = schedules.cyclical_cosine(num_steps=cycle * p["cycles"], num_cycles=p["cycles"],
                                             exploration=1 - sampled / cycle)
        num_samples, thinning = sampled * p["cycles"], sampled // config.draws_per_cycle
    kernel = make_kernel(METHOD_KERNELS[method], model, schedule=schedule, **settings)
    assert kernel.grads_per_iteration == inner, (method, kernel.grads_per_iteration)
    pyro.set_rng_seed(seed)
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=0, thinning=thinning,
                initial_params=model.initial_params(), disable_progbar=not config.progress,  # it counts every
                checkpoint=checkpoint, checkpoint_every=config.checkpoint_every)  # iteration, exploration too
    start = time.perf_counter()
    try:
        mcmc.run(data.X_train, data.y_train, batch_size=scaled["batch_size"])
    except CheckpointError as err:  # a damaged file or other settings: one line, not a traceback
        raise StudyError(f"--resume: {err}") from None
    samples = {k: v.detach() for k, v in mcmc.get_samples().items()}
    return Fit(method, model, samples, steps, steps * inner, time.perf_counter() - start, kernel.compile_seconds,
               kernel.jit_backend if kernel.compile_seconds > 0 else None)


def _draws(fit: Fit, use: str) -> Dict[str, torch.Tensor]:
    """The θ draws of ``use`` under the model's site names (θa's twins renamed; both: θ's then θa's)."""
    theta = {k: v for k, v in fit.samples.items() if not k.endswith("_aux")}
    aux = {k: fit.samples[k + "_aux"] for k in theta} if use != "theta" else {}
    if use == "theta":
        return theta
    if use == "aux":
        return aux
    return {k: torch.cat([theta[k], aux[k]]) for k in theta}


def _scores(probs: List[torch.Tensor], data: ImageData) -> dict:
    """The metrics of one model average's probabilities on the test, corrupted and out-of-distribution sets."""
    row = metrics.classification_metrics(probs[0], data.y_test)
    row.pop("ece_mass")
    accuracy: Dict[int, List[float]] = {}
    nll: Dict[int, List[float]] = {}
    for (kind, severity), p in zip(data.corrupted, probs[1:1 + len(data.corrupted)]):
        accuracy.setdefault(severity, []).append(metrics.accuracy(p, data.y_corrupted))
        nll.setdefault(severity, []).append(metrics.nll(p, data.y_corrupted))
    row["corrupted_accuracy"] = [float(np.mean(accuracy[s])) for s in sorted(accuracy)]
    row["corrupted_nll"] = [float(np.mean(nll[s])) for s in sorted(nll)]
    row["corrupted_accuracy_mean"] = float(np.mean(row["corrupted_accuracy"]))
    if data.X_ood is not None:
        row["ood_auroc"] = metrics.ood_auroc(probs[0], probs[-1])
        row["ood_aupr"] = metrics.ood_aupr(probs[0], probs[-1])
    return row


def evaluate(fit: Fit, config: ImagesConfig, data: ImageData, flat_data, seed: int) -> Dict[str, dict]:
    """``{use: row}``: each use's model average scored on the clean, corrupted and out-of-distribution images
    (θ's and θa's draws predicted once each; "both" averages the two), and the top Hessian eigenvalue and trace
    of the training NLL per image at θ's (θa's) last draw."""
    sets = [data.X_test] + list(data.corrupted.values()) + ([] if data.X_ood is None else [data.X_ood])
    images = torch.cat(sets)
    sizes = [len(x) for x in sets]
    probs = {}
    with torch.no_grad():  # each draw's BatchNorm statistics from the flatness images (training images)
        for use in [u for u in fit.uses if u != "both"]:
            probs[use] = bma_predict(fit.model, _draws(fit, use), images, batchnorm_data=flat_data[0])
    if "both" in fit.uses:  # as many θ draws as θa draws: the average of the two averages
        probs["both"] = (probs["theta"] + probs["aux"]) / 2
    rows = {use: _scores(list(p.split(sizes)), data) for use, p in probs.items()}
    for use in rows:
        if use == "both":  # the draws of θ and θa: each measured on its own row
            continue
        last = {k: v[-1:] for k, v in _draws(fit, use).items()}
        measured = flatness.flatness_at_samples(fit.model, last, *flat_data, k=1, num_probes=config.trace_probes,
                                                seed=seed, likelihood_only=True)
        rows[use]["top_eigenvalue"] = float(measured["top_eigenvalues"][0, 0]) / len(flat_data[0])
        rows[use]["trace"] = float(measured["trace"][0]) / len(flat_data[0])
        loss = flatness.FlatLoss.from_model(fit.model, {k: v[0] for k, v in last.items()}, *flat_data,
                                            likelihood_only=True)
        with torch.no_grad():  # how far training got: the NLL per image there (ln of the classes at the start)
            rows[use]["train_nll"] = float(loss(loss.params)) / len(flat_data[0])
    return rows


def interpolation(fit: Fit, config: ImagesConfig, flat_data, points: int = 11) -> Optional[Dict[str, List[float]]]:
    """The training NLL per image along the straight line from the first cycle's last θ draw to the last
    cycle's (``None`` for an optimiser, or a sampler of one cycle)."""
    theta = _draws(fit, "theta")
    if fit.method in OPTIMISERS or config.protocol()["cycles"] < 2:
        return None
    first = {k: v[config.draws_per_cycle - 1] for k, v in theta.items()}
    last = {k: v[-1] for k, v in theta.items()}
    loss = flatness.FlatLoss.from_model(fit.model, first, *flat_data, likelihood_only=True)
    curve = flatness.interpolation_curve(loss, loss.flatten(first), loss.flatten(last), num_points=points)
    return {"t": [float(t) for t in curve.x], "nll": [float(v) / len(flat_data[0]) for v in curve.loss]}


def run_images_study(config: ImagesConfig, *, log: Callable[[str], None] = print) -> dict:
    """Fit every method of ``config.methods`` at ``config.seeds`` seeds; write ``report.md``, ``report.json``,
    ``corruption.png`` and ``interpolation.png`` to ``config.out``. Under ``torchrun`` the seeds are split over
    the ranks (each fit is the one-process fit of its seed) and rank 0 writes. Returns the report (rank 0)."""
    from .output import across_ranks

    config.validate()
    try:
        report = across_ranks(config, lambda config, staging, ranks: _lead(config, staging, log, ranks),
                              lambda config, ranks: _fit_seeds(config, ranks, load_image_data(config), lambda text: None),
                              log)
    except KeyboardInterrupt:
        if any(checkpoint_folder(config.out).glob("seed*")):
            log(f"checkpoints kept in {checkpoint_folder(config.out)}: the same command with --resume continues the run")
        raise
    if "rank" not in report:  # the run is complete (rank 0, or one process): its checkpoints are done with
        shutil.rmtree(checkpoint_folder(config.out), ignore_errors=True)
    return report


def _fit_seeds(config: ImagesConfig, ranks, data: ImageData, log: Callable[[str], None]):
    """Every seed fitted and scored, the seeds split over the ranks (:func:`~.output.seeds_over_ranks`):
    ``(rows, curves)`` on rank 0, the rows in seed order with the first seed's interpolation curves, ``None``
    elsewhere."""
    data = data.to(study_device(config.device))
    flat_rows = first_of_each_class(data.y_train, config.flatness_images)
    flat_data = (data.X_train[flat_rows], data.y_train[flat_rows])
    start = time.perf_counter()
    folder = study_checkpoints(config, ranks.distributed, log)

    def fit_seed(seed: int):
        rows, curves = [], {}
        for method in config.methods:
            done = None if folder is None else folder / f"seed{seed}-{method}.json"
            if done is not None and done.exists():  # --resume: this fit finished before the kill
                kept = json.loads(done.read_text())
                rows += kept["rows"]
                curves.update(kept["curves"])
                log(f"seed {seed} {METHOD_LABELS[method]}: kept from the killed run")
                continue
            checkpoint = None if folder is None else folder / f"seed{seed}-{method}.ckpt"
            if checkpoint is not None and checkpoint.exists():
                log(f"seed {seed} {METHOD_LABELS[method]}: continuing from its checkpoint")
            fit = fit_method(method, config, data, seed, checkpoint)
            first = len(rows)
            for use, scores in evaluate(fit, config, data, flat_data, seed).items():
                label = METHOD_LABELS[method] + ("" if use == "theta" and method != "emcmc" else
                                                 {"theta": " (θ)", "aux": " (θa)", "both": " (both)"}[use])
                row = {"label": label, "method": method, "use": use, "seed": seed, "seconds": fit.seconds,
                       "compiled": fit.compiled,
                       "grad_evals": fit.grad_evals, "draws": int(next(iter(_draws(fit, use).values())).shape[0]),
                       **scores}
                rows.append(row)
                log(f"seed {seed} {label}: accuracy {row['accuracy']:.4f}, NLL {row['nll']:.4f}, corrupted "
                    f"accuracy {row['corrupted_accuracy_mean']:.4f}"
                    + (f", OOD AUROC {row['ood_auroc']:.3f}" if "ood_auroc" in row else "")
                    + (f", top eigenvalue {row['top_eigenvalue']:.3g}" if "top_eigenvalue" in row else "")
                    + f" ({fit.seconds:.0f} s)")
            curve = interpolation(fit, config, flat_data) if seed == config.seed else None
            if curve is not None:
                curves[METHOD_LABELS[method]] = curve
            if done is not None:  # the fit's results, then its checkpoints are done with
                done.write_text(json.dumps({"rows": rows[first:], "curves": {} if curve is None else
                                            {METHOD_LABELS[method]: curve}}, default=float))
                for path in folder.glob(f"seed{seed}-{method}.*ckpt"):
                    path.unlink()
        log(f"seed {seed} done ({time.perf_counter() - start:.0f} s in all)")
        return rows, curves

    return seeds_over_ranks(ranks, [config.seed + i for i in range(config.seeds)], fit_seed, "gathering the fits' rows")


def _device_name(device: torch.device) -> str:
    """``cpu``, or the GPU's name with its device: ``NVIDIA H100 80GB HBM3 (cuda:0)``."""
    return str(device) if device.type != "cuda" else f"{torch.cuda.get_device_name(device)} ({device})"


def _lead(config: ImagesConfig, out, log: Callable[[str], None], ranks) -> dict:
    from .images_report import claims, paper_comparison, plot_corruption, plot_interpolation, report_markdown, summarize
    from .plots import save_figures

    start = time.perf_counter()
    data, device = load_image_data(config), study_device(config.device)
    protocol, scaled = config.protocol(), scaled_protocol(config, len(data.X_train))
    if scaled["step_size"] >= scaled["eta"] and any(m in config.methods for m in ("entropy-sgd", "entropy-sgld", "emcmc")):
        raise StudyError(f"the step size lr / N = {protocol['lr']} / {len(data.X_train)} = {scaled['step_size']:.3g} is not "
                         f"below eta = {scaled['eta']:.3g}: the coupling's step (θa toward θ) would overshoot; lower --lr "
                         "or raise --eta")
    weights = sum(p.numel() for p in network(protocol["network"], data.X_train.shape[1], data.num_classes).parameters())
    log(f"images: {data.source}: {len(data.X_train):,} training and {len(data.X_test):,} test images, "
        f"{data.num_classes} classes; {protocol['network']} ({weights:,} weights); {len(config.methods)} methods x "
        f"{config.seeds} seeds, {protocol['epochs']} epochs each ({scaled['iterations']:,} gradient evaluations); "
        f"on {_device_name(device)}" + ("" if config.jit == "off" else f", --jit {config.jit}"))
    if ranks.distributed:
        log(f"{ranks.world_size} ranks (torch.distributed, {ranks.backend}): the seeds split over them; rank 0 writes")
    rows, curves = _fit_seeds(config, ranks, data, log)
    report = {"config": asdict(config), "preset": config.preset, "protocol": protocol, "scaled": scaled,
              "threads": threads_record(), "device": _device_name(device), "weights": weights, "seeds": config.seeds,
              "flatness_images": min(config.flatness_images, len(data.X_train)),
              "data": {"source": data.source, "n_train": len(data.X_train), "n_test": len(data.X_test),
                       "corruptions": data.corruption_source, "ood": data.ood_source},
              "ranks": {"world_size": ranks.world_size, "backend": ranks.backend if ranks.distributed else None},
              "rows": rows, "summary": summarize(rows), "claims": claims(rows), "interpolation": curves,
              "paper": paper_comparison(config.dataset)}
    report["seconds"] = time.perf_counter() - start
    for claim in report["claims"]:
        log(f"claim: Entropy-MCMC has {claim['claim']}: {claim['verdict']}")
    hold_signals()  # the study is done: a Ctrl-C from here waits until the files are written
    save_figures({"corruption.png": plot_corruption(report), "interpolation.png": plot_interpolation(report)}, out)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=float))
    (out / "report.md").write_text(report_markdown(report))
    return report

