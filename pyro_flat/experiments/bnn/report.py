r"""What ``pyro-flat bnn`` reports: every number over seeds, each family's paired comparison, the counts.

:func:`summarize` turns the per-seed rows into mean ± standard error over seeds per method, and
each sharpness-aware method's **paired difference** from its baseline (the two share a seed, so
their initial weights and data): :math:`\bar d \pm \mathrm{se}(d)`, :math:`d_s = m_{SA,s} - m_{s}`.
A difference counts when :math:`|\bar d| > t_{0.975,\,n-1}\,\mathrm{se}(d)` over :math:`n \ge 2` seeds
(a two-sided paired t-test at 95 %: :func:`~.compare.t_critical`, 4.30 at three seeds). A pair whose
plain or sharpness-aware fit was still improving at the end of its run (its objective still falling
beyond 2 standard errors: a convergence warning, kept at the looser threshold so that it hides no
unconverged fit) compares two budgets, not two methods: its verdicts are ``not converged`` and no
count includes it.
:func:`findings` computes the sentences; :func:`report_markdown` and the figures show the rest.

>>> runs = [{"label": l, "method": m, "seed": s, "top_eigenvalue": t, "ece": 0.1, "accuracy": 0.9, "nll": 0.3,
...          "ood_auroc": 0.8, "trace": 10.0, "loss_drop": 0.0, "loss_drop_se": 0.01, "seconds": 1.0,
...          "steps": 10, "grad_evals": 10, "shift": []}
...         for s, (a, b) in enumerate([(5.0, 4.0), (6.0, 4.5), (5.5, 4.4)])
...         for l, m, t in (("SGLD", "sgld", a), ("SASGLD", "sasgld", b))]
>>> pair = summarize(runs)["pairs"][0]
>>> pair["plain"], pair["sharp"], round(pair["top_eigenvalue"]["mean"], 2), pair["top_eigenvalue"]["verdict"]
('SGLD', 'SASGLD', -1.2, 'better')
"""

from __future__ import annotations

import math
from typing import Dict, List

import numpy as np

from ..compare import LARGE_SAMPLE_SIGMAS, mean_and_se, t_critical, threshold_text
from ..configs import BNN_EXTRAS, BNN_FAMILIES
from .families import METHOD_LABELS, network_text

#: the metrics of a row, and whether lower is better
METRICS = {"accuracy": False, "nll": True, "ece": True, "ood_auroc": False, "top_eigenvalue": True, "trace": True}
NAMES = {"accuracy": "accuracy", "nll": "NLL", "ece": "ECE", "ood_auroc": "OOD AUROC",
         "top_eigenvalue": "top eigenvalue", "trace": "trace"}
SHIFT_METRICS = ("accuracy", "nll", "ece")


def _stat(values) -> dict:
    mean, se = mean_and_se(values)
    return {"mean": mean, "se": se, "n": len(values)}


def _verdict(mean: float, se: float, n: int, lower_is_better: bool) -> str:
    """``better``/``worse`` when the paired difference over ``n >= 2`` seeds is beyond the t critical
    value's standard errors (:func:`~.compare.t_critical`), else ``tie`` (``one seed`` when there is
    nothing to compare with). Differences that are equal at every seed (a standard error of 0, as one
    test image of accuracy at each of 3 seeds can be) give no spread to judge by: a tie."""
    if n < 2:
        return "one seed"
    if not se > 0 or not abs(mean) > t_critical(n) * se:
        return "tie"
    return "better" if (mean < 0) == lower_is_better else "worse"


def _pair_rows(plain: List[dict], sharp: List[dict]) -> dict:
    """The paired differences ``sharp - plain`` over the seeds both ran, per metric and shift."""
    by_seed = {r["seed"]: r for r in plain}
    pairs = [(by_seed[r["seed"]], r) for r in sharp if r["seed"] in by_seed]
    out = {}
    for name, lower in METRICS.items():
        d = _stat([b[name] - a[name] for a, b in pairs])
        out[name] = {**d, "verdict": _verdict(d["mean"], d["se"], d["n"], lower)}
    out["shift"] = []
    for i, point in enumerate(pairs[0][0]["shift"] if pairs else []):
        entry = {"kind": point["kind"], "strength": point["strength"]}
        for name in SHIFT_METRICS:
            d = _stat([b["shift"][i][name] - a["shift"][i][name] for a, b in pairs])
            entry[name] = {**d, "verdict": _verdict(d["mean"], d["se"], d["n"], METRICS[name])}
        out["shift"].append(entry)
    return out


