"""The study behind ``pyro-flat paths``: the minimum-energy path between two minima of a Bayesian MLP.

Di Carlo, Goddard & Schwab report that minima of a network's training loss are joined by paths of
low loss, along which the curvature rises away from the minima. This study tests that on the MLP
of ``pyro-flat bnn``:

1. two SGLD chains (the BNN study's settings) give one draw each;
2. each draw descends (full-batch Adam on the training NLL per image, prior excluded, as the
   flatness measures of the BNN study) to a minimum: the endpoints;
3. the straight line and the minimum-energy path (:func:`~pyro_flat.flatness.minimum_energy_path`)
   join them; :func:`~pyro_flat.flatness.curvature_along_path` measures the top Hessian eigenvalue
   and the trace along both;
4. SGD started on the path between two images, with minibatch gradients at several step sizes and
   batch sizes (:func:`~pyro_flat.flatness.projected_dynamics`; the full batch is the noise-free
   control), is read off as a position along the path against time (Di Carlo et al.'s Fig. 3);
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
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from .. import flatness
from ..datasets import load_mnist_ood
from ..models import BayesianMLP
from ..predictive import iter_draws
from .compare import best_text, mean_and_se
from .configs import PathConfig
from .output import hold_signals, study_output


def _last_draws(key: str, config: PathConfig, model, data, log) -> dict:
    """The last draw of each of two chains of sampler ``key``, run as the BNN study runs it: ``{label:
    [draw, draw]}`` (for EntropySGLD, θ and θa)."""
    from .bnn import BNNConfig, sample_chains, sampler_label

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


def _minibatch_gradient(model: BayesianMLP, loss: flatness.FlatLoss, X, y, batch_size: int, seed: int):
    """``x -> ∇`` of the training NLL per image on a fresh minibatch of ``batch_size`` images (all of
    them for ``batch_size >= N``), in the flat layout of ``loss``."""
    shapes = {n: loss.model_target.sites[n].shape for n in loss.blocks}
    generator = torch.Generator().manual_seed(seed)
    n = len(X)

    def gradient(x: torch.Tensor) -> torch.Tensor:
        idx = torch.randperm(n, generator=generator)[:batch_size] if batch_size < n else torch.arange(n)
        x = x.detach().requires_grad_(True)
        parts = {k: x[block].reshape(shapes[k]) for k, block in loss.blocks.items()}
        weights = [(parts[f"layers.{i}.weight"], parts[f"layers.{i}.bias"]) for i in range(len(model.layers))]
        nll = torch.nn.functional.cross_entropy(model.logits(X[idx], weights), y[idx])
        return torch.autograd.grad(nll, x)[0]

    return gradient


def _dynamics(config: PathConfig, model, loss, path, data, log) -> list:
    """SGD from ``dynamics_start`` on the path for each step size and batch size (the full batch, a
    single chain, as the noise-free control)."""
    n = len(data.X_train)
    runs = []
    for step_size in config.dynamics_step_sizes:
        for batch_size in sorted({min(b, n) for b in config.dynamics_batch_sizes} | {n}):
            gradient = _minibatch_gradient(model, loss, data.X_train, data.y_train, batch_size, config.seed)
            start = time.perf_counter()
            run = flatness.projected_dynamics(path, gradient, start=config.dynamics_start, step_size=step_size,
                                              num_steps=config.dynamics_steps,
                                              num_chains=1 if batch_size == n else config.dynamics_chains,
                                              seed=config.seed, record_every=max(1, config.dynamics_steps // 50))
            seconds = time.perf_counter() - start
            toward = run.to_nearer_end[0] - run.to_nearer_end[-1]
            runs.append({"step_size": step_size, "batch_size": batch_size, "seconds": seconds,
                         "diverged": run.diverged, "steps": run.steps.tolist(), "position": run.position.tolist(),
                         "distance": run.distance.tolist(),
                         "toward_end": float(toward.mean()), "final_distance": float(run.distance[-1].mean())})
            log(f"SGD on the path, step {step_size:g}, batch {batch_size}: moved {runs[-1]['toward_end']:+.4f} of the "
                f"path toward the nearer end and {runs[-1]['final_distance']:.3g} away from the path in "
                f"{run.steps[-1]} steps ({seconds:.1f} s)")
    return runs


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


def _run_path_study(config: PathConfig, staging: Optional[Path], log: Callable[[str], None]) -> dict:
    data = load_mnist_ood(config.data_dir, in_digits=config.in_digits)
    n = len(data.X_train)
    model = BayesianMLP(data.X_train.shape[1], config.hidden, len(data.in_digits), prior_scale=config.prior_scale)
    by_sampler = {}
    for key in ("sgld",) + tuple(k for k in config.samplers if k != "sgld"):
        by_sampler.update(_last_draws(key, config, model, data, log))
    draws = by_sampler["SGLD"]
    full = flatness.FlatLoss.from_model(model, draws[0], data.X_train, data.y_train, likelihood_only=True)
    loss = flatness.FlatLoss(lambda x: full.fn(x) / n, full.params, full.blocks, full.model_target)  # NLL per image
    log(f"endpoints: {len(draws)} draws descend {config.descent_steps} Adam steps each ...")
    start = time.perf_counter()
    ends = [_descend(loss.fn, loss.flatten(d), config.descent_steps, config.descent_lr) for d in draws]
    descent_seconds = time.perf_counter() - start
    log(f"endpoints: each draw descended {config.descent_steps} Adam steps ({descent_seconds:.1f} s) to training "
        f"NLL per image {float(loss.fn(ends[0])):.2e} and {float(loss.fn(ends[1])):.2e}")
    start = time.perf_counter()
    line = flatness.straight_path(loss, ends[0], ends[1], num_points=config.num_points)
    line_seconds = time.perf_counter() - start
    log(f"minimum-energy path: relaxing {config.num_points} images (at most {config.max_steps} FIRE steps) ...")
    start = time.perf_counter()
    path = flatness.minimum_energy_path(loss, ends[0], ends[1], num_points=config.num_points,
                                        step_size=config.neb_step_size, spring=config.spring, tol=config.tol,
                                        max_steps=config.max_steps, insertion_rounds=0)
    path_seconds = time.perf_counter() - start
    log(f"minimum-energy path: {len(path.points)} images, {path.iterations} FIRE steps in {path_seconds:.1f} s, "
        f"{'converged' if path.converged else 'NOT converged'} (largest force {path.max_force:.2e}, tol {config.tol:g}); "
        f"highest loss {path.loss.max():.2e} against the straight line's {line.loss.max():.2e}")
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
    start = time.perf_counter()
    log(f"SGD started on the path: step sizes {config.dynamics_step_sizes}, batch sizes "
        f"{config.dynamics_batch_sizes} and the full batch, {config.dynamics_steps} steps ...")
    dynamics = _dynamics(config, model, loss, path, data, log)
    log(f"SGD started on the path: done in {time.perf_counter() - start:.1f} s")
    report = {"config": asdict(config), "n_train": n,
              "endpoints_loss": [float(loss.fn(e)) for e in ends],
              "path": {"converged": path.converged, "max_force": path.max_force, "iterations": path.iterations,
                       "seconds": path_seconds},
              "seconds": {"descent": descent_seconds, "straight_line": line_seconds, "path": path_seconds,
                          **{f"curvature, {k}": v["seconds"] for k, v in profiles.items()}},
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
    out = []
    for label, p in report["profiles"].items():
        top, trace = np.asarray(p["top_eigenvalue"]), np.asarray(p["trace"])
        ends = 0.5 * (top[0] + top[-1])
        out.append(f"{label}: loss per image from {min(p['loss']):.2e} to {max(p['loss']):.2e}; top Hessian "
                   f"eigenvalue {ends:.3g} at the ends (mean) and {top.max():.3g} at its highest "
                   f"({top.max() / ends:.1f}x), trace {0.5 * (trace[0] + trace[-1]):.3g} to {trace.max():.3g}.")
    path = report["profiles"]["minimum-energy path"]
    top = np.asarray(path["top_eigenvalue"])
    middle = top[len(top) // 4: len(top) - len(top) // 4]
    if middle.min() > max(top[0], top[-1]):
        out.append("Along the minimum-energy path the curvature rises away from both endpoints: every image of "
                   "its middle half is sharper than either end (the entropic confinement Di Carlo et al. report).")
    else:
        out.append("Along the minimum-energy path the curvature does not rise above both endpoints everywhere "
                   "in its middle half.")
    out += _draw_findings(report)
    out += _dynamics_findings(report)
    return out


def _draw_findings(report: dict) -> list:
    floor = max(report["profiles"]["minimum-energy path"]["loss"])
    out = []
    for label, pair in report["draws"].items():
        out.append(f"{label}: training NLL per image {pair[0]['loss']:.3f} and {pair[1]['loss']:.3f}, top eigenvalue "
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
    out.append(f"Of the samplers' draws, {best_text(estimates, lowest=True, what=what)}; "
               f"{best_text(estimates, lowest=False, what=what)}.")
    draws = [d for pair in report["draws"].values() for d in pair]
    lowest = min(d["loss"] for d in draws)
    nearest = min(d["distance"] for d in draws)
    out.append(f"The lowest training NLL of any draw, {lowest:.3g}, is {lowest / floor:.0f}x the path's highest "
               f"({floor:.2g}), and the nearest draw is {nearest:.3g} from the path ({nearest / report['path_length']:.2f} "
               f"of its length, {report['path_length']:.3g}): "
               + ("the samplers' draws sit well above the valley floor the path runs along, not on it."
                  if lowest > 10 * floor else "some draws reach the valley floor."))
    return out


def _dynamics_findings(report: dict) -> list:
    runs = report["dynamics"]
    if not runs:
        return []
    n, length = report["n_train"], report["path_length"]
    out = []
    for step_size in sorted({r["step_size"] for r in runs}):
        here = [r for r in runs if r["step_size"] == step_size]
        control = next(r for r in here if r["batch_size"] == n)
        text = ", ".join(f"batch {r['batch_size']}: {r['toward_end']:+.4f} ({r['final_distance']:.3g} away)"
                         + (" DIVERGED" if r["diverged"] else "") for r in here)
        out.append(f"SGD from position {report['config']['dynamics_start']:g}, step {step_size:g}, after "
                   f"{control['steps'][-1]} steps: moved toward the nearer end by (fraction of the path; distance "
                   f"from the path in brackets) {text}.")
    noisy = [r for r in runs if r["batch_size"] < n]
    controls = {r["step_size"]: r for r in runs if r["batch_size"] == n}
    near = [r for r in noisy if r["final_distance"] < 0.1 * length and not r["diverged"]]
    excess = [r["toward_end"] - controls[r["step_size"]]["toward_end"] for r in near]
    if near and max(excess) > 0.05:
        best = near[int(np.argmax(excess))]
        out.append(f"Minibatch noise drives SGD back toward the ends: at step {best['step_size']:g} and batch "
                   f"{best['batch_size']} the chains moved {max(excess):.3f} of the path further toward the nearer "
                   "end than full-batch gradient descent, while staying near the path.")
    else:
        far = [r for r in noisy if r["final_distance"] >= 0.1 * length or r["diverged"]]
        text = "Di Carlo et al.'s drift back toward the ends is not seen here: "
        if near:
            spread = max(abs(r["final_distance"] / controls[r["step_size"]]["final_distance"] - 1) for r in near)
            text += (f"runs that stay near the path move at most {max(excess):.1e} of it beyond full-batch descent, "
                     f"and end within {spread:.0%} of its distance from the path: at these minima (training NLL "
                     f"{min(report['endpoints_loss']):.1e} per image) their minibatch gradients add almost no noise")
        else:
            text += "no minibatch run stays near the path"
        if far:
            text += (f"; {len(far)} run(s) with small batches were thrown more than a tenth of the path's length "
                     f"({0.1 * length:.3g}) off it, out of the valley rather than along it")
        out.append(text + ".")
    return out


def _write(report, profiles, staging: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from .plots import save_figures

    fig = flatness.plot_path_profiles(profiles)
    for ax in fig.axes:
        ax.set_yscale("log")
    fig.axes[0].set(ylabel="training NLL per image", title="training NLL per image")
    fig.suptitle(f"between two minima of the MLP's training NLL per image ({report['n_train']} images); log scale",
                 fontsize=10)
    fig.tight_layout()
    save_figures({"paths.png": fig, "draws.png": plot_draws(report), "dynamics.png": plot_dynamics(report)}, staging)
    (staging / "report.json").write_text(json.dumps(report, indent=2))
    (staging / "report.md").write_text(_markdown(report))


def plot_draws(report: dict):
    """Left: each sampler's last draws in the (training NLL, top eigenvalue) plane, beside both
    paths. Right: the draws alone, on linear axes, each sampler's mean with ± 2 standard errors, so
    that the samplers can be ranked (they sit far from the paths, in one corner of the left panel)."""
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
        near.errorbar(mx, my, xerr=2 * sx, yerr=2 * sy, color=style["color"], capsize=3, lw=1.5)
        near.scatter([mx], [my], s=140, label=f"{label}: mean of {len(pair)} draws ± 2 SE", **style)
    wide.set(xscale="log", yscale="log", xlabel="training NLL per image", ylabel="top Hessian eigenvalue",
             title="the samplers' last draws against the paths between two minima")
    near.set(xlabel="training NLL per image", ylabel="top Hessian eigenvalue",
             title="the draws alone (small markers: each draw)")
    for ax in (wide, near):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def plot_dynamics(report: dict):
    """Position along the path and distance from it against the iteration, one column per step size."""
    import matplotlib.pyplot as plt

    sizes = sorted({r["step_size"] for r in report["dynamics"]})
    fig, axes = plt.subplots(2, len(sizes), figsize=(5.5 * len(sizes), 6.4), squeeze=False)
    n = report["n_train"]
    batches = sorted({r["batch_size"] for r in report["dynamics"]})
    for col, step_size in enumerate(sizes):
        top, bottom = axes[0, col], axes[1, col]
        for r in (r for r in report["dynamics"] if r["step_size"] == step_size):
            color = f"C{batches.index(r['batch_size'])}"
            label = "full batch (no noise)" if r["batch_size"] == n else f"batch {r['batch_size']}"
            steps, position, distance = (np.asarray(r[k]) for k in ("steps", "position", "distance"))
            top.plot(steps, position, color=color, lw=0.8, alpha=0.5)
            top.plot(steps, position.mean(1), color=color, lw=2, label=label)
            bottom.plot(steps[1:], distance[1:].mean(1), color=color, lw=2, label=label)
        top.set(title=f"SGD started on the path, step {step_size:g}", xlabel="iteration",
                ylabel="position of the nearest path point\n(0, 1: the minima)", ylim=(-0.02, 1.02))
        top.axhline(report["config"]["dynamics_start"], color="grey", ls=":", lw=1)
        bottom.set(xlabel="iteration", ylabel="distance from the path", yscale="log")
        bottom.axhline(report["path_length"], color="grey", ls="--", lw=1, label="the path's length")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _markdown(report: dict) -> str:
    c = report["config"]
    lines = ["# The minimum-energy path between two minima of a Bayesian MLP", "",
             f"MLP 784-{'-'.join(map(str, c['hidden']))}-{len(c['in_digits'])} on {report['n_train']} MNIST images "
             f"(digits {tuple(c['in_digits'])}). Two SGLD chains ({c['grad_evals']} iterations, step {c['step_size']:g}) "
             f"give one draw each; each descends {c['descent_steps']} full-batch Adam steps (lr {c['descent_lr']:g}) "
             "on the training NLL per image (prior excluded) to a minimum. Path: nudged elastic band, "
             f"{c['num_points']} images, climbing image; {'converged' if report['path']['converged'] else 'NOT converged'} "
             f"after {report['path']['iterations']} FIRE steps (largest force {report['path']['max_force']:.2e}). "
             f"Curvature: Lanczos top eigenvalue and a {c['trace_probes']}-probe Hutchinson trace per image.", "",
             "| | position | loss per image | top eigenvalue | trace |", "|---|---|---|---|---|"]
    for label, p in report["profiles"].items():
        for i in range(len(p["position"])):
            lines.append(f"| {label if i == 0 else ''} | {p['position'][i]:.2f} | {p['loss'][i]:.2e} | "
                         f"{p['top_eigenvalue'][i]:.3g} | {p['trace'][i]:.3g} ± {p['trace_stderr'][i]:.2g} |")
    lines += ["", "## Where the samplers' draws sit", "",
              f"Last draws of two chains per sampler; distance from the path (length {report['path_length']:.3g}) "
              "and the position of the nearest path point.", "",
              "| sampler | chain | training NLL | top eigenvalue | trace | distance | position |",
              "|---|---|---|---|---|---|---|"]
    for label, pair in report["draws"].items():
        for chain, d in enumerate(pair):
            lines.append(f"| {label if chain == 0 else ''} | {chain} | {d['loss']:.3f} | {d['top_eigenvalue']:.3g} | "
                         f"{d['trace']:.3g} ± {d['trace_stderr']:.2g} | {d['distance']:.3g} | {d['position']:.2f} |")
    lines += ["", "## SGD started on the path", "",
              f"From position {c['dynamics_start']:g}, {c['dynamics_steps']} steps, {c['dynamics_chains']} chains "
              "per minibatch size (one for the full batch), gradients of the training NLL per image.", "",
              "| step | batch | toward the nearer end | distance from the path | diverged |", "|---|---|---|---|---|"]
    for r in report["dynamics"]:
        lines.append(f"| {r['step_size']:g} | {r['batch_size']} | {r['toward_end']:+.4f} | {r['final_distance']:.3g} | "
                     f"{'yes' if r['diverged'] else 'no'} |")
    lines += ["", "## What the numbers show", ""] + [f"- {t}" for t in report["findings"]]
    lines += ["", "Seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in report["seconds"].items()) + "."]
    return "\n".join(lines) + "\n"


__all__ = ["PathConfig", "run_path_study", "findings", "plot_draws", "plot_dynamics"]
