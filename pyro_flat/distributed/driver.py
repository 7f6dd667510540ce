r"""The across-ranks part of :class:`pyro_flat.MCMC`: start a rank's share of a run, check the ranks as it
goes, and bring the draws to rank 0.

:class:`pyro_flat.MCMC` runs one batched kernel per process either way; with
``chain_method="distributed"`` or ``"data_parallel"`` it asks this module for:

- :func:`start_rank_run`: join the group, agree on the run's settings, split the chains
  (:class:`~pyro_flat.chains.ChainShard`) or hand the kernel its data shards
  (:class:`~pyro_flat.distributed.DataParallelShards`), and check on every rank that the model batches;
- :func:`checked`: the sampling loop with the collective error check, so that every rank raises the
  same error within one check interval of a failure (:data:`CHECK_ITERATIONS` iterations, longer while
  iterations are fast), and writes its checkpoint after
  the same iteration (:class:`CheckpointClock`);
- :func:`agree_on_checkpoints`: every rank continues from the same iteration of its own checkpoint file;
- :func:`with_draws` and :func:`gather_draws`: the draws made so far (after an error) and at the end,
  gathered to rank 0 in chain order.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

import torch

from ..chains.shard import ChainShard
from ..storage.checkpoint import Checkpointer, CheckpointError, rank_checkpoint_paths
from ..errors import DivergenceError
from ..targets import Params
from .data_parallel import DataParallelShards
from .group import Ranks, fingerprint, init_from_env, shard_fingerprint

#: iterations between two collective error checks of a run across ranks at first (each costs one all-reduce,
#: about 1 ms on the 2-core test machine, 50-100 us on a usual host, and makes the faster rank wait)
CHECK_ITERATIONS = 128
#: the most iterations between two checks: the interval doubles while checks come less than
#: :data:`CHECK_SECONDS` apart (by rank 0's clock, shared in the check's own all-reduce), and halves
#: while they come more than 4 times that apart
MAX_CHECK_ITERATIONS = 4096
CHECK_SECONDS = 0.5


@dataclass
class RankRun:
    """This rank's part of a run across ranks: its ``ranks``, its ``shard`` of the chains (``None`` for
    data-parallel chains, which every rank runs whole), how many chains it runs and from where."""

    ranks: Ranks
    shard: Optional[ChainShard]
    num_chains: int
    initial_params: Optional[Params]
    data_parallel: Optional[DataParallelShards]

    @property
    def total_chains(self) -> int:
        return self.num_chains if self.shard is None else self.shard.total


def start_rank_run(method: str, num_chains: int, initial_params: Optional[Params], settings: dict,
                   args: tuple, kwargs: dict, devices: list,
                   probe: Callable[[int, Optional[Params]], Optional[str]]) -> RankRun:
    """Join the group and prepare this rank's part of ``method`` (``"distributed"`` or
    ``"data_parallel"``). Every rank must pass the same ``settings`` (checked, named in the error) and
    the same model arguments (their shapes, for data-parallel shards); ``probe(chains, initial_params)``
    says why the model cannot batch this rank's chains, or ``None``."""
    ranks = init_from_env(device=devices[0] if devices else None)
    data_parallel = method == "data_parallel"
    summary = shard_fingerprint if data_parallel else fingerprint
    ranks.agree(f"MCMC(chain_method={method!r})", {
        **settings, "the model's arguments": summary(args),
        "the model's keyword arguments": summary(kwargs), "initial_params": summary(initial_params)})
    ranks.sync_random_state(devices[0] if devices else None)
    shard = None if data_parallel else ChainShard.split(num_chains, ranks.rank, ranks.world_size, ranks.group)
    local = num_chains if shard is None else shard.count
    if initial_params is not None and shard is not None:
        initial_params = {k: shard.rows(torch.as_tensor(v)) for k, v in initial_params.items()}
    try:
        reason, error = probe(local, initial_params), None
    except Exception as err:  # the user's error (bad data, a discrete latent, ...): every rank stops
        reason, error = None, err
    failure = ranks.check(error)
    if failure is not None:
        raise failure from error
    reasons = [r for r in ranks.all_objects(reason, "comparing the vectorization probes") if r is not None]
    if reasons:
        # the reason may be the model's (it does not broadcast over a leading chain dimension) or the
        # kernel's own (EntropyHMC's NUTS runs one chain at a time): say it as given and both ways out
        raise ValueError(
            f"chain_method={method!r} runs each rank's chains as one batched kernel, and "
            f"{settings.get('the kernel', 'the kernel')} cannot batch these chains ({reasons[0]}). If the model "
            "is the cause, write it so that every latent may carry a leading batch dim and gather its data as "
            "X[idx] (or pass minibatches='shared'), or pass a batched potential_fn; if the kernel is, run the "
            "chains in one process (chain_method='sequential').")
    return RankRun(ranks, shard, local, initial_params, DataParallelShards(ranks) if data_parallel else None)