def _labels_of(runs: List[dict], method: str) -> List[str]:
    return list(dict.fromkeys(r["label"] for r in runs if r["method"] == method))


def summarize(runs: List[dict]) -> dict:
    """``{"rows": [...], "pairs": [...]}``: per method label, every metric as mean ± standard error over
    seeds (``shift`` too), the loss trend and time; per family (and per extra comparison) the paired
    difference of each metric and its verdict."""
    labels = list(dict.fromkeys(r["label"] for r in runs))
    rows = []
    for label in labels:
        mine = [r for r in runs if r["label"] == label]
        row = {"label": label, "method": mine[0]["method"], "seeds": [r["seed"] for r in mine],
               "steps": mine[0]["steps"], "grad_evals": mine[0]["grad_evals"],
               "seconds": float(np.mean([r["seconds"] for r in mine]))}
        row.update({name: _stat([r[name] for r in mine]) for name in METRICS})
        known = [r for r in mine if np.isfinite(r["loss_drop_se"])]  # seeds whose drop has an error
        drop = float(np.mean([r["loss_drop"] for r in known])) if known else float("nan")
        drop_se = math.sqrt(sum(r["loss_drop_se"] ** 2 for r in known)) / len(known) if known else float("nan")
        row["loss_drop"] = {"mean": drop, "se": drop_se, "falling": bool(drop_se > 0 and drop > LARGE_SAMPLE_SIGMAS * drop_se),
                            "rising": bool(drop_se > 0 and -drop > LARGE_SAMPLE_SIGMAS * drop_se)}
        row["shift"] = [{"kind": p["kind"], "strength": p["strength"],
                         **{name: _stat([r["shift"][i][name] for r in mine]) for name in SHIFT_METRICS}}
                        for i, p in enumerate(mine[0]["shift"])]
        rows.append(row)
    comparisons = [(family, plain, sharp, True) for family, (plain, sharp) in BNN_FAMILIES.items()]
    comparisons += [(METHOD_LABELS[base], base, extra, False) for extra, base in BNN_EXTRAS.items()]
    falling = {r["label"] for r in rows if r["loss_drop"]["falling"]}
    pairs = []
    for family, plain, sharp, is_family in comparisons:
        for base_label in _labels_of(runs, plain):
            for sharp_label in _labels_of(runs, sharp):
                pair = {"family": family, "plain": base_label, "sharp": sharp_label, "is_family": is_family,
                        "converged": not {base_label, sharp_label} & falling,
                        **_pair_rows([r for r in runs if r["label"] == base_label],
                                     [r for r in runs if r["label"] == sharp_label])}
                if not pair["converged"]:
                    _not_comparable(pair)
                pairs.append(pair)
    return {"rows": rows, "pairs": pairs}


def _not_comparable(pair: dict) -> None:
    """Every verdict of ``pair`` becomes ``not converged``: one of its fits was still improving, so its
    differences compare budgets, not methods (see the module)."""
    for name in METRICS:
        pair[name]["verdict"] = "not converged"
    for entry in pair["shift"]:
        for name in SHIFT_METRICS:
            entry[name]["verdict"] = "not converged"


def _signed(stat: dict) -> str:
    return f"{stat['mean']:+.3g} ± {stat['se']:.2g}" if stat["n"] > 1 else f"{stat['mean']:+.3g}"


def _names(pairs: List[dict]) -> str:
    return ", ".join(p["family"] for p in pairs) or "none"


