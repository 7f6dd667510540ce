r"""The stochastic-gradient loop shared by SGLD, SGD, EntropySGLD and their relatives.

:class:`StochasticGradientKernel` makes one (or a few) gradient evaluations of the minibatch
potential per iteration and applies the subclass's :meth:`~StochasticGradientKernel.update`
(SGLD: :math:`z \leftarrow z - \alpha\nabla\tilde U(z) + \sqrt{2\alpha T}\,\xi`). The loop
handles schedules (cyclical ones included), thinning inside the kernel, the preconditioner's
warm-up, the compiled iteration (``jit_compile``) and divergences (:func:`~pyro_flat.kernels.divergence.blow_up_of`, read one step late, reported by
:func:`~pyro_flat.kernels.divergence.divergence_error`).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, Optional, Union

import torch

from ..chains.streams import random_state, restore_random_state
from ..schedules import Schedule, as_schedule, factor_at
from ..targets import Params
from ..targets.precision import AutocastTarget, check_autocast
from ..validation import check_positive
from .base import TargetKernel
from .compiled_step import MAX_FUSED_STEPS, CompiledSteps
from .divergence import PendingRead, blow_up_of, divergence_error, fused_blow_up, inf_norm, step_norms
from .integrators import StepSize, Transition, langevin_step
from .preconditioning import DEFAULT_STEP_SIZE, Preconditioner


#: exploration iterations in a row after which a draw is given up on (a schedule that never samples)
MAX_EXPLORATION_RUN = 1_000_000


class StochasticGradientKernel(TargetKernel):
    """Base class: one gradient of the (minibatch) potential per iteration.

    Subclasses implement :meth:`update` ``(params, grads, step_size, temperature)``, the rule at
    this iteration's step size and temperature (0 in a cyclical schedule's exploration phase), and
    may override :meth:`transition` (it returns a :class:`Transition`; the statistics of the
    target's evaluation at the current state become per-draw statistics) and :meth:`build_target`
    (what is sampled).

    :param step_size: base step :math:`\\alpha > 0`.
    :param temperature: :math:`T > 0`; the target is :math:`\\propto \\exp(-U/T)`. A network wants ``1e-4``
        and ``step_size = lr / N``: at 1 its BMA is underconfident (:mod:`pyro_flat.nn.module`).
    :param schedule: ``None``, a positive float or a callable ``k -> factor`` (see
        :mod:`pyro_flat.schedules`); the step at iteration ``k`` is ``step_size * schedule(k)``.
    :param preconditioner: ``None``, ``"diagonal"``, ``"dense"`` or a fixed tensor: the metric
        :math:`M^{-1}` of :mod:`~pyro_flat.kernels.preconditioning`, estimated from the
        full-data curvature during warm-up and frozen for sampling. With one, ``step_size`` is in
        the metric's units (default :data:`~pyro_flat.kernels.preconditioning.DEFAULT_STEP_SIZE`);
        without one it is required.

    :param autocast: ``torch.bfloat16``: the potential's forward and backward under ``torch.autocast``, the state
        and the update in fp32 (:mod:`~pyro_flat.targets.precision`); ``None`` (default): fp32 throughout. With
        ``jit_compile`` the trace records autocast's casts, so the compiled and fused graphs run the same mixed
        precision.

    ``model``, ``potential_fn``, ``init_strategy``, ``record_draws`` and ``jit_compile`` are those
    of :class:`TargetKernel`. A step is a divergence when the energy or the state becomes NaN/inf,
    or when the state's largest absolute coordinate grows more than :attr:`max_growth` (1e4) times
    in one iteration (from at least 1): Stan calls an energy error of 1,000 a divergence, and a
    Langevin step has no energy error to measure, so a jump by four orders of magnitude is the rule
    here. A divergence raises :class:`~pyro_flat.DivergenceError` and keeps the draws made before
    it. ``diagnostics()`` gives Pyro's divergence list (always empty: a divergence stops the chain) and the per-draw ``sample_stats``: ``step_size`` (the step that
    produced the draw), ``potential_energy`` (the minibatch estimate of U at the draw) and the
    target's own statistics, and ``grad_evals``: the gradient evaluations of the potential each
    chain has used up to that draw, warm-up included (a preconditioner's Hessian-vector products
    count two each) (:attr:`num_grad_evals` is the running count),
    so that samplers with different costs per iteration compare per gradient evaluation.
    """

    allow_zero_temperature = False
    #: a step whose state's largest absolute coordinate grows more than this many times (from at least 1) is
    #: a divergence, like a NaN; ``None`` checks only for NaN/inf (:func:`~pyro_flat.kernels.divergence.blow_up_of`)
    max_growth: Optional[float] = 1e4

    def __init__(
        self,
        model: Optional[Callable] = None,
        *,
        potential_fn: Optional[Callable[[Params], torch.Tensor]] = None,
        step_size: Optional[float] = None,
        temperature: float = 1.0,
        schedule: Union[None, float, Schedule] = None,
        preconditioner: Union[None, str, torch.Tensor] = None,
        init_strategy: Optional[Callable] = None,
        record_draws: bool = True,
        jit_compile: Union[bool, str] = False,
        autocast: Union[None, str, torch.dtype] = None,
    ):
        super().__init__(model, potential_fn=potential_fn, init_strategy=init_strategy,
                         record_draws=record_draws, jit_compile=jit_compile)
        self.autocast = check_autocast(autocast)
        self.preconditioner = None if preconditioner is None else Preconditioner(preconditioner)
        if step_size is None and self.preconditioner is None:
            raise ValueError(f"{type(self).__name__} needs step_size= (try a value such that step_size "
                             "* (largest curvature) < 1), or preconditioner='dense'/'diagonal', whose "
                             f"step size defaults to {DEFAULT_STEP_SIZE}.")
        self.step_size = check_positive(
            "step_size", DEFAULT_STEP_SIZE if step_size is None else step_size,
            hint="Try a value such that step_size * (largest curvature) < 1, or 0.05-0.3 with a "
                 "preconditioner."
        )
        if self.allow_zero_temperature and temperature == 0:
            self.temperature = 0.0
        else:
            self.temperature = check_positive("temperature", temperature)
        self.schedule = as_schedule(schedule)

    #: gradient evaluations of the potential per iteration (per chain)
    grads_per_iteration = 1

    run_state = ("num_grad_evals", "carried")

    def state_dict(self) -> Dict[str, object]:
        """:meth:`TargetKernel.state_dict <pyro_flat.kernels.base.TargetKernel.state_dict>` plus the
        preconditioner's metric and which compiled graphs the run had built and the last iteration would
        reuse (a resumed run builds them where it would have reused them)."""
        state = super().state_dict()
        if self.preconditioner is not None:
            state["preconditioner"] = self.preconditioner.state_dict()
        if self._steps is not None:
            state["compiled"] = self._steps.state_dict()
        return state

    def load_state_dict(self, state: Dict[str, object]) -> None:
        state = dict(state)
        preconditioner, compiled = state.pop("preconditioner", None), state.pop("compiled", None)
        if preconditioner is not None:
            self.preconditioner.load_state_dict(preconditioner)
        if compiled is not None and self._steps is not None:
            self._steps.load_state_dict(compiled)
        super().load_state_dict(state)

    #: The chain's state beyond ``params`` that :meth:`update` reads and replaces, ``{name: tensor}``
    #: (:class:`~pyro_flat.SGHMC`'s momenta; empty for the Langevin kernels). A compiled graph takes it
    #: as inputs and returns its new value (:mod:`~pyro_flat.kernels.compiled_step`); a new chain
    #: (``setup``) starts it again.
    carried: Params

    @contextmanager
    def carrying(self, state: Params) -> Iterator[None]:
        """Run with :attr:`carried` set to ``state``; the kernel's own value is back afterwards (a graph's
        trace, or its check against the eager iteration, leaves the chain's state as it was)."""
        saved, self.carried = self.carried, state
        try:
            yield
        finally:
            self.carried = saved

    supports_thinning = True

    @property
    def step_size_input(self) -> bool:
        """Whether :meth:`transition` takes ``step_size`` as a 0-d tensor, so that one compiled graph (``jit_compile``)
        serves every step of a schedule (the rules here do: :func:`~pyro_flat.kernels.integrators.scaled_add`).
        A subclass whose update needs a Python number returns ``False`` (a graph per step size, once it repeats);
        one that fails to trace with a tensor step falls back to that after a warning."""
        return True

    def _compile_target(self, params: Params) -> None:
        """``jit_compile``: the whole iteration as one graph per temperature and metric (the step size an input),
        built once its key repeats (see :mod:`~pyro_flat.kernels.compiled_step`)."""
        if self._steps is not None:  # an earlier chain's graphs: keep what they cost
            self._compile_seconds += self._steps.compile_seconds
        self._steps = CompiledSteps(self, self.jit_backend)

    @property
    def compile_seconds(self) -> float:
        return self._compile_seconds + (0.0 if self._steps is None else self._steps.compile_seconds)

    @property
    def is_compiled(self) -> bool:
        """Whether the last iteration ran through a compiled graph."""
        return self._steps is not None and self._steps.last_compiled

    def _transition(self, params: Params, step_size: float, temperature: float) -> Transition:
        steps = self._steps
        adapting = (self.preconditioner is not None and self.preconditioner.adaptive
                    and self._iteration < self._warmup_steps)  # the metric changes: stay eager
        out = None if steps is None or adapting else steps(params, step_size, temperature)
        return self.transition(params, step_size, temperature) if out is None else out

    def wrap_target(self, target):
        return target if self.autocast is None else AutocastTarget(target, self.autocast)

    def after_setup(self, params: Params) -> None:
        if self.preconditioner is not None:  # a Hessian-vector product costs about two gradients
            self.num_grad_evals += 2 * self.preconditioner.setup(
                self.target, params, num_chains=self.num_chains, warmup_steps=self._warmup_steps)

    def langevin(self, params: Params, grads: Params, step_size: StepSize, temperature: float) -> Params:
        """The shared Langevin step, preconditioned when the kernel has a preconditioner."""
        if self.preconditioner is None:
            return langevin_step(params, grads, step_size, temperature)
        return self.preconditioner.step(params, grads, step_size, temperature)

    def sample(self, params: Params) -> Params:
        """One warm-up iteration, or after warm-up :attr:`steps_per_draw` sampling-phase iterations
        of which the last is the draw (thinning inside the kernel: the others are never stored).

        With a cyclical schedule (one with ``is_sampling(k)``, e.g. :class:`~pyro_flat.schedules.cyclical_cosine`)
        each cycle's exploration iterations make no draw and inject no noise (unless its ``exploration_noise``):
        after warm-up one call runs through them to the next sampling-phase iterations (cSGMCMC, Zhang et al. 2020).

        Compiled (``jit_compile``), a draw's iterations in one sampling phase run as fused graphs of :attr:`fused_steps`
        iterations, each at its own step (:meth:`~pyro_flat.kernels.compiled_step.CompiledSteps.fused`): one call
        and one host sync per graph instead of per iteration, the same draws up to round-off.
        """
        sampling = self._iteration >= self._warmup_steps
        if sampling and self._steps is not None:
            fused = self._fused_draw(params)
            if fused is not None:
                return fused
        return self._iterate(params, sampling)

    #: iterations per fused graph call (``jit_compile`` after warm-up); ``None``: the largest divisor of
    #: the iterations per draw up to :data:`MAX_FUSED_STEPS`; 1 turns fusing off
    fused_steps: Optional[int] = None

    def _fused_length(self) -> int:
        if self.fused_steps is not None:
            return self.fused_steps if self.steps_per_draw % self.fused_steps == 0 else 1
        return max(k for k in range(1, min(self.steps_per_draw, MAX_FUSED_STEPS) + 1) if self.steps_per_draw % k == 0)

    def _fused_draw(self, params: Params) -> Optional[Params]:
        """A draw's :attr:`steps_per_draw` iterations as fused graph calls, or ``None`` (then they run one
        by one) where a graph cannot do them: a phase that changes within the draw (or a step size that
        does, where the graph bakes the step in)."""
        first, total, length = self._iteration, self.steps_per_draw, self._fused_length()
        if length < 2 or not all(self.in_sampling_phase(k) for k in range(first, first + total)):
            return None
        step_sizes = [self.step_size * self._schedule_factor(k) for k in range(first, first + total)]
        for call in range(total // length):
            saved_random, carried = random_state(params, self.chain_streams), self.carried
            out = self._steps.fused(params, step_sizes[call * length: (call + 1) * length], self.temperature)
            if out is None:  # no graph (it failed to trace or compile): the rest one by one
                if call == 0:
                    return None
                params = self._iterate(params, True, steps=total - call * length, record=False)
                break
            new_params, energy, stats, last_stats, norms, batches = out
            before = self._state_norm if params is self._normed_state else inf_norm(params)
            problem, norm = fused_blow_up(norms, before, self.max_growth)
            if problem is not None:
                # replay one by one on the same numbers and minibatches: the error names the iteration
                # and the chain (if round-off keeps the replay finite, its states stand)
                restore_random_state(saved_random)
                self.carried = carried
                with self.target.batches.scripted(batches):
                    params = self._iterate(params, True, steps=length, record=call == 0, eager=True)
                continue
            self._state_norm, self._normed_state = norm, new_params
            self.num_grad_evals += self.grads_per_iteration * length
            if call == 0 and first > self._warmup_steps:  # the previous draw's statistics (see _iterate)
                self._record_state({"potential_energy": energy, **stats})
            self._iteration += length
            self._last_stats = {"step_size": step_sizes[(call + 1) * length - 1], **last_stats}
            params = new_params
        self._stats["step_size"].append(self._last_stats["step_size"])  # the draw's own step, as one by one
        self._stats["grad_evals"].append(self.num_grad_evals)
        self._record_draw(params)
        return params

    def _iterate(self, params: Params, sampling: bool, *, steps: Optional[int] = None, record: bool = True,
                 eager: bool = False) -> Params:
        """The iterations of :meth:`sample` one at a time (``steps`` of them, default a draw's)."""
        needed, j, noisy_exploration = (steps or self.steps_per_draw) if sampling else 1, 0, self.exploration_noise
        unchecked = None  # the last step, its divergence check not yet read (see _check_step)
        while needed:
            k = self._iteration
            if self.preconditioner is not None and not sampling:  # warm-up: one step a call, nothing unchecked
                self.num_grad_evals += 2 * self.preconditioner.adapt(k, params)
            explore = not self.in_sampling_phase(k)
            temperature = 0.0 if explore and not noisy_exploration else self.temperature
            step_size = self.step_size * self._schedule_factor(k)
            try:
                step = self.transition if eager else self._transition
                new_params, energy, grads, target_stats = step(params, step_size, temperature)
            except Exception:
                self._check_step(unchecked)  # a step from a diverged state may fail: the divergence is the cause
                raise
            self.num_grad_evals += self.grads_per_iteration
            self._check_step(unchecked)
            unchecked = (k, params, grads, new_params, energy, step_size, PendingRead(step_norms(energy, new_params)))
            self._iteration += 1
            state_stats = {"potential_energy": energy, **target_stats}
            if record and j == 0 and k > self._warmup_steps:
                # `params` is the draw returned by the previous call: its statistics are known
                # now, at no extra cost (they come with this step's potential evaluation).
                self._record_state(state_stats)
            self._last_stats = {"step_size": step_size, **state_stats}
            params = new_params
            j += 1
            if not (sampling and explore):  # exploration iterations make no draw
                needed -= 1
            elif j >= MAX_EXPLORATION_RUN:
                raise ValueError(f"{type(self).__name__}: the schedule's is_sampling(k) was False for {j:,} iterations in "
                                 f"a row (up to k = {k}): a run that never reaches a sampling phase makes no draw. "
                                 "Give the schedule sampling iterations (e.g. cyclical_cosine with exploration < 1 - "
                                 "1/cycle length).")
        self._check_step(unchecked)  # before the draw: a diverged state is never kept
        if sampling and steps is None:
            self._stats["step_size"].append(self._last_stats["step_size"])  # one for all chains
            self._stats["grad_evals"].append(self.num_grad_evals)
            self._record_draw(params)
        return params

    def _schedule_factor(self, k: int) -> float:
        """``schedule(k)``, a positive finite number (:func:`~pyro_flat.schedules.factor_at`), its step checked."""
        value = factor_at(self.schedule, k, type(self).__name__)
        self.check_step_size(k, self.step_size * value)
        return value

    def check_step_size(self, iteration: int, step_size: float) -> None:
        """Hook: raise a ``ValueError`` that names ``iteration`` if the update cannot take ``step_size`` there
        (called before each iteration runs, eagerly or in a graph; SGHMC checks its preconditioned
        stability limit)."""

    #: the most iterations :meth:`iterations_for` looks through for a schedule's sampling phases
    MAX_COUNTED_ITERATIONS = 10**7

    def iterations_for(self, warmup_steps: int, num_draws: int) -> int:
        """With a cyclical schedule, the exploration iterations between the draws too: after warm-up the
        run goes on until ``num_draws * steps_per_draw`` sampling-phase iterations are made (a schedule
        that samples too rarely to count within :attr:`MAX_COUNTED_ITERATIONS`: the sampling ones only)."""
        needed = num_draws * self.steps_per_draw
        if getattr(self.schedule, "is_sampling", None) is None:
            return warmup_steps + needed
        k, last = warmup_steps, warmup_steps + self.MAX_COUNTED_ITERATIONS
        while needed and k < last:
            needed -= self.in_sampling_phase(k)
            k += 1
        return k if not needed else warmup_steps + num_draws * self.steps_per_draw

    @property
    def exploration_noise(self) -> bool:
        """The schedule's ``exploration_noise``: exploration iterations keep the noise (else temperature 0)."""
        return bool(getattr(self.schedule, "exploration_noise", False))

    def in_sampling_phase(self, iteration: int) -> bool:
        """Whether ``iteration`` may make a draw: always, unless the schedule's ``is_sampling`` says no."""
        is_sampling = getattr(self.schedule, "is_sampling", None)
        return True if is_sampling is None else bool(is_sampling(iteration))

    def transition(self, params: Params, step_size: StepSize, temperature: float) -> Transition:
        """One iteration at this step's size and temperature (0 in a cyclical schedule's
        exploration phase): the new state, and the energy, gradient and target statistics at ``params``."""
        energy, grads, stats = self.target.evaluate(params)
        return Transition(self.update(params, grads, step_size, temperature), energy, grads, stats)

    def logging(self) -> Dict[str, str]:
        return {"step size": f"{self._last_stats.get('step_size', self.step_size):.2e}"}

    def _complete_stats(self) -> None:
        if self._last_draw is not None and len(self._stats["potential_energy"]) < len(
            self._stats["step_size"]
        ):
            energy, _, stats = self.target.evaluate(self._last_draw)
            self._record_state({"potential_energy": energy, **stats})

    def _reset_chain_state(self, warmup_steps: int) -> None:
        super()._reset_chain_state(warmup_steps)
        self.carried = {}  # a subclass fills it in after_setup
        self.num_grad_evals = 0  # per chain, warm-up included
        self._state_norm, self._normed_state = math.nan, None  # the last step's ‖θ‖∞ and its state

    def _record_state(self, state_stats: dict) -> None:
        for name, value in state_stats.items():
            self._stats[name].append(value)

    def update(self, params: Params, grads: Params, step_size: StepSize, temperature: float) -> Params:
        raise NotImplementedError

    def _check_step(self, step: Optional[tuple]) -> None:
        r"""The divergence check (:func:`~pyro_flat.kernels.divergence.blow_up_of`) of ``step``, ``(k, params, grads,
        new_params, energy, step_size, norms)`` (``None``: nothing to check), read one step late: on a GPU the host
        then queues step :math:`k+1` before it waits for step :math:`k`; a draw's last step is read before the draw is
        kept. The error names iteration ``k`` and keeps the draws made before it."""
        if step is None:
            return
        k, params, grads, new_params, energy, step_size, norms = step
        # the state's norm: the previous step's result, computed only for a state it did not make
        before = self._state_norm if params is self._normed_state else inf_norm(params)
        problem, self._state_norm = blow_up_of(norms, before, self.max_growth)
        self._normed_state = new_params
        if problem is not None:
            raise divergence_error(
                type(self).__name__, problem, params=params, grads=grads, new_params=new_params, energy=energy,
                step_size=step_size, base_step_size=self.step_size, iteration=k, warming_up=k < self._warmup_steps,
                chain=self._chain, num_chains=self.num_chains, max_growth=self.max_growth, num_draws=len(self._draws),
                draws=self._stack_draws(self._draws) if self._draws else [], completed_chains=self._completed_draws)


__all__ = ["StochasticGradientKernel", "Transition", "MAX_EXPLORATION_RUN"]
