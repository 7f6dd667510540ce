r"""Classification metrics for predictive probabilities.

``probs`` is either ``(N,)`` (binary: the probability of class 1) or ``(N, C)``; ``y`` holds
integer labels (or 0./1. floats for the binary case). Every function returns a Python float.

Example::

    >>> import torch
    >>> from pyro_flat import metrics
    >>> p, y = torch.tensor([0.9, 0.2, 0.6]), torch.tensor([1., 0., 0.])
    >>> round(metrics.accuracy(p, y), 3), round(metrics.brier(p, y), 3)
    (0.667, 0.137)
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch

from ..validation import check_positive_int

_EPS = 1e-12


#: How far a row of probabilities may sum from 1 (float32 softmax averaged over draws: ~1e-6).
SUM_TOL = 1e-3


def _as_probs(name: str, probs) -> torch.Tensor:
    """``probs`` as ``(N, C)`` float64 rows (binary ``(N,)`` as ``[1 - p, p]``), or a ``ValueError``
    naming ``name`` unless there is at least one row, every entry lies in [0, 1] (so is finite) and
    every row sums to 1 within :data:`SUM_TOL`. A few vectorized reductions: cheap enough per draw."""
    probs = torch.as_tensor(probs, dtype=torch.float64)
    if probs.dim() not in (1, 2) or probs.numel() == 0:
        raise ValueError(f"{name} must be (N,) probabilities of class 1 or (N, C) rows of class probabilities, "
                         f"with N >= 1; got shape {tuple(probs.shape)}.")
    inside = (probs >= 0) & (probs <= 1 + SUM_TOL)  # NaN fails both comparisons
    if not bool(inside.all()):
        raise ValueError(f"{name} must be probabilities in [0, 1], got an entry {probs[~inside][0].item():g}; "
                         "pass probabilities, not logits or scores (e.g. torch.softmax(logits, -1)).")
    if probs.dim() == 1:
        return torch.stack([1.0 - probs, probs], dim=-1)
    deviation = probs.sum(-1) - 1.0
    worst = int(deviation.abs().argmax())
    if abs(float(deviation[worst])) > SUM_TOL:
        raise ValueError(f"{name} rows must sum to 1 (each row is one point's class probabilities), but row "
                         f"{worst} sums to {1.0 + float(deviation[worst]):.6g}; normalise them, e.g. "
                         "torch.softmax(logits, -1).")
    return probs


def _as_classes(probs: torch.Tensor, y: torch.Tensor):
    probs = _as_probs("probs", probs)
    y = torch.as_tensor(y).reshape(-1)
    if probs.shape[0] != y.shape[0]:
        raise ValueError(
            f"probs must be (N,) or (N, C) with N = len(y); got probs {tuple(probs.shape)}, y {tuple(y.shape)}"
        )
    if y.dtype == torch.bool:
        y = y.long()
    if y.is_floating_point() and not bool((y == y.round()).all()):  # NaN != NaN: refused too
        bad = y[y != y.round()][0].item()
        raise ValueError(f"y must hold integer class labels 0..{probs.shape[1] - 1}, got {bad:g}; pass the "
                         "labels (e.g. 0. and 1. for binary probs), not probabilities.")
    labels = y.long()
    if bool((labels < 0).any()) or bool((labels >= probs.shape[1]).any()):
        raise ValueError(f"y must hold class labels 0..{probs.shape[1] - 1}, got {int(labels.min())}.."
                         f"{int(labels.max())}")
    return probs, labels


def accuracy(probs: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of points whose most probable class is the label."""
    p, labels = _as_classes(probs, y)
    return float((p.argmax(-1) == labels).double().mean())


def nll(probs: torch.Tensor, y: torch.Tensor) -> float:
    r"""Mean negative log predictive probability :math:`-\frac1N\sum_i \log p(y_i \mid x_i)`."""
    return float(pointwise_nll(probs, y).mean())