def findings(report: dict) -> List[str]:
    """Sentences computed from the numbers: the claim's count over the five families, each family's
    flatness and calibration verdicts, the shifted test sets, the extra methods, and which fits were
    still improving."""
    every = [p for p in report["pairs"] if p["is_family"]]
    pairs = [p for p in every if p.get("converged", True)]
    unconverged = [p for p in every if p not in pairs]
    n_seeds = max((r["top_eigenvalue"]["n"] for r in report["rows"]), default=0)
    out = []
    if unconverged:
        out.append(f"Not comparable ({len(unconverged)} of {len(every)} families: {_names(unconverged)}): the plain or "
                   "the sharpness-aware fit was still improving at the end of its run (its objective still falling "
                   "beyond 2 standard errors), so the differences compare budgets, not methods; give them more "
                   "--grad-evals. They are left out of every count below.")
    if every and n_seeds < 2:
        out.append(f"One seed: no error bars, so no claim is counted; run --seeds 3 or more "
                   f"({len(every)} families ran).")
    elif pairs:
        flatter = [p for p in pairs if p["top_eigenvalue"]["verdict"] == "better"]
        calibrated = [p for p in pairs if p["ece"]["verdict"] == "better"]
        both = [p for p in flatter if p in calibrated]
        sharper = [p for p in pairs if p["top_eigenvalue"]["verdict"] == "worse"]
        worse_ece = [p for p in pairs if p["ece"]["verdict"] == "worse"]
        lower_nll = [p for p in pairs if p["nll"]["verdict"] == "better"]
        higher_nll = [p for p in pairs if p["nll"]["verdict"] == "worse"]
        out.append(
            f"The claim of \"Flat Seeking BNNs\" (each sharpness-aware version is flatter and better calibrated than "
            f"its baseline) holds here for {len(both)} of the {len(pairs)} comparable families ({_names(both)}) "
            f"over {n_seeds} seeds, counting a difference when the mean paired difference exceeds "
            f"{threshold_text(n_seeds)}. "
            f"Flatter (lower top eigenvalue): {len(flatter)} ({_names(flatter)}); sharper: {_names(sharper)}. "
            f"Better calibrated (lower ECE): {len(calibrated)} ({_names(calibrated)}); worse: {_names(worse_ece)}. "
            f"Lower test NLL: {len(lower_nll)} ({_names(lower_nll)}); higher: {_names(higher_nll)}.")
        for p in pairs:
            out.append(f"{p['family']}: {p['sharp']} against {p['plain']} (paired difference over seeds): top "
                       f"eigenvalue {_signed(p['top_eigenvalue'])} ({p['top_eigenvalue']['verdict']}), trace "
                       f"{_signed(p['trace'])} ({p['trace']['verdict']}), ECE {_signed(p['ece'])} "
                       f"({p['ece']['verdict']}), NLL {_signed(p['nll'])} ({p['nll']['verdict']}), accuracy "
                       f"{_signed(p['accuracy'])} ({p['accuracy']['verdict']}).")
        out += _shift_findings(pairs, n_seeds)
    for p in (p for p in report["pairs"] if not p["is_family"]):
        out.append(f"{p['sharp']} against {p['plain']}: top eigenvalue {_signed(p['top_eigenvalue'])} "
                   f"({p['top_eigenvalue']['verdict']}), ECE {_signed(p['ece'])} ({p['ece']['verdict']}), NLL "
                   f"{_signed(p['nll'])} ({p['nll']['verdict']}), accuracy {_signed(p['accuracy'])} "
                   f"({p['accuracy']['verdict']}).")
    falling = [r["label"] for r in report["rows"] if r["loss_drop"]["falling"]]
    rising = [r["label"] for r in report["rows"] if r["loss_drop"].get("rising")]
    out.append("No fit's objective was still falling over the last fifth of its run (within 2 standard errors)."
               if not falling else
               f"Still falling over the last fifth of the run (beyond 2 standard errors, mean over seeds): "
               f"{', '.join(falling)}: their rows compare the methods at this budget, not at convergence.")
    if rising:
        out.append(f"Rising over the last fifth of the run (beyond 2 standard errors): {', '.join(rising)}.")
    return out


