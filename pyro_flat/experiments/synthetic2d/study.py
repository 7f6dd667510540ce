r"""The study behind ``pyro-flat synthetic2d``: started on the ridge, which basin does each sampler end in?

The energy is :func:`~pyro_flat.mixtures.sharp_flat_2d`: a sharp mode (30% of the mass) and a flat
one (70%). As in the paper's 2-D figures the chains start **at the saddle** between them. Every
measure is the share of chains in the **flat basin of U = −log p**: the points from which gradient
descent on the posterior's energy ends at the flat mode
(:meth:`~pyro_flat.mixtures.SharpFlatMixture.in_flat_basin`). Beside each measured share stands
the exact share of the same set under the law the variable samples at stationarity, integrated
by quadrature: the posterior p for SGLD's and EntropySGLD's θ, the smoothed posterior
``p * N(0, ηI)`` for θa, ``exp(−E U(θ + σε))`` for FlatSGLD (SASGLD's law has no closed form and
SGD is an optimiser). Monte Carlo errors are binomial over independent chains.

Three runs:

- **ridge**: ``num_chains`` chains of each sampler from the saddle, ``num_steps`` steps; EntropySGLD
  also preconditioned under each of ``coupling_metrics`` (with a fixed identity metric for θ, so
  that θ's own steps are SGLD's and the metrics differ only in how θ feels θa: not at all under
  ``"joint"``, through the pull :math:`\varepsilon K(\theta-\theta_a)/\eta` under ``"pulled"``);
- **line**: ``line_chains`` chains from each of ``line_points`` points on the segment from the sharp
  to the flat mode, ``line_steps`` steps: the share that ends in the flat basin against the start;
- **exact**: the landscape of ``p_η`` for each η (saddle, barriers, highest peak, basin masses).

>>> config = Synthetic2DConfig.reduced(num_chains=50, num_steps=100, line_points=3, line_chains=10,
...                                    line_steps=50, progress=False)
>>> report = run_synthetic2d(config, log=lambda line: None)
>>> [row["label"] for row in report["ridge"]][:3]
['SGD θ', 'SGLD θ', 'EntropySGLD θ (η = 0.25)']
>>> report["exact"]["posterior_flat_basin"]   # exact share of p in the flat basin
0.7
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

import pyro

from ...kernels import make_kernel
from ...models.mixtures import SharpFlatMixture, sharp_flat_2d
from .. import plots
from ..compare import compare_text, differ
from ..configs import Synthetic2DConfig
from ..output import hold_signals, study_output, threads_record

#: Sample paths drawn per panel of ``paths.png``.
PATHS_SHOWN = 3
#: The η of the exact landscape figure's right panel.
LANDSCAPE_ETAS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.44, 0.6, 0.8, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 4.0, 6.0)


@dataclass
class _Sampler:
    label: str
    name: str
    settings: Dict[str, float] = field(default_factory=dict)

    @property
    def metric(self) -> Optional[str]:
        """EntropySGLD's coupling metric, for the preconditioned runs (None: the plain kernel)."""
        return self.settings.get("coupling_metric")

    def kernel(self, mixture: SharpFlatMixture, step_size: float):
        potential = lambda p: -mixture.log_prob(p["theta"])  # noqa: E731
        # a fixed identity metric for θ: the metrics differ only in how they couple θ and θa
        preconditioner = {} if self.metric is None else {"preconditioner": torch.ones(2)}
        return make_kernel(self.name, potential_fn=potential, step_size=step_size, **self.settings, **preconditioner)

    def variables(self) -> List[Tuple[str, str]]:
        """``(site, label)`` of each variable reported."""
        if self.name == "entropy-sgld":
            eta = f"(η = {self.settings['eta']:g}" + ("" if self.metric is None else f", {self.metric} metric") + ")"
            return [("theta", f"EntropySGLD θ {eta}"), ("theta_aux", f"EntropySGLD θa {eta}")]
        return [("theta", f"{self.label} θ")]


def _samplers(config: Synthetic2DConfig) -> List[_Sampler]:
    return ([_Sampler("SGD", "sgd"), _Sampler("SGLD", "sgld")]
            + [_Sampler("EntropySGLD", "entropy-sgld", {"eta": eta}) for eta in config.etas]
            + [_Sampler(f"SASGLD (ρ = {config.rho:g})", "sasgld", {"rho": config.rho}),
               _Sampler(f"FlatSGLD (σ = {config.sigma:g})", "flat-sgld", {"sigma": config.sigma})]
            + [_Sampler("EntropySGLD", "entropy-sgld", {"eta": eta, "coupling_metric": metric})
               for eta in config.etas for metric in config.coupling_metrics])


