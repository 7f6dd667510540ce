"""Flatness of a Pyro model's posterior at MCMC draws: the top Hessian eigenvalues and the
Hessian trace of the full-data potential at each draw (θ or the guiding θa)."""

from __future__ import annotations

from typing import Callable, Dict, Mapping, Optional, Union

import numpy as np
import torch
from pyro import poutine

from ..targets import is_subsample_site
from .loss import FlatLoss
from .spectrum import top_eigenvalues
from .trace import hessian_trace

__all__ = ["flatness_at_samples"]


def flatness_at_samples(model: Callable, samples: Mapping[str, torch.Tensor], *args,
                        use: str = "theta", k: int = 1, num_probes: int = 20,
                        num_draws: Optional[int] = None, suffix: str = "_aux", seed: int = 0,
                        likelihood_only: bool = False, autocast: Union[None, str, torch.dtype] = None,
                        **kwargs) -> Dict[str, np.ndarray]:
    """Top-``k`` Hessian eigenvalues and Hutchinson traces of ``model``'s potential at draws.

    :param model: the original model (a :func:`~pyro_flat.flat_posterior` model is unwrapped).
    :param samples: ``mcmc.get_samples()``, ``{site: (num_draws, ...)}``.
    :param args, kwargs: the model's data; a subsampled plate is evaluated on all of it.
    :param use: ``"theta"`` (the draws of the sites) or ``"aux"`` (their ``name + suffix``
        twins, plugged in as the sites' unconstrained values).
    :param num_draws: measure this many draws, evenly spaced (default: all).
    :param likelihood_only: measure the negative log-likelihood alone (see :meth:`FlatLoss.from_model`).
    :param autocast: ``"bf16"``: the loss's forward under bf16 autocast (:meth:`FlatLoss.under_autocast`), as a
        network sampled with the kernels' ``autocast`` was.
    :returns: ``{"draw": (S,), "top_eigenvalues": (S, k), "trace": (S,), "trace_stderr": (S,)}``.

    The Hessian is that of the potential :math:`U(z)` in unconstrained coordinates
    (:meth:`FlatLoss.from_model`), the quantity the samplers move in.
    """
    from ..evaluation.predictive import iter_draws

    if use not in ("theta", "aux"):
        raise ValueError(f"use must be 'theta' or 'aux', got use={use!r}.")
    model = getattr(model, "base_model", model)
    with torch.no_grad():
        tr = poutine.trace(model).get_trace(*args, **kwargs)
    latents = [n for n, s in tr.nodes.items()
               if s["type"] == "sample" and not s["is_observed"] and not is_subsample_site(s)]
    missing = [n for n in latents if n not in samples or (use == "aux" and n + suffix not in samples)]
    if missing:
        want = [n + suffix for n in missing] if use == "aux" else missing
        raise ValueError(f"samples lack the site(s) {want} of the model (keys: {sorted(samples)}).")
    supports = {n: tr.nodes[n]["fn"].support for n in latents}
    total = len(next(iter(samples[n] for n in latents)))
    chosen = np.arange(total) if num_draws is None or num_draws >= total else \
        np.unique(np.linspace(0, total - 1, int(num_draws)).round().astype(int))
    picked = {n: samples[n][chosen] for n in latents}
    if use == "aux":
        picked.update({n + suffix: samples[n + suffix][chosen] for n in latents})
    draws = list(iter_draws(picked, use, suffix, latents, supports))
    loss = FlatLoss.from_model(model, draws[0], *args, likelihood_only=likelihood_only, **kwargs).under_autocast(autocast)
    eigs, traces, stderrs = [], [], []
    for draw in draws:
        at = loss.at(loss.flatten(draw))
        eigs.append(top_eigenvalues(at, k=k, seed=seed))
        estimate = hessian_trace(at, num_probes=num_probes, seed=seed)
        traces.append(estimate.value)
        stderrs.append(estimate.stderr)
    return {"draw": chosen, "top_eigenvalues": np.array(eigs), "trace": np.array(traces),
            "trace_stderr": np.array(stderrs)}
