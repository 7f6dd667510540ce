"""Random numbers per chain, the same however the chains are split over processes: which chains a process
runs and the rows of the shared stream they take (:mod:`~pyro_flat.chains.shard`), or a stream of their
own (:mod:`~pyro_flat.chains.streams`)."""

from .shard import (ChainShard, chain_draw, chain_indices, chain_rand_like, chain_randn_like, chain_randn_like_each,
                    chains_all, chains_average, chains_min, current_shard, global_chain, owns, shard_of, sharded)
from .streams import (RANDOM_STREAMS, ChainStreams, NoiseSpec, chain_seed, check_random_streams, context_value,
                      drawing_from, streams_for)

__all__ = ["ChainShard", "current_shard", "shard_of", "sharded", "chain_draw", "chain_randn_like",
           "chain_randn_like_each", "chain_rand_like", "chain_indices", "owns", "global_chain", "chains_average",
           "chains_min", "chains_all", "RANDOM_STREAMS", "check_random_streams", "chain_seed", "NoiseSpec",
           "ChainStreams", "context_value", "drawing_from", "streams_for"]