def pointwise_nll(probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    r"""Each point's negative log predictive probability :math:`-\log p(y_i \mid x_i)`, shape ``(N,)``."""
    p, labels = _as_classes(probs, y)
    return -(p.gather(-1, labels[:, None]).clamp_min(_EPS).log()).squeeze(-1)


def brier(probs: torch.Tensor, y: torch.Tensor) -> float:
    r"""Brier score. Binary ``(N,)`` input: :math:`\frac1N\sum_i (p_i - y_i)^2`; ``(N, C)`` input:
    :math:`\frac1N\sum_i \sum_c (p_{ic} - [y_i = c])^2`."""
    binary = torch.as_tensor(probs).dim() == 1
    p, labels = _as_classes(probs, y)
    onehot = torch.nn.functional.one_hot(labels, p.shape[1]).double()
    sq = (p - onehot).pow(2).sum(-1)
    return float((sq / 2 if binary else sq).mean())


def reliability_curve(probs: torch.Tensor, y: torch.Tensor, n_bins: int = 15,
                      binning: str = "width") -> Dict[str, np.ndarray]:
    """The calibration curve of the top-class confidence: per non-empty bin, the mean confidence
    ``confidence``, the accuracy ``accuracy`` and the number of points ``count`` (the bins of
    :func:`ece`; ``binning="mass"``: equal numbers of points per bin)."""
    n_bins = check_positive_int("n_bins", n_bins, hint="It is the number of confidence bins, e.g. n_bins=15.")
    p, labels = _as_classes(probs, y)
    conf, pred = p.max(-1)
    correct = (pred == labels).double()
    n = conf.shape[0]
    if binning == "width":
        bins = torch.clamp((conf * n_bins).long(), max=n_bins - 1)
    elif binning == "mass":
        order = conf.argsort()
        bins = torch.empty_like(order)
        bins[order] = torch.div(torch.arange(n, device=conf.device) * n_bins, n, rounding_mode="floor")
    else:
        raise ValueError(f"binning must be 'width' or 'mass', got {binning!r}")
    out = {"confidence": [], "accuracy": [], "count": []}
    for b in range(n_bins):
        sel = bins == b
        if bool(sel.any()):
            out["confidence"].append(float(conf[sel].double().mean()))
            out["accuracy"].append(float(correct[sel].mean()))
            out["count"].append(int(sel.sum()))
    return {k: np.array(v) for k, v in out.items()}


def ece(probs: torch.Tensor, y: torch.Tensor, n_bins: int = 15, binning: str = "width") -> float:
    r"""Expected calibration error of the top-class confidence.

    .. math:: \mathrm{ECE} = \sum_b \frac{|B_b|}{N}\,\lvert \mathrm{acc}(B_b) - \mathrm{conf}(B_b)\rvert

    ``binning="width"``: ``n_bins`` equal-width bins on [0, 1]; ``binning="mass"``: bins holding
    equal numbers of points (sorted by confidence). The bins are those of :func:`reliability_curve`.
    """
    curve = reliability_curve(probs, y, n_bins, binning)
    weights = curve["count"] / curve["count"].sum()
    return float((weights * np.abs(curve["accuracy"] - curve["confidence"])).sum())


def classification_metrics(probs: torch.Tensor, y: torch.Tensor, n_bins: int = 15) -> Dict[str, float]:
    """Accuracy, NLL, Brier and both ECE variants in one dict."""
    return {
        "accuracy": accuracy(probs, y),
        "nll": nll(probs, y),
        "brier": brier(probs, y),
        "ece": ece(probs, y, n_bins, "width"),
        "ece_mass": ece(probs, y, n_bins, "mass"),
    }


def predictive_entropy(probs: torch.Tensor) -> torch.Tensor:
    """The entropy of each row of ``(N, C)`` (or ``(N,)`` binary) probabilities, in nats: the
    usual out-of-distribution score of a Bayesian model average."""
    return _entropy("probs", probs)


def _entropy(name: str, probs) -> torch.Tensor:
    probs = _as_probs(name, probs)
    return -(probs * probs.clamp_min(_EPS).log()).sum(-1)


def auroc(positive_scores: torch.Tensor, negative_scores: torch.Tensor) -> float:
    """The area under the ROC curve of scores meant to be higher for the positives:
    :math:`P(s_+ > s_-) + \tfrac12 P(s_+ = s_-)` (the Mann-Whitney statistic, ties counted half).

    >>> auroc(torch.tensor([0.9, 0.8]), torch.tensor([0.1, 0.85]))
    0.75
    """
    pos = torch.as_tensor(positive_scores, dtype=torch.float64).reshape(-1)
    neg = torch.as_tensor(negative_scores, dtype=torch.float64).reshape(-1)
    if pos.numel() == 0 or neg.numel() == 0:
        raise ValueError("auroc needs at least one positive and one negative score")
    for name, scores in (("positive_scores", pos), ("negative_scores", neg)):
        if not bool(torch.isfinite(scores).all()):
            raise ValueError(f"{name} holds NaN or inf (at index {int((~torch.isfinite(scores)).nonzero()[0])}); "
                             "the scores must be finite numbers: drop or fix those points first.")
    scores = torch.cat([pos, neg])
    # average ranks (ties share their mean rank), then the Mann-Whitney U of the positives
    order = scores.argsort()
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=torch.float64, device=scores.device)
    values, inverse = scores.unique(return_inverse=True)
    mean_rank = torch.zeros(len(values), dtype=torch.float64, device=scores.device).index_add_(0, inverse, ranks)
    mean_rank /= torch.bincount(inverse, minlength=len(values)).to(torch.float64)
    u = mean_rank[inverse[: len(pos)]].sum() - len(pos) * (len(pos) + 1) / 2
    return float(u / (len(pos) * len(neg)))


