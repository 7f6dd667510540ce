r"""Step-size schedules: multiplicative factors :math:`s(k)` of the base step size.

A kernel with base step ``step_size`` :math:`\alpha` and schedule :math:`s` takes step
:math:`\alpha_k = \alpha\, s(k)` at iteration :math:`k = 0, 1, \dots` (warm-up included). A schedule
is any callable ``k -> float``; a plain float is a constant factor. The factor form keeps the
scale (``step_size``) and the shape (the schedule) apart, so a schedule can be reused across models.

Example::

    >>> from pyro_flat import schedules
    >>> s = schedules.cyclical_cosine(num_steps=100, num_cycles=2)
    >>> round(s(0), 3), round(s(25), 3), round(s(49), 3), round(s(50), 3)
    (1.0, 0.5, 0.001, 1.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Union

Schedule = Callable[[int], float]


@dataclass(frozen=True)
class constant:
    r""":math:`s(k) = c`."""

    factor: float = 1.0

    def __call__(self, k: int) -> float:
        return self.factor


@dataclass(frozen=True)
class polynomial_decay:
    r"""Welling & Teh (2011): :math:`s(k) = (1 + k/b)^{-\gamma}`, :math:`\gamma \in (0.5, 1]`.

    Satisfies the Robbins-Monro conditions :math:`\sum_k \alpha_k = \infty`,
    :math:`\sum_k \alpha_k^2 < \infty` for :math:`\gamma \in (0.5, 1]`.
    """

    b: float = 1000.0
    gamma: float = 0.55

    def __post_init__(self):
        if self.b <= 0:
            raise ValueError(f"polynomial_decay: b must be > 0, got b={self.b}")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"polynomial_decay: gamma must be in (0, 1], got gamma={self.gamma}")

    def __call__(self, k: int) -> float:
        return (1.0 + k / self.b) ** (-self.gamma)


@dataclass(frozen=True)
class cyclical_cosine:
    r"""Cyclical cosine schedule of cSGMCMC (Zhang et al., ICLR 2020).

    With cycle length :math:`L = \lceil K / C \rceil` for ``num_steps`` :math:`K` and ``num_cycles``
    :math:`C`:

    .. math:: s(k) = \tfrac12\Big(\cos\frac{\pi \,(k \bmod L)}{L} + 1\Big).

    Each cycle starts with large steps (exploration) and ends with small ones (sampling);
    :meth:`is_sampling` is true in the last ``1 - exploration`` fraction of each cycle, where
    cSGMCMC collects samples. Passed as ``schedule=`` to a stochastic-gradient kernel, the
    exploration iterations make no draw and, unless ``exploration_noise=True``, inject no noise
    (optimisation steps, as cSGMCMC; for LocalEntropySGLD, no noise in the outer step; the
    official Entropy-MCMC code keeps the noise at every step, ``exploration_noise=True``): ``MCMC(num_samples=n)`` counts sampling-phase iterations only, so a run makes
    about ``warmup + n / (1 - exploration)`` iterations; ``num_steps`` should cover them.
    """

    num_steps: int
    num_cycles: int = 4
    exploration: float = 0.5
    #: whether the exploration iterations keep the kernel's noise (its temperature) or run at temperature 0
    exploration_noise: bool = False

    def __post_init__(self):
        if self.num_steps < 1 or self.num_cycles < 1 or self.num_cycles > self.num_steps:
            raise ValueError(
                "cyclical_cosine needs 1 <= num_cycles <= num_steps, got "
                f"num_steps={self.num_steps}, num_cycles={self.num_cycles}"
            )
        if not 0 <= self.exploration < 1:
            raise ValueError(f"exploration must be in [0, 1), got {self.exploration}")
        if not any(self.is_sampling(k) for k in range(self.cycle_length)):
            raise ValueError(f"cyclical_cosine: exploration={self.exploration} leaves no sampling iteration in a cycle "
                             f"of {self.cycle_length} (num_steps={self.num_steps} / num_cycles={self.num_cycles}): "
                             "lower exploration or use longer cycles.")

    @property
    def cycle_length(self) -> int:
        return math.ceil(self.num_steps / self.num_cycles)

    def __call__(self, k: int) -> float:
        phase = (k % self.cycle_length) / self.cycle_length
        return 0.5 * (math.cos(math.pi * phase) + 1.0)

    def is_sampling(self, k: int) -> bool:
        """Whether iteration ``k`` lies in the sampling phase of its cycle."""
        return (k % self.cycle_length) / self.cycle_length >= self.exploration


def as_schedule(schedule: Union[None, float, Schedule]) -> Schedule:
    """Normalise the ``schedule`` argument of a kernel to a callable."""
    if schedule is None:
        return constant(1.0)
    if isinstance(schedule, (int, float)):
        if not math.isfinite(schedule) or schedule <= 0:
            raise ValueError(f"a constant schedule factor must be positive and finite, got {schedule}")
        return constant(float(schedule))
    if not callable(schedule):
        raise ValueError(
            f"schedule must be None, a positive float or a callable k -> factor, got {schedule!r}"
        )
    return schedule


def factor_at(schedule: Schedule, k: int, owner: str) -> float:
    """``schedule(k)`` as a float, refused unless it is a positive finite number (a step of 0 freezes the chain; a
    negative or NaN one is no step); ``owner`` (the kernel) is named in the error."""
    factor = schedule(k)
    try:
        value = float(factor)
    except (TypeError, ValueError):
        value = float("nan")
    if isinstance(factor, (bool, str, bytes)) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{owner}: schedule({k}) returned {factor!r}; a schedule must give a positive finite factor "
                         "of step_size at every iteration k.")
    return value

