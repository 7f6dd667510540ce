r"""``pyro_flat.MCMC``: Pyro's MCMC driver, plus chains vectorized in one process.

Pyro runs ``num_chains`` chains one after the other, or in worker processes (about 1 ms of
traffic per draw). pyro-flat's kernels can instead advance all chains together as one batched
tensor (a leading chain dimension on every parameter), which is what many-chain studies need:
hundreds of chains at the cost of a few. :class:`MCMC` is ``pyro.infer.MCMC`` with two more
arguments, ``chain_method`` and ``thinning``. ``chain_method`` is one of:

- ``"vectorized"``: one kernel, one process, all chains batched; an error says why if the model
  does not broadcast;
- ``"auto"`` (default): vectorized when the kernel supports it and the model broadcasts over a
  leading chain dimension (checked by evaluating the first chains both ways), else Pyro's
  behaviour, with a warning that says why;
- ``"sequential"``/``"parallel"``: Pyro's behaviour (``"parallel"``: its worker processes);
- ``"distributed"``: across the ranks of a ``torch.distributed`` group (``torchrun``): each rank runs
  its block of the chains, vectorized, and rank 0 gathers the draws; one seed gives the same draws on
  any number of ranks, up to round-off (:mod:`pyro_flat.distributed`). ``mcmc.rank`` and ``mcmc.world_size`` say where;
- ``"data_parallel"``: every rank runs every chain on its own shard of the data, the potential summed
  over the ranks (:class:`~pyro_flat.distributed.DataParallelTarget`); the chains are identical on
  every rank.

Whatever ran is in ``mcmc.chain_method``; how its chains drew minibatches in ``mcmc.minibatches``.
``random_streams`` says where vectorized chains draw their noise: ``"shared"`` (default), one stream
for all chains (across ranks each rank draws every chain's numbers and keeps its own rows), or
``"per_chain"``, a stream per chain seeded from a seed drawn from the global stream at set-up (alike on
every rank) and the chain's number (:class:`~pyro_flat.chains.streams.ChainStreams`): each rank draws only its
own chains' numbers, which is what lets a network's chains scale over ranks, and a chain's draws are the
same on any number of ranks (one process included) with the same option, up to round-off. Seeded runs
give other numbers under the two options, equally valid. Compiled (``jit_compile``), a graph takes the
per-chain numbers as inputs, drawn before each call.
Vectorized chains draw their own (``minibatches="per_chain"``, the default: the plate's indices are
``(C, B)``, chain ``c``'s in row ``c``, and a model that gathers ``X[idx]`` evaluates all chains in one
pass), so they are independent, as R-hat and ESS assume; ``"shared"`` gives every chain one minibatch
(cheaper for a model that cannot gather per chain, but correlated chains: R-hat and ESS overstate
convergence). Samples, ``summary()``, ``diagnostics()`` and :func:`pyro_flat.to_arviz` look as after
Pyro's own run; with ``pyro.set_rng_seed(s)`` before ``run`` a vectorized run is reproducible bit for bit.

``thinning=k`` (NumPyro's meaning) keeps every ``k``-th of the ``num_samples`` post-warm-up iterations,
``num_samples // k`` draws per chain, made inside one ``sample`` call: the skipped states are never stored.
The progress bar counts iterations (a cyclical schedule's exploration ones too): its rate and time left are true.

Example::

    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_flat import MCMC, EntropySGLD
    >>> def model():
    ...     pyro.sample("x", dist.Normal(torch.zeros(2), 1.).to_event(1))
    >>> mcmc = MCMC(EntropySGLD(model, eta=0.5, step_size=0.05), num_samples=100,
    ...             warmup_steps=50, num_chains=8, disable_progbar=True)
    >>> mcmc.run()
    >>> mcmc.chain_method, mcmc.get_samples(group_by_chain=True)["x_aux"].shape
    ('vectorized', torch.Size([8, 100, 2]))
"""

from __future__ import annotations

import logging
import warnings
from typing import Dict, Optional, Sequence

import torch

import pyro
import pyro.infer
from pyro import poutine
from pyro.infer.mcmc.logger import ProgressBar, initialize_logger
from pyro.infer.mcmc.util import print_summary
from pyro.util import optional

