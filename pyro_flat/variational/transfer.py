"""Bayesian transfer learning: only some sites of a model are variational, the rest stay pre-trained."""

from __future__ import annotations

from typing import Callable, Dict, Iterable, Mapping, Sequence, Union

import torch

import pyro.poutine as poutine

from ..validation import check_tensor


def transfer_model(model: Callable, pretrained: Union[Mapping[str, torch.Tensor], torch.nn.Module],
                   variational: Sequence[str]) -> Callable:
    """``model`` with only the latent sites named in ``variational`` left random.

    A site is variational if its name is an entry of ``variational`` or lies under one
    (``"fc2"`` covers ``"fc2.weight"`` and ``"fc2.bias"``: a ``PyroModule``'s submodule). Every
    other latent site is fixed at its value in ``pretrained`` (a dict, or an ``nn.Module`` whose
    ``state_dict`` names match the sites) by ``poutine.condition``: it becomes observed, a constant
    term of the ELBO. Fit the result with any guide, e.g. ``AutoNormal(transfer_model(...))``, as
    SA-BMA's transfer learning trains only the classifier and normalisation layers.

    >>> import torch, pyro, pyro.distributions as dist
    >>> def model():
    ...     a = pyro.sample("body.weight", dist.Normal(torch.zeros(3), 1.).to_event(1))
    ...     b = pyro.sample("head.weight", dist.Normal(0., 1.))
    >>> fitted = transfer_model(model, {"body.weight": torch.ones(3)}, variational=["head"])
    >>> trace = pyro.poutine.trace(fitted).get_trace()
    >>> trace.nodes["body.weight"]["is_observed"], trace.nodes["head.weight"]["is_observed"]
    (True, False)
    """
    if not callable(model):
        raise TypeError(f"model must be a callable Pyro model, got {type(model).__name__} model={model!r}.")
    if isinstance(pretrained, torch.nn.Module):
        pretrained = dict(pretrained.state_dict())
    if not isinstance(pretrained, Mapping):
        raise TypeError("pretrained must be a dict {site name: tensor} or an nn.Module whose state_dict names "
                        f"the sites, got {type(pretrained).__name__}.")
    if not isinstance(variational, Iterable):
        raise TypeError(f"variational must be a list of site names or submodule prefixes, e.g. ['fc2'], got "
                        f"{type(variational).__name__} {variational!r}.")
    prefixes = [] if isinstance(variational, str) else [str(v) for v in variational]
    if not prefixes:
        raise ValueError("variational must be a non-empty list of site names or submodule prefixes, "
                         f"e.g. ['fc2'], got {variational!r}")
    fixed: Dict[str, torch.Tensor] = {}

    def is_variational(name: str) -> bool:
        return any(name == p or name.startswith(p + ".") for p in prefixes)

    values = {name: _pretrained_value(name, value) for name, value in pretrained.items()
              if not is_variational(str(name))}

    def resolve(args, kwargs) -> None:
        with poutine.block():  # a private run: invisible to any trace the caller is recording
            trace = poutine.trace(model).get_trace(*args, **kwargs)
        latents = [n for n, s in trace.nodes.items()
                   if s["type"] == "sample" and not s["is_observed"] and type(s["fn"]).__name__ != "_Subsample"]
        for p in prefixes:
            if not any(n == p or n.startswith(p + ".") for n in latents):
                raise ValueError(f"variational entry {p!r} matches no latent site; the model's latent sites "
                                 f"are {latents}")
        for name in latents:
            if is_variational(name):
                continue
            if name not in values:
                raise ValueError(f"no pretrained value for the latent site {name!r}: pass it in pretrained "
                                 "or list it (or its submodule) in variational")
            value = values[name]
            if value.shape != trace.nodes[name]["value"].shape:
                raise ValueError(f"pretrained[{name!r}] has shape {tuple(value.shape)}, the site has "
                                 f"{tuple(trace.nodes[name]['value'].shape)}")
            fixed[name] = value.detach()

    def conditioned(*args, **kwargs):
        if not fixed:
            resolve(args, kwargs)
        return poutine.condition(model, data=fixed)(*args, **kwargs)

    return conditioned


def _pretrained_value(name: str, value) -> torch.Tensor:
    """``pretrained[name]`` as a tensor, refused if it is not one or has a non-finite entry."""
    value = check_tensor(f"pretrained[{name!r}]", value, "a tensor (the site's pre-trained value)")
    if value.is_floating_point():
        bad = ~torch.isfinite(value.detach())
        if bad.any():
            first = tuple(int(i) for i in bad.nonzero()[0])
            raise ValueError(f"pretrained[{name!r}] has {int(bad.sum())} non-finite entries of {value.numel()} "
                             f"(e.g. {float(value.reshape(-1)[bad.reshape(-1)][0])} at index {first}): a fixed "
                             "site must hold finite values; fix the pre-trained weights or list the site (or its "
                             "submodule) in variational.")
    return value


__all__ = ["transfer_model"]
