"""The report of ``pyro-flat mnist79``: what the study prints and writes in ``report.md``.

Everything here reads the report dict that :func:`~pyro_flat.experiments.mnist79.study.run_mnist79` builds
(and writes as ``report.json``), so a report can be rewritten from a saved run.
"""

from __future__ import annotations

from ...evaluation.diagnostics import MAX_R_HAT, MIN_ESS
from ...kernels.preconditioning import pull_strength
from ..configs import MOMENTUM_SAMPLERS, MNIST79Config

#: the confidence bins of the study's two ECEs (equal-width and equal-count bins)
ECE_BINS = 15
#: the reliability diagram's bins, of equal count (fewer than the ECE's: 20 test images a point)
RELIABILITY_BINS = 10


def metric_text(config: MNIST79Config) -> str:
    """What EntropySGLD's preconditioned metric is and what it does to θ's dynamics."""
    if config.preconditioner == "none":
        return "no preconditioner: plain Entropy-MCMC steps, θ pulled toward θa"
    m = config.coupling_metric
    strength = pull_strength(m)
    if strength == 0.0:
        return ("joint metric (the exact inverse Hessian of the joint): θ moves as preconditioned SGLD on f and "
                "ignores θa, so θ's chain is the SGLD baseline's; only θa's marginal is Entropy-MCMC's")
    if m == "block":
        return ("block-Jacobi metric: θ pulled toward θa as in Entropy-MCMC; θ and θa move together slowly "
                "along the flattest directions")
    return (f"pulled joint metric, strength ε = {strength:g}: θ moves as preconditioned SGLD on f plus a pull toward "
            f"θa that closes a fraction {strength:g} x step of the gap θa − θ per step in the flat directions (less "
            "in the stiff ones), with the exact metric's mixing; the gap's variance carries a larger "
            "discretisation error than θ's")


def schedule_text(config: MNIST79Config) -> str:
    """``(500 warm-up + 5000 iterations, every 5th kept: 1000 draws per chain)``."""
    every = "every iteration kept" if config.thin == 1 else f"every {config.thin}th kept"
    return (f"({config.warmup} warm-up + {config.num_samples} iterations, {every}: "
            f"{config.num_samples // config.thin} draws per chain)")


def threads_text(report: dict) -> str:
    """" Ran on 1 torch thread (why)." from ``report["threads"]`` (the thread count changes the draws)."""
    threads = report.get("threads") or {}
    if not threads:
        return ""
    count = threads["count"]
    return f" Ran on {count} torch thread{'s' if count > 1 else ''} ({threads['why']}); another count changes the draws."


def metrics_text(report: dict) -> str:
    """The lines the study prints at its end: BMA metrics, diagnostics, verdicts, the reference."""
    lines = []
    for name, per_use in report.get("bma", {}).items():
        for use, m in per_use.items():
            lines.append(f"  BMA {name:>12} over {use:>5}: accuracy {m['accuracy']:.4f}, NLL {m['nll']:.4f}, "
                         f"ECE {m['ece']:.4f} ({ECE_BINS} equal-width bins), Brier {m['brier']:.4f}")
    for name, groups in report.get("diagnostics", {}).items():
        for group, d in groups.items():
            lines.append(f"  {name:>12} {group}: max R-hat {d['max_r_hat']:.4f}, min ESS bulk "
                         f"{d['min_ess_bulk']:.0f}, min ESS tail {d['min_ess_tail']:.0f}")
        lines.append(f"  {name:>12}: {report['verdict'][name]['text']}")
    for name, per_block in report.get("against_reference", {}).items():
        for block, c in per_block.items():
            lines.append(f"  {name:>12} {block} against {report['config']['reference']}: " + comparison_text(c))
    if "reference_worth" in report:
        lines.append("  " + report["reference_worth"].replace("**", ""))
    return "\n".join(lines)


def reference_worth(report: dict) -> str:
    """What the comparison with the reference is worth, from the reference's own convergence."""
    ref = report["config"]["reference"]
    verdict, groups = report["verdict"][ref], report["diagnostics"][ref]
    ess = min(d["min_ess_bulk"] for d in groups.values())
    error = f"its means carry a Monte Carlo error of about {1 / ess ** 0.5:.3f} sd at the worst coordinate (1/√ESS)"
    if verdict["converged"]:
        return f"The reference converged by the same rule; {error}."
    above = sum(d["above_r_hat"] for d in groups.values())
    total = sum(d["coordinates"] for d in groups.values())
    return (f"**The reference did not converge by the same rule** ({above} of {total} coordinates have R-hat "
            f"above {MAX_R_HAT}; min bulk ESS {ess:.0f}): {error}, and its chains disagree in those coordinates, "
            "so in those coordinates a sampler's difference from the reference may be the reference's own error.")


