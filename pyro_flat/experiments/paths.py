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
4. the loss and curvature at the two SGLD draws say where the sampler's draws sit.

>>> report = run_path_study(PathConfig.reduced(progress=False), write=False, log=lambda line: None)
>>> sorted(report["profiles"])
['minimum-energy path', 'straight line']
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Tuple

import numpy as np
import torch

from .. import flatness
from ..datasets import load_mnist_ood
from ..models import BayesianMLP
from .output import require_int, require_positive, staged_output


@dataclass
class PathConfig:
    """Settings of the path study (the defaults are the CLI's; :meth:`reduced` is for tests)."""

    data_dir: Optional[str] = None
    in_digits: Tuple[int, ...] = (0, 1, 2, 3, 4)
    hidden: Tuple[int, ...] = (100,)
    prior_scale: float = 0.1
    batch_size: int = 100
    step_size: float = 5e-5
    grad_evals: int = 6000
    descent_steps: int = 1000
    descent_lr: float = 1e-3
    num_points: int = 16
    neb_step_size: float = 1e-2
    spring: float = 1.0
    tol: float = 1e-3
    max_steps: int = 1000
    trace_probes: int = 10
    seed: int = 0
    out: str = "pyro-flat-out/paths"
    overwrite: bool = False
    progress: bool = True

    @classmethod
    def reduced(cls, **overrides) -> "PathConfig":
        small = dict(grad_evals=200, descent_steps=50, num_points=5, max_steps=40, trace_probes=3)
        return cls(**{**small, **overrides})

    def check(self) -> None:
        for option in ("prior_scale", "step_size", "descent_lr", "neb_step_size", "spring", "tol"):
            require_positive(f"--{option.replace('_', '-')}", getattr(self, option))
        for option, minimum in (("grad_evals", 2), ("descent_steps", 1), ("max_steps", 1), ("batch_size", 1)):
            require_int(f"--{option.replace('_', '-')}", getattr(self, option), minimum)
        require_int("--num-points", self.num_points, 3)
        require_int("--trace-probes", self.trace_probes, 2)


def _two_draws(config: PathConfig, model, data, log):
    """The last draw of each of two SGLD chains, run as the BNN study runs its samplers."""
    from .bnn import BNNConfig, sample_chains

    bnn = BNNConfig(data_dir=config.data_dir, in_digits=config.in_digits, hidden=config.hidden,
                    prior_scale=config.prior_scale, batch_size=config.batch_size, step_size=config.step_size,
                    grad_evals=config.grad_evals, num_chains=2, num_draws=1, seed=config.seed,
                    progress=config.progress)
    samples, _, _ = sample_chains("sgld", "SGLD", bnn, model, data, log)
    return [{k: v[c, -1] for k, v in samples.items()} for c in (0, 1)]


def _descend(loss_fn, x: torch.Tensor, steps: int, lr: float) -> torch.Tensor:
    x = x.detach().clone().requires_grad_(True)
    optimiser = torch.optim.Adam([x], lr=lr)
    for _ in range(steps):
        optimiser.zero_grad()
        loss_fn(x).backward()
        optimiser.step()
    return x.detach()


def _point_measures(loss, point, probes, seed) -> dict:
    here = loss.at(point)
    with torch.no_grad():
        value = float(here(point))
    trace = flatness.hessian_trace(here, num_probes=probes, seed=seed)
    return {"loss": value, "top_eigenvalue": flatness.top_eigenvalues(here, k=1, tol=1e-3, seed=seed)[0],
            "trace": trace.value, "trace_stderr": trace.stderr}


def run_path_study(config: PathConfig, *, write: bool = True, log: Callable[[str], None] = print) -> dict:
    """Run the study; with ``write`` also write ``report.md``, ``report.json`` and ``paths.png``."""
    config.check()
    data = load_mnist_ood(config.data_dir, in_digits=config.in_digits)
    n = len(data.X_train)
    model = BayesianMLP(data.X_train.shape[1], config.hidden, len(data.in_digits), prior_scale=config.prior_scale)
    draws = _two_draws(config, model, data, log)
    full = flatness.FlatLoss.from_model(model, draws[0], data.X_train, data.y_train, likelihood_only=True)
    loss = flatness.FlatLoss(lambda x: full.fn(x) / n, full.params, full.blocks, full.model_target)  # NLL per image
    start = time.perf_counter()
    ends = [_descend(loss.fn, loss.flatten(d), config.descent_steps, config.descent_lr) for d in draws]
    descent_seconds = time.perf_counter() - start
    log(f"endpoints: each draw descended {config.descent_steps} Adam steps ({descent_seconds:.1f} s) to training "
        f"NLL per image {float(loss.fn(ends[0])):.2e} and {float(loss.fn(ends[1])):.2e}")
    start = time.perf_counter()
    line = flatness.straight_path(loss, ends[0], ends[1], num_points=config.num_points)
    line_seconds = time.perf_counter() - start
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
    at_draws = [_point_measures(loss, loss.flatten(d), config.trace_probes, config.seed) for d in draws]
    report = {"config": asdict(config), "n_train": n,
              "endpoints_loss": [float(loss.fn(e)) for e in ends],
              "path": {"converged": path.converged, "max_force": path.max_force, "iterations": path.iterations,
                       "seconds": path_seconds},
              "seconds": {"descent": descent_seconds, "straight_line": line_seconds, "path": path_seconds,
                          **{f"curvature, {k}": v["seconds"] for k, v in profiles.items()}},
              "profiles": {k: {q: np.asarray(v).tolist() for q, v in p.items() if q != "seconds"}
                           for k, p in profiles.items()},
              "draws": at_draws}
    report["findings"] = findings(report)
    for text in report["findings"]:
        log(text)
    if write:
        _write(report, profiles, config, log)
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
    d = report["draws"]
    out.append(f"The SGLD draws sit far above this valley floor: training NLL per image {d[0]['loss']:.3f} and "
               f"{d[1]['loss']:.3f}, top eigenvalue {d[0]['top_eigenvalue']:.3g} and {d[1]['top_eigenvalue']:.3g} "
               f"(the path's highest: {top.max():.3g}).")
    return out


def _write(report, profiles, config, log) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = flatness.plot_path_profiles(profiles)
    for ax in fig.axes:
        ax.set_yscale("log")
    fig.axes[0].set(ylabel="training NLL per image", title="training NLL per image")
    fig.suptitle(f"between two minima of the MLP's training NLL per image ({report['n_train']} images); log scale",
                 fontsize=10)
    fig.tight_layout()
    with staged_output(config.out, "paths", config.overwrite) as staging:
        fig.savefig(staging / "paths.png", dpi=110)
        plt.close(fig)
        (staging / "report.json").write_text(json.dumps(report, indent=2))
        (staging / "report.md").write_text(_markdown(report))
    log(f"wrote {config.out}: report.md, report.json, paths.png")


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
    lines += ["", "## What the numbers show", ""] + [f"- {t}" for t in report["findings"]]
    lines += ["", "Seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in report["seconds"].items()) + "."]
    return "\n".join(lines) + "\n"


__all__ = ["PathConfig", "run_path_study", "findings"]
