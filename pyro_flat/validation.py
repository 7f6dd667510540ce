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
import numbers
import os
from typing import TYPE_CHECKING, Optional

# torch and numpy are imported where they are used: the memory check below serves the CLI's option
# checks too, which must not import torch (``pyro-flat --help`` answers at once)
if TYPE_CHECKING:
    import numpy as np
    import torch


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
    import torch

    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__} {value!r}.") from None


def check_real_tensor(name: str, value) -> "torch.Tensor":
    """``value`` as a floating-point tensor: a starting point that a gradient can flow through.
    Integers and bools (``torch.tensor([1, 2])``, ``[1, 2]``) become the default float dtype; a
    ``TypeError`` naming ``name`` for what is no tensor of real numbers.

    >>> check_real_tensor("initial_params['x']", [1, 2]).dtype
    torch.float32
    >>> check_real_tensor("initial_params['x']", 1j)
    Traceback (most recent call last):
    ...
    TypeError: initial_params['x'] is complex (torch.complex64); pass real floats, e.g. torch.tensor([0.5, -1.0]).
    """
    import torch

    tensor = check_tensor(name, value, "a tensor (or array) of real numbers")
    if tensor.is_complex():
        raise TypeError(f"{name} is complex ({tensor.dtype}); pass real floats, e.g. torch.tensor([0.5, -1.0]).")
    return tensor if tensor.is_floating_point() else tensor.to(torch.get_default_dtype())


#: The seeds a ``torch.Generator`` takes: 0 to 2**64 - 1.
MAX_SEED = 2 ** 64 - 1


def check_seed(seed) -> Optional[int]:
    """``seed`` as an ``int`` in [0, 2**64 - 1] (what ``torch.Generator.manual_seed`` takes), or
    ``None``; a ``TypeError`` (not an integer) or ``ValueError`` (out of range) naming ``seed``.

    >>> check_seed(-1)
    Traceback (most recent call last):
    ...
    ValueError: seed must be an integer from 0 to 2**64 - 1 (or None), got seed=-1; pass e.g. seed=0.
    """
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an integer or None, got {type(seed).__name__} seed={seed!r}; "
                        "pass e.g. seed=0, or seed=None to draw from torch's global stream.")
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be an integer from 0 to 2**64 - 1 (or None), got seed={seed!r}; "
                         "pass e.g. seed=0.")
    return int(seed)


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


def machine_memory() -> Optional[int]:
    """This machine's physical memory in bytes (``None`` where it is not known: not POSIX)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(name: str, num_bytes: float, *, what: str = "draws", hint: str = "pass smaller values",
                 share: float = 0.5) -> None:
    """A ``ValueError`` naming ``name`` when a run would keep more than ``share`` of this machine's
    memory (``num_bytes`` of ``what``, estimated before any work); no bound where the memory is not
    known. The one memory check of the package: the CLI's options and :class:`pyro_flat.MCMC`'s
    ``num_chains`` both use it.

    >>> check_memory("num_chains", 2.0 ** 80, hint="pass fewer chains.")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: num_chains: the run would keep about 1.13e+15 GiB of draws, more than 50% of this machine's ...
    """
    total = machine_memory()
    if total is not None and num_bytes > share * total:
        raise ValueError(_hinted(f"{name}: the run would keep about {num_bytes / 2 ** 30:.3g} GiB of {what}, more "
                                 f"than {share:.0%} of this machine's {total / 2 ** 30:.3g} GiB;", hint))


#: copies of a chain's state a kernel holds besides its kept draws (point, gradient, noise, proposal, ...)
STATE_COPIES = 16


def check_chain_memory(num_chains: int, num_draws: int, bytes_per_state: float, *, bytes_per_chain: float = 0,
                       exact: bool = True) -> None:
    """A ``ValueError`` naming ``num_chains`` when ``num_chains`` chains cannot fit in this machine's
    memory (:func:`check_memory`): each keeps ``num_draws`` draws of a ``bytes_per_state`` state and
    :data:`STATE_COPIES` working copies, plus ``bytes_per_chain`` (e.g. its minibatch permutation).
    ``exact=False``: ``bytes_per_state`` is only a lower bound (the model is not traced yet)."""
    per_chain = bytes_per_state * (num_draws + STATE_COPIES) + bytes_per_chain
    total = machine_memory()
    fits = "" if total is None else f" ({'' if exact else 'at most '}about {int(0.5 * total // per_chain):,} fit)"
    check_memory("num_chains", num_chains * per_chain,
                 what="chain states and draws" + ("" if exact else " (counting one number per chain and draw)"),
                 hint=f"num_chains={num_chains:,} chains of {num_draws:,} draws cannot be held in memory: pass "
                      f"fewer chains{fits}, or fewer num_samples (or thinning=k).")


def to_numpy(x, dtype="float64") -> "np.ndarray":
    """``x`` (a tensor on any device, an array, a number or a list) as a numpy array of ``dtype``
    (``None``: keep the tensor's own dtype)."""
    import numpy as np
    import torch

    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)
