r"""The one rule every study's findings use to call a difference: a two-sided t-test at 95 %.

A mean over ``n`` independent units (seeds, chains, probes) with standard error ``se`` differs from
another when the difference exceeds :func:`t_critical` ``(n)`` combined standard errors,
:math:`|a - b| > t_{0.975,\,n-1}\sqrt{se_a^2 + se_b^2}`: 4.30 over 3 seeds, 2.26 over 10 chains, about 2
over many (``n=None``: :data:`LARGE_SAMPLE_SIGMAS`, for binomial shares over hundreds of chains). With
``n - 1`` degrees of freedom the rule is the paired test's, and conservative for two independent
means of ``n`` units each (Welch's test would allow up to ``2n - 2``). Otherwise the two are tied, and
no sentence may name a winner. Rankings follow the same rule: the best is named alone only when it
differs from every other. Every sentence says the threshold it used (:func:`threshold_text`).

>>> compare_text(0.31, 0.015, 0.30, 0.015)
'the same within Monte Carlo error (difference +0.010 ± 0.021)'
>>> best_text({"A": (3.81, 0.02), "B": (3.80, 0.05), "C": (3.2, 0.03)}, lowest=False, what="mean top eigenvalue")
"A's and B's have the highest mean top eigenvalue (3.81 ± 0.02, 3.8 ± 0.05): tied within 2 standard errors"
>>> differ(0.5, 0.1, 0.0, 0.1), differ(0.5, 0.1, 0.0, 0.1, n=3)
(True, False)
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

#: combined standard errors a difference must exceed when the units behind them are many (``n=None``):
#: the normal limit of the t critical value, 1.96, rounded up
LARGE_SAMPLE_SIGMAS = 2.0


def t_critical(n: Optional[int]) -> float:
    """Standard errors a mean of ``n`` independent units must exceed: the two-sided 95 % t critical
    value with ``n - 1`` degrees of freedom (``inf`` below 2 units; ``n=None``: :data:`LARGE_SAMPLE_SIGMAS`).

    >>> round(t_critical(3), 2), round(t_critical(30), 2), t_critical(None)
    (4.3, 2.05, 2.0)
    """
    if n is None:
        return LARGE_SAMPLE_SIGMAS
    if n < 2:
        return float("inf")
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1))


def power(difference: float, sd: float, n: int) -> float:
    r"""The probability that a paired two-sided t-test at 95 % over ``n`` units declares a true mean difference
    ``difference`` when the units' differences have standard deviation ``sd``: with
    :math:`\delta = \text{difference}\,\sqrt n/\text{sd}`, :math:`P(|T| > t_{0.975,\,n-1})` for
    :math:`T` noncentral t with :math:`n - 1` degrees of freedom and noncentrality :math:`\delta`.

    >>> round(power(0.0, 1.0, 5), 3), round(power(2.0, 1.0, 5), 3)
    (0.05, 0.909)
    """
    from scipy.stats import nct

    if n < 2 or not sd > 0:
        raise ValueError(f"power needs n >= 2 units and sd > 0, got n={n}, sd={sd}")
    critical, shift = t_critical(n), abs(difference) * math.sqrt(n) / sd
    wrong_side = float(nct.cdf(-critical, n - 1, shift))  # scipy's nan far in the tail is 0
    return float(nct.sf(critical, n - 1, shift)) + (0.0 if math.isnan(wrong_side) else wrong_side)


def detectable_difference(se: float, n: int, probability: float = 0.8) -> float:
    """The smallest true mean difference that a paired t-test over ``n`` units, whose mean difference has
    standard error ``se``, declares with ``probability`` (:func:`power` solved for the difference).

    >>> round(detectable_difference(1.0, 5), 2)  # in standard errors, against t = 2.78 to be declared at all
    3.76
    """
    from scipy.optimize import brentq

    if not 0.05 < probability < 1:
        raise ValueError(f"probability must be in (0.05, 1), got {probability}")
    sd = se * math.sqrt(n)
    return float(brentq(lambda d: power(d, sd, n) - probability, 0.0, (t_critical(n) + 20) * se))


def threshold_text(n: Optional[int], unit: str = "seeds") -> str:
    """How a sentence names its threshold: "2 standard errors", or "t = 4.30 standard errors (the 95 %
    t critical value for 3 seeds)"."""
    if n is None:
        return f"{LARGE_SAMPLE_SIGMAS:g} standard errors"
    return f"t = {t_critical(n):.2f} standard errors (the 95 % t critical value for {n} {unit})"


def mean_and_se(values) -> Tuple[float, float]:
    """The mean of ``values`` and its standard error (sample sd / √n; 0 for a single value)."""
    values = [float(v) for v in values]
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, sd / math.sqrt(n)


