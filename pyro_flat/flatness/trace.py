r"""The Hessian trace by Hutchinson's estimator, with its standard error.

.. math:: \operatorname{tr} H = \mathbb E_v\big[v^\top H v\big], \qquad
          \widehat{\operatorname{tr}} = \frac1n \sum_{p=1}^n v_p^\top H v_p,\quad
          \mathrm{se} = \frac{\mathrm{sd}_p(v_p^\top H v_p)}{\sqrt n},

with Rademacher probes :math:`v_p \in \{\pm1\}^d` (the minimum-variance choice:
:math:`\operatorname{Var}(v^\top H v) = 2\sum_{i\ne j} H_{ij}^2`, zero for a diagonal Hessian).
The products are batched with ``torch.func.vmap``.
"""

from __future__ import annotations

import math
from typing import Dict, NamedTuple, Optional, Union

import torch

from ..validation import check_positive_int
from .loss import FlatLoss, HessianOperator, LossFn, as_flat_loss
from .probes import check_seed, rademacher, seeded_generator

__all__ = ["hessian_trace", "TraceEstimate"]


class TraceEstimate(NamedTuple):
    """A trace estimate: ``value``, its Monte-Carlo ``stderr`` and the ``num_probes`` used.

    A tuple of plain numbers: ``trace, stderr, _ = hessian_trace(...)``.
    """

    value: float
    stderr: float
    num_probes: int


def hessian_trace(loss_fn: Union[FlatLoss, LossFn], params: Optional[torch.Tensor] = None, *,
                  num_probes: int = 100, seed: Optional[int] = 0, chunk_size: int = 16,
                  per_site: bool = False) -> Union[TraceEstimate, Dict[str, TraceEstimate]]:
    """Hutchinson's estimate of :math:`\\operatorname{tr}\\nabla^2 \\ell(\\theta)` and its standard error.

    :param loss_fn: ``(d,) tensor -> scalar`` or a :class:`FlatLoss`.
    :param params: the point (may be omitted with a :class:`FlatLoss`).
    :param num_probes: Rademacher probes (at least 2, for the standard error).
    :param chunk_size: probes per vectorized batch of Hessian-vector products.
    :param per_site: ``{block: TraceEstimate}``, the traces of the diagonal blocks (they sum to
        the full trace).

    >>> import torch
    >>> est = hessian_trace(lambda x: (x ** 2).sum() + 3 * x[0] * x[1], torch.zeros(3), num_probes=200)
    >>> abs(est.value - 6.0) < 4 * est.stderr   # tr H = 6; the cross term adds noise
    True
    """
    num_probes = check_positive_int("num_probes", num_probes, minimum=2,
                                    hint="At least 2 probes give a standard error; e.g. num_probes=100.")
    chunk_size = check_positive_int("chunk_size", chunk_size, hint="It is the probes per batch, e.g. chunk_size=16.")
    seed = check_seed(seed)
    loss = as_flat_loss(loss_fn, params)
    if per_site:
        return loss.per_block(hessian_trace, num_probes=num_probes, seed=seed, chunk_size=chunk_size)
    op = HessianOperator(loss, chunk_size=chunk_size)
    probes = rademacher(num_probes, loss.dim, seeded_generator(seed)).to(loss.params.device)
    quad = (op.matmat(probes).to(torch.float64) * probes).sum(-1)
    stderr = float(quad.std(unbiased=True)) / math.sqrt(num_probes)
    return TraceEstimate(float(quad.mean()), stderr, num_probes)
