r"""Bayesian model averaging of predictive *probabilities* over θ and/or θa draws.

.. math:: p(y \mid x, D) \approx \frac{1}{S} \sum_{s=1}^{S} p(y \mid x, \theta^{(s)})

Probabilities are averaged, never logits (averaging logits is a different, overconfident
predictor). With ``use="aux"`` the guiding draws :math:`\theta_a^{(s)}` are plugged into the
model in place of :math:`\theta`; ``use="both"`` averages over the union of both sets, as in
Entropy-MCMC's evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable, Dict, Optional, Tuple, Union

import torch
from pyro import poutine
from pyro.poutine.messenger import Messenger

from ..nn.batches import Batches
from ..roundoff import roundoff_tolerance
from ..targets import check_finite_inputs, is_subsample_site, support_transform
from ..targets.precision import check_autocast
from ..validation import check_tensor

_USES = ("both", "theta", "aux")


class _Predict(Messenger):
    """Plug in latent values and a block of plate indices; record the sites' distributions."""

    def __init__(self, values: Dict[str, torch.Tensor], indices: Dict[str, torch.Tensor]):
        super().__init__()
        self.values, self.indices = values, indices
        self.fns: Dict[str, object] = {}
        self.plate_dims: Dict[str, Dict[str, int]] = {}

    def _pyro_sample(self, msg) -> None:
        name = msg["name"]
        if is_subsample_site(msg):
            if name in self.indices:
                msg["value"] = self.indices[name]
                msg["done"] = True
            return
        if name in self.values:
            msg["value"] = self.values[name]
            msg["done"] = True
        else:
            self.fns[name] = msg["fn"]

    def _postprocess_message(self, msg) -> None:
        if msg["name"] in self.fns:
            self.plate_dims[msg["name"]] = {f.name: f.dim for f in msg["cond_indep_stack"]}


def _index_blocks(size: int, batch: int):
    """Blocks of ``batch`` consecutive indices covering ``range(size)``; the last one overlaps the
    previous block so that every block has the plate's fixed ``subsample_size``. Yields
    ``(indices, keep)`` where ``keep`` masks the indices not seen before."""
    for start in range(0, size, batch):
        stop = min(start + batch, size)
        first = max(stop - batch, 0)
        idx = torch.arange(first, stop)
        yield idx, idx >= start


def stacked_draws(samples: Dict[str, torch.Tensor], use: str, suffix: str, latent_names, supports) -> Dict[str, torch.Tensor]:
    """``{site: (S, ...)}``: the θ draws, the θa draws (in the constrained space, under θ's names) or both,
    one after the other along the first dimension (the order of :func:`iter_draws`)."""
    parts = []
    if use in ("theta", "both"):
        parts.append({n: samples[n] for n in latent_names})
    if use in ("aux", "both"):
        parts.append({n: support_transform(n, supports[n])(samples[n + suffix]) if n + suffix in samples
                      else samples[n] for n in latent_names})
    return {n: torch.cat([part[n] for part in parts]) for n in latent_names}


def iter_draws(samples: Dict[str, torch.Tensor], use: str, suffix: str, latent_names, supports):
    """Yield dicts {site: value} of θ draws, θa draws (in the constrained space, under θ's names) or both."""
    num = next(iter(samples[n] for n in latent_names)).shape[0]
    if use in ("theta", "both"):
        for s in range(num):
            yield {n: samples[n][s] for n in latent_names}
    if use in ("aux", "both"):
        for s in range(num):
            yield {
                n: support_transform(n, supports[n])(samples[n + suffix][s]) if n + suffix in samples else samples[n][s]
                for n in latent_names
            }


def bma_predict(
    model: Callable,
    samples: Dict[str, torch.Tensor],
    *args,
    use: Optional[str] = None,
    site: Optional[str] = None,
    suffix: str = "_aux",
    batchnorm_data: Optional[torch.Tensor] = None,
    autocast: Union[None, str, torch.dtype] = None,
    **kwargs,
) -> torch.Tensor:
    """Average the predictive class probabilities of ``model(*args, **kwargs)`` over draws.

    :param model: the original model (a :func:`~pyro_flat.flat_posterior` model is unwrapped).
    :param samples: ``mcmc.get_samples()``: ``{site: (num_draws, ...)}`` with θ sites and their
        ``name + suffix`` twins.
    :param use: ``"theta"``, ``"aux"`` or ``"both"``; by default ``"both"`` when the samples have
        auxiliary twins and ``"theta"`` when they have none (SGLD, ensembles, Predictive draws).
    :param site: the observed site to predict; by default the only non-latent site whose
        distribution has ``probs`` (Bernoulli, Categorical, ...).
    :param batchnorm_data: training inputs, for a :class:`~pyro_flat.nn.BayesianModule` with BatchNorm
        layers: each draw predicts with its own statistics over them (``model.batchnorm_data``).
    :param autocast: ``torch.bfloat16`` (or ``"bf16"``): each draw's forward under ``torch.autocast``, the
        average over draws accumulated in fp32 (the kernels' ``autocast``, :mod:`pyro_flat.targets.precision`).
    :returns: probabilities shaped like the site's ``probs`` (``(N,)`` for Bernoulli, ``(N, C)``
        for Categorical). Subsampling plates are switched off: every data point is predicted.

    A model that broadcasts over a leading dimension of its latents (as vectorized chains need) is run
    on blocks of draws at once, up to :data:`BLOCK_ELEMENTS` probabilities a block (checked on the first
    two draws against one draw at a time, as ``MCMC`` checks its chains): 16,000 draws of a 5-weight
    logistic regression on 1,000 points took 48 s one at a time and 0.2 s in blocks. Any other model
    is run one draw at a time.

    Example::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro_flat import bma_predict
        >>> def model(X, y=None):
        ...     w = pyro.sample("w", dist.Normal(0., 1.).expand([2]).to_event(1))
        ...     with pyro.plate("data", X.shape[0]):
        ...         pyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)
        >>> draws = {"w": torch.tensor([[1., 0.], [3., 0.]]), "w_aux": torch.zeros(2, 2)}
        >>> bma_predict(model, draws, torch.tensor([[1., 5.]]), use="theta")
        tensor([0.8418])
    """
    if not callable(model):
        raise TypeError(f"model must be the Pyro model (a callable) the samples came from, got "
                        f"{type(model).__name__} model={model!r}.")
    if not isinstance(samples, Mapping):
        raise TypeError(f"samples must be a dict {{site: (num_draws, ...) tensor}} such as mcmc.get_samples(), "
                        f"got {type(samples).__name__}.")
    if use is not None and use not in _USES:
        raise ValueError(f"use must be one of {_USES} (or None), got use={use!r}")
    model = getattr(model, "base_model", model)
    if any(isinstance(a, Batches) for a in (*args, *kwargs.values())):
        raise ValueError("bma_predict predicts every row of its inputs in order: pass them as a tensor, not "
                         "Batches(loader) (a loader's batches come in its own order). Pass the data as tensors.")
    check_finite_inputs(args, kwargs, before="predicting", who="bma_predict: ")
    dtype = check_autocast(autocast)
    if dtype is not None:
        tensors = [v for v in (*args, *kwargs.values(), *samples.values()) if isinstance(v, torch.Tensor)]
        with torch.autocast(device_type=tensors[0].device.type if tensors else "cpu", dtype=dtype):
            return bma_predict(model, samples, *args, use=use, site=site, suffix=suffix,
                               batchnorm_data=batchnorm_data, **kwargs)
    if batchnorm_data is not None:
        if not hasattr(model, "batchnorm_data"):
            raise TypeError(f"batchnorm_data is for a pyro_flat.nn.BayesianModule with BatchNorm layers; "
                            f"{type(model).__name__} has no BatchNorm statistics to recompute: leave it out.")
        with model.batchnorm_data(batchnorm_data):
            return bma_predict(model, samples, *args, use=use, site=site, suffix=suffix, **kwargs)
    with torch.no_grad():
        tr = poutine.trace(model).get_trace(*args, **kwargs)
    latents = [  # a site with class probabilities is an output to predict, even if samples hold its draws
        n for n, s in tr.nodes.items()  # (pyro.infer.Predictive returns the observed site too)
        if s["type"] == "sample" and not s["is_observed"] and not is_subsample_site(s) and n in samples
        and not hasattr(s["fn"], "probs")
    ]
    if not latents:
        raise ValueError(
            f"bma_predict: none of the model's latent sites are in samples (keys {sorted(samples)})."
        )
    samples = _as_tensors(samples, latents, suffix, tr)
    has_aux = any(n + suffix in samples for n in latents)
    if use is None:
        use = "both" if has_aux else "theta"
    if use in ("aux", "both") and not has_aux:
        raise ValueError(
            f"bma_predict(use={use!r}) needs auxiliary draws named '<site>{suffix}' "
            "(from EntropySGLD or flat_posterior); these samples have none. Use use='theta'."
        )
    sites = [n for n, s in tr.nodes.items() if s["type"] == "sample" and not is_subsample_site(s)]
    if site is not None and site not in sites:
        raise ValueError(f"bma_predict: no site {site!r}; the model's sample sites are {sites}.")
    samples = _drop_plate_dims(samples, latents, suffix, tr)
    _check_draws(samples, latents, suffix, tr)
    supports = {n: tr.nodes[n]["fn"].support for n in latents}
    plates = {
        n: (st["fn"].size, st["value"].numel())
        for n, st in tr.nodes.items()
        if st["type"] == "sample" and is_subsample_site(st) and st["value"].numel() < st["fn"].size
    }
    if len(plates) > 1:
        raise ValueError(
            f"bma_predict supports one subsampled plate, the model has {sorted(plates)}; "
            "call the model without subsampling for prediction."
        )
    draws = stacked_draws(samples, use, suffix, latents, supports)
    count = next(iter(draws.values())).shape[0]
    device = tr.nodes[latents[0]]["value"].device  # where the model draws its latents
    with torch.no_grad():
        first, site = _predict_probs(model, args, kwargs, _rows(draws, 0, 1, True, device), plates, site)
        block = _block_size(model, args, kwargs, draws, plates, site, first, device)
        first = _at_least_fp32(first)  # under autocast a draw's probabilities may be bf16: the average is not
        if block == 1:  # one draw at a time
            total = first.clone()
            for s in range(1, count):
                total.add_(_at_least_fp32(_predict_probs(model, args, kwargs, _rows(draws, s, s + 1, True, device),
                                                         plates, site)[0]))
            return total / count
        total = torch.zeros_like(first)
        for start in range(0, count, block):
            rows = _rows(draws, start, start + block, device=device)
            probs = _predict_probs(model, args, kwargs, rows, plates, site)[0]
            total.add_(_at_least_fp32(probs).sum(0))
    return total / count


def _at_least_fp32(probs: torch.Tensor) -> torch.Tensor:
    return probs.float() if probs.dtype in (torch.bfloat16, torch.float16) else probs


#: the most probabilities (draws x points x classes) :func:`bma_predict` computes in one block of draws
BLOCK_ELEMENTS = 2 ** 21


def _rows(draws: Dict[str, torch.Tensor], start: int, stop: int, squeeze: bool = False,
          device: Optional[torch.device] = None) -> Dict[str, torch.Tensor]:
    """Draws ``start:stop`` (or draw ``start``) on the model's ``device``: draws kept in host memory (those
    of vectorized chains) move to a GPU model a block at a time."""
    return {n: (v[start] if squeeze else v[start:stop]).to(device) for n, v in draws.items()}


def _block_size(model, args, kwargs, draws, plates, site, first: torch.Tensor, device: torch.device) -> int:
    """How many draws :func:`bma_predict` evaluates at once: as many as :data:`BLOCK_ELEMENTS` allows
    when the model broadcasts over a leading dimension of its latents (the first two draws together
    give each one's probabilities, within round-off), else 1."""
    count = next(iter(draws.values())).shape[0]
    block = min(count, max(1, BLOCK_ELEMENTS // max(1, first.numel())))
    if block < 2:
        return 1
    try:
        both = _predict_probs(model, args, kwargs, _rows(draws, 0, 2, device=device), plates, site)[0]
        second = _predict_probs(model, args, kwargs, _rows(draws, 1, 2, True, device), plates, site)[0]
    except Exception:  # the model does not take a leading dimension: one draw at a time
        return 1
    if both.shape != (2, *first.shape):
        return 1
    rtol, atol = _roundoff(draws, both, device)
    return block if torch.allclose(both, torch.stack([first, second]), rtol=rtol, atol=atol) else 1


#: the most two ways of computing a probability may differ and be taken as round-off: a model that mixes up draws
#: (a leading dimension taken for data) differs by far more
MOST_ROUNDOFF = 1e-2


def _roundoff(draws: Dict[str, torch.Tensor], probs: torch.Tensor, device: torch.device) -> Tuple[float, float]:
    """How far one draw's probabilities, computed alone and beside another, may differ: round-off of a reduction as
    long as a draw's weights (:func:`~pyro_flat.roundoff.roundoff_tolerance`) in the precision that computed them
    (autocast's, or TF32 on a GPU), at most :data:`MOST_ROUNDOFF`."""
    weights = sum(v[0].numel() for v in draws.values())
    dtype = probs.dtype
    if torch.is_autocast_enabled(device.type):
        dtype = max(dtype, torch.get_autocast_dtype(device.type), key=lambda d: torch.finfo(d).eps)
    rtol, atol = roundoff_tolerance(dtype, max(1, weights), 1.0, device)
    return min(rtol, MOST_ROUNDOFF), min(atol, MOST_ROUNDOFF)


def _as_tensors(samples, latents, suffix, tr) -> dict:
    """The latents' draws and their twins as tensors: numpy arrays or lists become tensors of the
    site's dtype and device (float64 numpy draws would not multiply float32 data)."""
    out = dict(samples)
    for n in latents:
        site = tr.nodes[n]["value"]
        for key in (n, n + suffix):
            if key in samples and not torch.is_tensor(samples[key]):
                draws = check_tensor(f"samples[{key!r}]", samples[key], "a (num_draws, ...) tensor or array of draws")
                out[key] = draws.to(dtype=site.dtype if draws.is_floating_point() else draws.dtype, device=site.device)
    return out


def _drop_plate_dims(samples, latents, suffix, tr) -> dict:
    """``pyro.infer.Predictive``'s layout ``(num_draws, 1, ..., 1, *site shape)`` (singletons for the
    model's plates) as ``(num_draws, *site shape)``; other layouts as they are."""
    out = dict(samples)
    for n in latents:
        shape = tuple(tr.nodes[n]["value"].shape)
        for key in (n, n + suffix):
            draws = samples.get(key)
            if draws is None or draws.dim() <= len(shape) + 1:
                continue
            middle = tuple(draws.shape[1:draws.dim() - len(shape)])
            if all(size == 1 for size in middle) and tuple(draws.shape[draws.dim() - len(shape):]) == shape:
                out[key] = draws.reshape((draws.shape[0],) + shape)
    return out


def _check_draws(samples, latents, suffix, tr) -> None:
    """Each latent's draws: ``(num_draws, *site shape)``, at least one, all finite (their twins too)."""
    for n in latents:
        draws, shape = samples[n], tuple(tr.nodes[n]["value"].shape)
        if draws.dim() == len(shape) + 2 and tuple(draws.shape[2:]) == shape:
            raise ValueError(
                f"bma_predict: samples[{n!r}] has shape {tuple(draws.shape)}, grouped by chain; samples must be "
                f"(num_draws, ...) with draws of the site's shape {shape}: flatten the chain dim, e.g. "
                "mcmc.get_samples() without group_by_chain=True.")
        if draws.dim() != len(shape) + 1 or tuple(draws.shape[1:]) != shape:
            raise ValueError(f"bma_predict: samples[{n!r}] has shape {tuple(draws.shape)}, but the model's site "
                             f"{n!r} has shape {shape}; samples must be (num_draws, *site shape).")
        twin, unconstrained = samples.get(n + suffix), support_transform(n, tr.nodes[n]["fn"].support).inverse_shape
        if twin is not None and (twin.dim() != draws.dim() or twin.shape[1:] != unconstrained(draws.shape)[1:]):
            raise ValueError(f"bma_predict: samples[{n + suffix!r}] has shape {tuple(twin.shape)}, but samples[{n!r}] "
                             f"{tuple(draws.shape)}: the twin holds θa draws of site {n!r}, each of its shape. Pass "
                             "the samples of one run (mcmc.get_samples()) unchanged.")
        for key in (n, n + suffix):
            if key in samples and samples[key].shape[:1] == (0,):
                raise ValueError(f"bma_predict: samples hold no draws (samples[{key!r}] has shape "
                                 f"{tuple(samples[key].shape)}); run the sampler with num_samples >= 1 first.")
            if key in samples and not torch.isfinite(samples[key]).all():
                raise ValueError(f"bma_predict: samples[{key!r}] holds NaN or inf; the chain diverged: "
                                 "drop those draws or rerun with a smaller step size.")


def _predict_probs(model, args, kwargs, values, plates, site):
    """Class probabilities of one draw over all data points, one plate-sized block at a time."""
    if plates:
        (plate, (size, batch)), = plates.items()
        blocks = _index_blocks(size, batch)
    else:
        plate, blocks = None, [(None, None)]
    out = None
    for idx, keep in blocks:
        indices = {} if plate is None else {plate: idx}
        with _Predict(values, indices) as handler:
            model(*args, **kwargs)
        if site is None:
            candidates = [n for n, fn in handler.fns.items() if hasattr(fn, "probs")]
            if len(candidates) != 1:
                raise ValueError(
                    "bma_predict: cannot tell which site to predict; candidates with class "
                    f"probabilities: {candidates}. Pass site='name'."
                )
            site = candidates[0]
        fn = handler.fns.get(site)
        if fn is None or not hasattr(fn, "probs"):
            raise ValueError(
                f"bma_predict: site {site!r} has no class probabilities (Bernoulli / "
                "Categorical expected); for continuous outputs use pyro.infer.Predictive."
            )
        probs = fn.probs
        if plate is None:
            return probs.clone(), site
        if plate not in handler.plate_dims.get(site, {}):
            raise ValueError(f"bma_predict: site {site!r} is not inside the subsampled plate {plate!r}")
        dim = len(fn.batch_shape) + handler.plate_dims[site][plate]  # position in probs
        if out is None:
            shape = list(probs.shape)
            shape[dim] = size
            out = probs.new_zeros(shape)
        out.index_copy_(dim, idx[keep].to(probs.device), probs.index_select(dim, keep.nonzero().squeeze(-1).to(probs.device)))
    return out, site
