"""The one rule every study's findings use to call a difference: beyond 2 combined standard errors.

Two estimates ``a ± se_a`` and ``b ± se_b`` (independent) differ when
:math:`|a - b| > 2 \\sqrt{se_a^2 + se_b^2}`; otherwise they are tied, and no sentence may name a
winner. Rankings follow the same rule: the best is named alone only when it differs from every
other.

>>> compare_text(0.31, 0.015, 0.30, 0.015)
'the same within Monte Carlo error (difference +0.010 ± 0.021)'
>>> best_text({"A": (3.81, 0.02), "B": (3.80, 0.05), "C": (3.2, 0.03)}, lowest=False, what="mean top eigenvalue")
"A's and B's have the highest mean top eigenvalue (3.81 ± 0.02, 3.8 ± 0.05): tied within 2 standard errors"
"""

from __future__ import annotations

import math
from typing import Dict, Tuple

#: combined standard errors a difference must exceed to count
TIE_SIGMAS = 2.0


def mean_and_se(values) -> Tuple[float, float]:
    """The mean of ``values`` and its standard error (sample sd / √n; 0 for a single value)."""
    values = [float(v) for v in values]
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, sd / math.sqrt(n)


def differ(a: float, se_a: float, b: float, se_b: float) -> bool:
    """Whether ``a`` and ``b`` differ by more than :data:`TIE_SIGMAS` combined standard errors."""
    return abs(a - b) > TIE_SIGMAS * math.hypot(se_a, se_b)


def compare_text(a: float, se_a: float, b: float, se_b: float) -> str:
    """``a`` against ``b``: "the same within Monte Carlo error (...)" or "higher/lower by ..."."""
    diff, se = a - b, math.hypot(se_a, se_b)
    if not differ(a, se_a, b, se_b):
        return f"the same within Monte Carlo error (difference {diff:+.3f} ± {se:.3f})"
    return f"{'higher' if diff > 0 else 'lower'} by {abs(diff):.3f} ± {se:.3f}"


def best_text(estimates: Dict[str, Tuple[float, float]], *, lowest: bool, what: str) -> str:
    """Who has the lowest (or highest) ``what`` among ``{name: (mean, se)}``, naming everyone tied
    with the best under :func:`differ`."""
    pick = min if lowest else max
    best = pick(estimates, key=lambda k: estimates[k][0])
    tied = [k for k in estimates if k == best or not differ(*estimates[best], *estimates[k])]
    values = ", ".join(f"{estimates[k][0]:.3g} ± {estimates[k][1]:.2g}" for k in tied)
    word = "lowest" if lowest else "highest"
    if len(tied) == 1:
        return f"{best}'s have the {word} {what} ({values}), beyond 2 standard errors of every other"
    names = ", ".join(f"{k}'s" for k in tied[:-1]) + f" and {tied[-1]}'s"
    return f"{names} have the {word} {what} ({values}): tied within 2 standard errors"
