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

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..compare import claim_verdict, paired_verdict, seed_summary, t_critical

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
           "trace", "train_nll", "train_nll_change", "distance")
#: methods compared with Entropy-MCMC in the report, but not counted in the paper's claims (not its baselines)
NOT_THE_PAPERS = ("SGD ensemble",)


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
        entry = {name: summary for name in METRICS if (summary := seed_summary(mine, name))}
        verdicts = [r["converged"] for r in mine if r.get("converged") is not None]
        if verdicts:
            entry["converged"] = {"count": sum(verdicts), "n": len(verdicts)}
        severities = [r["corrupted_accuracy"] for r in mine if r.get("corrupted_accuracy")]
        if severities:
            per = np.array(severities, dtype=float)
            entry["corrupted_accuracy"] = {"mean": per.mean(0).tolist(),
                                           "se": (per.std(0, ddof=1) / np.sqrt(len(per))).tolist()
                                           if len(per) > 1 else [0.0] * per.shape[1], "n": len(per)}
        out[label] = entry
    return out


def claims(rows: Sequence[dict], which: Sequence[Tuple[str, str, bool]] = CLAIMS) -> List[dict]:
    """Each claim of ``which`` tested pair by pair (see the module's text): a list of
    ``{"metric", "claim", "verdict", "pairs": [{"other", "mean", "se", "n", "verdict", "declared_at",
    "detectable", "counted"}, ...]}``. The pairs against :data:`NOT_THE_PAPERS` are listed but not counted;
    a claim one of whose counted rows has a fit that did not converge (``converged`` False) is "not tested
    (not converged)"."""
    by_label: Dict[str, Dict[str, Dict[int, float]]] = {}
    unconverged = {r["label"] for r in rows if r.get("converged") is False}
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
        pairs = [{"other": label, **paired_verdict(ours, by_label[label][name], lower), "counted": label not in NOT_THE_PAPERS}
                 for label in others]
        verdicts = {p["verdict"] for p in pairs if p["counted"]}
        late = sorted({ours_label, *(p["other"] for p in pairs if p["counted"])} & unconverged)
        verdict = claim_verdict(verdicts, late)
        out.append({"metric": name, "claim": text, "verdict": verdict, "pairs": pairs, "ours": ours_label,
                    "not_converged": late})
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


def protocol_rows(report: dict) -> List[Tuple[str, str, str]]:
    """``(setting, this run, the paper's CIFAR-10 value)`` for the report's first table; the paper's cell is empty
    where the run keeps it."""
    from .config import PAPER_PROTOCOL

    yes = lambda flag: "yes" if flag else "no"  # noqa: E731

    def column(p: dict, n: int, side: int, step: float, eta: float, draws: int) -> List[str]:
        """One column of the table, the run's or the paper's, written the same way so that equal values read equal."""
        return [p["network"], f"{n:,}", str(side), str(p["epochs"]), str(p["cycles"]), str(p["draw_epochs"]), str(draws),
                str(p["batch_size"]), f"{p['lr']:g}", f"{step:.3g}",
                f"{p['weight_decay']:g} (sd {1 / math.sqrt(n * p['weight_decay']):.3g})", f"{p['temperature']:g}",
                f"{eta:.3g}", f"**{step / eta:.3g}**", yes(p["exploration_noise"]), yes(p["aux_prior"]), yes(p["augment"])]

    p, sc, n = report["protocol"], report["scaled"], report["data"]["n_train"]
    paper, paper_n = PAPER_PROTOCOL, PAPER_PROTOCOL["train_size"]
    names = ["network", "training images N", "image side (pixels)", "epochs (every method)" if p["budget"] == "epochs" else
             "epochs (SGD; the same gradient evaluations for every method)", "cosine cycles",
             "epochs sampled at the end of each cycle", "draws kept per cycle (θ and θa each)", "minibatch",
             "learning rate lr (mean loss)", "step size lr / N", "weight decay (prior sd 1/√(N wd))", "temperature", "η",
             "**per-step coupling lr / (N η)**", "noise in the exploration phase", "prior on θa (the weight decay on θa)",
             "augmentation (crop and flip)"]
    mine = column(p, n, report["data"].get("side", p.get("image_size")), sc["step_size"], sc["eta"],
                  report["config"]["draws_per_cycle"])
    theirs = column(paper, paper_n, 32, paper["lr"] / paper_n, paper["eta"], 2)
    return [(name, a, "" if a == b else b) for name, a, b in zip(names, mine, theirs)]


