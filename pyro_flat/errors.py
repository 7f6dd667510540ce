"""The errors that cross pyro-flat's layers: raised low (a kernel, a rank), caught high (the driver, a study).

- :class:`DivergenceError`: a chain's potential, gradient or state became NaN/inf (kernels);
- :class:`RankLost` and :class:`OtherRankFailed`: a run across ranks lost a rank, or failed on another
  rank (:mod:`pyro_flat.distributed`);
- :class:`CheckpointError`: a checkpoint that cannot continue a run (:mod:`pyro_flat.storage`), caught by the
  driver, the ranks and the studies.

The errors of one layer alone stay with it (:class:`~pyro_flat.targets.ChangedSitesError` with the targets).
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch


class DivergenceError(FloatingPointError):
    """A chain produced a NaN/inf potential, gradient or state.

    The chain stops at once; nothing non-finite reaches the samples. The draws made before the
    divergence are kept:

    - ``samples``: the failing chain's post-warm-up draws, ``{site: tensor(num_draws, ...)}``
      in the constrained space (what ``mcmc.get_samples()`` would have held for it);
    - ``completed_chains``: the same for the chains that finished before it.

    ``site``, ``iteration`` (counted from 0, warm-up included), ``chain`` and ``step_size`` say where.
    """

    def __init__(
        self,
        message: str,
        *,
        site: Optional[str] = None,
        iteration: int = -1,
        chain: int = 0,
        step_size: float = float("nan"),
        samples: Optional[Dict[str, torch.Tensor]] = None,
        completed_chains: Optional[List[Dict[str, torch.Tensor]]] = None,
    ):
        super().__init__(message)
        self.site, self.iteration, self.chain, self.step_size = site, iteration, chain, step_size
        self.samples = samples or {}
        self.completed_chains = completed_chains or []

    def __reduce__(self):  # picklable across Pyro's multiprocessing chains
        return (
            _rebuild_divergence,
            (str(self), self.site, self.iteration, self.chain, self.step_size, self.samples,
             self.completed_chains),
        )


def _rebuild_divergence(message, site, iteration, chain, step_size, samples, completed):
    return DivergenceError(
        message, site=site, iteration=iteration, chain=chain, step_size=step_size,
        samples=samples, completed_chains=completed,
    )


class RankLost(RuntimeError):
    """A collective failed: another rank died, or did not answer within the group's timeout."""


class OtherRankFailed(RuntimeError):
    """Raised by a rank whose own part is sound when another rank's is at fault (e.g. its data shard):
    :meth:`pyro_flat.distributed.Ranks.check` then hands every rank the failing rank's error, not this one."""


class CheckpointError(ValueError):
    """A checkpoint that cannot continue this run: unreadable, corrupt, or of another configuration."""


__all__ = ["DivergenceError", "RankLost", "OtherRankFailed", "CheckpointError"]
