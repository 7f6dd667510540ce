"""The shared skeleton of pyro-flat's kernels (Pyro ``MCMCKernel`` shape): the contract and set-up.

:class:`TargetKernel` is what every kernel shares: per chain, ``setup`` builds the target (the
model's potential, with fresh minibatches each call, or a ``potential_fn``: a
:class:`~pyro_flat.targets.Target`) and draws the initial point; ``sample`` (the subclass) makes
one transition and records the per-draw statistics that :func:`pyro_flat.to_arviz` turns into
``sample_stats`` (:mod:`~pyro_flat.kernels.recording`); ``diagnostics`` hands them to Pyro's
driver, which keeps them per chain (also across its worker processes). With ``num_chains`` set
(by :class:`pyro_flat.MCMC`) one kernel advances that many chains at once: every tensor carries a
leading chain dimension (:mod:`~pyro_flat.kernels.vectorization` decides whether a model allows it).

:class:`~pyro_flat.kernels.stochastic_gradient.StochasticGradientKernel` adds the
one-gradient-per-step loop of SGLD and its relatives.
"""

from __future__ import annotations

import inspect
import time
import warnings
from typing import Callable, ContextManager, Dict, Optional, Tuple, Union

import torch
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel

from ..chains.streams import ChainStreams, check_random_streams, drawing_from
from ..chains.shard import shard_of
from ..targets import (CallablePotential, CoupledPotential, ModelPotential, Params, Target, check_minibatches,
                       compile_target)
from ..validation import check_nonnegative_int, check_positive_int, check_real_tensor, check_thinning
from .protocol import DataParallelism, RunChoices
from .recording import DrawRecording
from .vectorization import probe_chains


def constructor_signature(cls: type) -> inspect.Signature:
    """Every argument ``cls(...)`` accepts: its ``__init__``'s, following ``**kwargs`` up the base classes (a
    subclass or mixin that passes ``**kwargs`` on takes its bases' arguments too), without ``self`` and the
    settings the class fixes itself (``fixed_settings``)."""
    found: Dict[str, inspect.Parameter] = {}
    fixed = set(getattr(cls, "fixed_settings", ()))  # what the class sets itself (SGD's temperature)
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = list(inspect.signature(vars(klass)["__init__"]).parameters.values())[1:]
        for p in params:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in found and p.name not in fixed:
                found[p.name] = p
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    ordered = sorted(found.values(), key=lambda p: p.kind is p.KEYWORD_ONLY)  # stable: the MRO's order within each
    return inspect.Signature(ordered)