def _stationary_law(mixture: SharpFlatMixture, sampler: _Sampler, site: str, exact: dict
                    ) -> Tuple[str, Optional[float]]:
    """The law ``site`` of ``sampler`` follows at stationarity, and its exact flat-basin share."""
    if sampler.name == "sgd":
        return "none (an optimiser: it stops at the minimum of the basin it enters)", None
    if sampler.name == "sasgld":
        return "no closed form (the SAM gradient is not the gradient of an energy)", None
    if sampler.name == "flat-sgld":
        return f"exp(−E U(θ + σε)), σ = {sampler.settings['sigma']:g}", exact["flat_sgld_flat_basin"]
    if site == "theta_aux":
        eta = sampler.settings["eta"]
        return f"p * N(0, {eta:g} I)", exact["smoothed"][str(float(eta))]["flat_basin_of_U"]
    return "p", exact["posterior_flat_basin"]


def _share(flat: torch.Tensor) -> Tuple[float, float]:
    """Share of True and its binomial standard error."""
    p = float(flat.double().mean())
    return p, math.sqrt(max(p * (1 - p), 0.0) / flat.numel())


def exact_landscape(mixture: SharpFlatMixture, etas, sigma: float) -> dict:
    """The exact facts of the study: for each η the saddle and barriers of ``U_η``, which peak is
    highest, and the mass of ``p_η`` in the flat basin of U and in its own flat basin."""
    rows = {}
    for eta in sorted({0.0, *map(float, etas)}):
        points = mixture.critical_points(eta)
        barriers = mixture.barriers(eta)
        rows[str(eta)] = {
            "eta": eta,
            "saddle": None if points["saddle"] is None else points["saddle"].tolist(),
            "barrier_out_of_sharp": None if barriers is None else barriers[0],
            "barrier_out_of_flat": None if barriers is None else barriers[1],
            "highest_peak": mixture.highest_peak(eta),
            "flat_component_mass": float(mixture.weights[int(np.argmax(mixture.scales))]),
            "flat_basin_of_U": round(mixture.flat_basin_mass(eta=eta), 4),
            "own_flat_basin": round(mixture.flat_basin_mass(eta=eta, basin_eta=eta), 4),
        }
    return {"smoothed": rows, "posterior_flat_basin": rows["0.0"]["flat_basin_of_U"],
            "peak_crossover": round(mixture.peak_crossover(), 4),
            "unimodal_beyond": round(mixture.unimodal_beyond(), 4),
            "flat_sgld_flat_basin": round(mixture.flat_basin_mass(mixture.randomly_smoothed_log_density(sigma, 8)), 4)}


