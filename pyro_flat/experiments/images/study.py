r"""The image study behind ``pyro-flat images``: Entropy-MCMC against its baselines on a residual network.

Each method of :data:`~.images_config.IMAGE_METHODS` trains the same network (a
:class:`~pyro_flat.nn.BayesianModule` of a ResNet with BatchNorm) on the same data, once per seed,
for the same epochs, and is scored by its Bayesian model average: test
accuracy, NLL, ECE and Brier; accuracy on corrupted test sets at five severities
(:mod:`pyro_flat.data.corruptions`, or CIFAR-10-C's files); out-of-distribution AUROC and AUPR by
predictive entropy (held-out digits, or SVHN's test set); the top Hessian eigenvalue and trace of
the training NLL at its last draw; the loss along the straight line between two draws of different
cycles. :mod:`.images_report` compares Entropy-MCMC with every other method by paired t-tests over
the seeds.

**The paper's protocol in pyro-flat's terms.** The paper trains on the mean minibatch loss
:math:`f` with learning rate :math:`\ell`, weight decay :math:`w`, temperature :math:`T` and coupling
:math:`\lVert\theta-\theta_a\rVert^2/(2\eta)` added to the negative log posterior :math:`U = N f`
plus the prior, pyro-flat's potential. So with :math:`N` training images: step size
:math:`\alpha = \ell/N`; a Normal prior of precision :math:`N w` on every weight (sd
:math:`1/\sqrt{N w}`); the temperature as published (the noise
:math:`\sqrt{2\ell T/N}` is :math:`\sqrt{2\alpha T}`). θa's step toward θ is then
:math:`\alpha/\eta = \ell/(N\eta)` of the gap: 0.025 on CIFAR-10. The dynamics depend on that fraction, not
on :math:`\eta` itself, so a run on other data keeps it (``coupling``) and takes :math:`\eta = \ell/(0.025 N)`.
As the official code, the samplers keep their noise in the cosine cycles' exploration phase
(``exploration_noise``) and :math:`\theta_a` has the weights' prior too (``aux_prior``: its weight decay); both
can be turned off. Every method runs the same cosine cycles for the same epochs (``budget="epochs"``, the
paper's rule; ``"gradients"`` gives every method the same gradient evaluations instead): the optimisers keep
their last iterate, the samplers ``draws_per_cycle`` draws from the last ``draw_epochs`` epochs of each cycle,
and the SGD ensemble's networks share one network's steps, two cycles each. A fit has converged when its
training NLL at the end of its last cycle is within ``converged_within`` of the cycle before's
(:func:`convergence`); :func:`travelled` measures how far it got from its start.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional

import torch

import pyro

from ... import schedules
from ...storage.checkpoint import CheckpointError
from ...kernels import make_kernel
from ...infer.mcmc import MCMC
from ...nn import BayesianModule, ResNet, random_crop_flip, resnet18
from .config import OPTIMISERS, ImagesConfig
from .data import ImageData, first_of_each_class, load_image_data, study_device
# the scores of a fit (convergence: a re-export, for the tests)
from .scores import Fit, convergence, draws_for, evaluate, interpolation  # noqa: F401
from ..output import StudyError, hold_signals, seeds_over_ranks, threads_record
from ..resume import checkpoint_folder, checkpoint_study_error, study_checkpoints, study_lock

#: the kernel of each method (names of :data:`pyro_flat.kernels.KERNELS`)
METHOD_KERNELS = {"sgd": "sgd", "sgd-ensemble": "sgd", "entropy-sgd": "local-entropy-sgd", "sam": "sam-sgd",
                  "sgld": "sgld", "entropy-sgld": "local-entropy-sgld", "emcmc": "entropy-sgld"}
METHOD_LABELS = {"sgd": "SGD", "sgd-ensemble": "SGD ensemble", "entropy-sgd": "Entropy-SGD", "sam": "SAM",
                 "sgld": "SGLD", "entropy-sgld": "Entropy-SGLD", "emcmc": "Entropy-MCMC"}
#: cosine cycles of each ``sgd-ensemble`` network (two, so that its convergence is checked like every fit's)
ENSEMBLE_CYCLES = 2


def network(name: str, channels: int, classes: int) -> torch.nn.Module:
    """``tiny-resnet`` (one stage of one block, 4 channels), ``small-resnet`` (three stages of one block, 8, 16
    and 32 channels) or ``resnet18``."""
    if name == "resnet18":
        return resnet18(num_classes=classes, in_channels=channels)
    blocks, width = ((1,), 4) if name == "tiny-resnet" else ((1, 1, 1), 8)
    return ResNet(blocks=blocks, width=width, in_channels=channels, num_classes=classes)


def scaled_protocol(config: ImagesConfig, num_train: int) -> Dict[str, float]:
    """The protocol in pyro-flat's scale (see the module's text): step size, prior sd, η (given, or from the
    per-step coupling), the coupling lr / (N η), and the iterations."""
    p = config.protocol()
    per_epoch = math.ceil(num_train / p["batch_size"])
    step = p["lr"] / num_train
    eta = p["eta"] if p["eta"] is not None else step / p["coupling"]
    return {"step_size": step, "prior_sd": 1.0 / math.sqrt(num_train * p["weight_decay"]), "eta": eta,
            "coupling": step / eta, "temperature": p["temperature"], "iterations_per_epoch": per_epoch,
            "iterations": p["epochs"] * per_epoch, "batch_size": p["batch_size"]}


def grads_per_step(method: str, config: ImagesConfig) -> int:
    """Gradient evaluations of one step: ``inner_steps`` for the local-entropy methods, 2 for SAM, else 1."""
    return config.inner_steps if method in ("entropy-sgd", "entropy-sgld") else 2 if method == "sam" else 1


def fit_plan(method: str, config: ImagesConfig, num_train: int) -> Dict[str, int]:
    """How ``method`` runs: ``networks`` (vectorized chains), ``steps`` per network, ``cycles``, and the draws:
    ``num_samples`` sampling-phase iterations, every ``thinning``-th kept (the end of each cycle for an optimiser,
    ``draws_per_cycle`` from the last ``draw_epochs`` epochs of each cycle for a sampler). Every method makes the
    same number of steps (``budget="epochs"``, the paper's rule) or of gradient evaluations (``"gradients"``);
    ``sgd-ensemble``'s networks share one network's steps."""
    p, scaled = config.protocol(), scaled_protocol(config, num_train)
    inner = grads_per_step(method, config) if p["budget"] == "gradients" else 1
    networks = config.members if method == "sgd-ensemble" else 1
    steps = scaled["iterations"] // inner // networks
    cycles = ENSEMBLE_CYCLES if method == "sgd-ensemble" else p["cycles"]
    cycle = steps // cycles
    if cycle < 2:
        raise StudyError(f"{METHOD_LABELS[method]} would make {steps} steps in {cycles} cycles: raise --epochs")
    if method in OPTIMISERS:  # the last iterate of each cycle
        return dict(networks=networks, steps=cycle * cycles, cycles=cycles, sampled=1, num_samples=cycles, thinning=1)
    sampled = max(config.draws_per_cycle, (p["draw_epochs"] * scaled["iterations_per_epoch"]) // inner)
    sampled = min(sampled - sampled % config.draws_per_cycle, cycle - cycle % config.draws_per_cycle)
    return dict(networks=networks, steps=cycle * cycles, cycles=cycles, sampled=sampled,
                num_samples=sampled * cycles, thinning=sampled // config.draws_per_cycle)


def fit_method(method: str, config: ImagesConfig, data: ImageData, seed: int,
               checkpoint: Optional[Path] = None) -> Fit:
    """Train ``method`` from the network's own initial weights (seeded; ``sgd-ensemble``: one network each) on
    ``data`` as :func:`fit_plan` says; ``checkpoint``: the file of the fit's checkpoints (every
    ``config.checkpoint_every`` seconds), which it continues from when it holds one."""
    p, scaled = config.protocol(), scaled_protocol(config, len(data.X_train))
    plan, inner = fit_plan(method, config, len(data.X_train)), grads_per_step(method, config)
    torch.manual_seed(seed)
    nets = [network(p["network"], data.X_train.shape[1], data.num_classes).to(data.X_train.device)
            for _ in range(plan["networks"])]
    model = BayesianModule(nets[0], prior=scaled["prior_sd"], transform=random_crop_flip if p["augment"] else None)
    starts = [model.initial_params(net.state_dict()) for net in nets]
    initial = {k: torch.stack([start[k] for start in starts]) for k in starts[0]}
    settings = {"step_size": scaled["step_size"], "jit_compile": False if config.jit == "off" else config.jit,
                "autocast": torch.bfloat16 if config.precision == "bf16" else None}
    if method in ("entropy-sgd", "entropy-sgld", "emcmc"):
        settings["eta"] = scaled["eta"]
    if method in ("entropy-sgd", "entropy-sgld"):
        settings["num_inner_steps"] = inner
    if method in ("sgld", "entropy-sgld", "emcmc"):
        settings["temperature"] = scaled["temperature"]
    if method == "emcmc" and p["aux_prior"]:  # the paper's weight decay on θa: θ's prior
        settings["aux_prior_sd"] = scaled["prior_sd"]
    if method == "sam":
        settings["rho"] = config.rho
    schedule = schedules.cyclical_cosine(num_steps=plan["steps"], num_cycles=plan["cycles"],
                                         exploration=1 - plan["sampled"] / (plan["steps"] // plan["cycles"]),
                                         exploration_noise=bool(p["exploration_noise"]) and method not in OPTIMISERS)
    kernel = make_kernel(METHOD_KERNELS[method], model, schedule=schedule, **settings)
    assert kernel.grads_per_iteration == inner, (method, kernel.grads_per_iteration)
    pyro.set_rng_seed(seed)
    chains = dict(num_chains=plan["networks"], initial_params=initial) if plan["networks"] > 1 else dict(
        initial_params=starts[0])
    mcmc = MCMC(kernel, num_samples=plan["num_samples"], warmup_steps=0, thinning=plan["thinning"],
                disable_progbar=not config.progress,  # it counts every iteration, exploration too
                checkpoint=checkpoint, checkpoint_every=config.checkpoint_every, **chains)
    start = time.perf_counter()
    try:
        mcmc.run(data.X_train, data.y_train, batch_size=scaled["batch_size"])
    except CheckpointError as err:  # a damaged file or other settings: one line, not a traceback
        raise checkpoint_study_error(config, err) from None
    by_chain = {k: v.detach().reshape(plan["networks"], -1, *v.shape[1 + (plan["networks"] > 1):])
                for k, v in mcmc.get_samples(group_by_chain=plan["networks"] > 1).items()}
    per_cycle = plan["num_samples"] // plan["thinning"] // plan["cycles"]  # draws kept per cycle
    cycle_ends = {k: v[:, per_cycle - 1::per_cycle] for k, v in by_chain.items()}
    if method in OPTIMISERS:  # the network(s) it ends with
        samples = {k: v[:, -1] for k, v in by_chain.items()}
    else:
        samples = {k: v[0] for k, v in by_chain.items()}
    initial = {**initial, **{k + "_aux": initial[k] for k in initial if k + "_aux" in samples}}
    return Fit(method, model, samples, cycle_ends, initial, plan["steps"], plan["steps"] * inner * plan["networks"],
               time.perf_counter() - start, kernel.compile_seconds,
               kernel.jit_backend if kernel.compile_seconds > 0 else None)


def run_images_study(config: ImagesConfig, *, log: Callable[[str], None] = print) -> dict:
    """Fit every method of ``config.methods`` at ``config.seeds`` seeds; write ``report.md``, ``report.json``,
    ``corruption.png`` and ``interpolation.png`` to ``config.out``. Under ``torchrun`` the seeds are split over
    the ranks (each fit is the one-process fit of its seed) and rank 0 writes. Returns the report (rank 0)."""
    from ..output import across_ranks

    config.validate()
    with study_lock(config):  # no other run into config.out touches its checkpoints until this one is done
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


class Job(NamedTuple):
    """One fit of a seed: its ``key`` (checkpoint files), ``method``, the ``config`` it runs with, its ``label``."""

    key: str
    method: str
    config: ImagesConfig
    label: str


def study_jobs(config: ImagesConfig, num_train: int) -> List[Job]:
    """The fits of each seed: every method of ``config.methods``; for an η sweep (``config.eta_factors``), SGD
    and Entropy-MCMC at each multiple of the regime's η."""
    factors = getattr(config, "eta_factors", None)
    if not factors:
        return [Job(m, m, config, METHOD_LABELS[m]) for m in config.methods]
    eta = scaled_protocol(config, num_train)["eta"]
    return [Job("sgd", "sgd", config, "SGD")] + [
        Job(f"emcmc-eta{f:g}", "emcmc", replace(config, eta=eta * f, coupling=None), f"Entropy-MCMC η x {f:g}")
        for f in factors]


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
        for job in study_jobs(config, len(data.X_train)):
            name = job.label
            done = None if folder is None else folder / f"seed{seed}-{job.key}.json"
            if done is not None and done.exists():  # --resume: this fit finished before the kill
                kept = json.loads(done.read_text())
                rows += kept["rows"]
                curves.update(kept["curves"])
                log(f"seed {seed} {name}: kept from the killed run")
                continue
            checkpoint = None if folder is None else folder / f"seed{seed}-{job.key}.ckpt"
            if checkpoint is not None and checkpoint.exists():
                log(f"seed {seed} {name}: continuing from its checkpoint")
            fit = fit_method(job.method, job.config, data, seed, checkpoint)
            first = len(rows)
            for use, scores in evaluate(fit, job.config, data, flat_data, seed).items():
                label = name + ("" if use == "theta" and job.method != "emcmc" else
                                {"theta": " (θ)", "aux": " (θa)", "both": " (both)"}[use])
                row = {"label": label, "method": job.method, "use": use, "seed": seed, "seconds": fit.seconds,
                       "compiled": fit.compiled, "eta": scaled_protocol(job.config, len(data.X_train))["eta"],
                       "grad_evals": fit.grad_evals, "draws": int(next(iter(draws_for(fit, use).values())).shape[0]),
                       **scores}
                rows.append(row)
                log(f"seed {seed} {label}: accuracy {row['accuracy']:.4f}, NLL {row['nll']:.4f}, corrupted "
                    f"accuracy {row['corrupted_accuracy_mean']:.4f}"
                    + (f", OOD AUROC {row['ood_auroc']:.3f}" if "ood_auroc" in row else "")
                    + (f", top eigenvalue {row['top_eigenvalue']:.3g}" if "top_eigenvalue" in row else "")
                    + (f", training NLL {row['train_nll']:.4f} ({'converged' if row['converged'] else 'not converged'}"
                       f": {row['train_nll_change']:.2g} from the cycle before)" if "train_nll" in row else "")
                    + f" ({fit.seconds:.0f} s)")
            curve = interpolation(fit, job.config, flat_data) if seed == config.seed else None
            if curve is not None:
                curves[name] = curve
            if done is not None:  # the fit's results, then its checkpoints are done with
                done.write_text(json.dumps({"rows": rows[first:], "curves": {} if curve is None else
                                            {name: curve}}, default=float))
                for path in folder.glob(f"seed{seed}-{job.key}.*ckpt"):
                    path.unlink()
        log(f"seed {seed} done ({time.perf_counter() - start:.0f} s in all)")
        return rows, curves

    return seeds_over_ranks(ranks, [config.seed + i for i in range(config.seeds)], fit_seed, "gathering the fits' rows")


