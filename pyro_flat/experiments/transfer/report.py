r"""What ``pyro-flat transfer`` reports: each method's numbers over seeds at each number of shots, SA-BMA's claims
counted, and ``transfer.png``.

:func:`claims` tests each claim pair by pair over the seeds (:func:`~.compare.paired_verdict`: the paired difference
against :math:`t_{0.975,\,n-1}` standard errors) at each number of shots and on each metric. A claim is
**reproduced** when its flat method wins every pair, **contradicted** when it loses any, **tied** otherwise, and
**not tested** when a fit of its pairs did not converge or there is one seed.

>>> rows = [{"method": m, "shots": 10, "seed": s, "nll": v + 0.01 * s, "converged": True}
...         for s in range(3) for m, v in (("sabma-block", 0.3), ("vi-block", 0.5))]
>>> claim = claims(rows, metrics=(("nll", "NLL", True),))[0]
>>> claim["verdict"], claim["pairs"][0]["verdict"]
('reproduced', 'for')
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from ..compare import claim_verdict, paired_verdict, seed_summary, t_critical
from .fits import LABELS

#: the methods without flatness that have a model average (SGD keeps one network)
NON_FLAT_BMA = ("swag-block", "laplace-head", "vi-block", "sgld-block", "sgld-adapters")
#: each claim: its text and its (flat method, other method) pairs
CLAIMS: Tuple[Tuple[str, Tuple[Tuple[str, str], ...]], ...] = (
    ("flat Bayesian transfer beats its non-flat counterpart",
     (("sabma-block", "vi-block"), ("emcmc-block", "sgld-block"), ("emcmc-adapters", "sgld-adapters"))),
    ("BMA with flatness (SA-BMA) beats every BMA without", tuple(("sabma-block", m) for m in NON_FLAT_BMA)),
    ("BMA with flatness (Entropy-MCMC, last block) beats every BMA without",
     tuple(("emcmc-block", m) for m in NON_FLAT_BMA)),
)
#: (metric, its name in the report, lower is better)
METRICS: Tuple[Tuple[str, str, bool], ...] = (
    ("nll", "NLL", True), ("accuracy", "accuracy", False), ("ece", "ECE", True),
    ("corrupted_accuracy_mean", "corrupted accuracy", False), ("ood_auroc", "OOD AUROC", False))
SUMMARISED = ("accuracy", "nll", "ece", "brier", "corrupted_accuracy_mean", "ood_auroc", "ood_aupr", "train_nll",
              "train_nll_change", "grad_evals", "seconds", "parameters")


def summarize(rows: Sequence[dict]) -> Dict[str, Dict[str, Dict[str, dict]]]:
    """``{shots: {method: {metric: {"mean", "se", "n"}, "converged": {"count", "n"}}}}`` over the seeds."""
    out: Dict[str, Dict[str, Dict[str, dict]]] = {}
    for k in dict.fromkeys(r["shots"] for r in rows):
        for method in dict.fromkeys(r["method"] for r in rows):
            mine = [r for r in rows if r["shots"] == k and r["method"] == method]
            if not mine:
                continue
            entry = {name: summary for name in SUMMARISED if (summary := seed_summary(mine, name))}
            entry["converged"] = {"count": sum(bool(r.get("converged")) for r in mine), "n": len(mine)}
            out.setdefault(str(k), {})[method] = entry
    return out


def claims(rows: Sequence[dict], which=CLAIMS, metrics=METRICS) -> List[dict]:
    """Each claim of ``which`` at each number of shots and metric (see the module): ``{"claim", "shots", "metric",
    "verdict", "pairs": [{"ours", "other", "mean", "se", "n", "verdict", ...}]}``."""
    out = []
    for k in dict.fromkeys(r["shots"] for r in rows):
        mine = [r for r in rows if r["shots"] == k]
        methods = {r["method"] for r in mine}
        unconverged = {r["method"] for r in mine if r.get("converged") is False}
        for text, pairs in which:
            present = [(a, b) for a, b in pairs if a in methods and b in methods]
            for name, metric_text, lower in metrics:
                values = {m: {r["seed"]: float(r[name]) for r in mine if r["method"] == m and r.get(name) is not None}
                          for m in methods}
                tested = [{"ours": a, "other": b, **paired_verdict(values[a], values[b], lower)} for a, b in present]
                late = sorted({m for a, b in present for m in (a, b)} & unconverged)
                out.append({"claim": text, "shots": k, "metric": metric_text, "pairs": tested, "not_converged": late,
                            "verdict": claim_verdict((p["verdict"] for p in tested), late)})
    return out


def _cell(entry: dict, name: str, digits: int = 4) -> str:
    if name not in entry:
        return "–"
    return f"{entry[name]['mean']:.{digits}f} ± {entry[name]['se']:.{digits}f}"


def _batch_text(report: dict) -> str:
    used = report.get("batch_size_used") or {"all": report["protocol"]["batch_size"]}
    sizes = sorted(set(used.values()))
    if len(sizes) == 1:
        return f"minibatch {sizes[0]}"
    return "minibatch " + ", ".join(f"{v} at {k} shots" for k, v in used.items())


def report_markdown(report: dict) -> str:
    """``report.md``: the protocol, each method's numbers and cost, and the claims."""
    p, pre, data = report["protocol"], report["pretrained"], report["data"]
    seeds = report["config"]["seeds"]
    lines = [
        "# Few-shot Bayesian transfer from a pre-trained ResNet", "",
        f"A {p['network']} pre-trained on classes {data['pretrain_classes'][0]}-{data['pretrain_classes'][-1]} "
        f"({pre['images']:,} images, {pre['epochs']} epochs; {'read from the cache' if pre.get('cached') else 'trained in this run'}; "
        f"held-out accuracy {pre['accuracy']:.4f}) is transferred to classes {data['new_classes'][0]}-"
        f"{data['new_classes'][-1]} with {', '.join(map(str, report['config']['shots']))} shots per class, at "
        f"{seeds} seeds (each its own shots). Data: {data['source']}. Test: {data['test']:,} images of the new classes; "
        f"corrupted: {data['corruptions']}; out-of-distribution: {data['ood']:,} held-out images of the pre-training "
        f"classes. Every method: {p['iterations']} steps in "
        f"{report['config']['cycles']} cosine cycles ({_batch_text(report)}), learning rate {p['lr']} (step size lr / N), the prior centred on the "
        f"pre-trained weights with precision N x {report['config']['weight_decay']:g}, temperature "
        f"{report['config']['temperature']:g} (Laplace: 1, as laplace-torch), Entropy-MCMC's per-step coupling "
        f"{report['config']['coupling']:g}. Run on {report['device']} in {report['seconds']:.0f} s.", ""]
    for k, methods in report["summary"].items():
        lines += [f"## {k} shots per class", "",
                  "| method | parameters | accuracy | NLL | ECE | corrupted accuracy | OOD AUROC | converged | gradients "
                  "| seconds |", "|---|---|---|---|---|---|---|---|---|---|"]
        for method, e in methods.items():
            lines.append(f"| {LABELS[method]} | {int(e['parameters']['mean']):,} | {_cell(e, 'accuracy')} | "
                         f"{_cell(e, 'nll')} | {_cell(e, 'ece')} | {_cell(e, 'corrupted_accuracy_mean')} | "
                         f"{_cell(e, 'ood_auroc', 3)} | {e['converged']['count']}/{e['converged']['n']} | "
                         f"{int(e['grad_evals']['mean']):,} | {e['seconds']['mean']:.1f} |")
        lines.append("")
    rule = (f"Each pair is the paired difference over {seeds} seeds, declared when it exceeds t = "
            f"{t_critical(seeds):.2f} standard errors (the 95 % t critical value for {seeds} seeds)." if seeds > 1 else
            "With one seed no claim is tested: pass --seeds 2 or more.")
    lines += ["## SA-BMA's claims, counted", "",
              rule + " A claim is reproduced when its flat method wins every pair, contradicted when it loses any, "
              "tied otherwise; a claim with a fit that did not converge is not tested.", "",
              "| claim | shots | metric | verdict | pairs (for / tie / against) |", "|---|---|---|---|---|"]
    for c in report["claims"]:
        counts = [sum(p["verdict"] == v for p in c["pairs"]) for v in ("for", "tie", "against")]
        lines.append(f"| {c['claim']} | {c['shots']} | {c['metric']} | {c['verdict']} | "
                     f"{counts[0]} / {counts[1]} / {counts[2]} |")
    lines += ["", "Cost: gradient evaluations of each fit (SA-BMA's step costs two; Laplace adds one pass over the "
                  "shots to SGD's fit). `transfer.png` shows the numbers with 95 % t intervals over the seeds.", ""]
    return "\n".join(lines)


