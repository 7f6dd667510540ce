"""Matplotlib figures of the studies. Each function draws one figure and returns it.

They take plain tensors/arrays and dicts, so notebooks, the CLI and users' own runs share them.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

import numpy as np
import torch

from ..datasets import SharpFlatMixture, flat_density_curves


def _plt():
    import matplotlib.pyplot as plt

    return plt


def plot_bma_curves(curves: Mapping[str, Mapping[str, np.ndarray]], *, title: str = "",
                    xlabel: str = "iteration (warm-up included)"):
    """Test accuracy and NLL of the running Bayesian model average, each with a band of ±1 standard
    error over the test points (``accuracy_se``, ``nll_se`` when the curves have them).

    ``curves[label] = {"x": ..., "accuracy": ..., "nll": ...}`` (``"iteration"`` instead of ``"x"``
    works too; see :func:`pyro_flat.experiments.mnist79.running_bma`).
    """
    plt = _plt()
    fig, (ax_acc, ax_nll) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (label, c) in enumerate(curves.items()):
        x = c.get("x", c.get("iteration"))
        for ax, key in ((ax_acc, "accuracy"), (ax_nll, "nll")):
            ax.plot(x, c[key], label=label, color=f"C{i}", lw=1.6)
            if key + "_se" in c:
                ax.fill_between(x, c[key] - c[key + "_se"], c[key] + c[key + "_se"], color=f"C{i}", alpha=0.12)
    ax_acc.set(xlabel=xlabel, ylabel="test accuracy of the BMA",
               title="accuracy (higher is better; band: ±1 standard error)")
    ax_nll.set(xlabel=xlabel, ylabel="test NLL per point of the BMA",
               title="negative log-likelihood (lower is better; band: ±1 s.e.)")
    ax_acc.legend(fontsize=8, loc="lower right")
    for ax in (ax_acc, ax_nll):
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_reliability(curves: Mapping[str, Mapping[str, np.ndarray]], *, title: str = ""):
    """Reliability diagram: accuracy against mean confidence per bin (marker area ∝ points in the
    bin), the diagonal being perfect calibration; ``curves[label]`` from
    :func:`pyro_flat.metrics.reliability_curve`."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.6, 5))
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
    low = 1.0
    for i, (label, c) in enumerate(curves.items()):
        sizes = 300 * c["count"] / c["count"].sum()
        ax.plot(c["confidence"], c["accuracy"], "-", color=f"C{i}", lw=1.2, label=label)
        ax.scatter(c["confidence"], c["accuracy"], s=sizes, color=f"C{i}", alpha=0.6)
        low = min(low, float(np.min(c["confidence"])), float(np.min(c["accuracy"])))
    low = max(0.0, np.floor(low * 10) / 10)
    ax.set(xlim=(low, 1.0), ylim=(low, 1.0), xlabel="mean top-class confidence in the bin",
           ylabel="accuracy in the bin", title=title or "reliability diagram")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def plot_weight_comparison(theta: torch.Tensor, aux: torch.Tensor, *, image_shape=(28, 28), pixel: int = 406):
    """θ against θa for a weight vector: one weight's draws, per-weight posterior sds, mean images.

    ``theta``/``aux`` are draws of shape ``(num_draws, d)``; ``pixel`` picks the weight shown.
    """
    plt = _plt()
    theta, aux = np.asarray(theta, dtype=float), np.asarray(aux, dtype=float)
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.8), layout="constrained")
    lo, hi = np.percentile(np.concatenate([theta[:, pixel], aux[:, pixel]]), [0.5, 99.5])
    axes[0].hist(theta[:, pixel], bins=50, range=(lo, hi), alpha=0.55, density=True, label="θ")
    axes[0].hist(aux[:, pixel], bins=50, range=(lo, hi), alpha=0.55, density=True, label="θa")
    axes[0].set(xlabel=f"weight w[{pixel}]", ylabel="density", title="one weight's draws")
    sd_t, sd_a = theta.std(0), aux.std(0)
    top = max(sd_t.max(), sd_a.max())
    axes[1].hist(sd_t, bins=60, range=(0, top), alpha=0.55, label="θ")
    axes[1].hist(sd_a, bins=60, range=(0, top), alpha=0.55, label="θa")
    axes[1].set(xlabel="posterior sd of a weight", ylabel="number of weights", title="spread of all weights")
    for ax in axes[:2]:
        ax.legend(fontsize=8)
    limit = np.abs(np.concatenate([theta.mean(0), aux.mean(0)])).max()
    for ax, draws, name in ((axes[2], theta, "θ"), (axes[3], aux, "θa")):
        im = ax.imshow(draws.mean(0).reshape(image_shape), cmap="RdBu_r", vmin=-limit, vmax=limit)
        ax.set(title=f"posterior mean of {name}", xticks=[], yticks=[])
    fig.colorbar(im, ax=axes[2:], shrink=0.8, label="weight (red: votes for a nine)")
    return fig


