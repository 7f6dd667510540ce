"""Argument checks shared by the whole package: one place decides what a valid number is.

Every check returns the value converted (``float`` or ``int``) or raises a ``ValueError`` that
names the argument, shows what was passed and, with ``hint``, says what to pass instead. A ``bool``
is never an integer here (``True`` is not a chain count), while numpy integers are.

Example::

    >>> from pyro_flat.validation import check_positive, check_positive_int
    >>> check_positive("eta", 1e-2), check_positive_int("num_chains", 4)
    (0.01, 4)
    >>> check_positive_int("num_chains", True)
    Traceback (most recent call last):
    ...
    ValueError: num_chains must be a positive integer, got num_chains=True.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import numbers


def _hinted(message: str, hint: str) -> str:
    return f"{message} {hint}".rstrip()


def check_positive(name: str, value, *, hint: str = "") -> float:
    """``float(value)`` if it is a positive finite number, else a ``ValueError`` naming ``name``."""
    try:
        x = float(value)
    except (TypeError, ValueError, RuntimeError):
        x = float("nan")
    if isinstance(value, (bool, str, bytes)) or not math.isfinite(x) or x <= 0:  # "0.1" is not a number
        raise ValueError(_hinted(f"{name} must be a positive finite number, got {name}={value!r}.", hint))
    return x


def check_number(name: str, value, example: str) -> float:
    """``float(value)`` (nan if it has several entries), or a ``TypeError`` naming ``name`` unless
    ``value`` is a number: not a bool nor a string (``check_positive`` would read ``"0.1"`` as 0.1).

    >>> check_number("rho", "0.1", "0.05")
    Traceback (most recent call last):
    ...
    TypeError: rho must be a number, got str rho='0.1'; pass e.g. rho=0.05.
    """
    if isinstance(value, bool) or not hasattr(value, "__float__"):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {name}={value!r}; "
                        f"pass e.g. {name}={example}.")
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):  # e.g. a tensor of several numbers
        return float("nan")


def check_tensor(name: str, value, what: str) -> torch.Tensor:
    """``torch.as_tensor(value)``, or a ``TypeError`` naming ``name`` (``what`` says what to pass).

    >>> check_tensor("start", "abc", "a 1-D tensor")
    Traceback (most recent call last):
    ...
    TypeError: start must be a 1-D tensor, got str 'abc'.
    """
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__} {value!r}.") from None


def check_eta(eta) -> float:
    """The coupling variance :math:`\\eta` of the Entropy-MCMC joint: a positive finite float."""
    return check_positive(
        "eta", eta, hint="It is the coupling variance: small eta (e.g. 1e-3) stays close to the "
                         "original posterior, large eta keeps only wide modes.")


def _check_int(name: str, value, minimum: int, what: str, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(_hinted(f"{name} must be {what}, got {name}={value!r}.", hint))
    return int(value)


def check_positive_int(name: str, value, *, minimum: int = 1, hint: str = "") -> int:
    """``int(value)`` if it is an integer ``>= minimum`` (default 1), else a ``ValueError``."""
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    return _check_int(name, value, minimum, what, hint)


def check_thinning(kernel, thinning: int) -> int:
    """``thinning`` if ``kernel`` can keep every ``thinning``-th iteration (a kernel with
    ``supports_thinning``, or ``thinning == 1``), else a ``ValueError`` that says what to do."""
    thinning = check_positive_int("thinning", thinning)
    if thinning > 1 and not getattr(kernel, "supports_thinning", False):
        raise ValueError(
            f"thinning={thinning} needs a pyro-flat stochastic-gradient kernel (SGLD, EntropySGLD, "
            f"...); {type(kernel).__name__} makes one iteration per draw. Use thinning=1 and "
            "slice the draws afterwards: mcmc.get_samples(group_by_chain=True)[name][:, ::k].")
    return thinning


def check_nonnegative_int(name: str, value, *, hint: str = "") -> int:
    """``int(value)`` if it is an integer ``>= 0``, else a ``ValueError`` naming ``name``."""
    return _check_int(name, value, 0, "a non-negative integer", hint)


def to_numpy(x, dtype=np.float64) -> np.ndarray:
    """``x`` (a tensor on any device, an array, a number or a list) as a numpy array of ``dtype``
    (``None``: keep the tensor's own dtype)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)
