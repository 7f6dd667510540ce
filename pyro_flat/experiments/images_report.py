r"""What ``pyro-flat images`` reports: each method's numbers over seeds, and the paper's claims counted.

:func:`summarize` gives mean ± standard error over seeds per row (a method, or Entropy-MCMC's θ, θa
and both). :func:`claims` tests each of the paper's claims about Entropy-MCMC against every other
method by the paired difference over seeds: with :math:`d_s` the difference at seed :math:`s`
(signed so that positive favours Entropy-MCMC), the pair counts for the claim when
:math:`\bar d > t_{0.975,\,n-1}\,\mathrm{se}(d)`, against it when :math:`\bar d < -t\,\mathrm{se}(d)`,
and is a tie otherwise (4.30 standard errors at 3 seeds, not 2). A claim is **reproduced** when
Entropy-MCMC wins every pair, **contradicted** when it loses any, **tied** otherwise.

The paper's predictions average θ's and θa's draws together, so its Entropy-MCMC is the "both" row;
its flatness claim is about θa, the guiding variable, so that row carries the Hessian measures.

>>> rows = [{"label": "SGD", "seed": s, "accuracy": 0.90 + 0.001 * s} for s in range(3)]
>>> rows += [{"label": "Entropy-MCMC (both)", "seed": s, "accuracy": 0.95 + 0.002 * s} for s in range(3)]
>>> claim = claims(rows, [("accuracy", "higher accuracy", False)])[0]
>>> claim["verdict"], claim["pairs"][0]["verdict"]
('reproduced', 'for')
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .compare import mean_and_se, t_critical

EMCMC = "Entropy-MCMC (both)"
EMCMC_FLAT = "Entropy-MCMC (θa)"
#: (metric, what the paper claims Entropy-MCMC has, lower is better)
CLAIMS: Tuple[Tuple[str, str, bool], ...] = (
    ("accuracy", "the highest test accuracy", False),
    ("nll", "the lowest test NLL", True),
    ("corrupted_accuracy_mean", "the highest accuracy on corrupted images (mean over severities)", False),
    ("ood_auroc", "the best out-of-distribution detection (AUROC)", False),
    ("top_eigenvalue", "the flattest solutions (lowest top Hessian eigenvalue)", True),
)
METRICS = ("accuracy", "nll", "ece", "brier", "corrupted_accuracy_mean", "ood_auroc", "ood_aupr", "top_eigenvalue",
           "trace", "train_nll")


#: the paper's CIFAR numbers (Li & Zhang 2024, their table of ResNet-18 results), beside a CIFAR run
PAPER_TABLE = ("Entropy-MCMC's published ResNet-18 results: CIFAR-10 accuracy 95.69 %, NLL 0.162; CIFAR-100 accuracy "
               "79.16 %, NLL 0.840 (200 epochs, 16 networks averaged). This run's protocol and size are in the first "
               "paragraph: compare only a run of --preset emcmc-cifar with them.")
PAPER_NOTE = ("The paper has no digits experiment: these numbers test its claims (Entropy-MCMC best in accuracy and NLL, "
              "flattest, best under corruption, best out-of-distribution) on a small ResNet and MNIST digits, at a "
              "budget of minutes rather than its 200 epochs of ResNet-18 on CIFAR.")


def paper_comparison(dataset: str) -> str:
    """What the report says of the paper's own numbers: its CIFAR table, or that it has no digits experiment."""
    return PAPER_NOTE if dataset == "digits" else PAPER_TABLE


def summarize(rows: Sequence[dict]) -> Dict[str, Dict[str, dict]]:
    """``{label: {metric: {"mean", "se", "n"}}}`` over the seeds, also per corruption severity
    (``corrupted_accuracy``: lists over severities)."""
    out: Dict[str, Dict[str, dict]] = {}
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = [r for r in rows if r["label"] == label]
        entry = {}
        for name in METRICS:
            values = [r[name] for r in mine if r.get(name) is not None]
            if values:
                mean, se = mean_and_se(values)
                entry[name] = {"mean": mean, "se": se, "n": len(values)}
        severities = [r["corrupted_accuracy"] for r in mine if r.get("corrupted_accuracy")]
        if severities:
            per = np.array(severities, dtype=float)
            entry["corrupted_accuracy"] = {"mean": per.mean(0).tolist(),
                                           "se": (per.std(0, ddof=1) / np.sqrt(len(per))).tolist()
                                           if len(per) > 1 else [0.0] * per.shape[1], "n": len(per)}
        out[label] = entry
    return out


