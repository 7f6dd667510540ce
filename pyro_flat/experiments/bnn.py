r"""The flatness study behind ``pyro-flat bnn``: flat-seeking samplers on a Bayesian neural network.

:func:`run_bnn_study` trains a :class:`~pyro_flat.models.BayesianMLP` on some MNIST digits (the
embedded data by default) with SGLD, EntropySGLD, SASGLD and FlatSGLD under **the same budget of
gradient evaluations** per chain (``num_chains`` chains run as one batched network, thinned inside
the kernel so that only the kept draws are stored), then reports, per sampler: the top Hessian
eigenvalue and the Hessian
trace of the full-data negative log-likelihood (the training loss, summed; the Gaussian prior
would only add :math:`I/\sigma_p^2`) at collected draws (:mod:`pyro_flat.flatness`), the BMA test
accuracy, NLL and ECE, and the out-of-distribution AUROC (predictive entropy on the held-out
digits). It draws the top of the Hessian spectrum (the share of eigenvalues above λ, by SLQ) and the
interpolation and perturbation curves.
:func:`run_toy_study` runs the same samplers on the 2-D sharp/flat energy, from the sharp mode.

>>> cfg = BNNConfig(grad_evals=100, num_draws=5, progress=False)
>>> cfg.iterations(2), cfg.in_digits, cfg.thinning(2)  # 25 iterations after burn-in, 5 kept
(50, (0, 1, 2, 3, 4), 5)
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from typing import Callable, List, Tuple

import numpy as np
import torch

import pyro

from .. import flatness, metrics
from ..datasets import load_mnist_ood
from ..mixtures import sharp_flat_2d
from ..kernels import kernel_class, make_kernel
from ..mcmc import MCMC
from ..models import BayesianMLP
from ..predictive import bma_predict
from .compare import best_text, compare_text, differ
from .configs import BNN_SAMPLERS, VI_METHODS, BNNConfig
from .output import StudyError, hold_signals, study_output



def make_bnn_kernel(name: str, config: "BNNConfig", model_or_potential, toy: bool = False):
    """The sampler ``name`` with the study's settings, on the MLP or (``toy``) the 2-D energy."""
    target = ({"model": model_or_potential} if isinstance(model_or_potential, BayesianMLP)
              else {"potential_fn": model_or_potential})
    if toy:
        settings = dict(eta=config.toy_eta, rho=config.toy_rho, sigma=config.toy_sigma)
    else:
        settings = dict(eta=config.eta, rho=config.rho, sigma=config.sigma,
                        preconditioner=None if config.preconditioner == "none" else config.preconditioner)
    return make_kernel(name, **target, step_size=config.step(toy), temperature=config.temperature,
                       **settings)




def make_elbo(key: str, config: "BNNConfig"):
    """The ELBO of a variational method of the study, and its gradient evaluations per step."""
    from pyro.infer import Trace_ELBO

    from ..variational import SABMA_ELBO, SAM_ELBO

    if key == "bbb":
        return Trace_ELBO(), 1, "BBB (Trace_ELBO)"
    if key == "sam":
        return SAM_ELBO(config.sam_rho), 2, f"SAM_ELBO (ρ = {config.sam_rho:g})"
    if key == "sabma":
        return SABMA_ELBO(config.sabma_gamma), 2, f"SABMA_ELBO (γ = {config.sabma_gamma:g})"
    raise StudyError(f"unknown variational method {key!r}: one of {', '.join(VI_METHODS)}")


def sampler_label(name: str) -> str:
    """The class name of a registered sampler (``"entropy-sgld"`` -> ``"EntropySGLD"``)."""
    return kernel_class(name).__name__