class TargetKernel(DrawRecording, MCMCKernel):
    """Base class of pyro-flat's kernels: the target, the initial point, the recorded draws.

    :param model: a Pyro model; exactly one of ``model`` and ``potential_fn`` is given.
    :param potential_fn: ``params -> scalar`` over real tensors; the initial point then comes from
        ``MCMC(..., initial_params=...)``. For vectorized chains it maps ``(C, ...)`` tensors to
        ``(C,)`` energies.
    :param init_strategy: Pyro init strategy for models. Default ``None``: the model's own start when it
        has one (an ``initial_params(num_chains=...)`` method, :mod:`~pyro_flat.targets.starts`: a
        :class:`~pyro_flat.nn.BayesianModule` starts each chain from PyTorch's initialisation of the
        network), else a draw from the prior (``init_to_sample``).
    :param record_draws: keep each chain's draws so that an error or a Ctrl-C can hand them back
        (costs one more reference per draw; set ``False`` for very large models).
    :param jit_compile: Pyro's option name. After setup, trace what each iteration computes into
        one graph and fuse it with ``torch.compile`` (inductor): for the stochastic-gradient kernels
        the whole iteration (:mod:`~pyro_flat.kernels.compiled_step`), for HMC the energy and
        gradient (:func:`~pyro_flat.targets.compile_target`). ``"fx"`` replays the traced graph
        without ``torch.compile`` (no compile time, the eager random stream). A model that cannot be
        traced, or whose control flow depends on values, runs eagerly after one warning that says why.
        On a GPU the stochastic-gradient kernels' graphs are also captured as CUDA graphs (one launch per
        iteration: ResNet-18's iteration on an H200 went from 16.0 ms eager to 9.8 ms).
    """

    def __init__(
        self,
        model: Optional[Callable] = None,
        *,
        potential_fn: Optional[Callable[[Params], torch.Tensor]] = None,
        init_strategy: Optional[Callable] = None,
        record_draws: bool = True,
        jit_compile: Union[bool, str] = False,
    ):
        if (model is None) == (potential_fn is None):
            raise ValueError(
                f"{type(self).__name__} needs exactly one of model= or potential_fn=, got "
                f"{'both' if model is not None else 'neither'}."
            )
        self.model = model
        self.potential_fn = potential_fn
        self.init_strategy = init_strategy
        self.record_draws = record_draws
        if jit_compile not in (False, True, "fx", "inductor"):
            raise ValueError(f"jit_compile must be True, False, 'fx' or 'inductor', got {jit_compile!r}.")
        self.jit_compile = jit_compile
        self._reset_jit()
        self.num_chains: Optional[int] = None  # vectorized chains (set by pyro_flat.MCMC)
        self.minibatches = "per_chain"  # how vectorized chains draw minibatches (set by pyro_flat.MCMC)
        self.random_streams = "shared"  # how vectorized chains draw random numbers (set by pyro_flat.MCMC)
        self.chain_streams: Optional[ChainStreams] = None  # the run's per-chain streams (random_streams="per_chain")
        self.data_parallel: Optional[DataParallelism] = None  # a data-parallel run's shards (set by pyro_flat.MCMC)
        self._pending_initial_params: Optional[Params] = None
        self._initial_params: Optional[Params] = None
        self.target = None
        self._num_setups = 0
        self._chain = 0
        self._forget_runs()
        self._reset_chain_state(0)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.__signature__ = constructor_signature(cls)  # help() and IDEs show every setting, not **kwargs

    #: The attributes that carry a run from one iteration to the next, beside ``params``: what
    #: :meth:`state_dict` saves. Each class lists its own; :meth:`state_dict` collects them over the MRO.
    run_state: Tuple[str, ...] = ("_iteration", "_warmup_steps", "_draws", "_stats", "_divergences", "_last_stats",
                                  "_last_draw", "_draw_device")

    def state_dict(self) -> Dict[str, object]:
        """The run's state after :meth:`setup` (every class's :attr:`run_state`, and the target's minibatch
        streams): with the same ``params`` and random streams, :meth:`load_state_dict` continues the run
        exactly. Holds tensors and plain objects that ``torch.save`` writes."""
        names = {n for klass in type(self).__mro__ for n in vars(klass).get("run_state", ())}
        state: Dict[str, object] = {name: getattr(self, name) for name in sorted(names) if hasattr(self, name)}
        state["minibatches"] = self.target.batches.state_dict()
        if self.chain_streams is not None:
            state["chain_streams"] = self.chain_streams.state_dict()
        # thousands of per-draw tensors pickle slowly one by one: stacked, they are one tensor each
        state["_draws"] = {n: torch.stack([d[n] for d in self._draws]) for n in self._draws[0]} if self._draws else {}
        state["_stats"] = {name: _stacked(values) for name, values in self._stats.items()}
        if isinstance(self.model, RunChoices):  # what the model measured (a BayesianModule's networks="measure")
            state["model_choices"] = self.model.run_choices()
        return state

    def load_state_dict(self, state: Dict[str, object]) -> None:
        """Put back what :meth:`state_dict` gave, after :meth:`setup` with the same configuration."""
        state = dict(state)
        self.target.batches.load_state_dict(state.pop("minibatches"))
        choices = state.pop("model_choices", None)
        if choices is not None:
            self.model.load_run_choices(choices)
        streams = state.pop("chain_streams", None)
        if streams is not None:
            self.chain_streams.load_state_dict(streams)
        draws = state.pop("_draws")
        self._draws = [dict(zip(draws, values)) for values in zip(*draws.values())] if draws else []
        self._stats.clear()
        self._stats.update({name: _unstacked(values) for name, values in state.pop("_stats").items()})
        for name, value in state.items():
            setattr(self, name, value)

    #: whether the kernel can make several iterations per kept draw (thinning inside the kernel)
    supports_thinning = False
    #: iterations per kept draw after warm-up (see :meth:`configure`)
    steps_per_draw = 1

    # ----------------------------------------------------------------- driver settings
    def configure(self, *, num_chains: Optional[int] = None, steps_per_draw: int = 1,
                  minibatches: str = "per_chain", data_parallel: Optional[DataParallelism] = None,
                  random_streams: str = "shared") -> None:
        """Settings a driver hands the kernel before a run; forgets every earlier run.

        :param num_chains: ``C`` chains advanced together as one batched tensor (a leading
            ``(C,)`` dim on every parameter), or ``None`` for one chain per :meth:`setup`
            (Pyro's own driver).
        :param steps_per_draw: iterations per kept draw after warm-up (thinning inside the
            kernel: the skipped states are never stored); ``> 1`` needs
            :attr:`supports_thinning`.
        :param minibatches: for vectorized chains of a subsampled model, ``"per_chain"`` (each
            chain its own minibatches: independent chains) or ``"shared"`` (one minibatch per step
            for all chains, which correlates them); see :class:`~pyro_flat.targets.ModelPotential`.
        :param data_parallel: ``None``, or how a data-parallel run assembles the target from this
            process's shard of the data (a :class:`~pyro_flat.kernels.protocol.DataParallelism`, such as
            :class:`~pyro_flat.distributed.DataParallelShards`): the potential is summed over the ranks.
        :param random_streams: for vectorized chains, ``"shared"`` (one random stream for all chains) or
            ``"per_chain"`` (a stream per chain, :class:`~pyro_flat.chains.streams.ChainStreams`, seeded at
            :meth:`setup` from the global stream; drawn from inside :meth:`drawing`).
        """
        if num_chains is not None:
            num_chains = check_positive_int("num_chains", num_chains)
        steps_per_draw = check_thinning(self, check_positive_int("steps_per_draw", steps_per_draw))
        self.num_chains = num_chains
        self.steps_per_draw = steps_per_draw
        self.minibatches = check_minibatches(minibatches)
        self.data_parallel = data_parallel
        self.random_streams = check_random_streams(random_streams)
        self._num_setups = 0
        self._forget_runs()
        self._reset_jit()

    # ----------------------------------------------------------------- MCMCKernel contract
    @property
    def initial_params(self) -> Optional[Params]:
        return self._initial_params

    @initial_params.setter
    def initial_params(self, params: Params) -> None:
        # Pyro's driver sets this before each chain's setup (when MCMC got initial_params); integers
        # become floats (a potential_fn's gradient flows through them)
        self._pending_initial_params = {k: check_real_tensor(f"initial_params[{k!r}]", v) for k, v in params.items()}

    @property
    def transforms(self) -> Dict[str, torch.distributions.Transform]:
        return {} if self.target is None else self.target.transforms

    def setup(self, warmup_steps: int, *args, **kwargs) -> None:
        warmup_steps = check_nonnegative_int("warmup_steps", warmup_steps)
        self._chain = self._num_setups
        self._num_setups += 1
        self._state_chains = self.num_chains  # how the recorded draws are laid out
        self._reset_chain_state(warmup_steps)
        self.chain_streams = None
        if self.random_streams == "per_chain" and self.num_chains is not None:
            # the run's seed from the global stream (the same on every rank); this process's chains' streams
            shard = shard_of(self.num_chains)
            start = 0 if shard is None else shard.start
            self.chain_streams = ChainStreams(int(torch.randint(0, 2**62, ())), range(start, start + self.num_chains))
        user_params, self._pending_initial_params = self._pending_initial_params, None
        self.target = self.wrap_target(self.build_target(args, kwargs, num_chains=self.num_chains,
                                                         initial_params=user_params))
        params = self.target.initial_params(user_params)
        energy, _ = self.target.potential_and_grad(params)
        bad = ~torch.isfinite(energy.reshape(-1))
        if bool(bad.any()):
            if self.data_parallel is not None:  # name the rank whose data shard failed, on every rank
                self.data_parallel.check_start(type(self).__name__, self.num_chains)
            where = "" if self.num_chains is None else f" of chain {int(bad.nonzero()[0, 0])}"
            raise ValueError(
                f"{type(self).__name__}: the potential energy at the initial point{where} is "
                f"{float(energy.reshape(-1)[bad][0])}; pass finite initial_params or a different "
                "init_strategy (e.g. init_to_median)."
            )
        if self.jit_compile and self.data_parallel is not None:
            self.warn_jit("runs eagerly: a data-parallel step all-reduces its gradient, which a traced graph "
                          "cannot do")
        elif self.jit_compile:  # after the eager checks above: the model's own errors surface eagerly
            self._compile_target(params)
        self._initial_params = params
        with self.drawing():
            self.after_setup(params)

    def drawing(self) -> ContextManager:
        """The context in which this run's chains draw their random numbers: its per-chain streams
        (``random_streams="per_chain"``), else the shared stream. The driver calls :meth:`sample` in it."""
        return drawing_from(self.chain_streams)

    def after_setup(self, params: Params) -> None:
        """Hook: per-chain state that needs the target and the initial point."""

    @property
    def iteration(self) -> int:
        """Iterations made since :meth:`setup` (warm-up included): what a progress bar counts."""
        return self._iteration

    def iterations_for(self, warmup_steps: int, num_draws: int) -> int:
        """The iterations a run of ``warmup_steps`` and ``num_draws`` kept draws makes (warm-up included):
        :attr:`steps_per_draw` per draw here; a kernel whose draws skip iterations says more."""
        return warmup_steps + num_draws * self.steps_per_draw

    @property
    def jit_backend(self) -> str:
        """``"fx"`` (replay the traced graph) or ``"inductor"`` (``torch.compile`` it; ``True``); ``"fx"`` too once
        inductor failed on this kernel's iteration (said in a warning): what compiles, and what ran."""
        failed = self._steps is not None and self._steps.backend == "fx"
        return "fx" if self.jit_compile == "fx" or failed else "inductor"

    @property
    def compile_seconds(self) -> float:
        """Seconds spent tracing and compiling for ``jit_compile`` (0 without it)."""
        return self._compile_seconds

    @property
    def is_compiled(self) -> bool:
        """Whether the last setup's iterations run through a compiled graph."""
        return self.target is not None and self.target.is_compiled

    def _compile_target(self, params: Params) -> None:
        """``jit_compile``: the target's energy and gradient as one graph (the trajectories of HMC)."""
        start = time.perf_counter()
        self.target, reason = compile_target(self.target, params, backend=self.jit_backend)
        self._compile_seconds += time.perf_counter() - start
        if reason is not None:
            self.warn_jit(f"runs eagerly: {reason}")

    def warn_jit(self, text: str) -> None:
        """A ``jit_compile`` warning, once per kernel (not once per chain)."""
        if not self._jit_warned:
            self._jit_warned = True
            warnings.warn(f"{type(self).__name__}(jit_compile={self.jit_compile!r}): {text}.", RuntimeWarning,
                          stacklevel=4)

    def _reset_jit(self) -> None:
        self._compile_seconds = 0.0  # time spent tracing (and compiling), earlier chains included
        self._steps = None  # a stochastic-gradient kernel's compiled iterations (CompiledSteps)
        self._jit_warned = False

    def logging(self) -> Dict[str, str]:
        return {}

    def diagnostics(self) -> dict:
        """The run's statistics (see :class:`~pyro_flat.kernels.recording.DrawRecording`); refuses a run that
        made no draw after warm-up, as ``pyro.infer.MCMC(kernel, num_samples=0)`` does.

        Pyro's driver checks no ``num_samples`` and hands it to no kernel, and offers no public way to
        read it: with 0 it runs the warm-up, then calls this and fails on an empty stack. The check
        rests on that order (``tests/test_bad_inputs.py`` fails if a Pyro release changes it).
        """
        if self.target is not None and self._iteration <= self._warmup_steps:
            raise ValueError("num_samples must be a positive integer, got num_samples=0 (no draw was made after "
                             f"the {self._warmup_steps} warm-up iterations). It is the number of draws kept per "
                             "chain: pass num_samples >= 1.")
        return super().diagnostics()

    # ----------------------------------------------------------------- subclass hooks
    def wrap_target(self, target: Target) -> Target:
        """The target the kernel samples, made from :meth:`build_target`'s (a subclass may wrap it)."""
        return target

    def build_target(self, args: tuple, kwargs: dict, *, num_chains: Optional[int] = None,
                     initial_params: Optional[Params] = None) -> Target:
        """The potential sampled, for ``num_chains`` vectorized chains (or one): the model's, or
        ``potential_fn``'s, which takes its sites and shapes from ``initial_params``. Builds without
        changing the kernel. Data-parallel: this shard's part, summed over the ranks."""
        return self.across_ranks(lambda shards: self._build_local_target(args, kwargs, num_chains, initial_params,
                                                                         shards))

    def across_ranks(self, build: Callable[[int], Target]) -> Target:
        """``build(1)``, or for a data-parallel run over ``R`` ranks the sum over the ranks of each
        shard's ``build(R)`` (its latent terms weighted ``1/R``; see
        :meth:`~pyro_flat.kernels.protocol.DataParallelism.assemble`)."""
        if self.data_parallel is None:
            return build(1)
        return self.data_parallel.assemble(build, type(self).__name__)

    def _build_local_target(self, args, kwargs, num_chains, initial_params, shards: int = 1) -> Target:
        if self.model is not None:
            return ModelPotential(self.model, args, kwargs, self.init_strategy, num_chains, self.minibatches,
                                  latent_weight=1.0 / shards)
        if initial_params is None:
            raise ValueError(
                f"{type(self).__name__}(potential_fn=...) needs a starting point: pass "
                "MCMC(kernel, ..., initial_params={name: tensor}) (one row per chain)."
            )
        return CallablePotential(self.potential_fn, initial_params, num_chains)

    def vectorization_error(self, num_chains: int, args: tuple, kwargs: dict,
                            initial_params: Optional[Params] = None, minibatches: str = "per_chain", *,
                            num_draws: int = 0) -> Optional[str]:
        """``None`` if the target evaluates ``num_chains`` chains at once correctly, each on its own
        minibatch with ``minibatches="per_chain"``, else why not (see
        :func:`~pyro_flat.kernels.vectorization.vectorization_error`). ``initial_params`` has a
        leading chain dimension. A ``ValueError`` naming ``num_chains`` when that many chains, each
        keeping ``num_draws`` draws, cannot fit in memory (checked before any batched work)."""
        previous, self.minibatches = self.minibatches, check_minibatches(minibatches)
        try:
            return probe_chains(self, num_chains, args, kwargs, initial_params, num_draws)
        finally:
            self.minibatches = previous

    # ----------------------------------------------------------------- helpers
    def _reset_chain_state(self, warmup_steps: int) -> None:
        self._warmup_steps = warmup_steps
        self._iteration = 0
        self._reset_records()


