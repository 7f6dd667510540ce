"""What ``pyro-flat images-eta`` reports: Entropy-MCMC's accuracy, NLL and θa's flatness against η, with SGD's
beside them (the paper tunes η on a grid; this sweep shows how much the choice matters).

:func:`sweep_table` gives, per η, the mean ± standard error over seeds of the "both" average's accuracy and NLL and
of θa's top Hessian eigenvalue and trace, and how many of its fits converged; :func:`plot_eta_sweep` draws them.

>>> rows = [{"label": "SGD", "method": "sgd", "use": "theta", "eta": 0.02, "seed": s, "accuracy": 0.9 + s / 100,
...          "nll": 0.3, "converged": True} for s in range(2)]
>>> rows += [{"label": "Entropy-MCMC η x 1 (both)", "method": "emcmc", "use": "both", "eta": 0.02, "seed": s,
...           "accuracy": 0.95, "nll": 0.2} for s in range(2)]
>>> table = sweep_table(rows)
>>> table["sgd"]["accuracy"]["mean"], table["emcmc"][0]["eta"], table["emcmc"][0]["nll"]["mean"]
(0.905, 0.02, 0.2)
"""

from __future__ import annotations

from typing import Sequence

from ..compare import seed_summary, t_critical

#: the sweep's measures: (row key, the use whose rows carry it, its axis label)
MEASURES = (("accuracy", "both", "test accuracy"), ("nll", "both", "test NLL"),
            ("top_eigenvalue", "aux", "θa's top Hessian eigenvalue"))




def sweep_table(rows: Sequence[dict]) -> dict:
    """``{"sgd": {measure: stats}, "emcmc": [{"eta", measure: stats, "converged", "fits"}, ...]}`` by η."""
    sgd = [r for r in rows if r["method"] == "sgd"]
    out = {"sgd": {key: seed_summary(sgd, key) for key in ("accuracy", "nll", "top_eigenvalue", "trace")},
           "emcmc": []}
    out["sgd"]["converged"] = sum(bool(r.get("converged")) for r in sgd)
    out["sgd"]["fits"] = len(sgd)
    for eta in sorted({r["eta"] for r in rows if r["method"] == "emcmc"}):
        mine = [r for r in rows if r["method"] == "emcmc" and r["eta"] == eta]
        by_use = {use: [r for r in mine if r["use"] == use] for use in ("theta", "aux", "both")}
        entry = {"eta": eta, **{key: seed_summary(by_use[use], key) for key, use, _ in MEASURES},
                 "trace": seed_summary(by_use["aux"], "trace")}
        fits = by_use["theta"] + by_use["aux"]
        entry["converged"], entry["fits"] = sum(bool(r.get("converged")) for r in fits), len(fits)
        out["emcmc"].append(entry)
    return out


def _cell(stats: dict, digits: int = 4) -> str:
    return "—" if not stats else f"{stats['mean']:.{digits}f} ± {stats['se']:.{digits}f}"


def sweep_markdown(report: dict) -> str:
    """``report.md`` of a sweep: the regime, one row per η and SGD's, and the wall time."""
    table, scaled, n = report["sweep"], report["scaled"], report["data"]["n_train"]
    lines = [f"# pyro-flat images-eta: {report['data']['source']}", "",
             f"Entropy-MCMC at {len(table['emcmc'])} values of η around the regime's η = {scaled['eta']:.3g} (per-step "
             f"coupling lr / (N η) = {scaled['coupling']:.3g}; the paper's 0.025), with SGD as the reference; "
             f"{n:,} training images, {report['protocol']['network']}, {report['protocol']['epochs']} epochs in "
             f"{report['protocol']['cycles']} cycles, temperature {scaled['temperature']:g}; {report['seeds']} seeds, "
             f"mean ± standard error (a difference is one beyond t = {t_critical(report['seeds']):.2f} standard "
             "errors). Accuracy and NLL of the average over θ's and θa's draws; the Hessian measures at θa's last draw; "
             "*converged*: fits (θ and θa each) whose training NLL at the end of the last cycle is within "
             f"{report['config']['converged_within']:g} of the cycle before's.", "",
             "| η | coupling per step | accuracy | NLL | θa's top eigenvalue | θa's trace | converged |",
             "|---|---|---|---|---|---|---|"]
    for entry in table["emcmc"]:
        lines.append(f"| {entry['eta']:.3g} | {scaled['step_size'] / entry['eta']:.3g} | {_cell(entry['accuracy'])} | "
                     f"{_cell(entry['nll'])} | {_cell(entry['top_eigenvalue'], 2)} | {_cell(entry['trace'], 1)} | "
                     f"{entry['converged']} of {entry['fits']} |")
    sgd = table["sgd"]
    lines.append(f"| SGD | — | {_cell(sgd['accuracy'])} | {_cell(sgd['nll'])} | {_cell(sgd['top_eigenvalue'], 2)} | "
                 f"{_cell(sgd['trace'], 1)} | {sgd['converged']} of {sgd['fits']} |")
    lines += ["", f"Figure: `eta_sweep.png`. Wall time {report['seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def plot_eta_sweep(report: dict):
    """Accuracy, NLL and θa's top eigenvalue against η (log scale), ± 1 standard error, SGD's as a band."""
    import matplotlib.pyplot as plt

    table = report["sweep"]
    fig, axes = plt.subplots(1, len(MEASURES), figsize=(12, 3.8))
    etas = [e["eta"] for e in table["emcmc"]]
    for ax, (key, _, label) in zip(axes, MEASURES):
        points = [(e["eta"], e[key]) for e in table["emcmc"] if e[key]]
        ax.errorbar([p[0] for p in points], [p[1]["mean"] for p in points], yerr=[p[1]["se"] for p in points],
                    marker="o", capsize=3, label="Entropy-MCMC" + (" (θa)" if key == "top_eigenvalue" else " (θ and θa)"))
        sgd = table["sgd"].get(key)
        if sgd:
            ax.axhspan(sgd["mean"] - sgd["se"], sgd["mean"] + sgd["se"], color="0.8", label="SGD (± 1 s.e.)")
            ax.axhline(sgd["mean"], color="0.4", lw=1)
        ax.axvline(report["scaled"]["eta"], color="C3", ls=":", lw=1, label="the regime's η")
        ax.set_xscale("log")
        ax.set_xlabel("η")
        ax.set_ylabel(label)
        ax.set_xticks(etas)
        ax.set_xticklabels([f"{e:.2g}" for e in etas], fontsize=7)
        ax.minorticks_off()
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Entropy-MCMC against η ({report['seeds']} seeds, ± 1 s.e.)")
    fig.tight_layout()
    return fig


__all__ = ["MEASURES", "sweep_table", "sweep_markdown", "plot_eta_sweep"]