def comparison_text(c: dict) -> str:
    return (f"|Δmean|/sd median {c['median_abs_mean_diff']:.3f} (worst {c['max_abs_mean_diff']:.2f}), "
            f"sd ratio median {c['median_sd_ratio']:.3f} (range {c['min_sd_ratio']:.2f}-{c['max_sd_ratio']:.2f})")


#: |z| of the cross-chain correlation above which the chains are called correlated
CHAIN_CORRELATION_Z = 4.0

SCHEME_TEXT = {"per_chain": "each drawing its own minibatches",
               "shared": "sharing one minibatch per step (and so their gradient noise)",
               "full batch": "on the full batch"}


def chains_text(chains: dict) -> str:
    """How one sampler's chains ran and whether their increments correlate (a ``report["chains"]`` entry)."""
    text = f"{chains['chain_method']} chains, {SCHEME_TEXT[chains['minibatches']]}"
    if "mean" not in chains:
        return text
    verdict = ("consistent with independent chains" if abs(chains["z"]) < CHAIN_CORRELATION_Z else
               "the chains are correlated, which R-hat and ESS do not allow for")
    return (f"{text}; correlation between chains' increments {chains['mean']:+.4f} (null sd "
            f"{chains['null_sd']:.4f}, z = {chains['z']:+.1f}): {verdict}")


