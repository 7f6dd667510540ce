"""ArviZ conversion and convergence verdicts: the one place that knows which ArviZ is installed.

ArviZ 0.x (Python 3.11 here) builds an ``InferenceData`` with ``az.from_dict``; ArviZ 1.x builds an
``xarray.DataTree`` with ``arviz_base.from_dict``. :func:`to_arviz` hides the difference: both carry
a ``posterior`` group with ``(chain, draw, ...)`` variables for every θ and θa site, and a
``sample_stats`` group with the kernels' per-draw statistics.

:func:`diagnostics_table` gives every coordinate's R-hat and ESS **unrounded** (``az.summary``
rounds to two decimals, so an R-hat of 1.0124 would read 1.01 and pass a 1.01 threshold), and
:func:`convergence_verdict` applies ArviZ's thresholds to it.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from ..validation import check_memory, to_numpy

ArrayDict = Dict[str, np.ndarray]


def mcmc_sample_stats(mcmc) -> Dict[str, torch.Tensor]:
    """The per-draw statistics of a finished ``MCMC`` run, ``{name: tensor(chain, draw)}``.

    pyro-flat kernels hand them to Pyro's driver through ``diagnostics()``, which keeps them per
    chain; kernels without them give ``{}``.
    """
    # Pyro keeps each chain's kernel diagnostics in MCMC._diagnostics and has no public reader for them (its
    # diagnostics() gives R-hat and ESS instead); tests/test_arviz_bma_metrics.py reads them through
    # pyro.infer.MCMC, so a Pyro release that moves them fails there
    per_chain = [d.get("sample_stats") for d in (mcmc._diagnostics or []) if isinstance(d, dict)]
    if not (per_chain and all(per_chain)):
        return {}
    return {name: torch.stack([torch.as_tensor(s[name]) for s in per_chain]) for name in per_chain[0]}


#: ArviZ's thresholds for a converged run (Vehtari et al. 2021): rank-normalised split R-hat and
#: bulk and tail ESS of every coordinate
MAX_R_HAT, MIN_ESS = 1.01, 400


def diagnostics_table(idata, var_names: Optional[Sequence[str]] = None):
    """``pandas.DataFrame`` of every coordinate's ``r_hat``, ``ess_bulk`` and ``ess_tail``, unrounded.

    >>> import torch
    >>> table = diagnostics_table(to_arviz({"w": torch.randn(4, 500, 2)}))
    >>> list(table.columns), len(table), bool(table["r_hat"].max() < 1.01)
    (['ess_bulk', 'ess_tail', 'r_hat'], 2, True)
    """
    import arviz as az

    table = az.summary(idata, var_names=list(var_names) if var_names else None, kind="diagnostics",
                       round_to="none")
    return table[["ess_bulk", "ess_tail", "r_hat"]]


def convergence_verdict(table, sample_stats: Optional[Mapping[str, torch.Tensor]] = None, *,
                        advice: str = "run more iterations") -> dict:
    """``{"converged", "text", "worst"}`` by ArviZ's thresholds over every row of ``table`` (a
    :func:`diagnostics_table`: R-hat ≤ :data:`MAX_R_HAT`, bulk and tail ESS ≥ :data:`MIN_ESS`),
    with ``advice`` when not converged; EntropyHMC's acceptance rate and divergences are added.
    R-hat is printed to four decimals, so that a printed value above 1.01 is never called converged.
    """
    bad = table[(table["r_hat"] > MAX_R_HAT) | (table["ess_bulk"] < MIN_ESS) | (table["ess_tail"] < MIN_ESS)]
    worst = bad.assign(_ess=bad[["ess_bulk", "ess_tail"]].min(axis=1)).sort_values(
        ["r_hat", "_ess"], ascending=[False, True]).head(3)
    hmc = {}
    if sample_stats and "acceptance_rate" in sample_stats:
        hmc = {"acceptance_rate": float(sample_stats["acceptance_rate"].mean()),
               "divergences": int(sample_stats.get("diverging", torch.zeros(1)).sum())}
    extra = (f"; acceptance rate {hmc['acceptance_rate']:.2f}, {hmc['divergences']} divergent transitions"
             if hmc else "")
    if bad.empty:
        text = (f"converged (max R-hat {table['r_hat'].max():.4f}, min ESS bulk {table['ess_bulk'].min():.0f}, "
                f"tail {table['ess_tail'].min():.0f})" + extra)
    else:
        rows = ", ".join(f"{i} (R-hat {r.r_hat:.4f}, ESS bulk {r.ess_bulk:.0f}, tail {r.ess_tail:.0f})"
                         for i, r in worst.iterrows())
        text = (f"NOT converged: {len(bad)} of {len(table)} coordinates miss the thresholds (R-hat ≤ {MAX_R_HAT}, "
                f"ESS ≥ {MIN_ESS}); worst {rows}. {advice[0].upper() + advice[1:]}" + extra)
    return {"converged": bad.empty, "text": text, "worst": list(worst.index), **hmc}


def guidance_correlation(theta, theta_aux) -> Dict[str, float]:
    r"""Does :math:`\theta` move toward :math:`\theta_a`? The correlation, per coordinate over all
    chains and consecutive draws, between :math:`\theta`'s next move and the gap to its twin,

    .. math:: r_j = \operatorname{corr}\big(\theta_{k+1,j} - \theta_{k,j},\
              \theta_{a,k,j} - \theta_{k,j}\big),

    averaged over coordinates (``mean``), with the share of coordinates where it is positive and
    ``null_sd`` :math:`= 1/\sqrt n`, one coordinate's sd when :math:`\theta`'s moves ignore
    :math:`\theta_a` (about; consecutive moves are not independent). Entropy-MCMC's drift pulls
    :math:`\theta` toward :math:`\theta_a`, so ``mean`` is positive; under the joint's exact inverse
    Hessian as metric it is 0 (:mod:`~pyro_flat.kernels.preconditioning`).

    :param theta: ``(chain, draw, ...)`` draws of θ; ``theta_aux`` the same of θa.

    >>> import torch
    >>> theta = torch.randn(2, 300, 5).cumsum(1)          # a random walk that ignores θa
    >>> r = guidance_correlation(theta, theta + torch.randn(2, 300, 5))
    >>> abs(r["mean"]) < 3 * r["null_sd"]
    True
    """
    x, a = to_numpy(theta).astype(np.float64), to_numpy(theta_aux).astype(np.float64)
    x, a = x.reshape(*x.shape[:2], -1), a.reshape(*a.shape[:2], -1)
    move = (x[:, 1:] - x[:, :-1]).reshape(-1, x.shape[-1])
    gap = (a[:, :-1] - x[:, :-1]).reshape(-1, x.shape[-1])
    move, gap = move - move.mean(0), gap - gap.mean(0)
    denom = np.sqrt((move ** 2).sum(0) * (gap ** 2).sum(0))
    r = np.where(denom > 0, (move * gap).sum(0) / np.where(denom > 0, denom, 1.0), 0.0)
    return {"mean": float(r.mean()), "positive_share": float((r > 0).mean()),
            "null_sd": float(1.0 / np.sqrt(len(move)))}


def chain_correlation(draws, *, num_shifts: int = 40, seed: int = 0) -> Dict[str, float]:
    r"""Are the chains independent? The correlation between two chains' increments,

    .. math:: \bar r = \operatorname{mean}_{i<j,\ d}\ \operatorname{corr}_k\big(\Delta_{i,k,d},\ \Delta_{j,k,d}\big),
              \qquad \Delta_{i,k} = x_{i,k+1} - x_{i,k},

    averaged over chain pairs and coordinates (``mean``). Independent chains give 0; chains that
    share their gradient noise (one minibatch for all vectorized chains) give a positive value.
    ``null_sd`` is its sd under independence, measured rather than assumed (coordinates of one
    posterior are correlated, so ``1/sqrt(draws x pairs x coordinates)`` would be too small): the
    same statistic with each pair's second chain shifted circularly in time by a random lag
    (``num_shifts`` times), which keeps every chain's own structure and breaks the pairing.
    ``z = mean / null_sd``.

    :param draws: ``(chain, draw, ...)`` draws of one site, at least 2 chains.

    >>> import torch
    >>> walks = torch.randn(4, 500, 3).cumsum(1)          # four independent random walks
    >>> abs(chain_correlation(walks)["z"]) < 4
    True
    """
    x = to_numpy(draws).astype(np.float64)
    if x.ndim < 2 or x.shape[0] < 2 or x.shape[1] < 3:
        raise ValueError(f"chain_correlation needs (chain, draw, ...) draws of at least 2 chains and 3 draws, "
                         f"got shape {x.shape}.")
    steps = np.diff(x.reshape(*x.shape[:2], -1), axis=1)
    sd = steps.std(1, keepdims=True)
    steps = (steps - steps.mean(1, keepdims=True)) / np.where(sd > 0, sd, 1.0)
    chains, length = steps.shape[:2]
    pairs = [(i, j) for i in range(chains) for j in range(i + 1, chains)]

    def statistic(shifts) -> float:
        return float(np.mean([(steps[i] * np.roll(steps[j], s, axis=0)).mean() for (i, j), s in zip(pairs, shifts)]))

    rng = np.random.default_rng(seed)
    low = max(1, length // 10)
    null = [statistic(rng.integers(low, length - low + 1, len(pairs))) for _ in range(num_shifts)]
    mean, null_sd = statistic([0] * len(pairs)), float(np.std(null))
    return {"mean": mean, "null_sd": null_sd, "z": mean / null_sd if null_sd > 0 else float("nan"),
            "pairs": len(pairs)}


def _from_mcmc(mcmc, var_names=None, coordinates=None) -> tuple[ArrayDict, ArrayDict]:
    if not hasattr(mcmc, "get_samples"):
        raise TypeError(f"to_arviz takes an MCMC object or a dict {{site: tensor}}, got {type(mcmc).__name__}.")
    require_draws(mcmc, "to_arviz(mcmc)")
    samples = select_draws(mcmc.get_samples(group_by_chain=True), var_names, coordinates, "to_arviz")
    posterior = {k: to_numpy(v, None) for k, v in samples.items()}
    return posterior, {k: to_numpy(v, None) for k, v in mcmc_sample_stats(mcmc).items()}


def require_draws(mcmc, what: str) -> None:
    """A ``ValueError`` that says why ``mcmc`` has no draws, instead of Pyro's ``NoneType`` errors."""
    if getattr(mcmc, "_samples", None) is None:
        if getattr(mcmc, "rank", 0) != 0 and getattr(mcmc, "chain_method", None) == "distributed":
            raise ValueError(f"{what}: this is rank {mcmc.rank}; the draws of all chains were gathered to rank 0. "
                             "Call it there (if mcmc.rank == 0: ...).")
        raise ValueError(f"{what}: this MCMC has no draws: call mcmc.run(...) first. A run that stopped "
                         "with an error has none either; after a DivergenceError its draws are in "
                         "err.samples and err.completed_chains (also kernel.partial_samples).")


def per_chain_diagnostics(diagnostics: dict, num_chains: int) -> list:
    """A vectorized kernel's diagnostics as Pyro's list of one dict per chain (numbers as floats,
    as Pyro's driver gives them)."""
    per_chain = []
    for c in range(num_chains):
        chain = {}
        for key, value in diagnostics.items():
            if key == "divergences":
                chain[key] = list(value[c])
            elif key == "sample_stats":
                chain[key] = {name: stat[:, c] for name, stat in value.items()}
            elif torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == num_chains:
                chain[key] = float(value[c]) if value[c].dim() == 0 else value[c]
            else:
                chain[key] = value
        per_chain.append(chain)
    return per_chain


def select_draws(samples: Mapping[str, torch.Tensor], var_names: Optional[Sequence[str]] = None,
                 coordinates: Optional[Mapping[str, object]] = None, what: str = "select_draws",
                 lead: int = 2) -> Dict[str, torch.Tensor]:
    """The sites ``var_names`` of ``samples`` (``(chain, draw, ...)``, or ``lead`` leading dims), and of a site
    in ``coordinates`` only those entries of its flattened value (a list of indices or a ``slice``), copied
    out: memory-mapped draws (``MCMC(..., draws_dir=...)``) are read for those entries alone. A selection
    that would need more than half of this machine's memory is refused, naming both arguments.

    >>> draws = {"w": torch.arange(24.).reshape(1, 2, 3, 4), "b": torch.zeros(1, 2)}
    >>> select_draws(draws, ["w"], {"w": [0, 11]})["w"].tolist()
    [[[0.0, 11.0], [12.0, 23.0]]]
    """
    names = list(samples) if var_names is None else list(var_names)
    unknown = [n for n in names if n not in samples] + [n for n in (coordinates or {}) if n not in names]
    if unknown:
        raise ValueError(f"{what}: no site(s) {unknown} among the draws (or left out by var_names); the sites are "
                         f"{sorted(samples)}.")
    picked = {}
    for name in names:
        value = torch.as_tensor(samples[name])  # numpy arrays too (without a copy)
        if coordinates is not None and name in coordinates:
            flat = value.reshape(*value.shape[:lead], -1)
            index = coordinates[name]
            index = torch.arange(flat.shape[-1])[index] if isinstance(index, slice) else torch.as_tensor(index)
            if index.dtype == torch.bool or index.dim() != 1 or (len(index) and not (
                    0 <= int(index.min()) and int(index.max()) < flat.shape[-1])):
                raise ValueError(f"{what}: coordinates[{name!r}] must be a slice or a list of flat indices in "
                                 f"[0, {flat.shape[-1]}) of the site's {tuple(value.shape[lead:])} values.")
            value = flat
        else:
            index = None
        picked[name] = (value, index)
    needed = sum((v.numel() if i is None else v.shape[:lead].numel() * len(i)) * v.element_size() * 2
                 for v, i in picked.values())  # the copy and ArviZ's own
    check_memory("var_names / coordinates", needed, what=f"draws for {what}",
                 hint="pass var_names=[...] (the sites to convert) or coordinates={site: indices} (a subset of "
                      "each site's entries), e.g. coordinates={'w': slice(0, 100)}.")
    return {n: (v if i is None else v.index_select(v.dim() - 1, i)) for n, (v, i) in picked.items()}


def to_arviz(
    mcmc_or_samples: Union[object, Mapping[str, torch.Tensor]],
    *,
    sample_stats: Optional[Mapping[str, torch.Tensor]] = None,
    group_by_chain: bool = True,
    var_names: Optional[Sequence[str]] = None,
    coordinates: Optional[Mapping[str, object]] = None,
):
    """Convert a finished ``pyro.infer.MCMC`` (or a dict of samples) to an ArviZ object.

    :param mcmc_or_samples: an ``MCMC`` after ``run``, or ``{site: tensor}``.
    :param sample_stats: extra per-draw statistics ``{name: tensor(chain, draw)}``.
    :param group_by_chain: for a dict, whether arrays are ``(chain, draw, ...)``; if ``False`` they
        are ``(draw, ...)`` of one chain.
    :param var_names, coordinates: convert only these sites, and of a site in ``coordinates`` only those
        entries of its flattened value (:func:`select_draws`): the way to diagnose a network's draws
        streamed to disk (``draws_dir``) when all of them would not fit in memory (refused then, by name).
    :returns: ``arviz.InferenceData`` on ArviZ 0.x, ``xarray.DataTree`` on ArviZ 1.x.

    Example::

        >>> import torch
        >>> from pyro_flat import to_arviz
        >>> idata = to_arviz({"w": torch.randn(2, 100, 3), "w_aux": torch.randn(2, 100, 3)})
        >>> idata.posterior["w"].shape
        (2, 100, 3)
    """
    if isinstance(mcmc_or_samples, Mapping):
        chosen = select_draws(mcmc_or_samples, var_names, coordinates, "to_arviz", lead=2 if group_by_chain else 1)
        posterior = {k: to_numpy(v, None) for k, v in chosen.items()}
        if not group_by_chain:
            posterior = {k: v[None] for k, v in posterior.items()}
        stats: ArrayDict = {}
    else:
        posterior, stats = _from_mcmc(mcmc_or_samples, var_names, coordinates)
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


def write_netcdf(idata, path) -> None:
    """Write ``idata`` (:func:`to_arviz`'s result) to the netCDF file ``path``, as ``idata.to_netcdf``.

    The file is built in memory and then written with plain file I/O: when the disk fills up, HDF5
    writing straight to it prints its own tracebacks and then crashes the interpreter (a segfault)
    as its half-written objects are freed. Here a full disk is one ``OSError`` naming ``path`` (its
    ``errno`` ENOSPC), and no part of the file is left behind.
    """
    import io
    import os

    buffer = io.BytesIO()
    try:
        _netcdf_into(idata, buffer)
    except (TypeError, ValueError, NotImplementedError):  # an xarray that cannot write to memory
        idata.to_netcdf(str(path))
        return
    try:
        with open(path, "wb") as file:
            file.write(buffer.getbuffer())
    except OSError as err:
        try:
            os.remove(path)
        except OSError:
            pass
        raise OSError(err.errno, err.strerror or str(err), str(path)) from err


def _netcdf_into(idata, target) -> None:
    """``idata`` as one netCDF-4 file (h5netcdf) in the file-like ``target``: ArviZ's own layout, a
    group per InferenceData group, numbers compressed."""
    import xarray as xr

    if isinstance(idata, getattr(xr, "DataTree", ())):  # pragma: no cover - ArviZ 1.x
        idata.to_netcdf(target, engine="h5netcdf")
        return
    mode = "w"
    if idata.attrs:
        xr.Dataset(attrs=idata.attrs).to_netcdf(target, mode=mode, engine="h5netcdf", group="/")
        mode = "a"
    for group in idata.groups():
        data = getattr(idata, group)
        encoding = {name: {"zlib": True} for name, values in data.variables.items() if values.dtype.kind in "biufcS"}
        data.to_netcdf(target, mode=mode, group=f"/{group}", engine="h5netcdf", encoding=encoding)
        mode = "a"


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
