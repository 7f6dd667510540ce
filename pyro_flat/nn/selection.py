r"""Which parameters of a network are Bayesian: ``BayesianModule(module, sampled=...)``.

Fine-tuning puts the posterior on part of a pre-trained network (its last block, its head, its
low-rank adapters: :func:`~pyro_flat.nn.low_rank_adapters`) and keeps the rest at the pre-trained values.
``sampled`` names that part:

- ``None``: every parameter with ``requires_grad=True`` (the others fixed, said in a warning unless
  :func:`~pyro_flat.nn.low_rank_adapters` froze them);
- a name or fnmatch pattern, or a list of them, on the names of ``module.named_parameters()``
  (``"fc.*"``, ``["layer4.*", "fc.*"]``);
- a predicate ``(name, parameter) -> bool``.

>>> import torch
>>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
>>> sampled_parameters(net, "2.*")
['2.weight', '2.bias']
>>> sampled_parameters(net, lambda name, p: p.dim() == 1)
['0.bias', '2.bias']
"""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Mapping
from typing import Callable, Dict, List, Sequence, Union

import torch

from .adapters import LowRankAdapter, frozen_by_adapters, preview_names

Sampled = Union[None, str, Sequence[str], Callable[[str, torch.nn.Parameter], bool]]


def sampled_parameters(module: torch.nn.Module, sampled: Sampled = None) -> List[str]:
    """The names of ``module``'s parameters that ``sampled`` chooses (see the module), in
    ``named_parameters()`` order; a ``ValueError`` naming ``sampled`` when it chooses none, or names a pattern
    that matches nothing."""
    named = list(module.named_parameters())
    names = [n for n, _ in named]
    if sampled is None:
        frozen = [n for n, p in named if not p.requires_grad]
        unexpected = [n for n in frozen if n not in frozen_by_adapters(module)]
        if unexpected:
            warnings.warn(f"BayesianModule: the parameters {unexpected} have requires_grad=False; they are left out "
                          "of the posterior and stay at their values (set requires_grad=True to sample them, or "
                          "choose the Bayesian part with sampled=).", UserWarning, stacklevel=3)
        chosen = [n for n, p in named if p.requires_grad]
        if not chosen:
            raise ValueError("every parameter of module has requires_grad=False: there is nothing to sample; set "
                             "requires_grad=True on the weights the posterior is over, or pass sampled=.")
        return chosen
    if callable(sampled):
        chosen = []
        for n, p in named:
            try:
                verdict = sampled(n, p)
            except Exception as err:  # noqa: BLE001 - the user's predicate: said to come from sampled=
                raise ValueError(
                    f"sampled=, the predicate (name, parameter) -> bool, raised {type(err).__name__} ({err}) when "
                    f"called on parameter {n!r} (shape {tuple(p.shape)}): fix the predicate so that it returns True or "
                    "False for every parameter of module.named_parameters(), or pass names or patterns instead "
                    "(sampled='fc.*').") from err
            if not isinstance(verdict, bool):
                raise TypeError(f"sampled({n!r}, parameter) must return True or False, got {verdict!r}.")
            if verdict:
                chosen.append(n)
        if not chosen:
            raise ValueError(f"sampled chose none of the parameters of {type(module).__name__} ({preview_names(names)}): "
                             "there is nothing to sample.")
        _warn_frozen_base(module, chosen, "sampled= (the predicate)")
        return chosen
    patterns = [sampled] if isinstance(sampled, str) else list(sampled) if isinstance(sampled, (list, tuple)) else None
    if not patterns or not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"sampled must be a parameter name or fnmatch pattern, a list of them, or a predicate "
                        f"(name, parameter) -> bool, got {sampled!r}.")
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in names)]
    if unmatched:
        raise ValueError(f"sampled: {unmatched} match no parameter of {type(module).__name__}, whose parameters are "
                         f"{preview_names(names)} (names from module.named_parameters(); patterns such as 'fc.*').")
    chosen = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    by_pattern = [n for n in chosen if any(fnmatch.fnmatchcase(n, p) for p in patterns if p != n and "base" not in p)]
    _warn_frozen_base(module, by_pattern, f"sampled={sampled!r}")
    return chosen


def _warn_frozen_base(module: torch.nn.Module, chosen: List[str], by: str) -> None:
    """A warning when a pattern or predicate (``by``) chose the frozen base weights of a layer that
    :func:`~pyro_flat.nn.low_rank_adapters` adapted (``"0.base.weight"``): they are sampled, as chosen, but were meant
    to stay at their pre-trained values; it names them and how to choose the adapters alone."""
    bases = tuple(f"{n}.base." for n, m in module.named_modules() if isinstance(m, LowRankAdapter))
    frozen = [n for n in chosen if n.startswith(bases)] if bases else []
    if not frozen:
        return
    order = [n.rpartition(".")[0] for n, _ in module.named_parameters()]
    layers = sorted({n.rpartition(".")[0] for n in chosen if n.rpartition(".")[2] in ("lora_A", "lora_B")},
                    key=order.index)
    only = [f"{layer}.lora_*" for layer in layers] or ["*.lora_*"]
    warnings.warn(f"BayesianModule: {by} also chose {len(frozen)} frozen base weight(s) of the layers "
                  f"low_rank_adapters adapted ({preview_names(frozen, limit=4)}): they are sampled, not kept at their "
                  "pre-trained values. To sample only the adapters (the factors '<layer>.lora_A' and "
                  f"'<layer>.lora_B'), pass sampled={only[0] if len(only) == 1 else only!r}, or sampled=None for every "
                  "adapter; to sample these weights too, name them exactly (or with a pattern that says 'base').",
                  UserWarning, stacklevel=4)


def state_weights(state: Mapping, shapes: Dict[str, tuple], device: torch.device) -> Dict[str, torch.Tensor]:
    """The sampled weights (``shapes``: their names and shapes) of a state dict, copied to ``device``; checked against
    the parameters' shapes, never reshaped."""
    if not isinstance(state, Mapping):
        raise TypeError(f"state_dict must be a dict {{parameter name: tensor}} such as net.state_dict(), got "
                        f"{type(state).__name__}.")
    missing = [n for n in shapes if n not in state]
    if missing:
        raise ValueError(f"state_dict has no entry for the weights {missing}; pass the module's state_dict().")
    for n, shape in shapes.items():
        if not torch.is_tensor(state[n]):
            raise TypeError(f"state_dict[{n!r}] must be a tensor, got {type(state[n]).__name__}.")
        if tuple(state[n].shape) != shape:
            raise ValueError(f"state_dict[{n!r}] has shape {tuple(state[n].shape)}, but the module's parameter "
                             f"{n!r} has shape {shape}: pass the state_dict of this network (a tensor is never "
                             "reshaped).")
    return {n: state[n].detach().to(device).clone() for n in shapes}


__all__ = ["sampled_parameters", "state_weights", "Sampled"]