class RanksFailed(Exception):
    """A rank raised: ``error`` is the same on every rank, ``cause`` is this rank's own error (or None)."""

    def __init__(self, error: BaseException, cause: Optional[BaseException]):
        super().__init__(str(error))
        self.error, self.cause = error, cause


class CheckpointClock:
    """When the ranks of a run write their checkpoints: at a collective check of :func:`checked` (every
    interval) where rank 0's ``every`` seconds have passed, so that every rank
    writes the state after the same iteration. :func:`checked` sets ``due`` for the item it yields next."""

    def __init__(self, ranks: Ranks, every: float):
        self.ranks, self.every, self.last, self.due = ranks, every, time.monotonic(), False

    def wish(self) -> bool:
        return self.ranks.is_main and time.monotonic() - self.last >= self.every

    def written(self) -> None:
        self.last, self.due = time.monotonic(), False


def _next_interval(interval: int, seconds: float, target: float = CHECK_SECONDS) -> int:
    """Rank 0's choice of the iterations until the next check, from the seconds the last ``interval`` took."""
    if seconds < target:
        return min(2 * interval, MAX_CHECK_ITERATIONS)
    if seconds > 4 * target:
        return max(interval // 2, CHECK_ITERATIONS)
    return interval


def checked(steps: Iterator[Tuple[str, int, Params]], run: Optional[RankRun],
            iterations_per_draw: int = 1, clock: Optional[CheckpointClock] = None) -> Iterator[Tuple[str, int, Params]]:
    """``steps``, with the collective error check when the run spans ranks: after set-up, every
    :data:`CHECK_ITERATIONS` iterations at first (doubling up to :data:`MAX_CHECK_ITERATIONS` while the checks
    come less than :data:`CHECK_SECONDS` apart, or a quarter of the checkpoints' interval, so that fast
    iterations do not pay an all-reduce and a wait for the slower rank every few milliseconds), at the end, and at once on a rank that raised. Every rank
    then raises :class:`RanksFailed` with the same error (see :meth:`pyro_flat.distributed.Ranks.check`), at
    most one interval (about :data:`CHECK_SECONDS` to 4 times that) after the failure. With a ``clock``, the
    same all-reduce decides whether every rank writes its checkpoint after the item it yields next."""
    if run is None or not run.ranks.distributed:
        yield from steps
        return
    since, interval, last = 0, CHECK_ITERATIONS, time.monotonic()
    while True:
        try:
            item, error = next(steps), None
        except StopIteration:
            item, error = None, None
        except Exception as err:  # a KeyboardInterrupt is not caught: torchrun stops every rank
            item, error = None, err
        if item is not None:
            since += iterations_per_draw if item[0] == "Sample" else 1
        if item is None or item[0] == "Initial" or since >= interval:
            since, now = 0, time.monotonic()
            # checks no further apart than a quarter of the checkpoints' interval: they decide when to write
            target = CHECK_SECONDS if clock is None else min(CHECK_SECONDS, clock.every / 4)
            wanted = _next_interval(interval, now - last, target) if run.ranks.is_main else 0  # the max: rank 0's
            failure, due, interval = run.ranks.check_and_share(
                error, clock is not None and item is not None and clock.wish(), wanted)
            last = now
            if failure is not None:
                raise RanksFailed(failure, error)
            if clock is not None:
                clock.due = due and item[0] != "Initial"
        if item is None:
            return
        yield item


def open_checkpoints(path: Path, every: float, fingerprint: dict, run: Optional[RankRun],
                     data: list = (), devices: list = ()) -> Tuple[Checkpointer, Optional[CheckpointClock]]:
    """A run's :class:`~pyro_flat.storage.checkpoint.Checkpointer` at ``path``, and across ranks each rank's own file
    (:func:`~pyro_flat.storage.checkpoint.rank_checkpoint_paths`, which keeps the previous one), agreed on by every
    rank (:func:`agree_on_checkpoints`), with the :class:`CheckpointClock` that times the writes. ``data``:
    the arguments whose position the checkpoints hold (:func:`~pyro_flat.storage.checkpoint.resumable_data`);
    ``devices``: the run's CUDA devices, where the checkpoints' CUDA tensors go."""
    if run is None or not run.ranks.distributed:
        refuse_other_world_sizes(path, 1)
        return Checkpointer(path, every, fingerprint, data=data, devices=devices), None
    ranks = run.ranks
    fingerprint = {**fingerprint, "rank": ranks.rank, "world_size": ranks.world_size}
    mine, previous = rank_checkpoint_paths(path, ranks.rank)

    def open_mine() -> Checkpointer:
        refuse_other_world_sizes(path, ranks.world_size)
        return Checkpointer(mine, every, fingerprint, previous, data, devices)

    saver = agree_on_checkpoints(ranks, open_mine)
    return saver, CheckpointClock(ranks, every)


def refuse_other_world_sizes(path: Path, world_size: int) -> None:
    """A :class:`~pyro_flat.storage.checkpoint.CheckpointError` if ``path`` holds the checkpoints of a run on another
    number of processes: a run of one process (``run.ckpt`` itself) or ranks this run does not have
    (``run.rank{r}.ckpt`` with ``r >= world_size``), which it would otherwise not see and start over."""
    pattern = re.compile(re.escape(path.stem) + r"\.rank(\d+)" + re.escape(path.suffix))
    ranks = sorted(int(m.group(1)) for m in map(pattern.fullmatch, (p.name for p in path.parent.iterdir())) if m)
    if world_size == 1 and ranks:
        raise CheckpointError(f"checkpoint {str(path)!r} was written by a run across {max(ranks) + 1} ranks (files "
                              f"{path.stem}.rank*{path.suffix}): continue it with torchrun --nproc_per_node "
                              f"{max(ranks) + 1}, or delete those files to start a new run of one process.")
    if world_size > 1 and path.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} was written by a run of one process: continue it without "
                              f"torchrun, or delete it to start a new run across {world_size} ranks.")
    if ranks and max(ranks) >= world_size:
        raise CheckpointError(f"checkpoint {str(path)!r} was written by a run across {max(ranks) + 1} ranks, and this "
                              f"run has {world_size}: continue it with torchrun --nproc_per_node {max(ranks) + 1}, or "
                              "delete its files to start a new run.")