def report_markdown(report: dict, config: MNIST79Config) -> str:
    """``report.md``: the run's settings, the BMA table and figures, the diagnostics and verdicts."""
    files = report["files"]
    md = [f"# MNIST 7 vs 9: {config.sampler}", ""]
    if report["interrupted"]:
        kept = ", ".join(f"{name} {n}" for name, n in report["draws_per_chain"].items())
        md += [f"**The run was interrupted** ({report['interrupted_by']}): the files hold the draws made before it "
               f"stopped, per chain: {kept} (of the schedule below).", ""]
    md += [f"Bayesian logistic regression (784 weights + bias, prior N(0, {config.prior_scale}²)) on "
           f"{report['data']['n_train']} training images from {report['data']['source']}; "
           f"test metrics on {report['data']['n_test']} images.",
           f"Sampler `{config.sampler}` (η = {config.eta}, step size {config.step_size}"
           + (f", momentum {config.momentum}" if {config.sampler, config.baseline} & set(MOMENTUM_SAMPLERS) else "")
           + ", preconditioner "
           f"{config.preconditioner}, minibatch {report['batch_size_used']}), {config.chains} chain(s) × "
           f"{schedule_text(config)}, "
           f"seed {config.seed}. Seconds: "
           + ", ".join(f"{k} {v}" for k, v in report["seconds"].items()) + "." + threads_text(report), ""]
    ranks = report.get("ranks") or {}
    if ranks.get("world_size", 1) > 1:
        md += [f"Ran on {ranks['world_size']} ranks (torch.distributed, {ranks['backend']} backend): each sampler's "
               "chains were split over the ranks and gathered to rank 0, which wrote these files. One seed gives "
               "the same draws on any number of ranks, up to floating-point round-off (a rank sums its "
               "chains' curvature in another order than one process does).", ""]
    if report.get("chains"):
        md += ["## Are the chains independent?", "",
               "The correlation between two chains' per-draw moves, averaged over chain pairs and the 785 "
               "coordinates; its null sd is measured by shifting one chain of each pair in time. Chains that "
               f"share a minibatch share its gradient noise and correlate; |z| ≥ {CHAIN_CORRELATION_Z:g} is called "
               "correlated.", ""]
        md += [f"- **{name}**: {chains_text(c)}." for name, c in report["chains"].items()]
        md += [""]
    if report.get("guidance"):
        md += ["## Does θ follow θa?", "",
               f"Metric of `{config.sampler}`: {metric_text(config)}. Per pixel, the correlation between θ's next "
               "move (from one kept draw to the next) and the gap θa − θ; averaged over pixels, with the share of "
               "pixels where it is positive. If θ ignored θa it would be 0 (about ± the null sd per pixel). The "
               "gap ‖θ − θa‖ (root mean square over the draws) is √(dη) under the exact joint; a metric that pulls θ "
               "makes the gap its fast direction, whose discretisation error is larger.", "",
               "| sampler | mean correlation | positive in | null sd per pixel | gap ‖θ − θa‖ | exact √(dη) |",
               "|---|---|---|---|---|---|"]
        md += [f"| {name} | {g['mean']:+.4f} | {g['positive_share']:.0%} | {g['null_sd']:.4f} | "
               f"{g.get('gap_rms', float('nan')):.2f} | {g.get('gap_exact', float('nan')):.2f} |"
               for name, g in report["guidance"].items()]
        md += [""]
    md += [
           "## Bayesian model average on the test set", "",
           f"| sampler | draws | accuracy | NLL | ECE ({ECE_BINS} equal-width bins) | ECE ({ECE_BINS} equal-count bins) "
           "| Brier |", "|---|---|---|---|---|---|---|"]
    for name, per_use in report["bma"].items():
        for use, m in per_use.items():
            md.append(f"| {name} | {use} | {m['accuracy']:.4f} | {m['nll']:.4f} | {m['ece']:.4f} | "
                      f"{m['ece_mass']:.4f} | {m['brier']:.4f} |")
    md += ["", f"The test set has {report['data']['n_test']} images: one image is "
           f"{1 / report['data']['n_test']:.3f} of accuracy, and each panel's title gives the standard error over "
           "the test points of its final value, shared by the curves. The curves' x axis counts gradient evaluations per chain: "
           f"EntropyHMC's and the preconditioner's Hessian-vector products (two each) are on all "
           f"{report['data']['n_train']} training images, the stochastic-gradient steps' on minibatches of "
           f"{report['batch_size_used']}. The reliability diagram bins the test images into {RELIABILITY_BINS} bins of "
           f"equal count; the table's ECEs use {ECE_BINS} bins, of equal width and of equal count.", "",
           f"![running BMA]({files['bma_curves']})", "", f"![reliability diagram]({files['reliability']})", "",
           "## Convergence diagnostics (ArviZ)", "",
           f"Verdict by ArviZ's thresholds (rank-normalised split R-hat ≤ {MAX_R_HAT}, bulk and tail ESS ≥ "
           f"{MIN_ESS} for every coordinate; Vehtari et al. 2021):", ""]
    for name, v in report["verdict"].items():
        md.append(f"- **{name}**: {v['text']}")
    md += ["", f"| sampler | variables | max R-hat | coordinates with R-hat > {MAX_R_HAT} | min ESS bulk | "
           "median ESS bulk | min ESS tail |", "|---|---|---|---|---|---|---|"]
    for name, groups in report["diagnostics"].items():
        for group, d in groups.items():
            md.append(f"| {name} | {group} | {d['max_r_hat']:.4f} | {d['above_r_hat']} of {d['coordinates']} | "
                      f"{d['min_ess_bulk']:.0f} | {d['median_ess_bulk']:.0f} | {d['min_ess_tail']:.0f} |")
    md += ["", "R-hat and ESS are ArviZ's, unrounded (`az.summary` rounds R-hat to two decimals)."]
    if "against_reference" in report:
        ref = report["config"]["reference"]
        md += ["", f"## Against the exact reference ({ref})", "",
               f"Per coordinate, the difference of the means in units of the reference's sd and the ratio "
               f"of the sds, against {ref}'s draws. " + reference_worth(report), "",
               "| sampler | variables | median abs(Δmean)/sd | worst | median sd ratio | sd ratio range |",
               "|---|---|---|---|---|---|"]
        for name, per_block in report["against_reference"].items():
            for block, c in per_block.items():
                md.append(f"| {name} | {block} | {c['median_abs_mean_diff']:.3f} | {c['max_abs_mean_diff']:.2f} | "
                          f"{c['median_sd_ratio']:.3f} | {c['min_sd_ratio']:.2f}-{c['max_sd_ratio']:.2f} |")
    md += ["", f"Every variable: [`{files['summary']}`]({files['summary']}). Draws (θ and θa, sample stats): "
           f"`{files['samples']}` (`arviz.from_netcdf`).", "",
           f"![trace]({files['trace']})", "", f"![rank]({files['rank']})", ""]
    if "weights" in files:
        md += ["## θ against θa", "", f"![weights]({files['weights']})", ""]
    md += [f"Convergence against the Wasserstein bound: {report['convergence']}.", ""]
    return "\n".join(md)