def run_synthetic2d(config: Synthetic2DConfig, *, log: Callable[[str], None] = print,
                    landscape_etas: Sequence[float] = ()) -> dict:
    """Run the study (no files written) and return its report; the ridge run's states are under
    ``report["states"]`` (label -> ``(marks, chains, 2)`` array) for the figures. The exact
    landscape is computed at ``config.etas`` and ``landscape_etas`` (the study's figure passes
    :data:`LANDSCAPE_ETAS`; each η costs a few seconds of quadrature)."""
    from ...convergence.runner import run_ensemble

    config.validate()
    mixture = sharp_flat_2d()
    exact = exact_landscape(mixture, sorted({*config.etas, *landscape_etas}), config.sigma)
    saddle = mixture.saddle().float()
    marks = config.marks()
    sharp, flat = mixture.sharp_loc, mixture.flat_loc
    positions = torch.linspace(0.0, 1.0, config.line_points)
    starts = (sharp + positions[:, None] * (flat - sharp)).repeat_interleave(config.line_chains, 0)
    early = marks.index(min(marks, key=lambda k: abs(k - config.num_steps // 10)))  # the step T/10
    ridge, line, states = [], {}, {}
    for sampler in _samplers(config):
        pyro.set_rng_seed(config.seed)
        run = run_ensemble(sampler.kernel(mixture, config.step_size), saddle, config.num_chains, marks,
                           progress_bar=config.progress)
        if sampler.metric is None:  # the preconditioned runs answer one question, from the ridge only
            pyro.set_rng_seed(config.seed)
            ends = run_ensemble(sampler.kernel(mixture, config.step_size), starts, len(starts), [config.line_steps],
                                progress_bar=False)[config.line_steps]
        for site, label in sampler.variables():
            path = torch.stack([run[k][site] for k in marks])  # (marks, chains, 2)
            stuck = plots.at_saddle(mixture, path)  # in neither basin
            flat_path = mixture.in_flat_basin(path) & ~stuck
            share, se = _share(flat_path[-1])
            by_step = flat_path.double().mean(1).tolist()
            saddle_share = float(stuck[-1].double().mean())
            law, exact_share = _stationary_law(mixture, sampler, site, exact)
            ridge.append({"label": label, "sampler": sampler.name, "settings": dict(sampler.settings),
                          "variable": site, "share": share, "se": se,
                          "chains": config.num_chains, "early_step": marks[early], "early_share": by_step[early],
                          "at_saddle": saddle_share, "at_saddle_by_step": stuck.double().mean(1).tolist(),
                          "law": law, "exact": exact_share, "share_by_step": by_step})
            if sampler.metric is None:
                states[label] = path.numpy()
                line[label] = mixture.in_flat_basin(ends[site]).reshape(config.line_points, -1).double().mean(1).tolist()
            exact_text = "no exact value" if exact_share is None else f"exact stationary {exact_share:.3f}"
            saddle_text = f", {saddle_share:.3f} still at the saddle (neither basin)" if saddle_share else ""
            log(f"{label}: {share:.3f} ± {se:.3f} of chains in the flat basin after {config.num_steps} steps"
                f"{saddle_text} ({exact_text}: {law})")
    saddle_position = float((mixture.saddle().float() - sharp) @ (flat - sharp) / ((flat - sharp) ** 2).sum())
    report = {"config": asdict(config), "threads": threads_record(), "mixture": asdict(mixture), "exact": exact, "marks": marks,
              "ridge": ridge, "line": {"position": [round(x, 4) for x in positions.tolist()], "saddle_position": saddle_position,
                                       "share": line},
              "findings": findings(ridge, exact, config)}
    for line_text in report["findings"]:
        log(line_text)
    report["states"] = states
    return report


def _compare(a: dict, b: dict) -> str:
    """``a``'s share against ``b``'s, by the studies' one rule (:mod:`.compare`)."""
    return compare_text(a["share"], a["se"], b["share"], b["se"], n=min(a["chains"], b["chains"]))


def _share_text(row: dict) -> str:
    return f"{row['share']:.3f} ± {row['se']:.3f}"


def find_row(ridge: List[dict], sampler: str, variable: str = "theta", **settings) -> Optional[dict]:
    """The row of ``sampler``'s ``variable`` run with ``settings`` (e.g. ``eta=0.5``), or ``None``."""
    return next((r for r in ridge if r["sampler"] == sampler and r["variable"] == variable
                 and all(r["settings"].get(k) == v for k, v in settings.items())), None)


def findings(ridge: List[dict], exact: dict, config: Synthetic2DConfig) -> List[str]:
    """Sentences that state what the numbers show (computed from them, for the report and console)."""
    sgld = find_row(ridge, "sgld")
    landscape = exact["smoothed"]["0.0"]
    lines = [f"From the saddle, {_share_text(sgld)} of SGLD's chains are in the flat basin after "
             f"{config.num_steps} steps ({sgld['early_share']:.3f} at step {sgld['early_step']}), against "
             f"{exact['posterior_flat_basin']:.3f} at stationarity: the barrier out of the sharp basin is "
             f"{landscape['barrier_out_of_sharp']:.1f} (in units of the temperature), so a chain keeps the basin "
             "it falls into in its first steps."]
    sgd = find_row(ridge, "sgd")
    if sgd is not None and sgd["at_saddle"] > 0.5:
        lines.append(f"SGD has no noise and the gradient vanishes at the saddle: {sgd['at_saddle']:.0%} of its "
                     f"chains are still there after {config.num_steps} steps, in neither basin (counted apart: "
                     f"{sgd['share']:.3f} in the flat basin). From the segment between the modes (line.png) it "
                     "ends in the basin it starts in.")
    for eta in config.etas:
        theta, aux = (find_row(ridge, "entropy-sgld", site, eta=eta, coupling_metric=None)
                      for site in ("theta", "theta_aux"))
        smoothed = exact["smoothed"][str(float(eta))]
        lines.append(
            f"η = {eta:g}: EntropySGLD θ is in the flat basin in {_share_text(theta)} of chains against SGLD's "
            f"{sgld['share']:.3f}: {_compare(theta, sgld)}. θa is there in {_share_text(aux)} against "
            f"{smoothed['flat_basin_of_U']:.3f} for its stationary law p * N(0, {eta:g} I), which spreads out of "
            f"the narrow sharp basin; in the basins of its own smoothed energy that law puts "
            f"{smoothed['own_flat_basin']:.3f} in the flat one.")
        lines += _metric_findings(ridge, sgld, theta, eta, config)
    lines += _pull_verdict(ridge, config)
    for row in ridge:
        if row["sampler"] in ("sasgld", "flat-sgld"):
            exact_text = ("" if row["exact"] is None
                          else f"; its stationary law puts {row['exact']:.3f} in the flat basin")
            lines.append(f"{row['label']}: {_share_text(row)} ({row['early_share']:.3f} at step "
                         f"{row['early_step']}) against SGLD's {sgld['share']:.3f}: {_compare(row, sgld)}"
                         f"{exact_text}.")
    lines.append(f"Smoothing keeps each component's mass ({landscape['flat_component_mass']:.2f} flat for every η), "
                 f"moves the highest peak to the flat mode for η > {exact['peak_crossover']:.2f} and leaves a "
                 f"single mode for η > {exact['unimodal_beyond']:.2f}. " + own_basin_text(exact))
    return lines


def _metric_findings(ridge: List[dict], sgld: dict, plain: dict, eta: float, config: Synthetic2DConfig) -> List[str]:
    """Does EntropySGLD's coupling metric change which basin θ ends in? Each metric's share against
    the joint metric's (under which θ never feels θa), the plain kernel's and SGLD's."""
    rows = {m: find_row(ridge, "entropy-sgld", "theta", eta=eta, coupling_metric=m) for m in config.coupling_metrics}
    if not rows:
        return []
    shares = ", ".join(f"{m} {_share_text(r)}" for m, r in rows.items())
    text = (f"η = {eta:g}, preconditioned (a fixed identity metric for θ, so θ's own steps are SGLD's): θ is in the "
            f"flat basin in {shares} of chains, against {_share_text(plain)} for the plain kernel and "
            f"{_share_text(sgld)} for SGLD.")
    if "joint" in rows:
        for m, r in rows.items():
            if m != "joint":
                text += f" The {m} metric against the joint one (no pull): {_compare(r, rows['joint'])}."
        text += f" The joint metric against SGLD: {_compare(rows['joint'], sgld)}."
    return [text]


def _pull_verdict(ridge: List[dict], config: Synthetic2DConfig) -> List[str]:
    """Across η: does the pulled metric's θ end in the flat basin more or less often than the joint
    metric's, under which θ never feels θa?"""
    if not {"pulled", "joint"} <= set(config.coupling_metrics):
        return []
    pairs = [(eta, *(find_row(ridge, "entropy-sgld", "theta", eta=eta, coupling_metric=m) for m in ("pulled", "joint")))
             for eta in config.etas]
    differs = [eta for eta, pulled, joint in pairs if differ(pulled["share"], pulled["se"], joint["share"], joint["se"],
                                                                 n=min(pulled["chains"], joint["chains"]))]
    if not differs:
        return ["The pull does not change which basin θ ends in: under the pulled metric θ is in the flat basin as "
                "often as under the joint metric, within Monte Carlo error, at every η (a chain picks its basin in "
                "its first ~100 steps, while θa is still near θ)."]
    return [f"The pull changes the share of θ in the flat basin beyond Monte Carlo error at η = "
            f"{', '.join(f'{eta:g}' for eta in differs)} (of {len(pairs)} values)."]


def own_basin_text(exact: dict, tolerance: float = 0.01) -> str:
    """Where p_η's mass in the flat basin of its own energy stays within ``tolerance`` of the flat
    component's mass, and what it becomes as the two modes merge (from ``exact["smoothed"]``)."""
    rows = sorted((r for r in exact["smoothed"].values() if r["saddle"] is not None), key=lambda r: r["eta"])
    mass = rows[0]["flat_component_mass"]
    kept = []
    for r in rows:  # the leading run of η values that stay near the component's mass
        if abs(r["own_flat_basin"] - mass) > tolerance:
            break
        kept.append(r)
    values = [r["own_flat_basin"] for r in kept]
    text = (f"In the basins of its own energy, p_η keeps {min(values):.3f}-{max(values):.3f} in the flat one for "
            f"η ≤ {kept[-1]['eta']:g}" if kept else "")
    beyond = rows[len(kept):]
    if beyond:
        shown = beyond[:1] + beyond[1:][-1:]  # the first and the last η past that range
        values = ", ".join(f"{r['own_flat_basin']:.3f} at η = {r['eta']:g}" for r in shown)
        text += (f"; beyond, the saddle moves toward the sharp mode and that share grows before the modes merge "
                 f"({values})")
    return text + "."


def run_synthetic2d_study(config: Synthetic2DConfig, *, log: Callable[[str], None] = print) -> dict:
    """Run the study and write ``report.md``, ``report.json`` and four figures to ``config.out``."""
    import matplotlib

    matplotlib.use("Agg")
    config.validate()
    with study_output(config, log) as staging:  # --out checked first
        report = run_synthetic2d(config, log=log, landscape_etas=LANDSCAPE_ETAS)
        hold_signals()  # the chains have run: a Ctrl-C from here waits until the files are written
        states = report.pop("states")
        mixture = sharp_flat_2d()
        plain = [r for r in report["ridge"] if "coupling_metric" not in r["settings"]]
        figures = {
            "paths.png": plots.plot_basin_endpoints(mixture, states, plain, paths_shown=PATHS_SHOWN),
            "shares.png": plots.plot_basin_shares(report["marks"], plain),
            "line.png": plots.plot_line_shares(report["line"], config.line_steps),
            "landscape.png": plots.plot_smoothed_landscape(mixture, config.etas, LANDSCAPE_ETAS, report["exact"]),
        }
        if len(plain) < len(report["ridge"]):
            figures["metrics.png"] = plots.plot_metric_shares(report["marks"], report["ridge"])
        plots.save_figures(figures, staging)
        (staging / "report.md").write_text(report_markdown(report))
        (staging / "report.json").write_text(json.dumps(report, indent=2))
    log(f"wrote {Path(config.out).expanduser()}: report.md, report.json, {', '.join(figures)}")
    return report


def report_markdown(report: dict) -> str:
    c, exact = report["config"], report["exact"]
    lines = ["# Sharp and flat basins in 2-D, from the ridge", "",
             f"Energy U = −log p of `sharp_flat_2d()` (sharp mode: 30% of the mass, sd 0.15; flat mode: 70%, "
             f"sd 0.8). {c['num_chains']} chains per sampler start at the saddle and make {c['num_steps']} steps "
             f"of size {c['step_size']:g} at temperature 1. Measure: the share of chains in the **flat basin of U** "
             "(gradient descent on U from the point ends at the flat mode), ± its binomial standard error. "
             "Exact: the share of the same set under the variable's stationary law, by quadrature "
             "(the discretisation bias of a finite step is not in it).", "",
             f"| sampler and variable | in the flat basin, step {report['ridge'][0]['early_step']} | in the flat "
             f"basin, step {c['num_steps']} | still at the saddle | exact stationary share | stationary law |",
             "|---|---|---|---|---|---|"]
    for r in report["ridge"]:
        exact_text = "–" if r["exact"] is None else f"{r['exact']:.3f}"
        lines.append(f"| {r['label']} | {r['early_share']:.3f} | {r['share']:.3f} ± {r['se']:.3f} | "
                     f"{r['at_saddle']:.2f} | {exact_text} | {r['law']} |")
    lines += ["", "## What the numbers show", ""] + [f"- {t}" for t in report["findings"]]
    lines += ["", "## The exact landscape of the smoothed posterior p_η = p * N(0, ηI)", "",
              "| η | saddle | barrier out of sharp | barrier out of flat | highest peak | flat component mass "
              "| p_η in U's flat basin | p_η in its own flat basin |", "|---|---|---|---|---|---|---|---|"]
    for row in exact["smoothed"].values():
        saddle = "none (unimodal)" if row["saddle"] is None else "({:.2f}, {:.2f})".format(*row["saddle"])
        barrier = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
        lines.append(f"| {row['eta']:g} | {saddle} | {barrier(row['barrier_out_of_sharp'])} | "
                     f"{barrier(row['barrier_out_of_flat'])} | {row['highest_peak']} | "
                     f"{row['flat_component_mass']:.2f} | {row['flat_basin_of_U']:.3f} | {row['own_flat_basin']:.3f} |")
    lines += ["", f"The flat peak of p_η is the higher one for η > {exact['peak_crossover']:.3f}; p_η has a single "
              f"mode for η > {exact['unimodal_beyond']:.3f}.", "",
              f"## From the line between the modes ({c['line_chains']} chains per start, {c['line_steps']} steps)",
              "", "`line.png`: the share ending in the flat basin against the start point.", "",
              "Figures: `paths.png` (final states and sample paths), `shares.png` (share against step), "
              "`line.png`, `landscape.png` (the exact smoothed landscape), `metrics.png` (EntropySGLD under each "
              "coupling metric, when run)."]
    return "\n".join(lines) + "\n"


__all__ = ["Synthetic2DConfig", "run_synthetic2d", "run_synthetic2d_study", "exact_landscape", "findings",
           "report_markdown"]