from ..chains.streams import check_random_streams
from ..chains.shard import sharded
from ..evaluation.diagnostics import per_chain_diagnostics, require_draws, select_draws
from ..storage.checkpoint import StopAfterIteration, check_checkpoint_arguments, resumable_data
from ..storage.fingerprint import run_fingerprint
from .draws import DrawBuffers, DrawFiles
from ..storage.draws_folder import DrawsFolder, check_draws_dir
from .progress import ProgressHook
from .sampling_loop import run_chains
from ..distributed.driver import (RankRun, RanksFailed, checked, gather_draws, open_checkpoints,
                                 start_rank_run, with_draws)
from ..kernels.protocol import ChainKernel
from .arguments import check_initial_params, check_kernel, pyro_driver_starts, run_cuda_devices
from ..targets import check_minibatches
from ..validation import check_chain_memory, check_nonnegative_int, check_positive_int, check_thinning

CHAIN_METHODS = ("auto", "vectorized", "sequential", "parallel", "distributed", "data_parallel")
#: the chain methods that span the ranks of a torch.distributed process group
RANK_METHODS = ("distributed", "data_parallel")


class MCMC(pyro.infer.MCMC):
    """``pyro.infer.MCMC`` with vectorized chains (see the module docstring).

    :param chain_method: ``"auto"``, ``"vectorized"``, ``"sequential"``, ``"parallel"``, ``"distributed"``,
        ``"data_parallel"``.
    :param thinning: keep every ``thinning``-th post-warm-up iteration (a pyro-flat
        stochastic-gradient kernel is needed for ``thinning > 1``).
    :param minibatches: ``"per_chain"`` (default) or ``"shared"``: how vectorized chains of a
        subsampled model draw minibatches (see the module docstring).
    :param random_streams: ``"shared"`` (default) or ``"per_chain"``: where vectorized chains draw their
        random numbers (see the module docstring); pass ``"per_chain"`` for chains across ranks.
    :param checkpoint: a file path: every ``checkpoint_every`` seconds (at the first draw after) and when
        the run ends, the run's whole state is written there (atomically: a kill leaves the previous
        checkpoint whole; :mod:`pyro_flat.storage.checkpoint`). ``run`` given an existing checkpoint of the same
        configuration **continues** it, with the draws the uninterrupted run would have made (bit for bit on
        the same machine); one of another configuration, or a corrupt one, is refused by name. A finished
        run's checkpoint gives its draws back at once. Needs a pyro-flat kernel in pyro-flat's loop (not
        Pyro's driver). Across ranks (``"distributed"``, ``"data_parallel"``) each rank writes its own file
        (``run.rank0.ckpt``, ``run.rank1.ckpt``, ... beside ``run.ckpt``, each with its previous one), every
        rank after the same iteration (at the first error check after the interval: every 128 iterations at
        first, up to 4,096 while they are fast),
        and a resumed run continues every rank from the latest iteration all the ranks' files hold.
    :param checkpoint_every: seconds between checkpoints (default 60); Ctrl-C writes one after the iteration in
        progress, then stops (a second Ctrl-C stops at once).
    :param draws_dir: a folder: the kept draws go to a ``.npy`` file per site there as they are made, not to
        memory, counted by a manifest (the format: :mod:`pyro_flat.infer.draws`); ``get_samples()`` gives memory-mapped
        tensors of them, and the draws made before an error or a Ctrl-C are in the files. One run at a time per
        folder, never replacing a file it did not write (:mod:`pyro_flat.storage.draws_folder`). As ``checkpoint``,
        vectorized chains in this process.
    :param overwrite_draws: let the run replace an earlier run's draws in ``draws_dir`` (default: refused).

    The other arguments are ``pyro.infer.MCMC``'s. ``initial_params`` for ``num_chains > 1`` have
    a leading chain dimension, as in Pyro; for one chain a leading dim of 1 is that chain's start
    (``model.initial_params(num_chains=1)``), and none is accepted too. Without ``initial_params`` chains
    start where the kernel's ``init_strategy`` says: by default the model's own start if it has one (a
    ``BayesianModule``: PyTorch's initialisation, per chain), else a prior draw. ``run`` may be called
    again (with other data, say): with the same seed it gives what a new ``MCMC`` object gives.
    """

    def __init__(self, kernel, num_samples: int, warmup_steps: Optional[int] = None,
                 initial_params: Optional[Dict[str, torch.Tensor]] = None, num_chains: int = 1,
                 chain_method: str = "auto", thinning: int = 1, minibatches: str = "per_chain",
                 checkpoint: Optional[str] = None, checkpoint_every: float = 60.0, draws_dir: Optional[str] = None,
                 random_streams: str = "shared", overwrite_draws: bool = False, **kwargs):
        check_kernel(kernel)
        self.checkpoint = check_checkpoint_arguments(checkpoint, checkpoint_every)
        self.checkpoint_every = None if self.checkpoint is None else float(checkpoint_every)  # unused without one
        self.draws_dir, self.overwrite_draws = check_draws_dir(draws_dir, overwrite_draws), overwrite_draws
        self._runs = set()  # the runs whose draws_dir files this object wrote: its next run may replace them
        own_loop = self.checkpoint is not None or self.draws_dir is not None
        num_samples = check_positive_int("num_samples", num_samples,
                                         hint="It is the number of draws kept per chain.")
        if warmup_steps is not None:
            warmup_steps = check_nonnegative_int("warmup_steps", warmup_steps)
        thinning = check_positive_int("thinning", thinning)
        if chain_method not in CHAIN_METHODS:
            raise ValueError(f"chain_method must be one of {CHAIN_METHODS}, got {chain_method!r}.")
        num_chains = check_positive_int("num_chains", num_chains)
        self._requested_minibatches = self.minibatches = check_minibatches(minibatches)
        self.random_streams = check_random_streams(random_streams)
        if thinning > 1 and num_samples < thinning:
            raise ValueError(f"num_samples={num_samples} keeps no draw with thinning={thinning}; "
                             "pass num_samples >= thinning.")
        can_vectorize = isinstance(kernel, ChainKernel)
        if own_loop and (not can_vectorize or not hasattr(kernel, "state_dict")
                         or chain_method not in ("auto", "vectorized") + RANK_METHODS):
            what = "checkpoint=" if self.checkpoint is not None else "draws_dir="
            raise ValueError(f"{what} needs a pyro-flat kernel run by pyro-flat's loop (chain_method 'auto', "
                             f"'vectorized', 'distributed' or 'data_parallel'); got {type(kernel).__name__} with "
                             f"chain_method={chain_method!r}.")
        if self.draws_dir is not None and chain_method in RANK_METHODS:
            raise ValueError(f"draws_dir= is not supported with chain_method={chain_method!r} yet: the ranks' draws "
                             "are gathered to rank 0's memory at the end. Leave draws_dir out (checkpoint= works "
                             "across ranks), or run the chains in one process.")
        if chain_method in ("vectorized",) + RANK_METHODS and not can_vectorize:
            raise ValueError(
                f"chain_method={chain_method!r} needs a pyro-flat kernel; {type(kernel).__name__} "
                "cannot batch chains. Use chain_method='sequential'."
            )
        check_thinning(kernel, thinning)
        if initial_params is not None:
            initial_params = check_initial_params(initial_params, num_chains)
            if own_loop and num_chains == 1:  # Pyro's one chain has no chain dimension; pyro-flat's loop has one
                initial_params = {k: v.unsqueeze(0) for k, v in initial_params.items()}
        # before any work: at least one float per chain and draw (initial_params: the state itself); the
        # kernel checks the model's real state size before it traces the model for so many chains
        state = 4 if initial_params is None else sum(
            v.element_size() * v.numel() for v in initial_params.values()) // num_chains
        check_chain_memory(num_chains, num_samples // thinning, max(state, 4), exact=initial_params is not None)
        self.thinning = thinning
        num_samples //= thinning
        self._requested = (num_chains, chain_method, initial_params, num_samples, warmup_steps, kwargs)
        self.kernel, self.chain_method = kernel, chain_method  # decided for good in run(), given the data
        self._try_vectorized = (num_chains > 1 or own_loop) and can_vectorize and chain_method in ("auto", "vectorized")
        self.rank, self.world_size, self.backend = 0, 1, None  # set by a run across ranks
        if self._try_vectorized or chain_method in RANK_METHODS:  # one kernel holds this process's chains
            super().__init__(kernel, num_samples, warmup_steps, num_chains=1, **kwargs)
        else:
            self._init_pyro(num_chains, initial_params)

    def _init_pyro(self, num_chains: int, initial_params) -> None:
        _, _, _, num_samples, warmup_steps, kwargs = self._requested
        with warnings.catch_warnings():
            if self.chain_method == "sequential":  # asked for: Pyro need not warn about it
                warnings.filterwarnings("ignore", message="num_chains=.*Chains will be drawn sequentially")
            super().__init__(self.kernel, num_samples, warmup_steps, initial_params=initial_params,
                             num_chains=num_chains, **kwargs)
        if num_chains > 1 and self.chain_method != "sequential":
            parallel = type(self.sampler).__name__ == "_MultiSampler"
            self.chain_method = "parallel" if parallel else "sequential"
        elif num_chains == 1:
            self.chain_method = "sequential"

    def run(self, *args, **kwargs) -> None:
        num_chains, method, initial_params, *_ = self._requested
        if self.checkpoint is not None:  # a loader that cannot be restored is refused before the run
            resumable_data(args, kwargs)
        if method in RANK_METHODS:
            return self._run_across_ranks(num_chains, initial_params, args, kwargs)
        if self._try_vectorized:  # vectorization requested: can it be done with these data?
            self.minibatches = self._requested_minibatches
            reason = self._probe(num_chains, args, kwargs, initial_params)
            if reason is None:
                return self._run_vectorized(num_chains, initial_params, args, kwargs)
            if self.minibatches == "per_chain" and self._probe(num_chains, args, kwargs, initial_params,
                                                              "shared") is None:
                hint = (f"{num_chains} chains cannot draw their own minibatches: the model does not give chain c "
                        f"the data of its own indices ({reason}). Gather the data with the plate's indices as "
                        "X[idx] (not X.index_select(0, idx)) and write the likelihood so that (C, B, ...) data "
                        "broadcast against (C, ...) parameters, or pass minibatches='shared' (one minibatch for "
                        "all chains, which correlates them)")
                if method == "vectorized":
                    raise ValueError(f"chain_method='vectorized': {hint}.")
                warnings.warn(f"{type(self.kernel).__name__}: running {num_chains} chains with Pyro's driver, "
                              f"not vectorized: {hint}.", stacklevel=2)
                self.chain_method = "sequential"
                self._init_pyro(num_chains, self._pyro_starts(initial_params, args, kwargs))
                return self._run_pyro(args, kwargs)
            if method == "vectorized":
                raise ValueError(
                    f"chain_method='vectorized': the model does not broadcast over a leading chain "
                    f"dimension ({reason}). Write it so that every latent may carry a leading "
                    "batch dim (as Predictive(parallel=True) needs), pass a batched potential_fn, "
                    "or use chain_method='sequential'."
                )
            warnings.warn(
                f"{type(self.kernel).__name__}: running {num_chains} chains with Pyro's driver, "
                f"not vectorized, because the model does not broadcast over a leading chain "
                f"dimension ({reason}).",
                stacklevel=2,
            )
            self.chain_method = "sequential"
            self._init_pyro(num_chains, self._pyro_starts(initial_params, args, kwargs))
        elif initial_params is None and num_chains > 1:  # Pyro's driver from the start
            starts = self._pyro_starts(None, args, kwargs)  # the model's own, one per chain
            if starts is not None:
                self._init_pyro(num_chains, starts)
        return self._run_pyro(args, kwargs)

    def _pyro_starts(self, initial_params, args: tuple, kwargs: dict):
        """``initial_params``, or when there are none the model's own start for every chain (see
        :func:`~pyro_flat.infer.arguments.pyro_driver_starts`)."""
        if initial_params is not None or not isinstance(self.kernel, ChainKernel):
            return initial_params
        return pyro_driver_starts(self.kernel, self._requested[0], args, kwargs)

    def _run_pyro(self, args: tuple, kwargs: dict) -> None:
        if self.checkpoint is not None or self.draws_dir is not None:
            raise ValueError("checkpoint= and draws_dir= need the chains vectorized in pyro-flat's loop, but they fell "
                             "back to Pyro's driver (see the warning above); make the model broadcast over a leading "
                             "chain dimension, or run without them.")
        self.minibatches = "per_chain"  # one chain per setup: each draws its own
        if self.random_streams == "per_chain":
            warnings.warn("random_streams='per_chain' applies to chains in pyro-flat's loop (vectorized, or across "
                          "ranks); this run's chains are in Pyro's driver (one chain, or chains that could not be "
                          "batched) and draw from the global random stream.", stacklevel=3)
        if isinstance(self.kernel, ChainKernel):  # one chain per setup; forget any earlier run
            self.kernel.configure(steps_per_draw=self.thinning)
        return super().run(*args, **kwargs)

    def get_samples(self, num_samples=None, group_by_chain=False):
        require_draws(self, "get_samples")
        return super().get_samples(num_samples, group_by_chain)

    def summary(self, prob: float = 0.9, var_names: Optional[Sequence[str]] = None,
                coordinates: Optional[Dict[str, object]] = None) -> None:
        """Pyro's summary table (mean, sd, quantiles, ESS, R-hat per coordinate); with ``var_names`` and
        ``coordinates`` of those sites and entries only (:func:`~pyro_flat.diagnostics.select_draws`), the
        way to summarise a network's draws that would not all fit in memory (``draws_dir``)."""
        require_draws(self, "summary")
        if var_names is None and coordinates is None:
            return super().summary(prob)
        print_summary(select_draws(self.get_samples(group_by_chain=True), var_names, coordinates, "summary"), prob=prob)

    def _probe(self, num_chains: int, args, kwargs, initial_params, minibatches: Optional[str] = None):
        """Why ``num_chains`` chains cannot run as one batched kernel, or ``None``; the global random stream
        is left as it was, so that the draws do not depend on the probe (nor on the chains it probed)."""
        with torch.random.fork_rng(devices=run_cuda_devices(args, kwargs, initial_params, self.kernel)):
            return self.kernel.vectorization_error(num_chains, args, kwargs, initial_params,
                                                   minibatches or self.minibatches, num_draws=self.num_samples)

    def _run_across_ranks(self, num_chains: int, initial_params, args, kwargs) -> None:
        """``chain_method="distributed"`` or ``"data_parallel"``: this rank's part of the run (see
        :mod:`pyro_flat.distributed.driver`)."""
        settings = {"the kernel": type(self.kernel).__name__, "num_chains": num_chains, "num_samples": self.num_samples,
                    "warmup_steps": self.warmup_steps, "thinning": self.thinning, "minibatches": self.minibatches,
                    "random_streams": self.random_streams}
        run = start_rank_run(self.chain_method, num_chains, initial_params, settings, args, kwargs,
                             run_cuda_devices(args, kwargs, initial_params, self.kernel),
                             lambda chains, params: self._probe(chains, args, kwargs, params))
        self.rank, self.world_size, self.backend = run.ranks.rank, run.ranks.world_size, run.ranks.backend
        self._run_vectorized(run.num_chains, run.initial_params, args, kwargs, run)

    def _run_vectorized(self, num_chains: int, initial_params, args, kwargs, run: Optional[RankRun] = None) -> None:
        """Pyro's sampling loop for one kernel that holds every chain (this rank's, with ``run``); draws go
        straight into preallocated ``(chain, draw, ...)`` buffers."""
        kernel, warmup, num_samples = self.kernel, self.warmup_steps, self.num_samples
        kernel.configure(num_chains=num_chains, steps_per_draw=self.thinning, minibatches=self.minibatches,
                         data_parallel=None if run is None else run.data_parallel, random_streams=self.random_streams)
        if initial_params is not None:
            kernel.initial_params = initial_params
        self._args, self._kwargs = args, kwargs
        args = tuple(a.detach() if torch.is_tensor(a) else a for a in args)
        quiet = self.sampler.disable_progbar or (run is not None and not run.ranks.is_main)
        # the bar counts iterations: a cyclical schedule's exploration ones too (the kernel knows how many)
        progress_bar = ProgressBar(warmup, kernel.iterations_for(warmup, num_samples) - warmup, disable=quiet)
        logger = initialize_logger(logging.getLogger("pyro.infer.mcmc"), "", progress_bar)
        hook = ProgressHook(logger, progress_bar, self.sampler.hook)
        saver, clock = (None, None) if self.checkpoint is None else open_checkpoints(  # across ranks: one file each
            self.checkpoint, self.checkpoint_every,
            {**run_fingerprint(kernel, num_chains=num_chains, num_samples=num_samples, warmup_steps=warmup,
                               thinning=self.thinning, minibatches=self.minibatches, initial_params=initial_params,
                               args=args, kwargs=kwargs),
             "random_streams": self.random_streams,
             "draws_dir": None if self.draws_dir is None else str(self.draws_dir)},
            run, resumable_data(args, kwargs), run_cuda_devices(args, kwargs, initial_params, kernel))
        recording = getattr(kernel, "record_draws", None)
        if self.draws_dir is not None and recording:  # the files hold the draws: no second copy in memory
            kernel.record_draws = False
        resumed = saver is not None and saver.saved is not None
        steps = run_chains(kernel, warmup, num_samples, args, kwargs,
                           resume=saver if resumed else None)
        store = folder = None
        try:
            if self.draws_dir is not None:  # locked for this run, and checked: before any draw
                folder = DrawsFolder(self.draws_dir, resume=saver.saved["draws"] if resumed else None,
                                     checkpoint=self.checkpoint, overwrite=self.overwrite_draws, own_runs=self._runs)
            validation = optional(pyro.validation_enabled(not self.disable_validation),
                                  self.disable_validation is not None)
            with sharded(None if run is None else run.shard), poutine.block(), validation, \
                    StopAfterIteration(enabled=saver is not None and clock is None) as ctrl_c:
                for phase, i, params in checked(steps, run, self.thinning, clock):
                    if phase == "Initial":
                        names = getattr(kernel, "save_params", None) or sorted(params)
                        # (draw, chain, ...) in host memory or files: draws leave a GPU as they are made
                        transforms = kernel.transforms
                        shapes = {n: (tuple(params[n].shape), params[n].dtype) for n in names}
                        store = DrawFiles(folder, shapes, num_samples) if folder else DrawBuffers(shapes, num_samples)
                        if resumed:  # the draws made before the stop, handed to the user's hook as when made
                            store.restore(saver.saved["draws"])
                            hook.resumed(kernel.iteration)
                            if self.sampler.hook is not None:
                                for j in range(max(saver.saved["done"] - warmup, 0)):
                                    row = store.row(j)
                                    self.sampler.hook(kernel, {n: transforms[n](v) if n in transforms else v
                                                               for n, v in row.items()}, "Sample", j)
                        continue
                    if phase == "Sample":
                        store.put(i, {n: transforms[n].inv(params[n]) if n in transforms else params[n] for n in names})
                    hook(kernel, params, phase, i)
                    if saver is not None:
                        done = i + 1 + (warmup if phase == "Sample" else 0)
                        if clock is None:
                            saver.maybe_write(kernel, params, done, store, done - warmup)
                        elif clock.due:  # every rank, after the same iteration
                            saver.write(kernel, params, done, store, done - warmup)
                            clock.written()
                    if ctrl_c.requested:  # Ctrl-C: this iteration's checkpoint, then the stop
                        saver.write(kernel, params, done, store, done - warmup)
                        raise KeyboardInterrupt
                if saver is not None:  # the finished run: run() again gives its draws back at once
                    saver.write(kernel, params, warmup + num_samples, store, num_samples)
                hook.flush(kernel)
                diagnostics = kernel.diagnostics()
            self.transforms = kernel.transforms
            self._samples = {n: v.transpose(0, 1) for n, v in store.tensors().items()}  # (chain, draw, ...) views
        except RanksFailed as failed:
            steps.close()  # this rank's kernel cleans up: its draws so far are in kernel.partial_samples
            raise with_draws(failed.error, run, kernel.partial_samples) from failed.cause
        finally:
            progress_bar.close()
            if saver is not None:
                saver.close()
            if self.draws_dir is not None:
                kernel.record_draws = recording
                if folder is not None:  # an error or a Ctrl-C too: the draws made so far go to the files
                    folder.close(store)
        if run is None:
            self.chain_method = "vectorized"
        self.num_chains = num_chains if run is None else run.total_chains
        self._diagnostics = per_chain_diagnostics(diagnostics, num_chains)
        if run is not None and run.shard is not None and run.ranks.distributed:
            self._samples, self._diagnostics = gather_draws(run, self._samples, self._diagnostics)