def plot_smoothing_1d(mixture: SharpFlatMixture, etas: Sequence[float], *, grid: Optional[torch.Tensor] = None,
                      draws: Optional[Mapping[float, Dict[str, torch.Tensor]]] = None):
    """p(θ) against the flat posterior p(θa) = p * N(0, η) for several η (1-D mixtures).

    ``draws[eta] = {"theta": ..., "theta_aux": ...}`` adds sample histograms (e.g. EntropySGLD's).
    """
    plt = _plt()
    grid = torch.linspace(-5, 6, 500) if grid is None else grid
    curves = flat_density_curves(mixture, etas, grid)
    fig, axes = plt.subplots(1, len(etas), figsize=(4.2 * len(etas), 3.6), sharey=True, squeeze=False)
    for ax, eta in zip(axes[0], etas):
        if draws and eta in draws:
            rng = (float(grid[0]), float(grid[-1]))
            ax.hist(draws[eta]["theta"].reshape(-1).numpy(), bins=100, range=rng, density=True,
                    alpha=0.4, color="C0", label="θ draws")
            ax.hist(draws[eta]["theta_aux"].reshape(-1).numpy(), bins=100, range=rng, density=True,
                    alpha=0.4, color="C1", label="θa draws")
        ax.plot(grid, curves[0.0], "C0", lw=1.6, label="p(θ | D)")
        ax.plot(grid, curves[float(eta)], "C1", lw=1.6, label="flat: p(θ | D) * N(0, η)")
        ax.set(title=f"η = {eta:g}", xlabel="θ")
    axes[0, 0].set_ylabel("density")
    axes[0, -1].legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def plot_trajectories_2d(mixture: SharpFlatMixture, paths: Mapping[str, np.ndarray], *, eta: float,
                         limits=((-4.0, 4.5), (-3.0, 3.5)), title: str = ""):
    """Trajectories over log-density contours of p (solid) and of the flat posterior p * N(0, ηI) (dashed).

    ``paths[label]`` is an array ``(num_steps, 2)``; the start is marked with a black dot.
    """
    plt = _plt()
    xs, ys = torch.linspace(*limits[0], 200), torch.linspace(*limits[1], 200)
    grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), -1)
    fig, ax = plt.subplots(figsize=(6.5, 5))
    for e, style in ((0.0, dict(colors="0.55", linewidths=0.8)),
                     (eta, dict(colors="C3", linestyles="--", linewidths=0.9))):
        logp = mixture.log_prob(grid, eta=e)  # contours of log-density: both modes stay visible
        ax.contour(xs, ys, logp, levels=np.linspace(float(logp.max()) - 8, float(logp.max()), 9), **style)
    for i, (label, path) in enumerate(paths.items()):
        path = np.asarray(path)
        ax.plot(path[:, 0], path[:, 1], "-", color=f"C{i}", lw=0.7, alpha=0.8, label=label)
        ax.plot(path[-1, 0], path[-1, 1], "o", color=f"C{i}", ms=7, mec="k")
    first = np.asarray(next(iter(paths.values())))[0]
    ax.plot(first[0], first[1], "ko", ms=6, label="start")
    ax.annotate("sharp mode", mixture.sharp_loc.tolist(), xytext=(-3.8, -2.6), arrowprops=dict(arrowstyle="->"))
    ax.annotate("flat mode", mixture.flat_loc.tolist(), xytext=(2.5, 3.0), arrowprops=dict(arrowstyle="->"))
    ax.plot([], [], color="0.55", label="p(θ) contours")
    ax.plot([], [], "--", color="C3", label=f"p(θ) * N(0, {eta:g} I) contours")
    ax.set(xlabel="θ₁", ylabel="θ₂", xlim=limits[0], ylim=limits[1], title=title)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig
