r"""The dynamics half of ``pyro-flat paths``: does noise push SGD along a path toward its flatter end?

Di Carlo, Goddard & Schwab start SGD on a minimum-energy path between two minima and read the
weights off as a position along the path. Where the curvature across the path varies, noise of
temperature :math:`T` meets the effective potential :math:`V(s) + \tfrac{T}{2}\sum_i\log\lambda_i(s)`
and drifts toward the flatter end. This module runs that experiment on the path study's MLP, for
each step size :math:`\alpha` (set by :math:`\alpha\,\lambda_{\max}`, :math:`\lambda_{\max}` the
largest top Hessian eigenvalue along the path) and each batch size:

- **free SGD** in the full weight space, minibatch gradients (``dynamics_chains`` chains, each its
  own minibatches), against **full-batch descent** from the same point, its noise-free control;
- **constrained SGD** moved along the path only (it feels the loss along the path, no curvature
  across it), against constrained full-batch descent;
- **SGLD** at low temperature, full-batch gradients plus isotropic noise whose variance per step
  equals the minibatch noise's (:func:`matched_temperature`): the isotropic-noise comparison.

Each chain's position is averaged over the second half of the run (the runs need not have come to
rest: along a flat path they rarely do); a run's shift is that average over its chains minus the
start, ± its standard error over chains. The
noise's own effect is a noisy run's shift minus its control's, and the entropic force is what the
free runs show beyond the constrained ones.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from ... import flatness
from ...targets.batching import EpochBatcher
from ..compare import differ, mean_and_se, threshold_text

#: the kinds of run, in the order of the report: (label, constrained, noise)
RUN_KINDS = (("free SGD", False, "minibatch"), ("free full-batch descent", False, "none"),
             ("constrained SGD", True, "minibatch"), ("constrained full-batch descent", True, "none"),
             ("free SGLD", False, "isotropic"))


def mlp_gradient(model, blocks: Dict[str, slice], X: torch.Tensor, y: torch.Tensor, decay_scale: float,
                 batches: Optional[EpochBatcher]) -> Callable[[torch.Tensor], torch.Tensor]:
    r"""``x (C, d) -> ∇ (C, d)`` of the loss per image of the path study for ``C`` chains at once,

    .. math:: \ell_B(w) = \frac1B\sum_{i\in B} -\log p(y_i \mid x_i, w) + \frac{\lVert w\rVert^2}{2 n s^2},

    on each chain's own minibatch from ``batches`` (``(C, B)`` indices), or on all ``n`` images
    when ``batches`` is None (``s``: ``decay_scale``); ``blocks`` lays the flat vector out as the
    MLP's layers."""
    n = len(X)
    names = [(f"layers.{i}.weight", f"layers.{i}.bias") for i in range(len(model.layers))]
    shapes = {k: (model.layers[i].out_features, -1) if k.endswith("weight") else (-1,)
              for i, pair in enumerate(names) for k in pair}

    def gradient(x: torch.Tensor) -> torch.Tensor:
        x = x.detach().requires_grad_(True)
        C = x.shape[0]
        # (C, 1, out, in) and (C, 1, out): the chains, then the data plate's slot (BayesianMLP.logits)
        parts = {k: x[:, block].reshape(C, 1, *shapes[k]) for k, block in blocks.items()}
        weights = [(parts[w], parts[b]) for w, b in names]
        if batches is None:
            inputs, labels = X, y.expand(C, -1)
        else:
            idx = batches()
            inputs, labels = X[idx], y[idx]
        logits = model.logits(inputs, weights)
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                reduction="sum") / labels.shape[-1]
        penalty = x.square().sum() / (2 * n * decay_scale ** 2)
        return torch.autograd.grad(nll + penalty, x)[0]

    return gradient


def matched_temperature(gradient_fn: Callable, full_gradient_fn: Callable, x: torch.Tensor, step_size: float,
                        num_batches: int) -> float:
    r"""The temperature of isotropic noise with the variance per step of SGD's minibatch noise at ``x``:
    SGD adds :math:`\alpha(g_B - g)`, of total variance :math:`\alpha^2\,\mathrm{tr}\,C_B`; SGLD adds
    :math:`\sqrt{2\alpha T}\,\xi`, of total variance :math:`2\alpha T d`; so
    :math:`T = \alpha\,\mathrm{tr}\,C_B / (2d)`, with :math:`\mathrm{tr}\,C_B` estimated from the
    ``num_batches`` minibatch gradients of one call of ``gradient_fn`` (its chains)."""
    x = x.reshape(1, -1)
    exact = full_gradient_fn(x)
    noisy = gradient_fn(x.expand(num_batches, -1))
    spread = float((noisy - exact).square().sum(-1).mean())
    return step_size * spread / (2 * x.shape[-1])