def _device_name(device: torch.device) -> str:
    """``cpu``, or the GPU's name with its device: ``NVIDIA H100 80GB HBM3 (cuda:0)``."""
    return str(device) if device.type != "cuda" else f"{torch.cuda.get_device_name(device)} ({device})"


def _lead(config: ImagesConfig, out, log: Callable[[str], None], ranks) -> dict:
    from .report import (claims, nll_power, paper_comparison, plot_corruption, plot_interpolation,
                         report_markdown, summarize)
    from ..plots import save_figures

    start = time.perf_counter()
    data, device = load_image_data(config), study_device(config.device)
    protocol, scaled = config.protocol(), scaled_protocol(config, len(data.X_train))
    jobs = study_jobs(config, len(data.X_train))
    for job in jobs:
        fit_plan(job.method, job.config, len(data.X_train))  # a schedule too short for its cycles: refused now
        mine = scaled_protocol(job.config, len(data.X_train))
        if mine["step_size"] >= mine["eta"] and job.method in ("entropy-sgd", "entropy-sgld", "emcmc"):
            raise StudyError(f"{job.label}: the step size lr / N = {protocol['lr']} / {len(data.X_train)} = "
                             f"{mine['step_size']:.3g} is not below eta = {mine['eta']:.3g}: the coupling's step (θa toward "
                             "θ) would overshoot; lower --lr or raise --eta")
    weights = sum(p.numel() for p in network(protocol["network"], data.X_train.shape[1], data.num_classes).parameters())
    log(f"images: {data.source}: {len(data.X_train):,} training and {len(data.X_test):,} test images, "
        f"{data.num_classes} classes; {protocol['network']} ({weights:,} weights); {len(jobs)} fits x "
        f"{config.seeds} seeds, {protocol['epochs']} epochs each ({scaled['iterations']:,} gradient evaluations); "
        f"on {_device_name(device)}" + ("" if config.jit == "off" else f", --jit {config.jit}")
        + ("" if config.precision == "fp32" else ", bf16 autocast (--precision)"))
    log(f"per-step coupling lr / (N eta) = {protocol['lr']} / ({len(data.X_train):,} x {scaled['eta']:.4g}) = "
        f"{scaled['coupling']:.4g} (the paper's: 0.025); temperature {scaled['temperature']:g}; every method "
        + ("the same epochs" if protocol["budget"] == "epochs" else "the same gradient evaluations"))
    if ranks.distributed:
        log(f"{ranks.world_size} ranks (torch.distributed, {ranks.backend}): the seeds split over them; rank 0 writes")
    rows, curves = _fit_seeds(config, ranks, data, log)
    report = {"config": asdict(config), "preset": config.preset, "protocol": protocol, "scaled": scaled,
              "threads": threads_record(), "device": _device_name(device), "weights": weights, "seeds": config.seeds,
              "flatness_images": min(config.flatness_images, len(data.X_train)),
              "data": {"source": data.source, "n_train": len(data.X_train), "n_test": len(data.X_test),
                       "side": int(data.X_train.shape[-1]),
                       "corruptions": data.corruption_source, "ood": data.ood_source},
              "ranks": {"world_size": ranks.world_size, "backend": ranks.backend if ranks.distributed else None},
              "rows": rows, "summary": summarize(rows), "claims": claims(rows), "interpolation": curves,
              "paper": paper_comparison(config.dataset)}
    report["config"]["members"] = config.members
    sweep = bool(getattr(config, "eta_factors", None))
    report["power"] = None if sweep else nll_power(rows, report["claims"])
    report["seconds"] = time.perf_counter() - start
    hold_signals()  # the study is done: a Ctrl-C from here waits until the files are written
    if sweep:
        from .eta import plot_eta_sweep, sweep_markdown, sweep_table

        report["sweep"] = sweep_table(rows)
        report.pop("claims")
        save_figures({"eta_sweep.png": plot_eta_sweep(report)}, out)
        (out / "report.json").write_text(json.dumps(report, indent=2, default=float))
        (out / "report.md").write_text(sweep_markdown(report))
        return report
    for claim in report["claims"]:
        log(f"claim: Entropy-MCMC has {claim['claim']}: {claim['verdict']}")
    save_figures({"corruption.png": plot_corruption(report), "interpolation.png": plot_interpolation(report)}, out)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=float))
    (out / "report.md").write_text(report_markdown(report))
    return report
