r"""Warm-up adaptation for HMC, one estimate per chain (every tensor has a leading chain dim).

- the step size by Nesterov dual averaging (Hoffman & Gelman 2014), with Pyro's
  :class:`pyro.ops.dual_averaging.DualAveraging`, which works elementwise on tensors;
- the covariance of the position by Welford's streaming estimator, regularised as in Stan;
- Stan's windows: a fast initial buffer, slow windows that double in length, a final buffer.
"""

from __future__ import annotations

from typing import List

import torch
from pyro.ops.dual_averaging import DualAveraging


def adaptation_windows(num_warmup: int, init_buffer: int = 75, term_buffer: int = 50,
                       base_window: int = 25) -> List[int]:
    """Iterations (0-based) at whose end the mass matrix is re-estimated (Stan's schedule).

    >>> adaptation_windows(1000)
    [99, 149, 249, 449, 949]
    >>> adaptation_windows(100)
    [74]
    """
    if num_warmup < 20:
        return []
    if init_buffer + base_window + term_buffer > num_warmup:
        # Stan's 15% / 75% / 10%, but at least 25 final steps (or half of warm-up) for dual
        # averaging to settle after the last change of the metric
        init_buffer = int(0.15 * num_warmup)
        term_buffer = max(int(0.1 * num_warmup), min(25, num_warmup // 2))
        base_window = num_warmup - init_buffer - term_buffer
    ends, start, window = [], init_buffer, base_window
    last = num_warmup - term_buffer
    while start + window < last:
        next_window = 2 * window
        if start + window + next_window > last:  # stretch the final window to the buffer
            window = last - start
        ends.append(start + window - 1)
        start, window = start + window, next_window
    if not ends or ends[-1] != last - 1:
        ends.append(last - 1)
    return ends


class StepSizeAdapter:
    """Dual averaging on :math:`\\log\\epsilon` towards a target acceptance probability, per chain."""

    def __init__(self, target_accept_prob: float = 0.8):
        self.target = target_accept_prob
        self._da = DualAveraging()

    def reset(self, step_size: torch.Tensor) -> None:
        self._da.prox_center = torch.log(10 * step_size)
        self._da.reset()

    def update(self, accept_prob: torch.Tensor) -> torch.Tensor:
        """One dual-averaging step; returns the step size to use next."""
        self._da.step(self.target - accept_prob)
        return torch.exp(self._da.get_state()[0])

    def final(self) -> torch.Tensor:
        """The averaged step size, used after warm-up."""
        return torch.exp(self._da.get_state()[1])


class WelfordCovariance:
    """Streaming mean and (co)variance of ``(C, D)`` samples; ``diagonal`` keeps only variances."""

    def __init__(self, diagonal: bool = True):
        self.diagonal = diagonal
        self.reset()

    def reset(self) -> None:
        self.n, self.mean, self.m2 = 0, None, None

    def update(self, x: torch.Tensor) -> None:
        self.n += 1
        if self.mean is None:
            self.mean = torch.zeros_like(x)
            self.m2 = torch.zeros_like(x) if self.diagonal else x.new_zeros(x.shape + x.shape[-1:])
        delta = x - self.mean
        self.mean = self.mean + delta / self.n
        after = x - self.mean
        if self.diagonal:
            self.m2 = self.m2 + delta * after
        else:
            self.m2 = self.m2 + delta.unsqueeze(-1) * after.unsqueeze(-2)

    def covariance(self) -> torch.Tensor:
        """Sample (co)variance shrunk towards ``1e-3 I`` as Stan does: ``(n/(n+5)) S + 1e-3 (5/(n+5))``."""
        n = self.n
        cov = self.m2 / max(n - 1, 1)
        shrink = 1e-3 * 5.0 / (n + 5.0)
        if self.diagonal:
            return (n / (n + 5.0)) * cov + shrink
        eye = torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
        return (n / (n + 5.0)) * cov + shrink * eye