def _shift_findings(pairs: List[dict], n_seeds: int) -> List[str]:
    """At the strongest strength of each shift: for how many families the sharpness-aware version
    has the lower NLL and ECE beyond the error bars (and for how many the higher)."""
    out = []
    if not pairs or not pairs[0]["shift"]:
        return out
    kinds = list(dict.fromkeys(s["kind"] for s in pairs[0]["shift"]))
    for kind in kinds:
        strongest = max(s["strength"] for s in pairs[0]["shift"] if s["kind"] == kind)
        parts = []
        for name in ("nll", "ece", "accuracy"):
            verdicts = [next(s for s in p["shift"] if s["kind"] == kind and s["strength"] == strongest)[name]["verdict"]
                        for p in pairs]
            parts.append(f"{NAMES[name]} better in {verdicts.count('better')}, worse in {verdicts.count('worse')}")
        unit = "°" if kind == "rotation" else " sd"
        out.append(f"Shifted test set, {kind} at its strongest ({strongest:g}{unit}), sharpness-aware against plain "
                   f"over the {len(pairs)} comparable families and {n_seeds} seeds: " + "; ".join(parts)
                   + f" (beyond {threshold_text(n_seeds)}).")
    return out


def plus_minus(value: float, error: float) -> str:
    """``value ± error`` with both to the error's second significant digit: ``7372 ± 170``,
    ``3.812 ± 0.034``."""
    if not (np.isfinite(error) and error > 0):
        return f"{value:.4g} ± {error:g}"
    decimals = max(0, 1 - int(np.floor(np.log10(error))))
    return f"{value:.{decimals}f} ± {error:.{decimals}f}"


def row_text(row: dict) -> str:
    """One fit's line in the log."""
    return (f"{row['label']}: accuracy {row['accuracy']:.3f}, NLL {row['nll']:.3f}, ECE {row['ece']:.3f}, "
            f"OOD AUROC {row['ood_auroc']:.3f}, top eigenvalue {row['top_eigenvalue']:.4g}, trace {row['trace']:.4g}; "
            f"{row['steps']} steps in {row['seconds']:.1f} s, loss drop over the last fifth "
            f"{row['loss_drop']:+.4f} ± {row['loss_drop_se']:.4f} per image")


def _cell(stat: dict, digits: int = 3) -> str:
    return f"{stat['mean']:.{digits}f} ± {stat['se']:.{digits}f}" if stat["n"] > 1 else f"{stat['mean']:.{digits}f}"


def _big(stat: dict) -> str:
    return plus_minus(stat["mean"], stat["se"]) if stat["n"] > 1 else f"{stat['mean']:.4g}"