def agree_on_checkpoints(ranks: Ranks, open_checkpoint: Callable[[], Checkpointer]) -> Checkpointer:
    """Open every rank's checkpoint (``open_checkpoint()``) and continue all of them from the latest
    iteration that every rank's files hold (each keeps its last two), or all from the start. A rank that
    cannot (a corrupt file, another configuration, a missing file) stops every rank with its error."""
    saver, error = None, None
    try:
        saver = open_checkpoint()
    except Exception as err:
        error = err
    failure = ranks.check(error)
    if failure is not None:
        if saver is not None:
            saver.close()
        raise failure from error
    held = ranks.all_objects(sorted(saver.found), "comparing the ranks' checkpoints")
    common = set(held[0]).intersection(*held[1:])
    if any(held) and not common:
        saver.close()
        lost = [r for r, dones in enumerate(held) if not dones]
        raise CheckpointError(
            f"the ranks' checkpoints of {str(saver.path.name)!r} do not continue one run: "
            + (f"rank(s) {lost} have none" if lost else "they hold no common iteration ("
               + "; ".join(f"rank {r}: {dones}" for r, dones in enumerate(held)) + ")")
            + ". Restore the missing files, or delete every rank's file to start a new run.")
    saver.continue_from(max(common) if common else None)
    return saver


def with_draws(error: BaseException, run: RankRun, partial: List[dict]) -> BaseException:
    """``error`` with the draws every chain made before it: on rank 0 for chains split over ranks (every
    rank for data-parallel chains, which are the same on every rank). A
    :class:`~pyro_flat.DivergenceError`'s failing chain goes to ``.samples``, the others to
    ``.completed_chains``; any other error carries them all as ``.partial_samples``."""
    if run.shard is not None:
        everyone = run.ranks.gather([{n: v.cpu() for n, v in chain.items()} for chain in partial],
                                    "gathering the draws made before the error to rank 0")
        chains = None if everyone is None else [chain for rank in everyone for chain in rank]
    else:
        chains = partial
    if chains is None:  # not rank 0
        return error
    if isinstance(error, DivergenceError) and 0 <= error.chain < len(chains):
        error.samples = chains[error.chain]
        error.completed_chains = [c for i, c in enumerate(chains) if i != error.chain]
    else:
        error.partial_samples = chains
    return error


def gather_draws(run: RankRun, samples: dict, diagnostics: list) -> Tuple[Optional[dict], Optional[list]]:
    """Every rank's chains to rank 0, in chain order: ``(samples, per-chain diagnostics)`` there,
    ``(None, None)`` on the other ranks. The draws travel as one tensor per rank
    (:meth:`~pyro_flat.distributed.Ranks.gather_rows`), the small diagnostics as objects."""
    names = list(samples)
    gathered = run.ranks.gather_rows([samples[n] for n in names], "gathering the draws to rank 0")
    everyone = run.ranks.gather(_cpu(diagnostics), "gathering the chains' diagnostics to rank 0")
    if everyone is None:
        return None, None
    return dict(zip(names, gathered)), [chain for per_chain in everyone for chain in per_chain]


def _cpu(diagnostics: list) -> list:
    """Per-chain diagnostics with their tensors on the CPU (to be sent to rank 0)."""
    def move(value):
        if torch.is_tensor(value):
            return value.cpu()
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        return value

    return [move(chain) for chain in diagnostics]


__all__ = ["CHECK_ITERATIONS", "MAX_CHECK_ITERATIONS", "CHECK_SECONDS", "RankRun", "RanksFailed", "CheckpointClock",
           "start_rank_run", "checked",
           "agree_on_checkpoints", "open_checkpoints", "with_draws", "gather_draws"]
