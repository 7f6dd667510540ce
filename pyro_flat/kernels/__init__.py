"""Pyro ``MCMCKernel``s for flat posteriors: one small module per algorithm.

:data:`KERNELS` is the one registry of them by name; :func:`kernel_class` accepts any spelling
(``"entropy-sgld"``, ``"entropy_sgld"``, ``"EntropySGLD"``) and :func:`make_kernel` builds one by
name, refusing a setting the kernel does not take (:func:`kernel_settings`), so a typo never vanishes.

>>> kernel_class("entropy_sgld") is kernel_class("EntropySGLD") is EntropySGLD
True
>>> k = make_kernel("sgld", potential_fn=lambda p: (p["x"] ** 2).sum(), step_size=0.01)
>>> type(k).__name__, k.step_size
('SGLD', 0.01)
>>> make_kernel("entropy-sgld", potential_fn=lambda p: (p["x"] ** 2).sum(), etta=0.1)  # doctest: +ELLIPSIS
Traceback (most recent call last):
TypeError: make_kernel('entropy-sgld'): EntropySGLD takes no setting 'etta' (did you mean 'eta'?); its settings: eta, ...
"""

import difflib
from typing import Callable, Dict, Optional, Tuple

from .base import TargetKernel, constructor_signature
from .entropy_hmc import EntropyHMC
from .entropy_sghmc import EntropySGHMC
from .entropy_sgld import EntropySGLD
from ..errors import DivergenceError
from .flat_sgld import FlatSGLD
from .local_entropy import LocalEntropySGD, LocalEntropySGLD
from .sam_sgd import SAMSGD
from .sasgld import SASGLD
from .sgd import SGD
from .sghmc import SGHMC
from .sgld import SGLD
from .stochastic_gradient import StochasticGradientKernel

#: Every kernel of the package by its canonical name (lower case, words joined by "-").
KERNELS: Dict[str, type] = {
    "sgld": SGLD,
    "sgd": SGD,
    "entropy-sgld": EntropySGLD,
    "sghmc": SGHMC,
    "entropy-sghmc": EntropySGHMC,
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
    """``kernel_class(name)(model, potential_fn=potential_fn, **settings)``.

    A setting the kernel does not take (not in :func:`kernel_settings`: ``eta`` for SGLD, a typo,
    SGD's ``temperature``, which the class fixes itself) is a ``TypeError`` that names it, the
    kernel and the settings it takes."""
    cls = kernel_class(name)
    accepted = kernel_settings(cls)
    unknown = [k for k in settings if k not in accepted]
    if unknown:
        raise TypeError(f"make_kernel({name!r}): {cls.__name__} takes no setting{'s' * (len(unknown) > 1)} "
                        f"{', '.join(_why_not(cls, k, accepted) for k in unknown)}; its settings: "
                        f"{', '.join(accepted)}.")
    return cls(model, potential_fn=potential_fn, **settings)


def kernel_settings(kernel) -> Tuple[str, ...]:
    """The settings :func:`make_kernel` passes to ``kernel`` (a name or a class), in its constructor's
    order: the keyword arguments ``cls(...)`` accepts, following ``**kwargs`` up to the base classes,
    less ``model``, ``potential_fn`` and the settings the class fixes itself (``fixed_settings``).

    >>> kernel_settings("sgd")
    ('step_size', 'schedule', 'preconditioner', 'init_strategy', 'record_draws', 'jit_compile', 'autocast')
    """
    cls = kernel_class(kernel) if isinstance(kernel, str) else kernel
    return tuple(n for n in constructor_signature(cls).parameters if n not in ("model", "potential_fn"))


def _why_not(cls: type, setting: str, accepted: Tuple[str, ...]) -> str:
    """``'setting'``, with why the kernel does not take it or the setting meant."""
    if setting in getattr(cls, "fixed_settings", ()):
        return f"{setting!r} ({cls.__name__} fixes it itself)"
    close = difflib.get_close_matches(setting, accepted, n=1)
    return f"{setting!r}" + (f" (did you mean {close[0]!r}?)" if close else "")


__all__ = [
    "KERNELS",
    "kernel_class",
    "make_kernel",
    "kernel_settings",
    "TargetKernel",
    "StochasticGradientKernel",
    "SGLD",
    "SGD",
    "EntropySGLD",
    "SGHMC",
    "EntropySGHMC",
    "EntropyHMC",
    "LocalEntropySGD",
    "LocalEntropySGLD",
    "SASGLD",
    "SAMSGD",
    "FlatSGLD",
    "DivergenceError",
]
