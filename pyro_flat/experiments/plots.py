"""Matplotlib figures of the studies. Each function draws one figure and returns it.

They take plain tensors/arrays and dicts, so notebooks, the CLI and users' own runs share them.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

import numpy as np
import torch

from ..models.mixtures import SharpFlatMixture, basin_boundary, flat_density_curves


def pyplot():
    """matplotlib.pyplot, imported when a figure is first drawn (the studies import without it)."""
    import matplotlib.pyplot as plt

    return plt


def plot_bma_curves(curves: Mapping[str, Mapping[str, np.ndarray]], *, title: str = "",
                    xlabel: str = "iteration (warm-up included)"):
    """Test accuracy and NLL of the running Bayesian model average, ``curves[label] = {"x" (or "iteration"),
    "accuracy", "nll"}`` (:func:`pyro_flat.metrics.running_bma`). Each title gives the last average's standard error
    over the test points (``accuracy_se``, ``nll_se``: the same for every curve, so no band per curve); the y axes
    span the curves from their second tenth on (the first draws' averages are noisy)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 4))
    for i, (label, c) in enumerate(curves.items()):
        for ax, key in zip(axes, ("accuracy", "nll")):
            ax.plot(c.get("x", c.get("iteration")), c[key], label=label, color=f"C{i}", lw=1.5, ls=("-", "--", ":")[i % 3])
    for ax, key, what in zip(axes, ("accuracy", "nll"), ("test accuracy of the BMA (higher is better)",
                                                         "test NLL per point of the BMA (lower is better)")):
        late = np.concatenate([np.asarray(c[key], dtype=float)[len(c[key]) // 10:] for c in curves.values()])
        pad = 0.1 * (late.max() - late.min()) + 1e-3
        ses = [float(np.asarray(c[key + "_se"])[-1]) for c in curves.values() if key + "_se" in c]
        ax.set(xlabel=xlabel, ylabel=what, ylim=(late.min() - pad, late.max() + pad),
               title=what.split(" (")[0].replace("test ", "") + (f" (±1 s.e. {np.median(ses):.3f})" if ses else ""))
        ax.grid(alpha=0.3)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="center right", fontsize=8)  # beside: it hides no curve
    if title:
        fig.suptitle(title)
    fig.text(0.01, 0.01, "y axes: the curves after their first tenth. The s.e. is over the test points, shared by "
                         "every curve: differences well below it are noise.", fontsize=8, color="grey")
    fig.tight_layout(rect=(0, 0.04, 0.85, 1), w_pad=2)
    return fig


def plot_bma_by_ensemble_size(ensembles: Mapping[str, Mapping[str, Sequence[float]]], num_test: int):
    """Test NLL and accuracy of the average of the first m draws against m, one line per method
    (``ensembles[label] = {"models", "accuracy", "nll"}``)."""
    plt = pyplot()
    fig, (ax_nll, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (label, e) in enumerate(ensembles.items()):  # ten colours, then the next line style
        style = dict(color=f"C{i % 10}", ls=("-", "--", ":", "-.")[i // 10 % 4], lw=1.5, label=label)
        ax_nll.plot(e["models"], e["nll"], **style)
        ax_acc.plot(e["models"], e["accuracy"], **style)
    ax_nll.set(xscale="log", xlabel="number of averaged draws (log scale)", ylabel="test NLL per image",
               title="BMA negative log-likelihood (lower is better)")
    ax_acc.set(xscale="log", xlabel="number of averaged draws (log scale)", ylabel="test accuracy",
               title=f"BMA accuracy ({num_test} test images: one image = {1 / num_test:.4f})")
    for ax in (ax_nll, ax_acc):
        ax.grid(alpha=0.3)
    if len(ensembles) <= 6:
        ax_nll.legend(fontsize=8)
        fig.tight_layout()
    else:  # many methods: the legend beside the panels, where it hides no line
        handles, labels = ax_nll.get_legend_handles_labels()
        fig.legend(handles, labels, loc="center right", fontsize=8)
        fig.tight_layout(rect=(0, 0, 0.86, 1))
    return fig


def plot_reliability(curves: Mapping[str, Mapping[str, np.ndarray]], *, title: str = ""):
    """Reliability diagram: accuracy against mean confidence per bin (marker area ∝ points in the
    bin), the diagonal being perfect calibration; ``curves[label]`` from
    :func:`pyro_flat.metrics.reliability_curve`."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 5))
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
    low = 1.0
    styles = ("-", "--", ":", "-.")
    for i, (label, c) in enumerate(curves.items()):
        # curves that coincide stay visible: earlier ones wider and underneath, each its own dash
        sizes = 300 * c["count"] / c["count"].sum()
        ax.plot(c["confidence"], c["accuracy"], styles[i % len(styles)], color=f"C{i}", lw=max(1.0, 3.4 - 0.6 * i),
                zorder=2 + i, label=label)
        ax.scatter(c["confidence"], c["accuracy"], s=sizes, color=f"C{i}", alpha=0.45, zorder=2 + i)
        low = min(low, float(np.min(c["confidence"])), float(np.min(c["accuracy"])))
    low = max(0.0, np.floor(low * 10) / 10)
    ax.set(xlim=(low, 1.0), ylim=(low, 1.0), xlabel="mean top-class confidence in the bin",
           ylabel="accuracy in the bin", title=title or "reliability diagram")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def plot_weight_comparison(theta: torch.Tensor, aux: torch.Tensor, *, image_shape=(28, 28), pixel: int = 406,
                           sampler: Optional[str] = None):
    """θ against θa for a weight vector: one weight's draws, per-weight posterior sds, mean images.

    ``theta``/``aux`` are draws of shape ``(num_draws, d)``; ``pixel`` picks the weight shown; ``sampler`` names
    the sampler that drew them in the figure's title.
    """
    plt = pyplot()
    theta, aux = np.asarray(theta, dtype=float), np.asarray(aux, dtype=float)
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.8), layout="constrained")
    lo, hi = np.percentile(np.concatenate([theta[:, pixel], aux[:, pixel]]), [0.5, 99.5])
    axes[0].hist(theta[:, pixel], bins=50, range=(lo, hi), alpha=0.55, density=True, label="θ")
    axes[0].hist(aux[:, pixel], bins=50, range=(lo, hi), alpha=0.55, density=True, label="θa")
    axes[0].set(xlabel=f"weight w[{pixel}]", ylabel="density", title="one weight's draws")
    sd_t, sd_a = theta.std(0), aux.std(0)
    span = (min(sd_t.min(), sd_a.min()), max(sd_t.max(), sd_a.max()))  # the sds' own range, not from 0
    axes[1].hist(sd_t, bins=60, range=span, alpha=0.55, label="θ")
    axes[1].hist(sd_a, bins=60, range=span, alpha=0.55, label="θa")
    axes[1].set(xlabel="posterior sd of a weight", ylabel="number of weights", title="spread of all weights")
    for ax in axes[:2]:
        ax.legend(fontsize=8)
    limit = np.abs(np.concatenate([theta.mean(0), aux.mean(0)])).max()
    for ax, draws, name in ((axes[2], theta, "θ"), (axes[3], aux, "θa")):
        im = ax.imshow(draws.mean(0).reshape(image_shape), cmap="RdBu_r", vmin=-limit, vmax=limit)
        ax.set(title=f"posterior mean of {name}", xticks=[], yticks=[])
    fig.colorbar(im, ax=axes[2:], shrink=0.8, label="weight (red: votes for a nine)")
    if sampler is not None:
        fig.suptitle(f"{sampler}: θ and its guiding twin θa")
    return fig


def plot_smoothing_1d(mixture: SharpFlatMixture, etas: Sequence[float], *, grid: Optional[torch.Tensor] = None,
                      draws: Optional[Mapping[float, Dict[str, torch.Tensor]]] = None):
    """p(θ) against the flat posterior p(θa) = p * N(0, η) for several η (1-D mixtures).

    ``draws[eta] = {"theta": ..., "theta_aux": ...}`` adds sample histograms (e.g. EntropySGLD's).
    """
    plt = pyplot()
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


_LIMITS_2D = ((-5.0, 6.0), (-4.0, 5.0))
#: A chain nearer the saddle than this has not left the ridge (SGD: the gradient vanishes there).
AT_SADDLE = 1e-3


def at_saddle(mixture: SharpFlatMixture, points) -> torch.Tensor:
    """Which ``(..., 2)`` points sit at the saddle (within :data:`AT_SADDLE`): in neither basin."""
    return (torch.as_tensor(points) - mixture.saddle().float()).norm(dim=-1) < AT_SADDLE


def _contours_2d(ax, mixture: SharpFlatMixture, limits=_LIMITS_2D) -> None:
    """Grey contours of log p (8 levels down from the peak), the basin boundary of U = −log p
    (dashed) and the saddle (x)."""
    xs, ys = torch.linspace(*limits[0], 200), torch.linspace(*limits[1], 200)
    logp = mixture.log_prob(torch.stack(torch.meshgrid(xs, ys, indexing="xy"), -1))
    top = float(logp.max())
    ax.contour(xs, ys, logp, levels=np.linspace(top - 16, top, 9), colors="0.7", linewidths=0.6)
    edge = basin_boundary(mixture)
    ax.plot(edge[:, 0], edge[:, 1], "k--", lw=0.9)
    saddle = mixture.saddle()
    ax.plot(float(saddle[0]), float(saddle[1]), "kx", ms=7, mew=1.5)
    ax.set(xlim=limits[0], ylim=limits[1], aspect="equal")


def plot_basin_endpoints(mixture: SharpFlatMixture, states: Mapping[str, np.ndarray], rows: Sequence[dict], *,
                         paths_shown: int = 3, start: str = "the saddle"):
    """One panel per sampler and variable: where its chains are at the last step (coloured by the
    basin of U = −log p they are in) and the first ``paths_shown`` chains' paths.

    ``states[label]`` is ``(steps, chains, 2)``; ``rows`` are the study's rows (label, share, se,
    exact, at_saddle) for the panel titles; ``start`` says where the chains started (legend).
    """
    plt = pyplot()
    by_label = {r["label"]: r for r in rows}
    n = len(states)
    cols = 2 if n == 4 else min(n, 5)
    nrows = -(-n // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.3 * cols, 3.4 * nrows + 0.8), squeeze=False)
    for ax, (label, path) in zip(axes.flat, states.items()):
        _contours_2d(ax, mixture)
        end = path[-1]
        stuck = at_saddle(mixture, end).numpy()  # in neither basin
        flat = mixture.in_flat_basin(torch.as_tensor(end)).numpy() & ~stuck
        sharp = ~flat & ~stuck
        ax.scatter(end[flat, 0], end[flat, 1], s=3, color="C0", alpha=0.5, lw=0)
        ax.scatter(end[sharp, 0], end[sharp, 1], s=3, color="C3", alpha=0.5, lw=0)
        ax.scatter(end[stuck, 0], end[stuck, 1], s=30, facecolor="none", edgecolor="C2", lw=1)
        for c in range(min(paths_shown, path.shape[1])):
            ax.plot(path[:, c, 0], path[:, c, 1], "-", color="k", lw=0.5, alpha=0.7)
        r = by_label[label]
        exact = "" if r["exact"] is None else f", exact {r['exact']:.2f}"
        where = f"flat basin: {r['share']:.2f} ± {r['se']:.2f}{exact}"
        if r.get("at_saddle", 0) > 0:
            where += f"; at the saddle: {r['at_saddle']:.2f}"
        ax.set_title(f"{label}\n{where}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("θ₁ (or θa₁)", fontsize=7)
        ax.set_ylabel("θ₂ (or θa₂)", fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    handles = [plt.Line2D([], [], color="0.7", lw=0.8, label="contours of log p (posterior)"),
               plt.Line2D([], [], color="k", ls="--", lw=0.9, label="basin boundary of U = −log p"),
               plt.Line2D([], [], color="k", marker="x", ls="",
                          label="saddle = every chain's start" if start == "the saddle" else "saddle"),
               plt.Line2D([], [], color="C0", marker="o", ls="", ms=4, label="last state, flat basin"),
               plt.Line2D([], [], color="C3", marker="o", ls="", ms=4, label="last state, sharp basin"),
               plt.Line2D([], [], color="C2", marker="o", mfc="none", ls="", ms=6,
                          label="last state at the saddle (neither basin)")]
    if paths_shown:
        handles.append(plt.Line2D([], [], color="k", lw=0.6, label=f"paths of {paths_shown} chains"))
    if start != "the saddle":
        fig.suptitle(f"every chain starts at {start}", fontsize=10)
    fig.legend(handles=handles, loc="lower center", ncol=len(handles) if cols >= 4 else 2, fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.05 if cols >= 4 else 0.12, 1, 1))
    return fig


def _share_band(ax, steps: np.ndarray, keep: np.ndarray, row: dict, color: str, style: str = "-") -> None:
    """A row's share of chains in the flat basin against the step, with its ±2 binomial standard errors."""
    share = np.asarray(row["share_by_step"])[keep]
    se = np.sqrt(share * (1 - share) / row["chains"])
    ax.plot(steps[keep], share, style, color=color, lw=1.4, label=row["label"])
    ax.fill_between(steps[keep], share - 2 * se, share + 2 * se, color=color, alpha=0.15, lw=0)


def plot_basin_shares(steps: Sequence[int], rows: Sequence[dict]):
    """Share of chains in the flat basin of U against the step, θ (left) and θa (right), with
    ±2 standard-error bands and the exact stationary share of each as a dashed line; chains still
    at the saddle (in neither basin) are not in the share, and their own share is dotted."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4), sharey=True)
    steps = np.asarray(steps)
    keep = steps > 0
    for panel, (ax, variable) in enumerate(zip(axes, ("theta", "theta_aux"))):
        chosen = [r for r in rows if r["variable"] == variable]
        for i, r in enumerate(chosen):
            color = f"C{i}"
            _share_band(ax, steps, keep, r, color)
            if r["exact"] is not None:
                ax.axhline(r["exact"], color=color, ls="--", lw=1)
            stuck = np.asarray(r.get("at_saddle_by_step", np.zeros(len(steps))))[keep]
            if stuck[-1] > 0:  # chains still at the saddle at the end (one passing by is not drawn)
                ax.plot(steps[keep], stuck, color=color, ls=":", lw=1.4, label=f"{r['label']}: at the saddle")
        ax.plot([], [], "k--", lw=1, label="exact stationary share (same colour)")
        ax.set(xscale="log", xlabel="step (log scale)", ylim=(-0.02, 1.02),
               title="θ of each sampler" if panel == 0 else "θa of EntropySGLD (law p * N(0, ηI))")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("share of chains in the flat basin of U = −log p\n(dotted: share still at the saddle)")
    fig.suptitle("All chains start at the saddle (bands: ±2 standard errors)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_metric_shares(steps: Sequence[int], rows: Sequence[dict]):
    """One panel per η: the share of θ's chains in the flat basin of U against the step for SGLD, the
    plain EntropySGLD and EntropySGLD under each coupling metric (±2 standard-error bands)."""
    plt = pyplot()
    etas = sorted({r["settings"]["eta"] for r in rows if "coupling_metric" in r["settings"]})
    fig, axes = plt.subplots(1, len(etas), figsize=(5.2 * len(etas), 4.2), sharey=True, squeeze=False)
    steps = np.asarray(steps)
    keep = steps > 0
    for ax, eta in zip(axes[0], etas):
        chosen = [r for r in rows if r["variable"] == "theta" and (r["sampler"] == "sgld" or (
            r["sampler"] == "entropy-sgld" and r["settings"]["eta"] == eta))]
        for i, r in enumerate(chosen):
            _share_band(ax, steps, keep, r, f"C{i}", "--" if r["sampler"] == "sgld" else "-")
        ax.set(xscale="log", xlabel="step (log scale)", title=f"θ from the saddle, η = {eta:g}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    axes[0, 0].set_ylabel("share of θ's chains in the flat basin of U")
    fig.suptitle("EntropySGLD under each coupling metric (a fixed identity metric for θ), against the plain kernel "
                 "and SGLD (bands: ±2 standard errors)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_line_shares(line: Mapping, steps: int):
    """Share of chains that end in the flat basin of U against their start on the segment from
    the sharp mode (0) to the flat mode (1); solid θ, dashed θa."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    x = np.asarray(line["position"])
    for i, (label, share) in enumerate(line["share"].items()):
        ax.plot(x, share, "--" if "θa" in label else "-", color=f"C{i % 10}", marker=".", lw=1.2, label=label)
    ax.axvline(line["saddle_position"], color="k", lw=0.8, ls=":", label="saddle")
    ax.set(xlabel="start: position on the segment from the sharp mode (0) to the flat mode (1)",
           ylabel=f"share in the flat basin of U after {steps} steps", ylim=(-0.02, 1.02))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    fig.tight_layout()
    return fig


def plot_smoothed_landscape(mixture: SharpFlatMixture, etas: Sequence[float], eta_grid: Sequence[float],
                            exact: Optional[dict] = None):
    """Exact facts of Gaussian smoothing: log p_η along the axis between the modes for each η
    (left), and against η the mass of p_η in the flat basin of U, in its own flat basin, and the
    flat component's mass (right). ``exact`` (from
    :func:`~pyro_flat.experiments.synthetic2d.study.exact_landscape` over ``eta_grid``) saves computing
    the masses again."""
    plt = pyplot()
    fig, (ax, ax_mass) = plt.subplots(1, 2, figsize=(12, 4.4))
    sharp, flat = mixture.sharp_loc, mixture.flat_loc
    t = torch.linspace(-0.5, 1.5, 600)
    along = sharp + t[:, None] * (flat - sharp)
    for i, eta in enumerate((0.0, *etas)):
        ax.plot(t, mixture.log_prob(along, eta=eta), color=f"C{i}", lw=1.4,
                label="p (posterior)" if eta == 0 else f"p * N(0, {eta:g} I)")
    ax.set(xlabel="position on the axis from the sharp mode (0) to the flat mode (1)", ylabel="log density",
           title="smoothing lowers the sharp peak", ylim=(-8, None))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    grid = np.asarray(eta_grid, dtype=float)
    merge = mixture.unimodal_beyond()
    bimodal = grid[grid < merge]
    rows = {} if exact is None else {float(r["eta"]): r for r in exact["smoothed"].values()}
    in_u = [rows[e]["flat_basin_of_U"] if e in rows else mixture.flat_basin_mass(eta=e) for e in grid]
    own = [rows[e]["own_flat_basin"] if e in rows else mixture.flat_basin_mass(eta=e, basin_eta=e) for e in bimodal]
    ax_mass.plot(grid, in_u, "o-", ms=3, label="mass of p_η in the flat basin of U = −log p")
    ax_mass.plot(bimodal, own, "s-", ms=3, label="mass of p_η in the flat basin of its own energy")
    ax_mass.axvspan(merge, grid.max(), color="0.9", label=f"p_η unimodal (η > {merge:.2f})")
    ax_mass.axhline(mixture.weights[int(np.argmax(mixture.scales))], color="k", lw=0.8,
                    label="mass of the flat component (every η)")
    ax_mass.axvline(mixture.peak_crossover(), color="k", ls=":", lw=0.8, label="flat peak highest beyond this η")
    ax_mass.set(xlabel="η", ylabel="mass", title="smoothing keeps each component's mass", ylim=(0.5, 1.02))
    ax_mass.grid(alpha=0.3)
    ax_mass.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def _at_pixel(var_names: Sequence[str], pixel: int) -> Dict[str, list]:
    """ArviZ ``coords`` that show every weight vector among ``var_names`` at coordinate ``pixel``."""
    return {f"{n}_dim_0": [pixel] for n in var_names if n.startswith("w")}


def plot_trace_panels(idata, var_names: Sequence[str], *, sampler: str, thin: int, pixel: int):
    """ArviZ trace plots of ``var_names`` (a weight vector shown at coordinate ``pixel``), one colour
    per chain, with the axes labelled."""
    import arviz as az
    import matplotlib.pyplot as plt

    chains = int(idata.posterior.sizes["chain"])
    colours = [f"C{c}" for c in range(chains)]
    axes = np.atleast_2d(az.plot_trace(idata, var_names=var_names, coords=_at_pixel(var_names, pixel), compact=False,
                                       chain_prop={"color": colours, "linestyle": ["-"] * chains},
                                       figsize=(12, 2.2 * len(var_names))))
    for row, name in zip(axes, var_names):
        label = f"{name}[{pixel}]" if name.startswith("w") else name
        row[0].set(xlabel=f"value of {label}", ylabel="density", title=label)
        row[1].set(xlabel=f"kept draw (every {thin}th iteration after warm-up)", ylabel=label, title=label)
        for ax in row:
            if ax.get_legend() is not None:
                ax.get_legend().remove()
    fig = axes.flat[0].figure
    handles = [plt.Line2D([], [], color=colour, lw=1.5, label=f"chain {c}") for c, colour in enumerate(colours)]
    fig.legend(handles=handles, loc="upper right", ncol=chains, fontsize=8, frameon=False)
    fig.suptitle(f"{sampler}: bias b and the centre pixel's weight w[{pixel}], θ and θa; "
                 "one colour per chain", x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig


def plot_rank_panels(idata, var_names: Sequence[str], *, sampler: str, pixel: int):
    """ArviZ rank plots of ``var_names`` (a weight vector shown at coordinate ``pixel``)."""
    import arviz as az
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, (len(var_names) + 1) // 2, figsize=(10, 7), squeeze=False)
    az.plot_rank(idata, var_names=var_names, coords=_at_pixel(var_names, pixel), ax=axes.flat[: len(var_names)])
    for ax, name in zip(axes.flat, var_names):
        label = f"{name}[{pixel}]" if name.startswith("w") else name
        ax.set(title=label, xlabel="rank of the draw among all chains", ylabel="chain")
    for ax in list(axes.flat)[len(var_names):]:
        ax.remove()
    fig.suptitle(f"{sampler}: rank plots (uniform bars in every chain: the chains agree)")
    fig.tight_layout()
    return fig


def save_figures(figures: Mapping[str, object], folder, *, dpi: int = 110) -> Dict[str, str]:
    """Write each ``{file name: figure}`` into ``folder`` and close it; returns ``{name: name}``."""
    from pathlib import Path

    plt = pyplot()
    for name, fig in figures.items():
        fig.savefig(Path(folder) / name, dpi=dpi)
        plt.close(fig)
    return {name: name for name in figures}