def _pair(ours: Dict[int, float], theirs: Dict[int, float], lower: bool) -> dict:
    seeds = sorted(set(ours) & set(theirs))
    d = [(theirs[s] - ours[s]) if lower else (ours[s] - theirs[s]) for s in seeds]  # positive: for the claim
    mean, se = mean_and_se(d) if d else (float("nan"), float("nan"))
    n = len(d)
    critical = t_critical(n)
    if n < 2:
        verdict = "one seed"
    elif (se > 0 and mean > critical * se) or (se == 0 and mean > 0):
        verdict = "for"
    elif (se > 0 and mean < -critical * se) or (se == 0 and mean < 0):
        verdict = "against"
    else:
        verdict = "tie"
    return {"mean": mean, "se": se, "n": n, "t_critical": critical, "verdict": verdict}


def claims(rows: Sequence[dict], which: Sequence[Tuple[str, str, bool]] = CLAIMS) -> List[dict]:
    """Each claim of ``which`` tested pair by pair (see the module's text): a list of
    ``{"metric", "claim", "verdict", "pairs": [{"other", "mean", "se", "n", "verdict"}, ...]}``."""
    by_label: Dict[str, Dict[str, Dict[int, float]]] = {}
    for r in rows:
        for name, _, _ in which:
            if r.get(name) is not None:
                by_label.setdefault(r["label"], {}).setdefault(name, {})[r["seed"]] = float(r[name])
    out = []
    for name, text, lower in which:
        ours_label = EMCMC_FLAT if name in ("top_eigenvalue", "trace") else EMCMC
        ours = by_label.get(ours_label, {}).get(name)
        others = [label for label in by_label if not label.startswith("Entropy-MCMC") and name in by_label[label]]
        if not ours or not others:
            out.append({"metric": name, "claim": text, "verdict": "not measured", "pairs": [], "ours": ours_label})
            continue
        pairs = [{"other": label, **_pair(ours, by_label[label][name], lower)} for label in others]
        verdicts = {p["verdict"] for p in pairs}
        if "one seed" in verdicts:
            verdict = "not tested (one seed)"
        elif "against" in verdicts:
            verdict = "contradicted"
        elif verdicts == {"for"}:
            verdict = "reproduced"
        else:
            verdict = "tied"
        out.append({"metric": name, "claim": text, "verdict": verdict, "pairs": pairs, "ours": ours_label})
    return out


def _cell(entry: Optional[dict], digits: int = 4) -> str:
    if not entry:
        return "—"
    return f"{entry['mean']:.{digits}f} ± {entry['se']:.{digits}f}"


def _compiled_text(rows: List[dict], jit: str) -> str:
    """What compiled the fits' iterations under ``--jit``, counted over the fits (inductor falls back to the
    traced graph where it fails its check against the eager iteration)."""
    if jit == "off":
        return ""
    fits = {(r["method"], r["seed"]): r.get("compiled") for r in rows}
    counts = {name: sum(c == name for c in fits.values()) for name in ("inductor", "fx", None)}
    parts = [f"{counts[name]} of {len(fits)} fits {text}" for name, text in
             (("inductor", "compiled by inductor"), ("fx", "run as traced graphs (fx)"), (None, "eager")) if counts[name]]
    return f"; --jit {jit}: {', '.join(parts)}"


