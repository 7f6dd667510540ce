r"""pyro-flat on ``torch.distributed``: chains across processes, and data-parallel gradients.

Two ways to spread a run over the ranks of a process group (started by ``torchrun``, joined by
:func:`init_from_env`):

- ``pyro_flat.MCMC(..., chain_method="distributed")``: each rank runs its share of the chains
  (:class:`ChainShard`), vectorized inside the rank; draws and statistics are gathered to rank 0.
  Random numbers are drawn so that chain ``c`` gets the same ones on any number of ranks
  (:mod:`pyro_flat.chains`): one seed, the same draws, up to round-off.
- ``pyro_flat.MCMC(..., chain_method="data_parallel")``: every rank runs every chain on its shard of
  the data; energies and gradients are summed over ranks (:class:`DataParallelTarget`) and the noise
  is drawn from one stream, so the chains stay bit-identical across ranks.

Example (``torchrun --nproc-per-node 2 script.py``)::

    pyro.set_rng_seed(0)
    mcmc = pyro_flat.MCMC(SGLD(model, step_size=1e-3), num_samples=1000, num_chains=8,
                          chain_method="distributed")
    mcmc.run(X, y)                      # 4 chains per rank
    if mcmc.rank == 0:
        print(mcmc.summary())           # all 8 chains
"""

from ..chains.shard import ChainShard, current_shard, sharded
from ..errors import OtherRankFailed, RankLost
from .data_parallel import DataParallelShards, DataParallelTarget, shard_rows
from .group import DEFAULT_TIMEOUT, Ranks, init_from_env, launched_by_torchrun

__all__ = ["init_from_env", "launched_by_torchrun", "Ranks", "RankLost", "OtherRankFailed", "DEFAULT_TIMEOUT",
           "ChainShard", "current_shard", "sharded", "DataParallelTarget", "DataParallelShards", "shard_rows"]