def sample_chains(key: str, name: str, config: BNNConfig, model: BayesianMLP, data, log) -> Tuple[dict, float, int]:
    """``num_chains`` vectorized chains; draws ``{site: (chain, draw, ...)}``, the seconds taken and
    the gradient evaluations per chain."""
    kernel = make_bnn_kernel(key, config, model)
    iterations = config.iterations(kernel.grads_per_iteration)
    warmup = int(config.warmup_fraction * iterations)
    thinning = config.thinning(kernel.grads_per_iteration)
    mcmc = MCMC(kernel, num_samples=iterations - warmup, warmup_steps=warmup, num_chains=config.num_chains,
                thinning=thinning, disable_progbar=not config.progress)
    pyro.set_rng_seed(config.seed)
    start = time.perf_counter()
    mcmc.run(data.X_train, data.y_train, batch_size=config.batch_size)
    seconds = time.perf_counter() - start
    log(f"{name}: {config.num_chains} chains ({mcmc.chain_method}, minibatches {mcmc.minibatches}) x {iterations} "
        f"iterations ({kernel.num_grad_evals} gradient evaluations each) in {seconds:.1f} s")
    return mcmc.get_samples(group_by_chain=True), seconds, kernel.num_grad_evals


def _fit_variational(key: str, config: BNNConfig, model: BayesianMLP, data, log) -> Tuple[str, dict, float, int, dict]:
    """SVI with an AutoNormal guide under the study's gradient budget; returns the label,
    ``num_chains * num_draws`` draws of the guide ``{site: (draw, ...)}``, seconds, gradient
    evaluations and the loss (per training image) over the last tenth of the steps and the tenth
    before, which says whether the fit was still improving."""
    from pyro.infer import SVI
    from pyro.infer.autoguide import AutoNormal
    from tqdm.auto import tqdm

    elbo, grads_per_step, label = make_elbo(key, config)
    steps = (config.svi_grad_evals or config.grad_evals) // grads_per_step
    pyro.clear_param_store()
    pyro.set_rng_seed(config.seed)
    guide = AutoNormal(model, init_scale=config.svi_init_scale)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": config.svi_lr}), elbo)
    start = time.perf_counter()
    losses = [svi.step(data.X_train, data.y_train, batch_size=config.batch_size)
              for _ in tqdm(range(steps), desc=label, disable=not config.progress)]
    seconds = time.perf_counter() - start
    tenth = max(1, steps // 10)  # has the loss stopped falling? the last tenth against the one before
    last, before = float(np.mean(losses[-tenth:])), float(np.mean(losses[-2 * tenth:-tenth] or losses[-tenth:]))
    latents = [n for n, site in guide.prototype_trace.nodes.items()
               if site["type"] == "sample" and not site["is_observed"]]
    with torch.no_grad():
        draws = [guide(data.X_train, data.y_train, batch_size=config.batch_size)
                 for _ in range(config.num_chains * config.num_draws)]
    samples = {n: torch.stack([d[n] for d in draws]) for n in latents}
    log(f"{label}: {steps} SVI steps ({steps * grads_per_step} gradient evaluations) in {seconds:.1f} s; "
        f"loss per image over the last tenth of the steps {last / len(data.X_train):.4f}, the tenth before "
        f"{before / len(data.X_train):.4f}")
    trend = {"loss_last_tenth": last / len(data.X_train), "loss_tenth_before": before / len(data.X_train)}
    return label, samples, seconds, steps * grads_per_step, trend


def bma_by_ensemble_size(model: BayesianMLP, samples: dict, X: torch.Tensor, y: torch.Tensor) -> dict:
    """Test accuracy and NLL of the average of the first m draws' probabilities, m = 1..S."""
    num_layers = len(model.layers)
    with torch.no_grad():
        probs = torch.stack([
            torch.softmax(model.logits(X, [(samples[f"layers.{l}.weight"][s], samples[f"layers.{l}.bias"][s])
                                           for l in range(num_layers)]), -1)
            for s in range(len(samples["layers.0.weight"]))])
        running = probs.cumsum(0) / torch.arange(1, len(probs) + 1)[:, None, None]
    return {"models": list(range(1, len(probs) + 1)),
            "accuracy": [metrics.accuracy(p, y) for p in running],
            "nll": [metrics.nll(p, y) for p in running]}


def run_bnn_study(config: BNNConfig, *, log: Callable[[str], None] = print) -> dict:
    """Run the four samplers on the MNIST BNN and the 2-D toy problem; write ``report.md``,
    ``report.json``, ``flatness.png`` and ``toy.png`` to ``config.out``. Returns the report."""
    config.validate()
    with study_output(config, log) as staging:
        report = _run_bnn_study(config, staging, log)
    log(f"wrote {config.out}: report.md, report.json, flatness.png, bma_vs_models.png and toy.png")
    return report


def _run_bnn_study(config: BNNConfig, out, log: Callable[[str], None]) -> dict:
    data = load_mnist_ood(config.data_dir, in_digits=config.in_digits)
    n_train = len(data.X_train)
    log(f"BNN on digits {data.in_digits}: {n_train} training, {len(data.X_test)} test and "
        f"{len(data.X_ood)} out-of-distribution images (digits {data.ood_digits})")
    model = BayesianMLP(data.X_train.shape[1], config.hidden, len(data.in_digits),
                        prior_scale=config.prior_scale)
    args, kwargs = (data.X_train, data.y_train), {"batch_size": config.batch_size}
    rows, curves, densities = [], {}, {}
    for key in BNN_SAMPLERS:
        name = sampler_label(key)
        by_chain, seconds, grad_evals = sample_chains(key, name, config, model, data, log)
        samples = {k: v.flatten(0, 1) for k, v in by_chain.items()}  # chain-major
        uses = ("theta", "aux", "both") if name == "EntropySGLD" else ("theta",)
        for use in uses:
            label = name if use == "theta" and name != "EntropySGLD" else f"{name} {'θ+θa' if use == 'both' else ('θa' if use == 'aux' else 'θ')}"
            start = time.perf_counter()
            row = {"sampler": label, "grad_evals": grad_evals, "seconds": seconds,
                   **_evaluate(model, samples, use, config, data, args, kwargs)}
            if use != "both":
                curves[label], densities[label] = _curves(model, by_chain, use, config, args, kwargs)
            rows.append(row)
            log(_row_text(row))
            log(f"{label}: {_measured_text(use, config)} in {time.perf_counter() - start:.1f} s")
    variational, ensembles = [], {}
    for key in VI_METHODS:
        label, samples, seconds, grad_evals, trend = _fit_variational(key, config, model, data, log)
        row = {"sampler": label, "grad_evals": grad_evals, "seconds": seconds, **trend,
               **_evaluate(model, samples, "theta", config, data, args, kwargs)}
        ensembles[label] = bma_by_ensemble_size(model, samples, data.X_test, data.y_test)
        variational.append(row)
        log(_row_text(row))
    toy = run_toy_study(config, log=log)
    report = {"config": asdict(config), "n_train": n_train, "n_test": len(data.X_test), "rows": rows,
              "variational": variational, "ensembles": ensembles, "toy": toy["rows"]}
    report["findings"] = findings(report)
    for text in report["findings"]:
        log(text)
    from .plots import plot_bma_by_ensemble_size, save_figures

    hold_signals()  # the study is done: a Ctrl-C from here waits until the files are written

    save_figures({"flatness.png": _flatness_figure(curves, densities, n_train),
                  "bma_vs_models.png": plot_bma_by_ensemble_size(ensembles, len(data.X_test)),
                  "toy.png": toy["figure"]}, out)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=float))
    (out / "report.md").write_text(_report_markdown(report))
    return report