def _settled(position: np.ndarray) -> np.ndarray:
    """Each chain's mean position over the second half of the record."""
    return position[len(position) // 2:].mean(axis=0)


def run_path_dynamics(config, model, blocks, path: flatness.EnergyPath, top_eigenvalue: float, X, y,
                      log: Callable[[str], None]) -> List[dict]:
    """Every run of the module's docstring for each ``α λmax`` of ``config.dynamics_alpha_lambda`` and
    each batch size; a list of records (``kind``, ``step_size``, ``batch_size``, ``temperature``,
    ``steps``, ``position`` and ``distance`` (T, C), ``settled`` per chain, ``shift`` ± ``shift_se``)."""
    n = len(X)
    start = path.at(config.dynamics_start)
    full = mlp_gradient(model, blocks, X, y, config.decay_scale, None)
    record_every = max(1, config.dynamics_steps // 100)
    runs = []

    def run(kind: str, step_size: float, batch_size: Optional[int], gradient, chains: int, temperature: float,
            alpha_lambda: float) -> None:
        constrained = kind.startswith("constrained")
        began = time.perf_counter()
        result = flatness.projected_dynamics(path, gradient, start=config.dynamics_start, step_size=step_size,
                                             num_steps=config.dynamics_steps, temperature=temperature,
                                             num_chains=chains, seed=config.seed, constrained=constrained,
                                             vectorized=True, record_every=record_every)
        settled = _settled(result.position)
        shift, shift_se = mean_and_se(settled - config.dynamics_start)
        runs.append({"kind": kind, "alpha_lambda": alpha_lambda, "step_size": step_size, "batch_size": batch_size,
                     "temperature": temperature, "chains": chains, "seconds": time.perf_counter() - began,
                     "diverged": result.diverged, "steps": result.steps.tolist(),
                     "position": result.position.tolist(), "distance": result.distance.tolist(),
                     "settled": settled.tolist(), "shift": shift, "shift_se": shift_se,
                     "final_distance": float(result.distance[-1].mean())})
        noise = (f"batch {batch_size}" if batch_size else "full batch") + (f", T = {temperature:.3g}" if temperature else "")
        log(f"{kind} ({noise}, {chains} chain{'s' if chains > 1 else ''}, α = {step_size:.3g}): moved "
            f"{shift:+.4f} ± {shift_se:.4f} along the path (second half's mean), {runs[-1]['final_distance']:.3g} from it"
            + (" DIVERGED" if result.diverged else "") + f" ({runs[-1]['seconds']:.1f} s)")

    for alpha_lambda in config.dynamics_alpha_lambda:
        step_size = alpha_lambda / top_eigenvalue
        for kind in ("free full-batch descent", "constrained full-batch descent"):
            run(kind, step_size, None, full, 1, 0.0, alpha_lambda)
        for batch_size in config.dynamics_batch_sizes:
            torch.manual_seed(config.seed)  # each batcher seeds its stream from the global one
            minibatch = mlp_gradient(model, blocks, X, y, config.decay_scale,
                                     EpochBatcher(n, batch_size, X.device, num_chains=config.dynamics_chains))
            for kind in ("free SGD", "constrained SGD"):
                run(kind, step_size, batch_size, minibatch, config.dynamics_chains, 0.0, alpha_lambda)
            probe = mlp_gradient(model, blocks, X, y, config.decay_scale,
                                 EpochBatcher(n, batch_size, X.device, num_chains=config.noise_batches))
            temperature = matched_temperature(probe, full, start, step_size, config.noise_batches)
            run("free SGLD", step_size, batch_size, full, config.sgld_chains, temperature, alpha_lambda)
    return runs


def flatter_end(profile: dict, probes: Optional[int] = None) -> dict:
    """Which end of the path is flatter: by the Hessian trace when the ends differ beyond the t critical
    value for ``probes`` Hutchinson probes (:mod:`.compare`), else by the top eigenvalue
    (``{"end": 0 or 1 or None, "by": ..., "text": ...}``)."""
    trace, se, top = (np.asarray(profile[k]) for k in ("trace", "trace_stderr", "top_eigenvalue"))
    if differ(trace[0], se[0], trace[-1], se[-1], n=probes):
        end = 0 if trace[0] < trace[-1] else 1
        return {"end": end, "by": "trace", "text": f"end {end} is the flatter by the Hessian trace "
                f"(end 0: {trace[0]:.4g} ± {se[0]:.2g}, end 1: {trace[-1]:.4g} ± {se[-1]:.2g})"}
    end = 0 if top[0] < top[-1] else 1
    return {"end": end, "by": "top eigenvalue",
            "text": f"the ends' traces are the same within {threshold_text(probes, 'probes')} (end 0: {trace[0]:.4g} ± {se[0]:.2g}, "
                    f"end 1: {trace[-1]:.4g} ± {se[-1]:.2g}); end {end} has the lower top eigenvalue "
                    f"(end 0: {top[0]:.3g}, end 1: {top[-1]:.3g}, {abs(top[0] / top[-1] - 1):.1%} apart)"}


#: the smallest shift along the path (a fraction of its length) a finding calls a drift, beyond its error bar
MIN_SHIFT = 0.01


def moved(shift: float, se: float, chains: Optional[int] = None) -> bool:
    """Whether a shift along the path, a mean over ``chains``, counts: beyond the t critical value's
    standard errors (:mod:`.compare`) and at least :data:`MIN_SHIFT`."""
    return abs(shift) >= MIN_SHIFT and differ(shift, se, 0.0, 0.0, n=chains)


def _excess(noisy: dict, control: dict) -> tuple:
    """A noisy run's shift beyond its control's, ± the noisy run's standard error (the control is
    deterministic)."""
    return noisy["shift"] - control["shift"], noisy["shift_se"]


def dynamics_findings(report: dict) -> List[str]:
    """What the runs show, computed from them: per step size and batch, each noisy run's shift beyond
    its noise-free control, toward which end, and the entropic part: free SGD's excess beyond
    constrained SGD's (the curvature across the path acts on the free runs only)."""
    runs = report["dynamics"]
    if not runs:
        return []
    flat = flatter_end(report["profiles"]["minimum-energy path"], report["config"].get("trace_probes"))
    clear = flat["by"] == "trace"  # an end measurably flatter by the trace
    out = [f"Which end is flatter: {flat['text']}."]

    def direction(shift: float) -> str:
        end = 1 if shift > 0 else 0
        return f"toward end {end}" + ("" if not clear else " (the flatter)" if end == flat["end"] else " (the sharper)")

    drifts = []  # (entropic shift, its standard error) per setting
    for alpha_lambda in sorted({r["alpha_lambda"] for r in runs}):
        here = [r for r in runs if r["alpha_lambda"] == alpha_lambda]
        free_control = next(r for r in here if r["kind"] == "free full-batch descent")
        fixed_control = next(r for r in here if r["kind"] == "constrained full-batch descent")
        out.append(f"At α λmax = {alpha_lambda:g} (α = {free_control['step_size']:.3g}), {free_control['steps'][-1]:,} "
                   f"steps from position {report['config']['dynamics_start']:g}: full-batch descent moved "
                   f"{free_control['shift']:+.4f} along the path (free, {free_control['final_distance']:.3g} from it) "
                   f"and {fixed_control['shift']:+.4f} (constrained), the loss's own slope.")
        for batch_size in sorted({r["batch_size"] for r in here if r["batch_size"]}):
            by_kind = {r["kind"]: r for r in here if r["batch_size"] == batch_size}
            free, fixed, sgld = by_kind["free SGD"], by_kind["constrained SGD"], by_kind["free SGLD"]
            parts = []
            for run, control in ((free, free_control), (fixed, fixed_control), (sgld, free_control)):
                excess, se = _excess(run, control)
                verdict = (f"{excess:+.4f} ± {se:.4f}, {direction(excess)}" if moved(excess, se, run["chains"])
                           else f"{excess:+.4f} ± {se:.4f}, no shift (beyond "
                                f"{threshold_text(run['chains'], 'chains')} and {MIN_SHIFT:g} of the path)")
                extra = f" at T = {run['temperature']:.2g} ({run['temperature'] * report['n_train']:.2g}/n)" \
                    if run["temperature"] else ""
                parts.append(f"{run['kind']}{extra}: {verdict}"
                             + (f" ({run['final_distance']:.3g} from the path)" if not run["kind"].startswith("constr")
                                else "") + (" DIVERGED" if run["diverged"] else ""))
            entropic = _excess(free, free_control)[0] - _excess(fixed, fixed_control)[0]
            entropic_se = math.hypot(free["shift_se"], fixed["shift_se"])
            chains = min(free["chains"], fixed["chains"])
            drifts.append((entropic, entropic_se, chains))
            out.append(f"Batch {batch_size}, shift beyond the noise-free control ({free['chains']} chains; SGLD "
                       f"{sgld['chains']}; ± standard error over chains): " + "; ".join(parts) + ". Free SGD's excess "
                       f"beyond constrained SGD's (the part the curvature across the path can cause): {entropic:+.4f} "
                       f"± {entropic_se:.4f}" + (f", {direction(entropic)}." if moved(entropic, entropic_se, chains) else
                                                 ", no drift measurable here."))
    seen = [(d, se) for d, se, n in drifts if moved(d, se, n)]
    toward = [d for d, _ in seen if clear and (d > 0) == (flat["end"] == 1)]
    if not seen:
        out.append("Di Carlo et al.'s drift toward the flatter end does not appear: in no setting does free SGD move "
                   f"beyond both its full-batch control and constrained SGD (by the t critical value for its chains "
                   f"and {MIN_SHIFT:g} of the path).")
    elif not clear:
        ends = sorted({1 if d > 0 else 0 for d, _ in seen})
        out.append(f"Free SGD drifts beyond its controls in {len(seen)} of {len(drifts)} settings (toward end "
                   f"{' and end '.join(map(str, ends))}), but neither end is measurably flatter by the Hessian "
                   "trace, so this run cannot test Di Carlo et al.'s drift toward the flatter end.")
    elif len(toward) == len(drifts):
        out.append("Di Carlo et al.'s drift toward the flatter end appears in every setting: free SGD moves toward it "
                   "beyond both full-batch descent and constrained SGD.")
    else:
        out.append(f"Free SGD drifts toward the flatter end beyond its controls in {len(toward)} of {len(drifts)} "
                   f"settings and toward the sharper end in {len(seen) - len(toward)}: Di Carlo et al.'s drift does "
                   "not hold throughout.")
    spread = max((float(np.std(r["settled"], ddof=1)) for r in runs if r["chains"] > 1), default=0.0)
    farthest = max(abs(r["shift"]) for r in runs)
    out.append(f"In {runs[0]['steps'][-1]:,} steps no run's chains moved more than {farthest:.3f} of the path on "
               f"average, and the chains of one run ended (second half's means) within a standard deviation of {spread:.3f} of each "
               "other: " + ("the dynamics barely move along this path in that time, so only a drift faster than "
                            "that can show." if max(farthest, spread) < 0.05 else
                            "the runs travel along the path within that time."))
    return out


def plot_dynamics(report: dict):
    """One row per α λmax: the position along the path against the iteration for the free runs and
    for the constrained ones (mean over chains, band ± 2 standard errors), and the free runs'
    distance from the path."""
    import matplotlib.pyplot as plt

    sizes = sorted({r["alpha_lambda"] for r in report["dynamics"]})
    fig, axes = plt.subplots(len(sizes), 3, figsize=(16, 4.2 * len(sizes)), squeeze=False)
    colors = {kind: f"C{i}" for i, (kind, _, _) in enumerate(RUN_KINDS)}
    for row, alpha_lambda in enumerate(sizes):
        free_ax, fixed_ax, far_ax = axes[row]
        for r in (r for r in report["dynamics"] if r["alpha_lambda"] == alpha_lambda):
            steps, position, distance = (np.asarray(r[k]) for k in ("steps", "position", "distance"))
            mean = position.mean(1)
            se = position.std(1, ddof=1) / math.sqrt(position.shape[1]) if position.shape[1] > 1 else 0 * mean
            label = r["kind"] + (f", batch {r['batch_size']}" if r["batch_size"] and r["kind"] != "free SGLD" else "") \
                + (f", T = {r['temperature']:.2g}" if r["temperature"] else "") + f" ({r['chains']})"
            ax = fixed_ax if r["kind"].startswith("constrained") else free_ax
            ax.plot(steps, mean, color=colors[r["kind"]], lw=1.8, label=label)
            ax.fill_between(steps, mean - 2 * se, mean + 2 * se, color=colors[r["kind"]], alpha=0.2)
            if not r["kind"].startswith("constrained"):
                far_ax.plot(steps[1:], distance[1:].mean(1), color=colors[r["kind"]], lw=1.8, label=label)
        for ax, title in ((free_ax, "free (full weight space)"), (fixed_ax, "constrained to the path")):
            ax.axhline(report["config"]["dynamics_start"], color="grey", ls=":", lw=1)
            ax.set(xlabel="iteration", ylabel="position along the path (0, 1: the minima)",
                   title=f"{title}, α λmax = {alpha_lambda:g}")
        far_ax.set(xlabel="iteration", ylabel="distance from the path", yscale="log",
                   title=f"free runs: distance from the path, α λmax = {alpha_lambda:g}")
        for ax in axes[row]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle("dynamics started on the minimum-energy path (chains in brackets; bands: ± 2 standard errors "
                 "over chains)", fontsize=10)
    fig.tight_layout()
    return fig


__all__ = ["mlp_gradient", "matched_temperature", "run_path_dynamics", "flatter_end", "moved", "dynamics_findings",
           "plot_dynamics"]
