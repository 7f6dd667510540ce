r"""Bayesian model averaging as the draws come, without storing them: a ``hook_fn`` for ``MCMC``.

:class:`OnlineBMA` adds each kept draw's class probabilities on held-out data to a running average,
for :math:`\theta`, for :math:`\theta_a` and for both when the draws have twins, and records the
average's accuracy, NLL, ECE and Brier score after every draw. Pass it as ``hook_fn`` to
:class:`pyro_flat.MCMC` or ``pyro.infer.MCMC``: it is called after every iteration and keeps the
sampling phase's. It is :func:`pyro_flat.metrics.running_bma` for a run whose draws are not kept
(a network's draws cost memory) or not yet finished.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from . import metrics
from ..chains.shard import chains_average
from .predictive import bma_predict
from ..targets import check_finite_inputs

USES = ("theta", "aux", "both")


class OnlineBMA:
    r"""The running Bayesian model average of a run's draws on held-out data.

    After the :math:`k`-th kept draw (all of its chains), for each ``use``:

    .. math:: \bar p_k = \bar p_{k-1} + \frac{p_k - \bar p_{k-1}}{k},

    :math:`p_k` the draw's class probabilities averaged over its chains (:func:`~pyro_flat.bma_predict`),
    and ``history[use]`` gains :func:`~pyro_flat.metrics.classification_metrics` of :math:`\bar p_k`.
    With Pyro's driver the draws come chain by chain, and only chains run in this process reach it:
    ``pyro.infer.MCMC``'s parallel chains call a copy in each worker (use :class:`pyro_flat.MCMC`'s
    vectorized chains, or ``chain_method="sequential"``). Across ranks (``chain_method="distributed"``)
    the average pools every rank's chains (one all-reduce of the probabilities per draw), so every rank
    holds the one-process average. A run resumed from a checkpoint hands the hook the draws it restored
    first, so the average is the uninterrupted run's. :meth:`curve` gives the running average as
    :func:`~pyro_flat.metrics.running_bma` gives it from stored draws (the studies' figure).

    :param model: the Pyro model sampled (the original, not its :func:`~pyro_flat.flat_posterior`).
    :param args: its arguments for the held-out inputs (``X_test``), as for :func:`~pyro_flat.bma_predict`.
    :param y: the held-out labels.
    :param uses: any of ``"theta"``, ``"aux"``, ``"both"``; by default all three when the draws have
        twins (sites ``name + suffix``), else ``"theta"``.
    :param n_bins: the ECE's bins.

    Example::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro_flat import MCMC, EntropySGLD, OnlineBMA
        >>> def model(X, y=None):
        ...     w = pyro.sample("w", dist.Normal(torch.zeros(2), 1.).to_event(1))
        ...     with pyro.plate("data", X.shape[0]):
        ...         pyro.sample("y", dist.Bernoulli(logits=(X * w).sum(-1)), obs=y)
        >>> X = torch.randn(200, 2); y = (X[:, 0] > 0).float()
        >>> bma = OnlineBMA(model, X[100:], y=y[100:])
        >>> mcmc = MCMC(EntropySGLD(model, eta=0.1, step_size=1e-2), num_samples=50, warmup_steps=20,
        ...             num_chains=2, hook_fn=bma, disable_progbar=True)
        >>> mcmc.run(X[:100], y[:100])
        >>> len(bma.history["both"]), sorted(bma.history["theta"][-1])
        (50, ['accuracy', 'accuracy_se', 'brier', 'ece', 'ece_mass', 'nll', 'nll_se'])
    """

    def __init__(self, model: Callable, *args, y: torch.Tensor, uses: Optional[Sequence[str]] = None,
                 suffix: str = "_aux", n_bins: int = 15, **kwargs):
        if not callable(model):
            raise TypeError(f"OnlineBMA: model must be the Pyro model sampled, got {type(model).__name__}.")
        if not torch.is_tensor(y):
            raise ValueError(f"OnlineBMA: y must be a tensor of held-out labels, got {type(y).__name__}.")
        check_finite_inputs(args, kwargs, before="predicting", who="OnlineBMA: ")
        if isinstance(uses, str):
            uses = (uses,)
        if uses is not None:
            unknown = [u for u in uses if u not in USES]
            if unknown or not uses:
                raise ValueError(f"OnlineBMA: uses={list(uses)!r}; pass a non-empty subset of {USES}.")
        self.model, self.args, self.kwargs, self.y = model, args, kwargs, y
        self.uses, self.suffix, self.n_bins = (None if uses is None else tuple(uses)), suffix, n_bins
        self.num_draws = 0
        #: the running average of each use's class probabilities
        self.probs: Dict[str, torch.Tensor] = {}
        #: each use's metrics after every kept draw
        self.history: Dict[str, List[Dict[str, float]]] = {}

    def __call__(self, kernel, params: Dict[str, torch.Tensor], stage: str, i: int) -> None:
        """``MCMC``'s ``hook_fn``: a sampling-phase draw (unconstrained ``params``) joins the average."""
        if not stage.startswith("Sample"):  # Pyro's driver names a chain's phase "Sample [c]" with several chains
            return
        transforms = kernel.transforms
        values = {name: (transforms[name].inv(v) if name in transforms else v).detach() for name, v in params.items()}
        if getattr(kernel, "num_chains", None) is None:  # Pyro's driver: one chain, no chain dimension
            values = {name: v.unsqueeze(0) for name, v in values.items()}
        # predicting runs the model, whose sample sites may draw random numbers: not from the run's stream,
        # or the chains would not be those of a run without this hook
        devices = [v.device for v in values.values() if v.device.type == "cuda"]
        with torch.random.fork_rng(devices=devices):
            self.update(values)

    def update(self, draws: Dict[str, torch.Tensor]) -> None:
        """Add one draw, ``{site: (chains, ...)}`` in the constrained space (θ sites and their twins)."""
        if not isinstance(draws, Mapping) or not draws:
            raise ValueError(f"OnlineBMA.update: draws must be one draw {{site: (chains, ...) tensor}} of the model's "
                             f"sites (θ and their twins), as MCMC's hook_fn hands it; got {draws!r:.80}.")
        if self.uses is None:
            twins = any(name + self.suffix in draws for name in draws)
            self.uses = USES if twins else ("theta",)
        self.num_draws += 1
        k = self.num_draws
        count = next(iter(draws.values())).shape[0]
        predicted: Dict[str, torch.Tensor] = {}
        for use in self.uses:
            if use == "both" and {"theta", "aux"} <= set(predicted):  # as many θ as θa draws: the mean of the two
                p = (predicted["theta"] + predicted["aux"]) / 2
            else:
                p = bma_predict(self.model, draws, *self.args, use=use, suffix=self.suffix, **self.kwargs).double()
                p = predicted[use] = chains_average(p, count)  # across ranks: every rank's chains
            if p.shape[0] != self.y.shape[0]:
                raise ValueError(f"OnlineBMA: y has {self.y.shape[0]} labels but the model predicts {p.shape[0]} "
                                 "points; pass the labels of the held-out inputs given as args.")
            average = self.probs.get(use)
            self.probs[use] = p if average is None else average + (p - average) / k
            row = metrics.classification_metrics(self.probs[use], self.y, n_bins=self.n_bins)
            n = self.y.shape[0]
            row["accuracy_se"] = float(np.sqrt(row["accuracy"] * (1 - row["accuracy"]) / n))
            row["nll_se"] = float(metrics.pointwise_nll(self.probs[use], self.y).std() / np.sqrt(n))
            self.history.setdefault(use, []).append(row)

    def curve(self, use: str, *, warmup: int = 0, thin: int = 1, num_points: int = 50,
              cost: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
        """``use``'s accuracy and NLL (with standard errors over the held-out points) after ``num_points``
        numbers of draws k, laid out as :func:`~pyro_flat.metrics.running_bma`'s: ``iteration = warmup +
        k * thin``, ``x = cost[k - 1]`` (e.g. gradient evaluations per chain) or the iteration."""
        if use not in self.history:
            raise ValueError(f"OnlineBMA.curve: no draws averaged for use={use!r} (it has {sorted(self.history)}).")
        rows = self.history[use]
        ks = metrics.curve_points(len(rows), num_points)
        out = metrics.curve_axis(ks, warmup, thin, cost)
        for key in ("accuracy", "accuracy_se", "nll", "nll_se"):
            out[key] = np.array([rows[k - 1][key] for k in ks])
        return out


__all__ = ["OnlineBMA", "USES"]
