r"""Where chains start: the user's ``initial_params`` put in, or the model's own starting point.

A model object may say where its chains start: a method ``initial_params(*, num_chains=None)``
returning ``{site: value}`` (values in the site's support, constrained; a leading ``(C,)`` dim with
``num_chains=C``, the chains different from one another). When a kernel is given no ``init_strategy``,
:class:`~pyro_flat.targets.ModelPotential` starts there (:func:`model_start`); other models start
from a prior draw (``init_to_sample``). :class:`~pyro_flat.nn.BayesianModule` has one: PyTorch's own
initialisation of the network, run again for every chain.

>>> class Model:
...     def __call__(self):
...         pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
...     def initial_params(self, *, num_chains=None):
...         w = torch.full((2,), 5.0)
...         return {"w": w if num_chains is None else w + torch.arange(num_chains)[:, None]}
>>> import pyro, pyro.distributions as dist
>>> from pyro_flat.targets import ModelPotential
>>> ModelPotential(Model(), num_chains=2).initial_params()["w"]
tensor([[5., 5.],
        [6., 6.]])
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

import torch
from pyro.infer.autoguide.initialization import init_to_sample, init_to_value

from ..chains.shard import shard_of
from .layout import Params
from .sites import SiteInfo

Hook = Callable[..., Dict[str, torch.Tensor]]


class InitialShapeError(ValueError):
    """An ``initial_params`` value of the wrong shape (``given`` against ``expected``, one chain's)."""

    def __init__(self, name: str, given: tuple, expected: tuple):
        super().__init__(
            f"initial_params[{name!r}] has shape {given}, but the site's unconstrained value has shape "
            f"{expected} (a leading chain dimension included when chains are vectorized); pass a tensor "
            "of that shape.")
        self.name, self.given, self.expected = name, given, expected


def merge_overrides(params: Params, overrides: Optional[Params], *, one_chain: bool = False) -> Params:
    """``params`` with the user's values put in, cast to each site's dtype and device. ``one_chain``: the
    run has one chain, and a value with one more leading dim of size 1 than its site is that chain's
    (``model.initial_params(num_chains=1)``)."""
    unknown = set(overrides or {}) - set(params)
    if unknown:
        raise ValueError(f"initial_params names {sorted(unknown)}, which are not latent sites of the "
                         f"target; its sites are {sorted(params)}.")
    for name, value in (overrides or {}).items():
        value = torch.as_tensor(value)
        expected = params[name].shape
        if one_chain and value.shape == (1, *expected):
            value = value[0]
        if value.shape != expected:
            raise InitialShapeError(name, tuple(value.shape), tuple(expected))
        params[name] = value.to(params[name]).clone()
    return params


def start_hook(model: Callable, init_strategy: Optional[Callable]) -> Optional[Hook]:
    """The model's ``initial_params`` method when no ``init_strategy`` is given, else ``None``."""
    hook = getattr(model, "initial_params", None) if init_strategy is None else None
    return hook if callable(hook) else None


def setup_strategy(hook: Optional[Hook], init_strategy: Optional[Callable]) -> Callable:
    """The init strategy of the model's set-up trace: its one-chain start with a hook (no prior draw
    is made), else ``init_strategy`` (``init_to_sample`` when ``None``)."""
    if hook is not None:
        return init_to_value(values=hook(num_chains=None), fallback=init_to_sample)
    return init_to_sample if init_strategy is None else init_strategy


def model_start(hook: Hook, sites: Dict[str, SiteInfo], num_chains: Optional[int],
                device: torch.device) -> Params:
    """Unconstrained starts of the sites from ``hook`` for ``num_chains`` chains (``None``: one, no chain
    dim). Under a chain shard every chain's start is made and this shard's kept, so that a chain's start
    does not depend on the split."""
    shard = shard_of(num_chains) if num_chains is not None else None
    total = num_chains if shard is None else shard.total
    values = hook(num_chains=total)
    owner = f"{type(hook.__self__).__name__}.initial_params" if hasattr(hook, "__self__") else "initial_params"
    if not isinstance(values, dict):
        raise TypeError(f"{owner}(num_chains={total}) must return a dict {{site: tensor}}, got "
                        f"{type(values).__name__}.")
    missing, unknown = set(sites) - set(values), set(values) - set(sites)
    if missing or unknown:
        raise ValueError(f"{owner}(num_chains={total}) gives the sites {sorted(values)}, the model samples "
                         f"{sorted(sites)}: it must give one value for every latent site and no other.")
    params = {}
    for name, site in sites.items():
        given = torch.as_tensor(values[name]).detach().to(device)
        value = site.transform.inv(given)
        expected = tuple(site.shape) if total is None else (total, *site.shape)
        if tuple(value.shape) != expected:
            raise ValueError(f"{owner}(num_chains={total})[{name!r}] has shape {tuple(given.shape)}; the site "
                             f"needs {expected} (unconstrained{'' if total is None else ', chains first'}).")
        params[name] = (value if shard is None else shard.rows(value)).clone()
    return params


__all__ = ["InitialShapeError", "merge_overrides", "start_hook", "setup_strategy", "model_start"]
