r"""The outcome of a convergence check: the empirical :math:`W_2` at each checkpoint against its
bound, the verdict, and its printout and figure. :func:`pyro_flat.convergence.check_convergence`
fills it in; :class:`ConvergenceError` carries a failed one.

>>> import numpy as np
>>> result = ConvergenceResult(
...     sampler="SGLD", target="posterior", estimator="gaussian", num_chains=200,
...     iterations=np.array([0, 100]), grad_evals=np.array([0, 100]), w2=np.array([1.0, 0.1]),
...     w2_stderr=np.array([0.01, 0.01]), w2_floor=0.02, bound=np.array([1.5, 0.3]),
...     bound_terms={}, constants={})
>>> result.passed
True
>>> print(result)
SGLD (200 chains, target posterior, gaussian W2): within the bound
  iterations 0..100: W2 1 -> 0.1 ± 0.01 (floor 0.02)
  bound 1.5 -> 0.3 (bound / W2 at the end: 3)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np


class ConvergenceError(AssertionError):
    """The empirical :math:`W_2` exceeded the bound beyond its error bar (``result`` attached)."""

    def __init__(self, message: str, result: "ConvergenceResult"):
        super().__init__(message)
        self.result = result


@dataclass
class ConvergenceResult:
    """What :func:`~pyro_flat.convergence.check_convergence` measured, and the verdict.

    ``w2[i]`` (with ``w2_stderr[i]``, bootstrap) estimates :math:`W_2(\\nu_k, \\pi)` at
    ``iterations[i]`` (``grad_evals[i]`` gradient evaluations per chain); ``w2_floor`` is the
    estimator's finite-sample floor (its value on exact draws of :math:`\\pi`); ``bound[i]`` the
    theoretical bound (``None`` where it does not apply: see ``warnings``), ``bound_terms`` its
    parts; ``exact_w2`` the exact distance where known (Gaussian problems, full batch).
    ``passed`` is ``True`` when no checkpoint has
    :math:`\\sqrt{w_2^2 - \\text{floor}^2} - 3\\,\\text{stderr} > \\text{bound}`, ``None`` without a bound.
    """

    sampler: str
    target: str
    estimator: str
    num_chains: int
    iterations: np.ndarray
    grad_evals: np.ndarray
    w2: np.ndarray
    w2_stderr: np.ndarray
    w2_floor: float
    bound: Optional[np.ndarray]
    bound_terms: Dict[str, float]
    constants: Dict[str, float]
    exact_w2: Optional[np.ndarray] = None
    violations: List[int] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    wall_time: Dict[str, float] = field(default_factory=dict)

    @property
    def w2_debiased(self) -> np.ndarray:
        return np.sqrt(np.clip(self.w2**2 - self.w2_floor**2, 0.0, None))

    @property
    def passed(self) -> Optional[bool]:
        return None if self.bound is None else not self.violations

    def __str__(self) -> str:
        verdict = {True: "within the bound", False: "VIOLATES the bound", None: "no bound"}[self.passed]
        lines = [f"{self.sampler} ({self.num_chains} chains, target {self.target}, "
                 f"{self.estimator} W2): {verdict}",
                 f"  iterations {self.iterations[0]}..{self.iterations[-1]}: W2 {self.w2[0]:.4g} -> "
                 f"{self.w2[-1]:.4g} ± {self.w2_stderr[-1]:.2g} (floor {self.w2_floor:.3g})"]
        if self.bound is not None:
            lines.append(f"  bound {self.bound[0]:.4g} -> {self.bound[-1]:.4g} "
                         f"(bound / W2 at the end: {self.bound[-1] / max(self.w2[-1], 1e-300):.3g})")
        if self.exact_w2 is not None:
            lines.append(f"  exact W2 at the end: {self.exact_w2[-1]:.4g}")
        if self.violations:
            lines.append(f"  violations at iterations {self.violations}")
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    def plot(self, ax=None, *, x: str = "iterations"):
        """Empirical :math:`W_2` (± 2 stderr), its floor, the exact value and the bound against
        ``x`` (``"iterations"`` or ``"grad_evals"``), log scale. Returns the figure."""
        import matplotlib.pyplot as plt

        if ax is None:
            fig, ax = plt.subplots(figsize=(6.4, 4.2))
        else:
            fig = ax.figure
        xs = self.grad_evals if x == "grad_evals" else self.iterations
        ax.errorbar(xs, self.w2, yerr=2 * self.w2_stderr, fmt="o-", ms=3, capsize=2,
                    label=f"empirical W2 ({self.estimator}, {self.num_chains} chains)")
        ax.axhline(self.w2_floor, color="gray", ls=":", label="estimator floor (exact draws)")
        if self.exact_w2 is not None:
            ax.plot(xs, self.exact_w2, "k--", lw=1, label="exact W2")
        if self.bound is not None:
            ax.plot(xs, self.bound, "r-", label="theoretical bound")
        ax.set_yscale("log")
        ax.set_xlabel("gradient evaluations per chain" if x == "grad_evals" else "iteration")
        ax.set_ylabel(f"W2 to the {self.target} law")
        verdict = {True: "passed", False: "VIOLATED", None: "no bound"}[self.passed]
        ax.set_title(f"{self.sampler}: {verdict}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        return fig
