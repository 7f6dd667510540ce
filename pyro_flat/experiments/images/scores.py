r"""One fit of the image study (``pyro-flat images``), :class:`Fit`, and its scores: its Bayesian model average
on the clean, corrupted and out-of-distribution images (:func:`evaluate`), the Hessian's top eigenvalue and trace at its last draw, whether
it converged (:func:`convergence`: the training NLL at the end of its last cycle against the cycle before's), how
far it travelled from its start (:func:`travelled`), and the loss between its first and last cycles' ends
(:func:`interpolation`). :mod:`.images` makes the fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from ... import flatness
from ...evaluation import metrics
from ...nn import BayesianModule
from ...evaluation.predictive import bma_predict
from .config import ImagesConfig
from .data import ImageData


@dataclass
class Fit:
    """One method's run at one seed: the draws it keeps ``{site: (draws, ...)}`` (an optimiser: its last iterate;
    ``sgd-ensemble``: each network's), its state at the end of each cycle ``{site: (networks, cycles, ...)}``, where
    it started ``{site: (networks, ...)}``, and what it cost."""

    method: str
    model: BayesianModule
    samples: Dict[str, torch.Tensor]
    cycle_ends: Dict[str, torch.Tensor]
    initial: Dict[str, torch.Tensor]
    iterations: int
    grad_evals: int
    seconds: float
    #: of ``seconds``, the time spent tracing and compiling the iteration (``--jit``)
    compile_seconds: float = 0.0
    #: what compiled its iterations: ``"inductor"``, ``"fx"`` (the traced graph, also where inductor failed its
    #: check), or ``None``
    compiled: Optional[str] = None

    @property
    def uses(self) -> Tuple[str, ...]:
        return ("theta", "aux", "both") if self.method == "emcmc" else ("theta",)


def draws_for(fit: Fit, use: str) -> Dict[str, torch.Tensor]:
    """The θ draws of ``use`` under the model's site names (θa's twins renamed; both: θ's then θa's)."""
    theta = {k: v for k, v in fit.samples.items() if not k.endswith("_aux")}
    aux = {k: fit.samples[k + "_aux"] for k in theta} if use != "theta" else {}
    if use == "theta":
        return theta
    if use == "aux":
        return aux
    return {k: torch.cat([theta[k], aux[k]]) for k in theta}


def _scores(probs: List[torch.Tensor], data: ImageData) -> dict:
    """The metrics of one model average's probabilities on the test, corrupted and out-of-distribution sets."""
    row = metrics.classification_metrics(probs[0], data.y_test)
    row.pop("ece_mass")
    accuracy: Dict[int, List[float]] = {}
    nll: Dict[int, List[float]] = {}
    for (kind, severity), p in zip(data.corrupted, probs[1:1 + len(data.corrupted)]):
        accuracy.setdefault(severity, []).append(metrics.accuracy(p, data.y_corrupted))
        nll.setdefault(severity, []).append(metrics.nll(p, data.y_corrupted))
    row["corrupted_accuracy"] = [float(np.mean(accuracy[s])) for s in sorted(accuracy)]
    row["corrupted_nll"] = [float(np.mean(nll[s])) for s in sorted(nll)]
    row["corrupted_accuracy_mean"] = float(np.mean(row["corrupted_accuracy"]))
    if data.X_ood is not None:
        row["ood_auroc"] = metrics.ood_auroc(probs[0], probs[-1])
        row["ood_aupr"] = metrics.ood_aupr(probs[0], probs[-1])
    return row


def evaluate(fit: Fit, config: ImagesConfig, data: ImageData, flat_data, seed: int) -> Dict[str, dict]:
    """``{use: row}``: each use's model average scored on the clean, corrupted and out-of-distribution images
    (θ's and θa's draws predicted once each; "both" averages the two), and the top Hessian eigenvalue and trace
    of the training NLL per image at θ's (θa's) last draw."""
    sets = [data.X_test] + list(data.corrupted.values()) + ([] if data.X_ood is None else [data.X_ood])
    images = torch.cat(sets)
    sizes = [len(x) for x in sets]
    probs = {}
    with torch.no_grad():  # each draw's BatchNorm statistics from the flatness images (training images)
        for use in [u for u in fit.uses if u != "both"]:
            probs[use] = bma_predict(fit.model, draws_for(fit, use), images, batchnorm_data=flat_data[0],
                                     autocast=_autocast(config))
    if "both" in fit.uses:  # as many θ draws as θa draws: the average of the two averages
        probs["both"] = (probs["theta"] + probs["aux"]) / 2
    rows = {use: _scores(list(p.split(sizes)), data) for use, p in probs.items()}
    for use in rows:
        rows[use]["distance"] = travelled(fit, use)
        if use == "both":  # the draws of θ and θa: each measured on its own row
            continue
        last = {k: v[-1:] for k, v in draws_for(fit, use).items()}
        measured = flatness.flatness_at_samples(fit.model, last, *flat_data, k=1, num_probes=config.trace_probes,
                                                seed=seed, likelihood_only=True)  # fp32: see _autocast
        rows[use]["top_eigenvalue"] = float(measured["top_eigenvalues"][0, 0]) / len(flat_data[0])
        rows[use]["trace"] = float(measured["trace"][0]) / len(flat_data[0])
        rows[use].update(convergence(fit, use, data, flat_data[0], config.converged_within, _autocast(config)))
    return rows