def _converged_text(entry: dict) -> str:
    c = entry.get("converged")
    return "—" if not c else f"{c['count']} of {c['n']}"


def report_markdown(report: dict) -> str:
    """``report.md``: the protocol beside the paper's, the table per method with its convergence, corruption by
    severity, the claims with the smallest differences the run detects."""
    s, p, jit = report["summary"], report["protocol"], report["config"]["jit"]
    within = report["config"]["converged_within"]
    lines = [f"# pyro-flat images: {report['data']['source']}", "",
             f"{report['data']['n_train']:,} training and {report['data']['n_test']:,} test images; "
             f"{p['network']} ({report['weights']:,} weights); {report['seeds']} seeds; protocol `{report['preset']}`. "
             f"Ran on {report['device']}" + _compiled_text(report["rows"], jit) + ".", "",
             "The protocol beside the paper's (Entropy-MCMC on CIFAR-10): the run keeps what the dynamics depend on "
             "(the per-step coupling, the temperature, the noise, θa's prior, the cycles and the draws per cycle); "
             "the paper's value is given where the run departs from it.", "",
             "| setting | this run | the paper, where it differs |", "|---|---|---|"]
    lines += [f"| {name} | {mine} | {paper} |" for name, mine, paper in protocol_rows(report)]
    lines += ["", "Every method runs the same cosine cycles (the optimisers keep their last iterate, the samplers their "
                  "draws from the end of each cycle); the SGD ensemble's "
                  f"{report['config'].get('members', '')} networks share one network's steps, two cycles each. "
                  f"Corrupted test sets: {report['data']['corruptions']}. Out-of-distribution: {report['data']['ood']}.",
              "", f"**Convergence.** A fit has converged when its training NLL per image (all {report['data']['n_train']:,} "
                  f"training images) at the end of its last cycle is within {within:g} of that at the end of the cycle "
                  "before; the column *converged* counts the seeds where it did, *change* is the largest such "
                  "difference. A claim that involves a method with a fit that did not converge is not tested.", "",
              "Mean ± standard error over the seeds. NLL, ECE and Brier of the Bayesian model average of each "
              "method's draws (the optimisers: their last network; the ensemble: its networks); the Hessian measures "
              f"are of the training NLL per image on {report['flatness_images']} training images at the last draw; "
              "*distance* is how far the weights travelled from the start (Entropy-MCMC (both): the centre "
              "(θ + θa)/2, which moves at half SGD's speed once the gap settles): a slow method is short of the "
              "others, a worse one is not.", "",
              "| method | accuracy | NLL | ECE | Brier | corrupted accuracy | OOD AUROC | OOD AUPR | top eigenvalue | trace "
              "| training NLL | change | distance | converged |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, entry in s.items():
        lines.append(f"| {label} | " + " | ".join(_cell(entry.get(m), 2 if m in ("top_eigenvalue", "trace", "distance")
                                                        else 4) for m in METRICS)
                     + f" | {_converged_text(entry)} |")
    lines += ["", "## Accuracy under corruption, by severity", "",
              "| method | " + " | ".join(f"severity {i}" for i in range(1, 6)) + " |", "|---|" + "---|" * 5]
    for label, entry in s.items():
        c = entry.get("corrupted_accuracy")
        if c:
            lines.append(f"| {label} | " + " | ".join(f"{m:.4f} ± {e:.4f}" for m, e in zip(c["mean"], c["se"])) + " |")
    lines += ["", "## The paper's claims, counted", "",
              f"Each pair: Entropy-MCMC against one method, the paired difference over {report['seeds']} seeds against "
              f"t = {t_critical(report['seeds']):.2f} standard errors (two-sided 95 %). A claim is reproduced when "
              "Entropy-MCMC wins every pair against the paper's baselines, contradicted when it loses one, tied "
              "otherwise; the SGD ensemble is not one of the paper's baselines: its pair is shown, not counted. "
              "Entropy-MCMC is its \"both\" row (θ's and θa's draws averaged, as the paper predicts), and θa for "
              "flatness. *declared beyond* is the smallest difference this run calls (t standard errors of the "
              "paired difference); *detected 4 times in 5* the true difference it would call with 80 % power.", ""]
    for claim in report["claims"]:
        lines.append(f"- **{claim['claim']}**: {claim['verdict']}"
                     + (f" ({', '.join(claim['not_converged'])} not converged)" if claim.get("not_converged") else "")
                     + ".")
        for pair in claim["pairs"]:
            lines.append(f"  - against {pair['other']}{'' if pair.get('counted', True) else ' (not counted)'}: "
                         f"difference {pair['mean']:+.4g} ± {pair['se']:.2g} (positive favours Entropy-MCMC): "
                         f"{pair['verdict']}; declared beyond {pair['declared_at']:.2g}, detected 4 times in 5 at "
                         f"{pair['detectable']:.2g}")
    counts = {v: sum(c["verdict"] == v for c in report["claims"]) for v in ("reproduced", "tied", "contradicted")}
    untested = sum(c["verdict"].startswith("not") for c in report["claims"])
    lines += ["", f"Reproduced {counts['reproduced']}, tied {counts['tied']}, contradicted {counts['contradicted']}"
                  + (f", not tested {untested}" if untested else "") + f" of {len(report['claims'])} claims."]
    power = report.get("power")
    if power:
        lines += ["", "## Power", "", power_text(power)]
    if report.get("paper"):
        lines += ["", "## The paper's numbers beside these", "", report["paper"]]
    lines += ["", f"Wall time {report['seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def nll_power(report_rows: Sequence[dict], claims_list: Sequence[dict]) -> Optional[dict]:
    """The NLL claim's power against SGD: the smallest difference this run detects 4 times in 5, and as a fraction
    of SGD's NLL (the paper's gain over SGD on CIFAR-10 is 21 %; the study aims to see 10 %)."""
    claim = next((c for c in claims_list if c["metric"] == "nll"), None)
    pair = None if claim is None else next((p for p in claim["pairs"] if p["other"] == "SGD"), None)
    sgd = [r["nll"] for r in report_rows if r["label"] == "SGD"]
    if pair is None or not sgd or pair["n"] < 2:
        return None
    base = float(np.mean(sgd))
    return {"detectable": pair["detectable"], "declared_at": pair["declared_at"], "sgd_nll": base,
            "fraction": pair["detectable"] / base, "declared_fraction": pair["declared_at"] / base, "n": pair["n"]}


def power_text(power: dict) -> str:
    """One paragraph on what the run could see in the NLL against SGD."""
    declared, detected = 100 * power["declared_fraction"], 100 * power["fraction"]
    verdict = ("a difference of 10 % would be declared and is detected 4 times in 5" if detected <= 10 else
               "a difference of 10 % would be declared, but is detected 4 times in 5 only from "
               f"{detected:.1f} %" if declared <= 10 else
               "a difference of 10 % would not be declared at this number of seeds")
    return (f"Against SGD (NLL {power['sgd_nll']:.4f}), this run declares an NLL difference beyond "
            f"{power['declared_at']:.4f} ({declared:.1f} % of SGD's NLL: t standard errors of the paired difference over "
            f"{power['n']} seeds) and detects a true one of {power['detectable']:.4f} ({detected:.1f} %) 4 times in 5. "
            f"The paper's NLL gain over SGD on CIFAR-10 was 21 %; the study aims to see 10 %: {verdict}.")


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


__all__ = ["CLAIMS", "METRICS", "NOT_THE_PAPERS", "PAPER_TABLE", "PAPER_NOTE", "paper_comparison", "protocol_rows",
           "nll_power", "power_text",
           "summarize", "claims", "report_markdown", "plot_corruption", "plot_interpolation"]