def _measured_text(use: str, config: BNNConfig) -> str:
    """What :func:`_evaluate` and :func:`_curves` measured for one variable (the stage line's words)."""
    if use == "both":
        return "BMA test and OOD predictions"
    return (f"BMA predictions, top eigenvalue and trace ({config.trace_probes} probes) at {config.flatness_draws} "
            f"draws, interpolation and perturbation curves, SLQ density ({config.slq_probes} x {config.slq_steps} "
            "Lanczos steps)")


def _evaluate(model, samples, use, config, data, args, kwargs) -> dict:
    """BMA accuracy, NLL, ECE and OOD AUROC of ``samples`` and, for one variable, the flatness of the
    training NLL at ``flatness_draws`` of them."""
    with torch.no_grad():
        p_test = bma_predict(model, samples, data.X_test, use=use)
        p_ood = bma_predict(model, samples, data.X_ood, use=use)
    row = {**metrics.classification_metrics(p_test, data.y_test), "ood_auroc": metrics.ood_auroc(p_test, p_ood)}
    if use != "both":
        flat = flatness.flatness_at_samples(model, samples, *args, use=use, k=1, num_probes=config.trace_probes,
                                            num_draws=config.flatness_draws, seed=config.seed,
                                            likelihood_only=True, **kwargs)
        top, trace = flat["top_eigenvalues"][:, 0], flat["trace"]
        n = len(trace)
        probe_se = float(np.sqrt((flat["trace_stderr"] ** 2).sum()) / n)  # Hutchinson's error of the mean
        row.update(top_eigenvalue=float(top.mean()), top_eigenvalue_sd=float(top.std()),
                   top_eigenvalue_se=float(top.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0,
                   trace=float(trace.mean()), trace_stderr=probe_se,
                   trace_se=float(np.sqrt((trace.var(ddof=1) / n if n > 1 else 0.0) + probe_se ** 2)),
                   flatness_draws=n)
    return row


def _curves(model, by_chain, use, config, args, kwargs):
    """Interpolation between the last draws of the first two chains (with one chain: its first and
    last draws), perturbations of and SLQ density at the last draw of chain 0."""
    from ..predictive import iter_draws

    if config.num_chains > 1:
        ends = {k: torch.stack([v[1, -1], v[0, -1]]) for k, v in by_chain.items()}
        between = "t (chain 1's last draw to chain 0's)"
    else:
        ends = {k: v[0, [0, -1]] for k, v in by_chain.items()}
        between = "t (first draw to last draw)"
    latents = [n for n in ends if not n.endswith("_aux")]
    supports = {n: torch.distributions.constraints.real for n in latents}  # the MLP's weights are real
    first, last = list(iter_draws(ends, use, "_aux", latents, supports))
    loss = flatness.FlatLoss.from_model(model, last, *args, likelihood_only=True, **kwargs)
    start = loss.flatten(first)
    line = flatness.interpolation_curve(loss, start, loss.params, num_points=config.curve_points)
    radii = np.linspace(0.0, 3.0, 7)
    pert = flatness.perturbation_curve(loss, radii=radii, num_directions=config.curve_directions, seed=config.seed)
    rho = flatness.eigenvalue_density(loss, num_probes=config.slq_probes, num_steps=config.slq_steps,
                                      seed=config.seed)
    return {"interpolation": line, "perturbation": pert, "between": between}, rho


def _flatness_figure(curves, densities, n_train):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    # the share of eigenvalues above λ reads the top of the spectrum, where a smoothed density is a
    # few isolated bumps; its right end is the top eigenvalue
    top = max(float(rho.nodes.max()) for rho in densities.values())
    grid = np.linspace(0.0, 1.05 * top, 2000)
    for label, rho in densities.items():
        axes[0].step(grid, rho.share_above(grid), where="post", label=label)
    dim = next(iter(densities.values())).dim
    axes[0].axhline(1.0 / dim, color="grey", ls=":", lw=1, label=f"one eigenvalue of {dim} (1/d)")
    probes = len(next(iter(densities.values())).nodes)
    axes[0].set(yscale="log", xlabel="Hessian eigenvalue λ", ylabel="share of eigenvalues above λ",
                title=f"top of the Hessian spectrum (SLQ, {probes} probes, last draw)")
    for label, c in curves.items():
        line = c["interpolation"]
        axes[1].plot(line.x, line.loss / n_train, marker=".", label=label)
        pert = c["perturbation"]
        axes[2].errorbar(pert.x, pert.loss / n_train, yerr=2 * pert.loss_stderr / n_train, marker=".",
                         capsize=2, label=label)
    between = next(iter(curves.values()))["between"]  # the same two draws' roles for every sampler
    axes[1].set(title="training NLL / N between two draws", xlabel=between, ylabel="mean NLL")
    axes[2].set(title="NLL / N, random perturbations of the last draw",
                xlabel="perturbation norm r", ylabel="mean NLL")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def run_toy_study(config: BNNConfig, *, log: Callable[[str], None] = print) -> dict:
    """The samplers on the 2-D sharp/flat energy (:func:`~pyro_flat.mixtures.sharp_flat_2d`),
    ``toy_chains`` vectorized chains each, all started at the sharp mode, same gradient budget.

    Reports, over the second half of the run, the share of draws in the **flat basin of U = −log p**
    (:meth:`~pyro_flat.mixtures.SharpFlatMixture.in_flat_basin`: gradient descent from the draw
    ends at the flat mode), and the mean top Hessian eigenvalue of the energy at the final states
    (the sharp mode's is 44, the flat one's 1.6). ``pyro-flat synthetic2d`` is the full study.
    """
    from ..convergence import run_ensemble

    mixture = sharp_flat_2d()
    potential = lambda p: -mixture.log_prob(p["theta"])  # noqa: E731
    energy = lambda x: -mixture.log_prob(x)  # noqa: E731
    rows, finals = [], {}
    log(f"toy 2-D energy: {config.toy_chains} chains of each sampler from the sharp mode, "
        f"{config.toy_grad_evals} gradient evaluations each ...")
    for key in BNN_SAMPLERS:
        name = sampler_label(key)
        start = time.perf_counter()
        kernel = make_bnn_kernel(key, config, potential, toy=True)
        iterations = config.iterations(kernel.grads_per_iteration, toy=True)
        marks = list(range(iterations // 2, iterations + 1, max(1, iterations // 100)))
        pyro.set_rng_seed(config.seed)
        states = run_ensemble(kernel, mixture.sharp_loc, config.toy_chains, marks, progress_bar=False)
        for site, label in (("theta", name if name != "EntropySGLD" else "EntropySGLD θ"),
                            ("theta_aux", "EntropySGLD θa")):
            if site not in states[marks[-1]]:
                continue
            flat_by_mark = torch.stack([mixture.in_flat_basin(states[k][site]).double() for k in marks])
            flat = flat_by_mark.mean()
            # chains are independent, draws of one chain are not: the error comes from per-chain means
            flat_se = float(flat_by_mark.mean(0).std()) / math.sqrt(config.toy_chains)
            final = states[marks[-1]][site]
            top = np.mean([flatness.hessian_eigenvalues(energy, x.double())[0] for x in final[:100]])
            rows.append({"sampler": label, "iterations": iterations, "flat_basin": float(flat),
                         "flat_basin_se": flat_se, "top_eigenvalue": float(top)})
            finals[label] = final.numpy()
            log(f"toy {label}: {100 * float(flat):.0f}% of draws in the flat basin of U, "
                f"mean top eigenvalue {top:.1f} ({time.perf_counter() - start:.1f} s)")
    return {"rows": rows, "figure": _toy_figure(mixture, finals, rows)}


def _toy_figure(mixture, finals, rows):
    from .plots import plot_basin_endpoints

    shares = [{"label": r["sampler"], "share": r["flat_basin"], "se": r["flat_basin_se"], "exact": None}
              for r in rows]
    return plot_basin_endpoints(mixture, {label: final[None] for label, final in finals.items()}, shares,
                                paths_shown=0, start="the sharp mode")


def plus_minus(value: float, error: float) -> str:
    """``value ± error`` with both to the error's second significant digit: ``7372 ± 170``,
    ``3.812 ± 0.034``."""
    if not (np.isfinite(error) and error > 0):
        return f"{value:.4g} ± {error:g}"
    decimals = max(0, 1 - int(np.floor(np.log10(error))))
    return f"{value:.{decimals}f} ± {error:.{decimals}f}"


def _row_text(row: dict) -> str:
    flat = ("" if "trace" not in row else
            f", top eigenvalue {plus_minus(row['top_eigenvalue'], row['top_eigenvalue_se'])}, trace "
            f"{plus_minus(row['trace'], row['trace_se'])}")
    return (f"{row['sampler']}: accuracy {row['accuracy']:.3f}, NLL {row['nll']:.3f}, ECE {row['ece']:.3f}, "
            f"OOD AUROC {row['ood_auroc']:.3f}{flat}")


def _table_row(r: dict) -> str:
    flat = ("– | –" if "trace" not in r else
            f"{plus_minus(r['top_eigenvalue'], r['top_eigenvalue_se'])} | {plus_minus(r['trace'], r['trace_se'])}")
    return (f"| {r['sampler']} | {r['accuracy']:.3f} | {r['nll']:.3f} | {r['ece']:.3f} | "
            f"{r['ood_auroc']:.3f} | {flat} |")


def findings(report: dict) -> List[str]:
    """Sentences that state what the BNN study's numbers show, by the studies' one rule for a
    difference (:mod:`.compare`: beyond 2 combined standard errors)."""
    rows = [r for r in report["rows"] if "trace" in r]
    n_test = report["n_test"]
    out = []
    if rows:
        top = {r["sampler"]: (r["top_eigenvalue"], r["top_eigenvalue_se"]) for r in rows}
        trace = {r["sampler"]: (r["trace"], r["trace_se"]) for r in rows}
        n = min(r["flatness_draws"] for r in rows)
        out.append(f"Flatness of the training NLL at {n} draws per sampler: {best_text(top, lowest=True, what='mean top eigenvalue')}; "
                   f"{best_text(trace, lowest=True, what='mean Hessian trace')}.")
    every = report["rows"] + report.get("variational", [])
    accuracy = {r["sampler"]: (r["accuracy"], np.sqrt(max(r["accuracy"] * (1 - r["accuracy"]), 1e-12) / n_test))
                for r in every}
    out.append(f"Test accuracy ({n_test} images; binomial standard errors): "
               f"{best_text(accuracy, lowest=False, what='BMA accuracy')}.")
    sgld = next((r for r in report["rows"] if r["sampler"] == "SGLD"), None)
    if sgld is not None and rows:
        flatter = [r["sampler"] for r in rows if r is not sgld
                   and differ(r["top_eigenvalue"], r["top_eigenvalue_se"], sgld["top_eigenvalue"], sgld["top_eigenvalue_se"])
                   and r["top_eigenvalue"] < sgld["top_eigenvalue"]]
        better = [r["sampler"] for r in report["rows"] if r is not sgld and differ(
            r["accuracy"], accuracy[r["sampler"]][1], sgld["accuracy"], accuracy["SGLD"][1]) and r["accuracy"] > sgld["accuracy"]]
        out.append("Against SGLD, its own baseline: flatter (lower top eigenvalue beyond 2 standard errors): "
                   f"{', '.join(flatter) or 'none'}; more accurate beyond 2 standard errors: {', '.join(better) or 'none'}"
                   + (" — so on this problem the flatter draws do not classify better." if flatter and not better else "."))
    toy = report.get("toy", [])
    base = next((r for r in toy if r["sampler"].startswith("SGLD")), None)
    if base is not None:
        parts = [f"{r['sampler']} {compare_text(r['flat_basin'], r['flat_basin_se'], base['flat_basin'], base['flat_basin_se'])}"
                 for r in toy if r is not base]
        out.append(f"2-D toy (toy.png), share of draws in the flat basin against {base['sampler']}'s "
                   f"{base['flat_basin']:.2f} ± {base['flat_basin_se']:.2f}: " + "; ".join(parts) + ".")
    return out


def _report_markdown(report: dict) -> str:
    c = report["config"]
    lines = [
        "# Flat-seeking samplers on a Bayesian MLP",
        "",
        f"MNIST digits {tuple(c['in_digits'])} ({report['n_train']} training images), MLP hidden "
        f"{tuple(c['hidden'])}, prior sd {c['prior_scale']}, minibatch {c['batch_size']}, step "
        f"{c['step_size']:g}, {c['num_chains']} chains x {c['grad_evals']} gradient evaluations per sampler, "
        f"BMA over {c['num_draws']} draws per chain; η = {c['eta']:g}, "
        f"ρ = {c['rho']:g}, σ = {c['sigma']:g}. Flatness: Hessian of the training negative log-likelihood (all "
        f"{report['n_train']} images, prior excluded) at "
        f"{c['flatness_draws']} draws ({c['trace_probes']} Hutchinson probes).",
        "",
        "Top eigenvalue and trace: mean over the draws ± its standard error (the spread between draws; "
        "for the trace also Hutchinson's probe error). Accuracy is on "
        f"{report.get('n_test', 'the')} test images (one binomial standard error: "
        + (f"{np.sqrt(0.25 / report['n_test']):.3f} at most)." if report.get("n_test") else "see n_test).")
        + " OOD AUROC: the BMA's predictive entropy separating the other digits' test images from the test set.",
        "",
        "| sampler | accuracy | NLL | ECE | OOD AUROC | top eigenvalue | trace |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [_table_row(r) for r in report["rows"]]
    lines += ["", "## What the numbers show", ""] + [f"- {t}" for t in report.get("findings", [])]
    lines += ["", "Figures: `flatness.png` (the top of the Hessian spectrum at chain 0's last draw by SLQ: the share "
                  "of eigenvalues above λ, whose right end is the top eigenvalue; the loss along the line between "
                  "two chains' last draws and under random perturbations of growing radius; per sampler), "
                  "`bma_vs_models.png` (BMA test NLL against the number of averaged draws, variational fits), "
                  "`toy.png` (the 2-D sharp/flat energy below)."]
    if report.get("variational"):
        ens = report["ensembles"]
        budget = ("the same gradient budget" if not c.get("svi_grad_evals")
                  else f"{c['svi_grad_evals']} gradient evaluations")
        lines += ["", f"## Variational (SVI, AutoNormal, init scale {c['svi_init_scale']:g}, Adam lr "
                      f"{c['svi_lr']:g}, {budget}; BMA over "
                      f"{c['num_chains'] * c['num_draws']} draws of q)", "",
                  "| method | accuracy | NLL | ECE | OOD AUROC | top eigenvalue | trace |",
                  "|---|---|---|---|---|---|---|"]
        lines += [_table_row(r) for r in report["variational"]]
        lines += ["", "Loss per training image (the negative ELBO, or its sharpness-aware version) over the last "
                      "tenth of the steps against the tenth before: "
                  + "; ".join(f"{r['sampler']} {r['loss_last_tenth']:.4f} against {r['loss_tenth_before']:.4f}"
                              for r in report["variational"]) + "."]
        lines += ["", "BMA test NLL against the number of averaged draws (`bma_vs_models.png`):", ""]
        for label, e in ens.items():
            picks = [m for m in (1, 2, 5, 10, 20, 40, 80) if m <= len(e["models"])]
            lines.append(f"- {label}: " + ", ".join(f"{m}: {e['nll'][m - 1]:.3f}" for m in picks))
    lines += ["", "## 2-D sharp/flat energy (all chains start at the sharp mode)", "",
              "Share of the draws (second half of the run) in the flat basin of U = −log p: gradient descent "
              "from the draw ends at the flat mode.", "",
              "| sampler | iterations | in the flat basin of U | mean top eigenvalue |",
              "|---|---|---|---|"]
    for r in report["toy"]:
        lines.append(f"| {r['sampler']} | {r['iterations']} | {r['flat_basin']:.2f} ± {r['flat_basin_se']:.2f} | "
                     f"{r['top_eigenvalue']:.1f} |")
    return "\n".join(lines) + "\n"


__all__ = ["BNNConfig", "BNN_SAMPLERS", "VI_METHODS", "run_bnn_study", "run_toy_study", "bma_by_ensemble_size",
           "sample_chains"]