def cycle_end_nll(fit: Fit, use: str, data: ImageData, batchnorm_data: torch.Tensor,
                  autocast: Optional[str] = None) -> np.ndarray:
    """The training NLL per image of each network at the end of each of its cycles, ``(networks, cycles)``
    (each draw with its own BatchNorm statistics, as it predicts; under ``autocast`` as it was sampled)."""
    twin = "_aux" if use == "aux" else ""
    ends = {k: fit.cycle_ends[k + twin] for k in fit.model.shapes}
    networks, cycles = next(iter(ends.values())).shape[:2]
    out = np.zeros((networks, cycles))
    with torch.no_grad():
        for i in range(networks):
            for c in range(cycles):
                probs = bma_predict(fit.model, {k: v[i, c][None] for k, v in ends.items()}, data.X_train,
                                    batchnorm_data=batchnorm_data, autocast=autocast)
                out[i, c] = metrics.nll(probs, data.y_train)
    return out


def convergence(fit: Fit, use: str, data: ImageData, batchnorm_data: torch.Tensor, within: float,
                autocast: Optional[str] = None) -> dict:
    """The convergence rule of the report: ``train_nll`` (the training NLL per image at the end of the last cycle,
    the mean over an ensemble's networks),
    ``train_nll_cycles`` (at the end of each cycle) and ``converged``: every network's last two within ``within`` of
    each other (``train_nll_change``: the largest difference)."""
    nll = cycle_end_nll(fit, use, data, batchnorm_data, autocast)
    change = float(np.abs(nll[:, -1] - nll[:, -2]).max()) if nll.shape[1] > 1 else float("inf")
    return {"train_nll": float(nll[:, -1].mean()), "train_nll_cycles": nll.mean(0).tolist(),
            "train_nll_change": change, "converged": bool(change <= within)}


def travelled(fit: Fit, use: str) -> float:
    """How far the method got from its start: the Euclidean distance over all weights from the initial network
    to the last draw (θ, θa, or for "both" the centre (θ + θa)/2, which the gradient of θ alone drives, at half
    SGD's speed once the gap settles), the mean over an ensemble's networks."""
    twin = "_aux" if use == "aux" else ""
    if use == "both":
        end = {k: (fit.samples[k][-1:] + fit.samples[k + "_aux"][-1:]) / 2 for k in fit.model.shapes}
    else:  # an ensemble's samples are its networks' ends; a single network's last draw is its end
        end = {k: fit.samples[k + twin] if fit.method == "sgd-ensemble" else fit.samples[k + twin][-1:]
               for k in fit.model.shapes}
    squares = sum((end[k] - fit.initial[k].to(end[k].device)).flatten(1).square().sum(1) for k in fit.model.shapes)
    return float(squares.sqrt().mean())


def _autocast(config: ImagesConfig) -> Optional[str]:
    """``--precision bf16``: the predictions and losses (the model averages, the training NLL, the interpolation)
    under the autocast the networks were sampled in. The curvature stays fp32: on the reduced run's tiny ResNet
    bf16 moved the gradient of the flatness images' NLL by 10 % and the top Hessian eigenvalue by 29 %
    (``tests/test_mixed_precision.py``), where the losses agree to 1e-5."""
    return "bf16" if config.precision == "bf16" else None


def interpolation(fit: Fit, config: ImagesConfig, flat_data, points: int = 11) -> Optional[Dict[str, List[float]]]:
    """The training NLL per image along the straight line from θ at the end of the first cycle to θ at the end of
    the last (``None`` for an ensemble, or a fit of one cycle)."""
    if fit.method == "sgd-ensemble" or config.protocol()["cycles"] < 2:
        return None
    first = {k: fit.cycle_ends[k][0, 0] for k in fit.model.shapes}
    last = {k: fit.cycle_ends[k][0, -1] for k in fit.model.shapes}
    loss = flatness.FlatLoss.from_model(fit.model, first, *flat_data, likelihood_only=True).under_autocast(
        _autocast(config))
    curve = flatness.interpolation_curve(loss, loss.flatten(first), loss.flatten(last), num_points=points)
    return {"t": [float(t) for t in curve.x], "nll": [float(v) / len(flat_data[0]) for v in curve.loss]}


__all__ = ["Fit", "draws_for", "evaluate", "convergence", "cycle_end_nll", "travelled", "interpolation"]