def _stacked(values: list):
    """A statistic's per-draw values as one tensor where they are tensors of one shape (else as they are)."""
    if values and all(torch.is_tensor(v) for v in values) and len({(v.shape, v.dtype) for v in values}) == 1:
        return torch.stack(values)
    return values


def _unstacked(values) -> list:
    return list(values.unbind(0)) if torch.is_tensor(values) else list(values)


def coupled_target(kernel: TargetKernel, args: tuple, kwargs: dict, *, num_chains: Optional[int],
                   initial_params: Optional[Params]) -> CoupledPotential:
    """The Entropy-MCMC joint of ``kernel``'s target (its ``eta``, ``sites`` and ``suffix``).

    For a ``potential_fn`` the initial values may name twins (``name + suffix``): the base
    potential takes only the others.
    """
    if kernel.model is None and initial_params is not None:
        suffix = kernel.suffix
        theta = {k: v for k, v in initial_params.items() if k[: -len(suffix)] not in initial_params}
        base = kernel.across_ranks(lambda shards: CallablePotential(kernel.potential_fn, theta, num_chains))
    else:
        base = TargetKernel.build_target(kernel, args, kwargs, num_chains=num_chains, initial_params=initial_params)
    return CoupledPotential(base, kernel.eta, kernel.sites, kernel.suffix, getattr(kernel, "aux_prior_sd", None))