def seed_summary(rows, key: str) -> dict:
    """``{"mean", "se", "n"}`` of ``key`` over the rows that have it (one per seed), or ``{}`` where none has."""
    values = [r[key] for r in rows if r.get(key) is not None]
    if not values:
        return {}
    mean, se = mean_and_se(values)
    return {"mean": mean, "se": se, "n": len(values)}


def differ(a: float, se_a: float, b: float, se_b: float, *, n: Optional[int] = None) -> bool:
    """Whether ``a`` and ``b`` differ by more than :func:`t_critical` ``(n)`` combined standard errors."""
    return abs(a - b) > t_critical(n) * math.hypot(se_a, se_b)


def compare_text(a: float, se_a: float, b: float, se_b: float, *, n: Optional[int] = None) -> str:
    """``a`` against ``b``: "the same within Monte Carlo error (...)" or "higher/lower by ..."."""
    diff, se = a - b, math.hypot(se_a, se_b)
    if not differ(a, se_a, b, se_b, n=n):
        return f"the same within Monte Carlo error (difference {diff:+.3f} ± {se:.3f})"
    return f"{'higher' if diff > 0 else 'lower'} by {abs(diff):.3f} ± {se:.3f}"


def best_text(estimates: Dict[str, Tuple[float, float]], *, lowest: bool, what: str, n: Optional[int] = None,
              unit: str = "draws") -> str:
    """Who has the lowest (or highest) ``what`` among ``{name: (mean, se)}`` (each over ``n`` ``unit``),
    naming everyone tied with the best under :func:`differ`."""
    pick = min if lowest else max
    best = pick(estimates, key=lambda k: estimates[k][0])
    tied = [k for k in estimates if k == best or not differ(*estimates[best], *estimates[k], n=n)]
    values = ", ".join(f"{estimates[k][0]:.3g} ± {estimates[k][1]:.2g}" for k in tied)
    word = "lowest" if lowest else "highest"
    if len(tied) == 1:
        return f"{best}'s have the {word} {what} ({values}), beyond {threshold_text(n, unit)} of every other"
    names = ", ".join(f"{k}'s" for k in tied[:-1]) + f" and {tied[-1]}'s"
    return f"{names} have the {word} {what} ({values}): tied within {threshold_text(n, unit)}"


def paired_verdict(ours: Dict[int, float], theirs: Dict[int, float], lower: bool) -> dict:
    """The paired difference over the seeds both have (``{seed: value}``; positive favours ``ours``, with ``lower``
    the better direction when true): ``{"mean", "se", "n", "t_critical", "verdict", "declared_at", "detectable"}``,
    the verdict "for" when the mean exceeds :func:`t_critical` standard errors, "against" below minus that, "tie"
    between, "one seed" with fewer than two.

    >>> paired_verdict({0: 0.9, 1: 0.91, 2: 0.92}, {0: 0.8, 1: 0.82, 2: 0.81}, lower=False)["verdict"]
    'for'
    """
    seeds = sorted(set(ours) & set(theirs))
    d = [(theirs[s] - ours[s]) if lower else (ours[s] - theirs[s]) for s in seeds]  # positive: for the claim
    mean, se = mean_and_se(d) if d else (float("nan"), float("nan"))
    n = len(d)
    critical = t_critical(n)
    # the smallest difference this run declares (t standard errors), and the one it declares 4 times in 5
    detect = {"declared_at": critical * se if n > 1 else float("inf"),
              "detectable": detectable_difference(se, n) if n > 1 and se > 0 else float("nan")}
    if n < 2:
        verdict = "one seed"
    elif (se > 0 and mean > critical * se) or (se == 0 and mean > 0):
        verdict = "for"
    elif (se > 0 and mean < -critical * se) or (se == 0 and mean < 0):
        verdict = "against"
    else:
        verdict = "tie"
    return {"mean": mean, "se": se, "n": n, "t_critical": critical, "verdict": verdict, **detect}





def claim_verdict(pair_verdicts, not_converged) -> str:
    """A claim's verdict from its pairs' :func:`paired_verdict` verdicts: "not measured" (no pair), "not tested (not
    converged)" (a fit of its pairs did not converge), "not tested (one seed)", "contradicted" (a pair against it),
    "reproduced" (every pair for it), else "tied".

    >>> claim_verdict({"for", "tie"}, []), claim_verdict({"for"}, []), claim_verdict({"for"}, ["SGD"])
    ('tied', 'reproduced', 'not tested (not converged)')
    """
    verdicts = set(pair_verdicts)
    if not verdicts:
        return "not measured"
    if not_converged:
        return "not tested (not converged)"
    if "one seed" in verdicts:
        return "not tested (one seed)"
    if "against" in verdicts:
        return "contradicted"
    return "reproduced" if verdicts == {"for"} else "tied"
