"""ArviZ conversion: the one place that knows which ArviZ is installed.

ArviZ 0.x (Python 3.11 here) builds an ``InferenceData`` with ``az.from_dict``; ArviZ 1.x builds an
``xarray.DataTree`` with ``arviz_base.from_dict``. :func:`to_arviz` hides the difference: both carry
a ``posterior`` group with ``(chain, draw, ...)`` variables for every θ and θa site, and a
``sample_stats`` group with the kernels' per-draw statistics.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Union

import numpy as np
import torch

from .validation import to_numpy

ArrayDict = Dict[str, np.ndarray]


def mcmc_sample_stats(mcmc) -> Dict[str, torch.Tensor]:
    """The per-draw statistics of a finished ``MCMC`` run, ``{name: tensor(chain, draw)}``.

    pyro-flat kernels hand them to Pyro's driver through ``diagnostics()``, which keeps them per
    chain; kernels without them give ``{}``.
    """
    per_chain = [d.get("sample_stats") for d in (mcmc._diagnostics or []) if isinstance(d, dict)]
    if not (per_chain and all(per_chain)):
        return {}
    return {name: torch.stack([torch.as_tensor(s[name]) for s in per_chain]) for name in per_chain[0]}


def _from_mcmc(mcmc) -> tuple[ArrayDict, ArrayDict]:
    if not hasattr(mcmc, "get_samples"):
        raise TypeError(f"to_arviz takes an MCMC object or a dict {{site: tensor}}, got {type(mcmc).__name__}.")
    if getattr(mcmc, "_samples", None) is None:
        raise ValueError("to_arviz(mcmc): this MCMC has no draws yet; call mcmc.run(...) first.")
    posterior = {k: to_numpy(v, None) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    return posterior, {k: to_numpy(v, None) for k, v in mcmc_sample_stats(mcmc).items()}


def to_arviz(
    mcmc_or_samples: Union[object, Mapping[str, torch.Tensor]],
    *,
    sample_stats: Optional[Mapping[str, torch.Tensor]] = None,
    group_by_chain: bool = True,
):
    """Convert a finished ``pyro.infer.MCMC`` (or a dict of samples) to an ArviZ object.

    :param mcmc_or_samples: an ``MCMC`` after ``run``, or ``{site: tensor}``.
    :param sample_stats: extra per-draw statistics ``{name: tensor(chain, draw)}``.
    :param group_by_chain: for a dict, whether arrays are ``(chain, draw, ...)``; if ``False`` they
        are ``(draw, ...)`` of one chain.
    :returns: ``arviz.InferenceData`` on ArviZ 0.x, ``xarray.DataTree`` on ArviZ 1.x.

    Example::

        >>> import torch
        >>> from pyro_flat import to_arviz
        >>> idata = to_arviz({"w": torch.randn(2, 100, 3), "w_aux": torch.randn(2, 100, 3)})
        >>> idata.posterior["w"].shape
        (2, 100, 3)
    """
    if isinstance(mcmc_or_samples, Mapping):
        posterior = {k: to_numpy(v, None) for k, v in mcmc_or_samples.items()}
        if not group_by_chain:
            posterior = {k: v[None] for k, v in posterior.items()}
        stats: ArrayDict = {}
    else:
        posterior, stats = _from_mcmc(mcmc_or_samples)
    if not posterior:
        raise ValueError("to_arviz: there are no samples to convert.")
    shapes = {k: v.shape[:2] for k, v in posterior.items()}
    if len(set(shapes.values())) != 1 or any(len(v.shape) < 2 for v in posterior.values()):
        raise ValueError(f"to_arviz: every site needs the same (chain, draw) leading shape, got {shapes}")
    if sample_stats:
        stats.update({k: to_numpy(v, None) for k, v in sample_stats.items()})
    if "diverging" in stats:  # ArviZ indexes draws with it
        stats["diverging"] = stats["diverging"].astype(bool)
    if "potential_energy" in stats and "lp" not in stats:
        stats["lp"] = -stats["potential_energy"]  # ArviZ's name for the log density
    return _build(posterior, stats)


def _build(posterior: ArrayDict, stats: ArrayDict):
    import arviz as az

    version = int(getattr(az, "__version__", "0").split(".")[0])
    if version >= 1:  # pragma: no cover - ArviZ 1.x needs Python >= 3.12
        from arviz_base import from_dict

        groups = {"posterior": posterior}
        if stats:
            groups["sample_stats"] = stats
        return from_dict(groups)
    return az.from_dict(posterior=posterior, sample_stats=stats or None)
