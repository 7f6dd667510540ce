"""Pyro ``MCMCKernel``s for flat posteriors: one small module per algorithm.

:data:`KERNELS` is the one registry of them by name; :func:`kernel_class` accepts any spelling
(``"entropy-sgld"``, ``"entropy_sgld"``, ``"EntropySGLD"``) and :func:`make_kernel` builds one from
settings shared by several samplers, each taking those its constructor accepts.

>>> kernel_class("entropy_sgld") is kernel_class("EntropySGLD") is EntropySGLD
True
>>> k = make_kernel("sgld", potential_fn=lambda p: (p["x"] ** 2).sum(), eta=0.1, step_size=0.01)
>>> type(k).__name__, k.step_size
('SGLD', 0.01)
"""

import inspect
from typing import Callable, Dict, Optional

from .base import TargetKernel
from .entropy_hmc import EntropyHMC
from .entropy_sgld import EntropySGLD
from .errors import DivergenceError
from .flat_sgld import FlatSGLD
from .local_entropy import LocalEntropySGD, LocalEntropySGLD
from .sam_sgd import SAMSGD
from .sasgld import SASGLD
from .sgd import SGD
from .sgld import SGLD
from .stochastic_gradient import StochasticGradientKernel

#: Every kernel of the package by its canonical name (lower case, words joined by "-").
KERNELS: Dict[str, type] = {
    "sgld": SGLD,
    "sgd": SGD,
    "entropy-sgld": EntropySGLD,
    "entropy-hmc": EntropyHMC,
    "local-entropy-sgld": LocalEntropySGLD,
    "local-entropy-sgd": LocalEntropySGD,
    "sasgld": SASGLD,
    "sam-sgd": SAMSGD,
    "flat-sgld": FlatSGLD,
}


def _key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def kernel_class(name: str) -> type:
    """The kernel class registered under ``name`` (case, ``-`` and ``_`` ignored)."""
    by_key = {_key(k): cls for k, cls in KERNELS.items()}
    if not isinstance(name, str) or _key(name) not in by_key:
        raise ValueError(f"unknown sampler {name!r}; choose one of {', '.join(KERNELS)}.")
    return by_key[_key(name)]


def make_kernel(name: str, model: Optional[Callable] = None, *,
                potential_fn: Optional[Callable] = None, **settings) -> TargetKernel:
    """``kernel_class(name)(model or potential_fn, **settings)``, passing each kernel only the
    settings its constructor takes (``eta`` reaches EntropySGLD, not SGLD)."""
    cls = kernel_class(name)
    accepted = _settings_of(cls) - set(getattr(cls, "fixed_settings", ()))
    kwargs = {k: v for k, v in settings.items() if k in accepted}
    return cls(model, potential_fn=potential_fn, **kwargs)


def _settings_of(cls: type) -> set:
    """Keyword arguments ``cls(...)`` accepts, following ``**kwargs`` up to the base classes."""
    names: set = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters.values()
        names |= {p.name for p in params if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names - {"self"}


__all__ = [
    "KERNELS",
    "kernel_class",
    "make_kernel",
    "TargetKernel",
    "StochasticGradientKernel",
    "SGLD",
    "SGD",
    "EntropySGLD",
    "EntropyHMC",
    "LocalEntropySGD",
    "LocalEntropySGLD",
    "SASGLD",
    "SAMSGD",
    "FlatSGLD",
    "DivergenceError",
]