def aupr(positive_scores: torch.Tensor, negative_scores: torch.Tensor) -> float:
    """The area under the precision-recall curve of scores meant to be higher for the positives, as
    average precision: the mean over the positives of the precision among the scores at least as high
    (a tie counts every tied score in). Chance is the positives' share.

    >>> aupr(torch.tensor([0.9, 0.4]), torch.tensor([0.8, 0.1]))  # (1/1 + 2/3) / 2
    0.8333333333333333
    """
    pos = torch.as_tensor(positive_scores, dtype=torch.float64).reshape(-1)
    neg = torch.as_tensor(negative_scores, dtype=torch.float64).reshape(-1)
    auroc(pos, neg)  # the same checks: non-empty and finite
    # for each positive: positives and negatives scoring at least as high
    above_pos = len(pos) - torch.searchsorted(pos.sort().values, pos, right=False).to(torch.float64)
    above_neg = len(neg) - torch.searchsorted(neg.sort().values, pos, right=False).to(torch.float64)
    return float((above_pos / (above_pos + above_neg)).mean())


def ood_aupr(probs_in: torch.Tensor, probs_out: torch.Tensor) -> float:
    """AUPR of finding the out-of-distribution inputs (the positives) by predictive entropy."""
    return aupr(_entropy("probs_out", probs_out), _entropy("probs_in", probs_in))


def ood_auroc(probs_in: torch.Tensor, probs_out: torch.Tensor) -> float:
    """AUROC of telling out-of-distribution inputs from in-distribution ones by the predictive
    entropy of their (model-averaged) probabilities; 0.5 is chance, 1 is perfect."""
    return auroc(_entropy("probs_out", probs_out), _entropy("probs_in", probs_in))


def running_bma(probs: torch.Tensor, y: torch.Tensor, *, warmup: int = 0, thin: int = 1,
                num_points: int = 50, cost: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
    """Accuracy and NLL of the Bayesian model average of the first k draws (pooled over chains),
    each with its standard error over the test points.

    ``probs`` (probabilities of class 1) has shape ``(chain, draw, n)``; returns arrays over
    ``num_points`` values of k, with ``iteration = warmup + k * thin`` and ``x`` = ``cost[k - 1]``
    (e.g. gradient evaluations per chain up to draw k) or the iteration without ``cost``.
    """
    num_draws, n = probs.shape[1], probs.shape[-1]
    ks = curve_points(num_draws, num_points)
    running = probs.double().cumsum(1).mean(0)  # (draw, n): chain-pooled partial sums
    out = {"accuracy": [], "accuracy_se": [], "nll": [], "nll_se": []}
    for k in ks:
        p = (running[k - 1] / k).clamp(1e-12, 1 - 1e-12)
        acc = accuracy(p, y)
        point_nll = -torch.where(y > 0.5, p.log(), (1 - p).log())
        out["accuracy"].append(acc)
        out["accuracy_se"].append(float(np.sqrt(acc * (1 - acc) / n)))
        out["nll"].append(float(point_nll.mean()))
        out["nll_se"].append(float(point_nll.std() / np.sqrt(n)))
    return {**curve_axis(ks, warmup, thin, cost), **{k: np.array(v) for k, v in out.items()}}


def curve_points(num_draws: int, num_points: int) -> np.ndarray:
    """The numbers of draws k (1-based, at most ``num_points`` of them, evenly spread) a running curve shows."""
    return np.unique(np.linspace(1, num_draws, min(num_points, num_draws)).astype(int))


def curve_axis(ks: np.ndarray, warmup: int, thin: int, cost: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
    """A running curve's x-axis at ``ks`` draws: ``iteration = warmup + k * thin`` and ``x = cost[k - 1]`` (or the
    iteration without ``cost``)."""
    iteration = warmup + ks * thin
    return {"iteration": iteration, "x": iteration if cost is None else np.asarray(cost)[ks - 1]}


__all__ = ["accuracy", "nll", "pointwise_nll", "brier", "ece", "classification_metrics", "predictive_entropy", "auroc",
           "ood_auroc", "aupr", "ood_aupr", "running_bma"]
