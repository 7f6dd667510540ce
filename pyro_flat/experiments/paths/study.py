"""The study behind ``pyro-flat paths``: the minimum-energy path between two minima of a Bayesian MLP.

Di Carlo, Goddard & Schwab report that minima of a network's training loss are joined by paths of
low loss, along which the curvature rises away from the minima. This study tests that on the MLP
of ``pyro-flat bnn``:

1. two SGLD chains (the BNN study's settings, prior sd 0.1) give one draw each;
2. each draw descends (full-batch Adam) to a minimum of the loss per image, the training NLL plus
   the weight decay of a prior sd of about 1 (so the minima are proper and the per-image gradients
   at them are not zero): the endpoints;
3. the straight line and the minimum-energy path (:func:`~pyro_flat.flatness.minimum_energy_path`,
   AutoNEB with insertion rounds) join them; :func:`~pyro_flat.flatness.curvature_along_path`
   measures the top Hessian eigenvalue and the trace along both;
4. dynamics started on the path (:mod:`~pyro_flat.experiments.paths.dynamics`: free and constrained
   SGD with minibatches of 10, each against full-batch descent, and isotropic SGLD of the same noise
   variance, at step sizes set by α λmax, 10,000 steps) are read off as a position along the path
   (Di Carlo et al.'s projected dynamics): does noise push them toward the flatter end?
5. each sampler of the BNN study (two chains each) is placed relative to the path: the loss and
   curvature at its last draws, their distance from the path and the position of the nearest path
   point.

>>> report = run_path_study(PathConfig.reduced(progress=False), write=False, log=lambda line: None)
>>> sorted(report["profiles"]), len(report["dynamics"]) > 0
(['minimum-energy path', 'straight line'], True)
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from ... import flatness
from ...data.datasets import load_mnist_ood
from ...models.zoo import BayesianMLP
from ...evaluation.predictive import iter_draws
from ..compare import best_text, mean_and_se, t_critical
from ..configs import PathConfig
from ..output import hold_signals, study_output, threads_record
from .dynamics import dynamics_findings, plot_dynamics, run_path_dynamics


def _last_draws(key: str, config: PathConfig, model, data, log) -> dict:
    """The last draw of each of two chains of sampler ``key``, run as the BNN study runs it: ``{label:
    [draw, draw]}`` (for EntropySGLD, θ and θa)."""
    from ..bnn.families import BNNConfig, sample_chains, sampler_label

    bnn = BNNConfig(data_dir=config.data_dir, in_digits=config.in_digits, hidden=config.hidden,
                    prior_scale=config.prior_scale, batch_size=config.batch_size, step_size=config.step_size,
                    grad_evals=config.grad_evals, num_chains=2, num_draws=1, seed=config.seed,
                    progress=config.progress)
    name = sampler_label(key)
    samples, _, _ = sample_chains(key, name, bnn, model, data, log)
    last = {k: v[:, -1] for k, v in samples.items()}
    latents = [n for n in last if not n.endswith("_aux")]
    supports = {n: torch.distributions.constraints.real for n in latents}  # the MLP's weights are real
    if not any(n.endswith("_aux") for n in last):
        return {name: list(iter_draws(last, "theta", "_aux", latents, supports))}
    return {f"{name} θ": list(iter_draws(last, "theta", "_aux", latents, supports)),
            f"{name} θa": list(iter_draws(last, "aux", "_aux", latents, supports))}


def _descend(loss_fn, x: torch.Tensor, steps: int, lr: float) -> torch.Tensor:
    x = x.detach().clone().requires_grad_(True)
    optimiser = torch.optim.Adam([x], lr=lr)
    for _ in range(steps):
        optimiser.zero_grad()
        loss_fn(x).backward()
        optimiser.step()
    return x.detach()


def _point_measures(loss, point, path, probes, seed) -> dict:
    here = loss.at(point)
    with torch.no_grad():
        value = float(here(point))
    trace = flatness.hessian_trace(here, num_probes=probes, seed=seed)
    position, distance = path.project(point)
    return {"loss": value, "top_eigenvalue": flatness.top_eigenvalues(here, k=1, tol=1e-3, seed=seed)[0],
            "trace": trace.value, "trace_stderr": trace.stderr, "position": float(position),
            "distance": float(distance)}


def run_path_study(config: PathConfig, *, write: bool = True, log: Callable[[str], None] = print) -> dict:
    """Run the study; with ``write`` also write ``report.md``, ``report.json`` and the figures
    (``--out`` is checked before any work)."""
    config.validate()
    if not write:
        return _run_path_study(config, None, log)
    with study_output(config, log) as staging:
        report = _run_path_study(config, staging, log)
    log(f"wrote {config.out}: report.md, report.json, paths.png, draws.png, dynamics.png")
    return report


def _subset(data, train_size: int):
    """The first ``train_size / k`` training images of each of the ``k`` digits (all for 0)."""
    if not train_size:
        return data
    per_digit = train_size // len(data.in_digits)
    keep = torch.cat([torch.nonzero(data.y_train == c)[:per_digit, 0] for c in range(len(data.in_digits))])
    return replace(data, X_train=data.X_train[keep], y_train=data.y_train[keep])


def _run_path_study(config: PathConfig, staging: Optional[Path], log: Callable[[str], None]) -> dict:
    data = _subset(load_mnist_ood(config.data_dir, in_digits=config.in_digits), config.train_size)
    n = len(data.X_train)
    model = BayesianMLP(data.X_train.shape[1], config.hidden, len(data.in_digits), prior_scale=config.prior_scale)
    by_sampler = {}
    for key in ("sgld",) + tuple(k for k in config.samplers if k != "sgld"):
        by_sampler.update(_last_draws(key, config, model, data, log))
    draws = by_sampler["SGLD"]
    nll = flatness.FlatLoss.from_model(model, draws[0], data.X_train, data.y_train, likelihood_only=True)
    decay = 1.0 / (2 * n * config.decay_scale ** 2)
    # the posterior's potential per image, up to a constant: the training NLL plus weight decay
    loss = flatness.FlatLoss(lambda x: nll.fn(x) / n + decay * x.square().sum(), nll.params, nll.blocks,
                             nll.model_target)
    log(f"endpoints: {len(draws)} draws descend {config.descent_steps} Adam steps each ...")
    start = time.perf_counter()
    ends = [_descend(loss.fn, loss.flatten(d), config.descent_steps, config.descent_lr) for d in draws]
    descent_seconds = time.perf_counter() - start
    end_gradients = [float(torch.func.grad(loss.fn)(e).norm()) for e in ends]
    log(f"endpoints: each draw descended {config.descent_steps} Adam steps ({descent_seconds:.1f} s) to loss per "
        f"image {float(loss.fn(ends[0])):.4g} and {float(loss.fn(ends[1])):.4g} (gradient norms "
        f"{end_gradients[0]:.1e}, {end_gradients[1]:.1e})")
    start = time.perf_counter()
    line = flatness.straight_path(loss, ends[0], ends[1], num_points=config.num_points)
    line_seconds = time.perf_counter() - start
    log(f"minimum-energy path: relaxing {config.num_points} images, {config.insertion_rounds} AutoNEB insertion "
        f"rounds (at most {config.max_steps} FIRE steps each) ...")
    start = time.perf_counter()
    path = flatness.minimum_energy_path(loss, ends[0], ends[1], num_points=config.num_points,
                                        step_size=config.neb_step_size, spring=config.spring, tol=config.tol,
                                        max_steps=config.max_steps, insertion_rounds=config.insertion_rounds)
    path_seconds = time.perf_counter() - start
    log(f"minimum-energy path: {len(path.points)} images, {path.iterations} FIRE steps in {path_seconds:.1f} s, "
        f"{'converged' if path.converged else 'NOT converged'} (largest force {path.max_force:.2e}, tol {config.tol:g}); "
        f"highest loss {path.loss.max():.4g} against the straight line's {line.loss.max():.4g}")
    profiles = {}
    for label, p in (("straight line", line), ("minimum-energy path", path)):
        start = time.perf_counter()
        profiles[label] = flatness.curvature_along_path(loss, p, num_probes=config.trace_probes, seed=config.seed)
        profiles[label]["seconds"] = time.perf_counter() - start
        log(f"curvature along the {label}: top eigenvalue and trace ({config.trace_probes} probes) at "
            f"{len(p.points)} images in {profiles[label]['seconds']:.1f} s")
    start = time.perf_counter()
    at_draws = {label: [_point_measures(loss, loss.flatten(d), path, config.trace_probes, config.seed) for d in pair]
                for label, pair in by_sampler.items()}
    log(f"curvature at the samplers' last draws: {sum(map(len, by_sampler.values()))} draws in "
        f"{time.perf_counter() - start:.1f} s")
    top = float(np.max(profiles["minimum-energy path"]["top_eigenvalue"]))
    start = time.perf_counter()
    log(f"dynamics from position {config.dynamics_start:g} of the path: α λmax {config.dynamics_alpha_lambda} "
        f"(λmax = {top:.3g}, the path's highest top eigenvalue), batches {config.dynamics_batch_sizes}, "
        f"{config.dynamics_steps} steps ...")
    dynamics = run_path_dynamics(config, model, loss.blocks, path, top, data.X_train, data.y_train, log)
    dynamics_seconds = time.perf_counter() - start
    log(f"dynamics: done in {dynamics_seconds:.1f} s")
    report = {"config": asdict(config), "threads": threads_record(), "n_train": n, "dim": loss.dim, "decay_trace": 2 * decay * loss.dim,
              "endpoints_loss": [float(loss.fn(e)) for e in ends], "endpoints_gradient": end_gradients,
              "path": {"converged": path.converged, "max_force": path.max_force, "iterations": path.iterations,
                       "images": len(path.points), "seconds": path_seconds},
              "top_eigenvalue": top,
              "seconds": {"descent": descent_seconds, "straight_line": line_seconds, "path": path_seconds,
                          **{f"curvature, {k}": v["seconds"] for k, v in profiles.items()},
                          "dynamics": dynamics_seconds},
              "profiles": {k: {q: np.asarray(v).tolist() for q, v in p.items() if q != "seconds"}
                           for k, p in profiles.items()},
              "path_length": float(path.arc_length[-1]), "draws": at_draws, "dynamics": dynamics}
    report["findings"] = findings(report)
    for text in report["findings"]:
        log(text)
    if staging is not None:
        hold_signals()  # the study is done: a Ctrl-C from here waits until the files are written
        _write(report, profiles, staging)
    return report


def findings(report: dict) -> list:
    """What the numbers show, computed from them."""
    decay = report["decay_trace"]
    out = [f"The endpoints are minima of the loss per image (training NLL plus weight decay): loss "
           f"{report['endpoints_loss'][0]:.4g} and {report['endpoints_loss'][1]:.4g}, gradient norm "
           f"{max(report['endpoints_gradient']):.1e} at most. The band has {report['path']['images']} images after "
           f"{report['config']['insertion_rounds']} AutoNEB insertion rounds and "
           + ("converged" if report["path"]["converged"] else "did NOT converge")
           + f" (largest force {report['path']['max_force']:.2e}, tol {report['config']['tol']:g})."]
    for label, p in report["profiles"].items():
        top, trace = np.asarray(p["top_eigenvalue"]), np.asarray(p["trace"])
        ends = 0.5 * (top[0] + top[-1])
        out.append(f"{label}: loss per image from {min(p['loss']):.4g} to {max(p['loss']):.4g}; top Hessian "
                   f"eigenvalue {ends:.3g} at the ends (mean) and {top.max():.3g} at its highest "
                   f"({top.max() / ends:.2f}x); trace of the NLL's Hessian (the weight decay's constant {decay:.4g} "
                   f"taken off) {0.5 * (trace[0] + trace[-1]) - decay:.3g} at the ends and {trace.max() - decay:.3g} "
                   f"at its highest.")
    path = report["profiles"]["minimum-energy path"]
    top, trace, se = (np.asarray(path[k]) for k in ("top_eigenvalue", "trace", "trace_stderr"))
    middle = slice(len(top) // 4, len(top) - len(top) // 4)
    sharper = top[middle] > max(top[0], top[-1])
    t = t_critical(report["config"].get("trace_probes"))  # each trace is a mean over its probes
    wider = trace[middle] - t * se[middle] > max(trace[0] + t * se[0], trace[-1] + t * se[-1])
    if sharper.all() and wider.all():
        out.append("Along the minimum-energy path the curvature rises away from both endpoints: every image of its "
                   f"middle half has a higher top eigenvalue and trace (beyond {t:.2f} standard errors, the t critical value "
                   "for its probes) than either end "
                   "(the entropic confinement Di Carlo et al. report).")
    else:
        out.append(f"Along the minimum-energy path the curvature does not rise above both endpoints throughout its "
                   f"middle half: {sharper.sum()} of its {sharper.size} images there have a higher top eigenvalue "
                   f"than either end and {wider.sum()} a trace higher beyond {t:.2f} standard errors (the t critical value for "
                   "its probes).")
    out += _draw_findings(report)
    out += dynamics_findings(report)
    return out


def _draw_findings(report: dict) -> list:
    floor = max(report["profiles"]["minimum-energy path"]["loss"])
    out = []
    for label, pair in report["draws"].items():
        out.append(f"{label}: loss per image {pair[0]['loss']:.3f} and {pair[1]['loss']:.3f}, top eigenvalue "
                   f"{pair[0]['top_eigenvalue']:.3g} and {pair[1]['top_eigenvalue']:.3g}; {pair[0]['distance']:.3g} "
                   f"and {pair[1]['distance']:.3g} from the path, nearest at positions {pair[0]['position']:.2f} "
                   f"and {pair[1]['position']:.2f}.")
    estimates = {k: mean_and_se(d["top_eigenvalue"] for d in v) for k, v in report["draws"].items()}
    far = sorted(k for k, v in report["draws"].items() if min(d["distance"] for d in v) > 0.5 * report["path_length"])
    if far:
        out.append(f"{', '.join(far)}: farther from the path than half its length, so the nearest path point "
                   "says little (such a point is about as far from every image).")
    n = min(len(v) for v in report["draws"].values())
    what = f"mean top eigenvalue (± its standard error over {n} draws)"
    out.append(f"Of the samplers' draws, {best_text(estimates, lowest=True, what=what, n=n)}; "
               f"{best_text(estimates, lowest=False, what=what, n=n)}.")
    draws = [d for pair in report["draws"].values() for d in pair]
    lowest = min(d["loss"] for d in draws)
    nearest = min(d["distance"] for d in draws)
    barrier = floor - min(report["endpoints_loss"])
    out.append(f"The lowest loss per image of any draw, {lowest:.3g}, is {lowest - floor:.3g} above the path's "
               f"highest ({floor:.4g}; the path rises {barrier:.2g} above its ends), and the nearest draw is "
               f"{nearest:.3g} from the path ({nearest / report['path_length']:.2f} of its length, "
               f"{report['path_length']:.3g}): "
               + ("the samplers' draws sit well above the valley floor the path runs along, not on it."
                  if lowest - floor > 10 * barrier else "some draws reach the valley floor."))
    return out


def _write(report, profiles, staging: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from ..plots import save_figures

    decay = report["decay_trace"]  # the weight decay adds a constant to the trace: shown without it
    fig = flatness.plot_path_profiles({k: dict(p, trace=np.asarray(p["trace"]) - decay) for k, p in profiles.items()})
    for ax in fig.axes:
        ax.set_yscale("log")
    fig.axes[0].set(ylabel="loss per image", title="loss per image (training NLL + weight decay)")
    fig.axes[2].set(ylabel="trace of the NLL's Hessian", title="trace of the NLL's Hessian (band: ±2 s.e.)")
    fig.suptitle(f"between two minima of the MLP's loss per image ({report['n_train']} images; the weight decay "
                 f"adds {decay:.4g} to every trace, taken off here); log scale", fontsize=10)
    fig.tight_layout()
    save_figures({"paths.png": fig, "draws.png": plot_draws(report), "dynamics.png": plot_dynamics(report)}, staging)
    (staging / "report.json").write_text(json.dumps(report, indent=2))
    (staging / "report.md").write_text(_markdown(report))


def plot_draws(report: dict):
    """Left: each sampler's last draws in the (training NLL, top eigenvalue) plane, beside both
    paths. Right: the draws alone, on linear axes, each sampler's mean with its 95 % t interval (the
    t critical value for its number of draws times the standard error: the rule of the findings' ranking),
    so that the samplers can be ranked (they sit far from the paths, in one corner of the left panel)."""
    import matplotlib.pyplot as plt

    fig, (wide, near) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [1, 1.15]})
    for i, (label, p) in enumerate(report["profiles"].items()):
        wide.plot(p["loss"], p["top_eigenvalue"], ".-", color=f"C{i}", alpha=0.6, label=f"{label} (images)")
    markers = "os^vDP*X"
    for j, (label, pair) in enumerate(report["draws"].items()):
        style = dict(color=f"C{j + 2}", marker=markers[j % len(markers)], edgecolor="k")
        loss = np.array([d["loss"] for d in pair])
        top = np.array([d["top_eigenvalue"] for d in pair])
        wide.scatter(loss, top, s=60, label=label, **style)
        near.scatter(loss, top, s=50, alpha=0.6, **style)
        (mx, sx), (my, sy) = mean_and_se(loss), mean_and_se(top)
        t = t_critical(len(pair))
        near.errorbar(mx, my, xerr=t * sx, yerr=t * sy, color=style["color"], capsize=3, lw=1.5)
        near.scatter([mx], [my], s=140, label=f"{label}: mean of {len(pair)} draws ± {t:.3g} SE (95 %)", **style)
    points = np.array([(d["loss"], d["top_eigenvalue"]) for pair in report["draws"].values() for d in pair])
    low, high = points.min(0), points.max(0)
    margin = 0.3 * np.maximum(high - low, 1e-3 * np.abs(high))  # the draws spread out; wide bars run off
    near.set(xlim=(low[0] - margin[0], high[0] + margin[0]), ylim=(low[1] - margin[1], high[1] + margin[1]))
    wide.set(xscale="log", yscale="log", xlabel="loss per image", ylabel="top Hessian eigenvalue",
             title="the samplers' last draws against the paths between two minima")
    near.set(xlabel="loss per image", ylabel="top Hessian eigenvalue",
             title="the draws alone (small markers: each draw; bars beyond the frame run off it)")
    for ax in (wide, near):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def _markdown(report: dict) -> str:
    c = report["config"]
    lines = ["# The minimum-energy path between two minima of a Bayesian MLP", "",
             f"MLP 784-{'-'.join(map(str, c['hidden']))}-{len(c['in_digits'])} on {report['n_train']} MNIST images "
             f"(digits {tuple(c['in_digits'])}); loss per image: the training NLL plus the weight decay "
             f"‖w‖²/(2nσ²) of a prior sd σ = {c['decay_scale']:g}. Two SGLD chains ({c['grad_evals']} gradient evaluations, "
             f"step {c['step_size']:g}) give one draw each; each descends {c['descent_steps']} full-batch Adam steps "
             f"(lr {c['descent_lr']:g}) to a minimum. Path: nudged elastic band from {c['num_points']} images, "
             f"climbing image, {c['insertion_rounds']} AutoNEB insertion rounds ({report['path']['images']} images); "
             f"{'converged' if report['path']['converged'] else 'NOT converged'} after {report['path']['iterations']} "
             f"FIRE steps (largest force {report['path']['max_force']:.2e}). Curvature: Lanczos top eigenvalue and a "
             f"{c['trace_probes']}-probe Hutchinson trace per image (the trace includes the weight decay's constant "
             f"{report['decay_trace']:.4g}).", "",
             "| | position | loss per image | top eigenvalue | trace |", "|---|---|---|---|---|"]
    for label, p in report["profiles"].items():
        for i in range(len(p["position"])):
            lines.append(f"| {label if i == 0 else ''} | {p['position'][i]:.2f} | {p['loss'][i]:.5g} | "
                         f"{p['top_eigenvalue'][i]:.3g} | {p['trace'][i]:.4g} ± {p['trace_stderr'][i]:.2g} |")
    lines += ["", "## Where the samplers' draws sit", "",
              f"Last draws of two chains per sampler; distance from the path (length {report['path_length']:.3g}) "
              "and the position of the nearest path point.", "",
              "| sampler | chain | loss per image | top eigenvalue | trace | distance | position |",
              "|---|---|---|---|---|---|---|"]
    for label, pair in report["draws"].items():
        for chain, d in enumerate(pair):
            lines.append(f"| {label if chain == 0 else ''} | {chain} | {d['loss']:.3f} | {d['top_eigenvalue']:.3g} | "
                         f"{d['trace']:.4g} ± {d['trace_stderr']:.2g} | {d['distance']:.3g} | {d['position']:.2f} |")
    lines += ["", "## Dynamics started on the path", "",
              f"From position {c['dynamics_start']:g}, {c['dynamics_steps']:,} steps; step sizes α from α λmax with "
              f"λmax = {report['top_eigenvalue']:.3g}, the path's highest top eigenvalue. Shift: each chain's position "
              "averaged over the second half of the run (the runs need not have come to rest), its mean over chains "
              "minus the start, ± the standard error over chains. SGLD: full-batch gradients plus isotropic noise of SGD's "
              "noise variance per step at the start.", "",
              "| α λmax | α | run | batch | T | chains | shift along the path | distance from the path | diverged |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in report["dynamics"]:
        spread = f" ± {r['shift_se']:.4f}" if r["chains"] > 1 else ""
        lines.append(f"| {r['alpha_lambda']:g} | {r['step_size']:.3g} | {r['kind']} | {r['batch_size'] or 'all'} | "
                     f"{r['temperature']:.2g} | {r['chains']} | {r['shift']:+.4f}{spread} | {r['final_distance']:.3g} | "
                     f"{'yes' if r['diverged'] else 'no'} |")
    lines += ["", "## What the numbers show", ""] + [f"- {t}" for t in report["findings"]]
    lines += ["", "Seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in report["seconds"].items()) + "."]
    return "\n".join(lines) + "\n"


__all__ = ["PathConfig", "run_path_study", "findings", "plot_draws"]