def report_markdown(report: dict) -> str:
    """``report.md``: the setting, the table per method, corruption by severity, OOD, flatness, the claims."""
    s, p, jit = report["summary"], report["protocol"], report["config"]["jit"]
    lines = [f"# pyro-flat images: {report['data']['source']}", "",
             f"{report['data']['n_train']:,} training and {report['data']['n_test']:,} test images; "
             f"{p['network']} ({report['weights']:,} weights); {report['seeds']} seeds; {p['epochs']} epochs in "
             f"{p['cycles']} cycle(s) for the samplers (draws from the last {p['draw_epochs']} epoch(s) of each), one "
             f"cosine decay for the optimisers; minibatch {p['batch_size']}. Protocol `{report['preset']}` in "
             f"pyro-flat's scale: step size {report['scaled']['step_size']:.3g} (lr {p['lr']} / N), prior sd "
             f"{report['scaled']['prior_sd']:.3g} (weight decay {p['weight_decay']}), temperature "
             f"{report['scaled']['temperature']:g}, eta {report['scaled']['eta']:.3g}. Ran on {report['device']}"
             + _compiled_text(report["rows"], jit) + ".", "",
             f"Corrupted test sets: {report['data']['corruptions']}. Out-of-distribution: {report['data']['ood']}.", "",
             "Mean ± standard error over the seeds. NLL, ECE and Brier of the Bayesian model average of each "
             "method's draws (the optimisers: their one network); the Hessian measures are of the training NLL per "
             f"image on {report['flatness_images']} training images, at the last draw, where the training NLL per image "
             "says how far training got (a method far above the others has not converged at this budget).", "",
             "| method | accuracy | NLL | ECE | Brier | corrupted accuracy | OOD AUROC | OOD AUPR | top eigenvalue | trace "
             "| training NLL |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, entry in s.items():
        lines.append(f"| {label} | " + " | ".join(_cell(entry.get(m), 2 if m in ("top_eigenvalue", "trace") else 4)
                                                  for m in METRICS) + " |")
    lines += ["", "## Accuracy under corruption, by severity", "",
              "| method | " + " | ".join(f"severity {i}" for i in range(1, 6)) + " |", "|---|" + "---|" * 5]
    for label, entry in s.items():
        c = entry.get("corrupted_accuracy")
        if c:
            lines.append(f"| {label} | " + " | ".join(f"{m:.4f} ± {e:.4f}" for m, e in zip(c["mean"], c["se"])) + " |")
    lines += ["", "## The paper's claims, counted", "",
              f"Each pair: Entropy-MCMC against one method, the paired difference over {report['seeds']} seeds against "
              f"t = {t_critical(report['seeds']):.2f} standard errors (two-sided 95 %). A claim is reproduced when "
              "Entropy-MCMC wins every pair, contradicted when it loses one, tied otherwise. Entropy-MCMC is its "
              "\"both\" row (θ's and θa's draws averaged, as the paper predicts), and θa for flatness.", ""]
    for claim in report["claims"]:
        lines.append(f"- **{claim['claim']}**: {claim['verdict']}.")
        for pair in claim["pairs"]:
            lines.append(f"  - against {pair['other']}: difference {pair['mean']:+.4g} ± {pair['se']:.2g} "
                         f"(positive favours Entropy-MCMC): {pair['verdict']}")
    counts = {v: sum(c["verdict"] == v for c in report["claims"]) for v in ("reproduced", "tied", "contradicted")}
    lines += ["", f"Reproduced {counts['reproduced']}, tied {counts['tied']}, contradicted {counts['contradicted']} "
                  f"of {len(report['claims'])} claims."]
    if report.get("paper"):
        lines += ["", "## The paper's numbers beside these", "", report["paper"]]
    lines += ["", f"Wall time {report['seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def plot_corruption(report: dict):
    """Accuracy by corruption severity (0: clean), mean ± standard error over seeds, one line per method."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, entry in report["summary"].items():
        c = entry.get("corrupted_accuracy")
        if not c:
            continue
        mean = [entry["accuracy"]["mean"]] + list(c["mean"])
        se = [entry["accuracy"]["se"]] + list(c["se"])
        ax.errorbar(range(6), mean, yerr=se, marker="o", capsize=3, label=label)
    ax.set_xlabel("corruption severity (0: clean test images)")
    ax.set_ylabel("accuracy of the model average")
    ax.set_title(f"accuracy under corruption ({report['seeds']} seeds, ± 1 s.e.)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_interpolation(report: dict):
    """The training NLL along the line between two cycles' θ draws, per sampler (first seed)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, curve in report["interpolation"].items():
        ax.plot(curve["t"], curve["nll"], marker=".", label=label)
    ax.set_xlabel("t (0: the first cycle's last θ draw, 1: the last cycle's)")
    ax.set_ylabel("training NLL per image")
    ax.set_title("the loss between draws of different cycles (first seed)")
    if report["interpolation"]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


__all__ = ["CLAIMS", "METRICS", "PAPER_TABLE", "PAPER_NOTE", "paper_comparison",
           "summarize", "claims", "report_markdown", "plot_corruption", "plot_interpolation"]