def report_markdown(report: dict) -> str:
    c = report["config"]
    seeds = sorted({s for r in report["rows"] for s in r["seeds"]})
    lines = [
        f"# Every BNN family, plain and sharpness-aware, on a Bayesian {c.get('network', 'mlp').upper()}",
        "",
        f"MNIST digits {tuple(c['in_digits'])} ({report['n_train']} training images), network: "
        f"{network_text(c, report.get('num_weights'))}, "
        f"prior sd {c['prior_scale']}, minibatch {c['batch_size']}, **{c['grad_evals']} gradient evaluations per "
        f"trajectory** (a chain, an ensemble member, a variational fit; a SAM step takes two), seeds "
        f"{', '.join(map(str, seeds))}. SGD and SGLD step {c['step_size']:g}; SAM radius ρ = {c['rho']:g} in weight "
        f"space (SASGLD, SA-SWAG, SA-MC-dropout, SA-ensemble), SA-BBB's ρ = {c['sam_rho']:g} (in weight space at "
        f"each draw of q), SA-BMA's KL ball γ = {c['sabma_gamma']:g} (on q's parameters); BBB fits: AutoNormal (init scale {c['svi_init_scale']:g}), Adam from "
        f"{c['svi_lr']:g} falling tenfold; SWAG rank {c['swag_rank']}, MC-dropout p = {c['dropout']:g}; SA-BMA as its "
        f"paper runs it: half the evaluations to a SWAG fit (SGD, SWAG's settings), the other half to SABMA_ELBO from "
        f"SWAG's low-rank posterior (Adam as the BBB fits; the model's own prior, not one from SWAG); "
        f"{c['num_chains']} chains per sampler and members per ensemble; EntropySGLD η = {c['eta']:g}, "
        f"FlatSGLD σ = {c['sigma']:g}.",
        "",
        f"Every number is the mean ± standard error over the {len(seeds)} seeds. Test: {report['n_test']} images "
        f"(one image = {1 / report['n_test']:.4f} of accuracy); OOD AUROC: the BMA's predictive entropy separating "
        f"{report.get('n_ood', 'the')} images of the other digits from the test set. Flatness: the Hessian of the "
        f"training negative log-likelihood (all {report['n_train']} images, prior excluded) at {c['flatness_draws']} "
        f"draws per fit (the MAP point of MC-dropout, without dropout), trace by {c['trace_probes']} Hutchinson probes.",
        "",
        "| method | accuracy | NLL | ECE | OOD AUROC | top eigenvalue | trace |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        lines.append(f"| {r['label']} | {_cell(r['accuracy'])} | {_cell(r['nll'])} | {_cell(r['ece'])} | "
                     f"{_cell(r['ood_auroc'])} | {_big(r['top_eigenvalue'])} | {_big(r['trace'])} |")
    ranks = report.get("ranks") or {"world_size": 1}
    if ranks["world_size"] > 1:
        lines += ["", f"Ran on {ranks['world_size']} ranks (torch.distributed, {ranks['backend']} backend): the seeds "
                      f"split over them, {c['threads']} thread(s) per rank; each fit is its seed's one-process fit, "
                      "and rank 0 gathered the rows and wrote this report."]
    lines += ["", "## What the numbers show", ""] + [f"- {t}" for t in report.get("findings", [])]
    lines += ["", "## Sharpness-aware against plain, paired by seed", "",
              "Each cell: the mean over seeds of (sharpness-aware − plain) ± its standard error; **bold** when beyond "
              f"{threshold_text(len(seeds))} (a two-sided paired t-test). *Not converged*: the row's plain or "
              "sharpness-aware fit was still improving at the end of its run, so it is not compared.", "",
              "| family | compared | top eigenvalue | trace | ECE | NLL | accuracy | OOD AUROC |",
              "|---|---|---|---|---|---|---|---|"]
    for p in report["pairs"]:
        cells = [(f"**{_signed(p[m])}**" if p[m]["verdict"] in ("better", "worse") else _signed(p[m]))
                 for m in ("top_eigenvalue", "trace", "ece", "nll", "accuracy", "ood_auroc")]
        compared = " − ".join((p["sharp"], p["plain"])) + ("" if p.get("converged", True) else " (*not converged*)")
        lines.append(f"| {p['family']} | {compared} | " + " | ".join(cells) + " |")
    lines += _shift_tables(report)
    lines += ["", "## Convergence and cost", "",
              "The objective per training image over the second half of each run: the minibatch potential U(θ) of the "
              "samplers (SASGLD's and the SA-ensemble's at θ, not at the perturbed point) and ensembles, the negative "
              "ELBO of the SVI fits (SA-BBB's, SA-SWAG's and SA-MC-dropout's at the perturbed weights θ + ε*, SA-BMA's "
              "over its SA-BMA phase, at the perturbed parameters φ + δ). Its drop from the second-to-last fifth to the "
              "last, mean over seeds ± standard error; a positive drop beyond 2 standard errors: still falling.",
              "", "| method | steps | gradient evaluations per trajectory | seconds per fit | loss drop per image | "
              "still falling |",
              "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        d = r["loss_drop"]
        lines.append(f"| {r['label']} | {r['steps']} | {r['grad_evals']} | {r['seconds']:.1f} | "
                     f"{d['mean']:+.4f} ± {d['se']:.4f} | {'yes' if d['falling'] else 'no'} |")
    lines += ["", "Figures: `families.png` (every metric per method, mean ± standard error over seeds, the seeds as "
                  "dots), `shift.png` (accuracy, NLL and ECE against the strength of each shift, the five families), "
                  "`bma_vs_models.png` (first seed: BMA test NLL and accuracy against the number of averaged draws)."]
    return "\n".join(lines) + "\n"


def _shift_tables(report: dict) -> List[str]:
    rows = report["rows"]
    if not rows or not rows[0]["shift"]:
        return []
    points = [(s["kind"], s["strength"]) for s in rows[0]["shift"]]
    head = "| method | clean | " + " | ".join(f"{'rot' if k == 'rotation' else 'noise'} {v:g}" for k, v in points) + " |"
    lines = ["", "## Shifted test sets", "",
             "The test images rotated by the given degrees, or with Gaussian noise of the given sd added (pixels in "
             "[0, 1], clipped); the labels are the clean set's."]
    for name in SHIFT_METRICS:
        lines += ["", f"{NAMES[name]}:", "", head, "|---|" + "---|" * (len(points) + 1)]
        for r in rows:
            lines.append(f"| {r['label']} | {_cell(r[name])} | " + " | ".join(_cell(s[name]) for s in r["shift"]) + " |")
    return lines


def _family_styles(report: dict) -> Dict[str, dict]:
    """A colour per family (extras grey), a filled marker for the plain method, an open one for the
    sharpness-aware."""
    styles = {}
    for i, (family, (plain, sharp)) in enumerate(BNN_FAMILIES.items()):
        styles[METHOD_LABELS[plain]] = {"color": f"C{i}", "marker": "o", "ls": "-", "mfc": f"C{i}"}
        styles[METHOD_LABELS[sharp]] = {"color": f"C{i}", "marker": "^", "ls": "--", "mfc": "white"}
    for r in report["rows"]:
        styles.setdefault(r["label"], {"color": "0.45", "marker": "s", "ls": ":", "mfc": "white"})
    return styles


def plot_families(report: dict):
    """Every metric per method: mean ± standard error over seeds, each seed a small dot."""
    import matplotlib.pyplot as plt

    rows, runs = report["rows"], report["runs"]
    styles = _family_styles(report)
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5), sharex=True)
    for ax, (name, lower) in zip(axes.flat, METRICS.items()):
        for x, r in enumerate(rows):
            st = styles[r["label"]]
            ax.errorbar(x, r[name]["mean"], yerr=r[name]["se"], color=st["color"], marker=st["marker"], ms=8,
                        mfc=st["mfc"], capsize=3, lw=1.5)
            seeds = [run[name] for run in runs if run["label"] == r["label"]]
            ax.plot([x] * len(seeds), seeds, ".", color=st["color"], alpha=0.4, ms=4)
        ax.set_title(f"{NAMES[name]} ({'lower' if lower else 'higher'} is better)")
        ax.grid(alpha=0.3, axis="y")
    for ax in axes[1]:
        ax.set_xticks(range(len(rows)), [r["label"] for r in rows], rotation=60, ha="right", fontsize=8)
    n = max(r["accuracy"]["n"] for r in rows)
    fig.suptitle(f"Each method: mean ± standard error over {n} seed{'s' if n > 1 else ''} (dots: the seeds); "
                 "filled: plain, open: sharpness-aware, grey: the other methods", fontsize=10)
    fig.tight_layout()
    return fig