def plot_transfer(report: dict):
    """NLL, ECE, corrupted accuracy and OOD AUROC of each method (rows) at each number of shots (colours): the mean
    over seeds with its own 95 % t interval (clipped to the metric's range; the claims use paired differences, in
    report.md). NLL and ECE on log axes; a hollow marker: a fit of that row did not converge."""
    from matplotlib import ticker

    from ..plots import pyplot

    plt = pyplot()
    panels = (("nll", "test NLL (lower is better)", True), ("ece", "ECE (lower is better)", True),
              ("corrupted_accuracy_mean", "accuracy on corrupted images (higher is better)", False),
              ("ood_auroc", "OOD AUROC (higher is better)", False))
    summary = report["summary"]
    methods = list(dict.fromkeys(m for shots in summary.values() for m in shots))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 0.45 * len(methods) + 1.8), sharey=True)
    for ax, (name, title, log_scale) in zip(axes, panels):
        for j, (k, by_method) in enumerate(summary.items()):
            ys = np.arange(len(methods)) + (j - (len(summary) - 1) / 2) * 0.25
            for y, method in zip(ys, methods):
                entry = by_method.get(method, {})
                e = entry.get(name)
                if e is None:
                    continue
                half = t_critical(e["n"]) * e["se"] if e["n"] > 1 else 0.0
                low = max(e["mean"] - half, e["mean"] / 3 if log_scale else 0.0)
                high = e["mean"] + half if log_scale else min(e["mean"] + half, 1.0)
                converged = entry["converged"]["count"] == entry["converged"]["n"]
                ax.errorbar(e["mean"], y, xerr=[[e["mean"] - low], [high - e["mean"]]], fmt="o", color=f"C{j}", ms=5,
                            capsize=2, mfc=f"C{j}" if converged else "white",
                            label=f"{k} shots" if method == methods[0] else None)
        if log_scale:  # plain numbers on a few ticks, none on the minor ones
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        if name == "ood_auroc":
            ax.axvline(0.5, color="grey", lw=0.8, ls="--")
            ax.text(0.5, -0.7, " chance", color="grey", fontsize=8, va="center")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3, which="both")
    axes[0].set_yticks(np.arange(len(methods)), [LABELS[m] for m in methods])
    axes[0].set_ylim(len(methods) - 0.5, -1)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9, frameon=False)
    fig.suptitle(f"Few-shot transfer: means over {report['config']['seeds']} seeds, each with its own 95 % t interval "
                 "(the claims use paired differences: report.md)", fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


__all__ = ["summarize", "claims", "report_markdown", "plot_transfer", "CLAIMS", "METRICS"]
