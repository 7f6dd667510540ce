r"""Random probe vectors for the stochastic estimators of :mod:`pyro_flat.flatness`.

Each estimator takes a ``seed``: with one, its probes come from a private generator (the global
``torch`` stream is left alone and the estimate is reproducible); with ``None``, from the global one.

>>> rademacher(2, 3, seeded_generator(0)).abs().tolist()
[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
"""

from __future__ import annotations

from typing import Optional

import torch

from ..validation import check_seed


def seeded_generator(seed: Optional[int]) -> Optional[torch.Generator]:
    """A CPU generator seeded with ``seed``, or ``None`` (the global stream) without one."""
    seed = check_seed(seed)
    return None if seed is None else torch.Generator().manual_seed(seed)


def rademacher(num: int, dim: int, generator: Optional[torch.Generator]) -> torch.Tensor:
    r"""``(num, dim)`` independent signs :math:`\pm 1` in float64 (Hutchinson's probes)."""
    return torch.randint(0, 2, (num, dim), generator=generator, dtype=torch.float64) * 2.0 - 1.0