def plot_shift(report: dict):
    """Accuracy, NLL and ECE against shift strength (0: the clean test set), for the five families'
    methods; mean ± standard error over seeds."""
    import matplotlib.pyplot as plt

    rows = [r for r in report["rows"] if r["method"] in {m for pair in BNN_FAMILIES.values() for m in pair}]
    rows = rows or report["rows"]
    styles = _family_styles(report)
    kinds = list(dict.fromkeys(s["kind"] for s in rows[0]["shift"])) if rows and rows[0]["shift"] else []
    fig, axes = plt.subplots(max(1, len(kinds)), 3, figsize=(15, 4 * max(1, len(kinds))), squeeze=False)
    for k, kind in enumerate(kinds):
        for j, name in enumerate(SHIFT_METRICS):
            ax = axes[k, j]
            for r in rows:
                points = [s for s in r["shift"] if s["kind"] == kind]
                x = [0.0] + [s["strength"] for s in points]
                y = [r[name]["mean"]] + [s[name]["mean"] for s in points]
                e = [r[name]["se"]] + [s[name]["se"] for s in points]
                st = styles[r["label"]]
                ax.errorbar(x, y, yerr=e, color=st["color"], marker=st["marker"], mfc=st["mfc"], ls=st["ls"],
                            capsize=2, lw=1.2, label=r["label"])
            unit = "rotation (degrees)" if kind == "rotation" else "noise sd (pixels in [0, 1])"
            ax.set(xlabel=unit, title=f"{NAMES[name]} under {kind} ({'lower' if METRICS[name] else 'higher'} "
                                      "is better)")
            ax.grid(alpha=0.3)
    if kinds:
        axes[0, 0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


__all__ = ["summarize", "findings", "report_markdown", "plot_families", "plot_shift", "row_text", "plus_minus",
           "METRICS"]
