"""The shared skeleton of pyro-flat's kernels (Pyro ``MCMCKernel`` shape).

:class:`TargetKernel` is what every kernel shares: per chain, ``setup`` builds the target (the
model's potential, with fresh minibatches each call, or a ``potential_fn``) and draws the initial
point; ``sample`` (the subclass) makes one transition and records the per-draw statistics that
:func:`pyro_flat.to_arviz` turns into ``sample_stats``; ``diagnostics`` hands them to Pyro's
driver, which keeps them per chain (also across its worker processes). With ``num_chains`` set
(by :class:`pyro_flat.MCMC`) one kernel advances that many chains at once: every tensor carries a
leading chain dimension.

:class:`StochasticGradientKernel` adds the one-gradient-per-step update of SGLD and its relatives.
"""

from __future__ import annotations

import math
import time
import warnings
from collections import defaultdict
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from pyro.infer.autoguide.initialization import init_to_sample
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel

from ..schedules import Schedule, as_schedule
from ..validation import check_nonnegative_int, check_positive, check_positive_int
from .compiled_step import CompiledSteps
from .errors import DivergenceError
from .integrators import langevin_step
from .preconditioning import DEFAULT_STEP_SIZE, Preconditioner
from ..targets import CallablePotential, CompiledTarget, CoupledPotential, ModelPotential, Params, compile_target
from ..targets.potential import InitialShapeError


class TargetKernel(MCMCKernel):
    """Base class of pyro-flat's kernels: the target, the initial point, the recorded draws.

    :param model: a Pyro model; exactly one of ``model`` and ``potential_fn`` is given.
    :param potential_fn: ``params -> scalar`` over real tensors; the initial point then comes from
        ``MCMC(..., initial_params=...)``. For vectorized chains it maps ``(C, ...)`` tensors to
        ``(C,)`` energies.
    :param init_strategy: Pyro init strategy for models (default: a draw from the prior).
    :param record_draws: keep each chain's draws so that an error or a Ctrl-C can hand them back
        (costs one more reference per draw; set ``False`` for very large models).
    :param jit_compile: Pyro's option name. After setup, trace what each iteration computes into
        one graph and fuse it with ``torch.compile`` (inductor): for the stochastic-gradient kernels
        the whole iteration (:mod:`~pyro_flat.kernels.compiled_step`), for HMC the energy and
        gradient (:func:`~pyro_flat.targets.compile_target`). ``"fx"`` replays the traced graph
        without ``torch.compile`` (no compile time, the eager random stream). A model that cannot be
        traced, or whose control flow depends on values, runs eagerly after one warning that says why.
    """

    def __init__(
        self,
        model: Optional[Callable] = None,
        *,
        potential_fn: Optional[Callable[[Params], torch.Tensor]] = None,
        init_strategy: Callable = init_to_sample,
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
        self._pending_initial_params: Optional[Params] = None
        self._initial_params: Optional[Params] = None
        self.target = None
        self._num_setups = 0
        self._chain = 0
        self._completed_draws: List[Dict[str, torch.Tensor]] = []
        self._reset_chain_state(0)

    #: whether the kernel can make several iterations per kept draw (thinning inside the kernel)
    supports_thinning = False
    #: iterations per kept draw after warm-up (see :meth:`configure`)
    steps_per_draw = 1

    # ----------------------------------------------------------------- driver settings
    def configure(self, *, num_chains: Optional[int] = None, steps_per_draw: int = 1) -> None:
        """Settings a driver hands the kernel before a run; forgets every earlier run.

        :param num_chains: ``C`` chains advanced together as one batched tensor (a leading
            ``(C,)`` dim on every parameter), or ``None`` for one chain per :meth:`setup`
            (Pyro's own driver).
        :param steps_per_draw: iterations per kept draw after warm-up (thinning inside the
            kernel: the skipped states are never stored); ``> 1`` needs
            :attr:`supports_thinning`.
        """
        if num_chains is not None:
            num_chains = check_positive_int("num_chains", num_chains)
        steps_per_draw = check_positive_int("steps_per_draw", steps_per_draw)
        if steps_per_draw > 1 and not self.supports_thinning:
            raise ValueError(
                f"thinning={steps_per_draw} needs a pyro-flat stochastic-gradient kernel (SGLD, "
                f"EntropySGLD, ...); {type(self).__name__} makes one iteration per draw. Use "
                "thinning=1 and slice the draws afterwards: "
                "mcmc.get_samples(group_by_chain=True)[name][:, ::k].")
        self.num_chains = num_chains
        self.steps_per_draw = steps_per_draw
        self._num_setups = 0
        self._completed_draws = []
        self._reset_jit()

    # ----------------------------------------------------------------- MCMCKernel contract
    @property
    def initial_params(self) -> Optional[Params]:
        return self._initial_params

    @initial_params.setter
    def initial_params(self, params: Params) -> None:
        # Pyro's driver sets this before each chain's setup (when MCMC got initial_params).
        self._pending_initial_params = {k: torch.as_tensor(v) for k, v in params.items()}

    @property
    def transforms(self) -> Dict[str, torch.distributions.Transform]:
        return {} if self.target is None else self.target.transforms

    def setup(self, warmup_steps: int, *args, **kwargs) -> None:
        warmup_steps = check_nonnegative_int("warmup_steps", warmup_steps)
        _check_driver_num_samples()
        self._chain = self._num_setups
        self._num_setups += 1
        self._state_chains = self.num_chains  # how the recorded draws are laid out
        self._reset_chain_state(warmup_steps)
        self.target = self.build_target(args, kwargs)
        user_params, self._pending_initial_params = self._pending_initial_params, None
        params = self.target.initial_params(user_params)
        energy, _ = self.target.potential_and_grad(params)
        bad = ~torch.isfinite(energy.reshape(-1))
        if bool(bad.any()):
            where = "" if self.num_chains is None else f" of chain {int(bad.nonzero()[0, 0])}"
            raise ValueError(
                f"{type(self).__name__}: the potential energy at the initial point{where} is "
                f"{float(energy.reshape(-1)[bad][0])}; pass finite initial_params or a different "
                "init_strategy (e.g. init_to_median)."
            )
        if self.jit_compile:  # after the eager checks above: the model's own errors surface eagerly
            self._compile_target(params)
        self._initial_params = params
        self.after_setup(params)

    def after_setup(self, params: Params) -> None:
        """Hook: per-chain state that needs the target and the initial point."""

    @property
    def jit_backend(self) -> str:
        """``"fx"`` (replay the traced graph) or ``"inductor"`` (``torch.compile`` it; ``True``)."""
        return "fx" if self.jit_compile == "fx" else "inductor"

    @property
    def compile_seconds(self) -> float:
        """Seconds spent tracing and compiling for ``jit_compile`` (0 without it)."""
        return self._compile_seconds

    @property
    def is_compiled(self) -> bool:
        """Whether the last setup's iterations run through a compiled graph."""
        return isinstance(getattr(self.target, "base", self.target), CompiledTarget)

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
        """Pyro's per-chain divergence list and the per-draw ``sample_stats``.

        For vectorized chains the lists are per chain and every statistic is ``(draw, chain)``;
        :class:`pyro_flat.MCMC` splits them into Pyro's one-dict-per-chain layout.
        """
        self._complete_stats()
        stats = {name: self._stack_stat(values) for name, values in self._stats.items()}
        divergences = self._divergences
        if self.num_chains is None:
            divergences = divergences[0]
        return {"divergences": divergences, "sample_stats": stats}

    def cleanup(self) -> None:
        # Pyro calls cleanup twice per chain: keep it idempotent.
        if self._draws:
            self._completed_draws.extend(self._stack_draws(self._draws))
            self._draws = []

    # ----------------------------------------------------------------- subclass hooks
    def build_target(self, args: tuple, kwargs: dict):
        """The potential sampled: the model's, or ``potential_fn``."""
        if self.model is not None:
            return ModelPotential(self.model, args, kwargs, self.init_strategy, self.num_chains)
        if self._pending_initial_params is None:
            raise ValueError(
                f"{type(self).__name__}(potential_fn=...) needs a starting point: pass "
                "MCMC(kernel, ..., initial_params={name: tensor}) (one row per chain)."
            )
        return CallablePotential(self.potential_fn, self._pending_initial_params, self.num_chains)

    def vectorization_error(self, num_chains: int, args: tuple, kwargs: dict,
                            initial_params: Optional[Params] = None) -> Optional[str]:
        """``None`` if the target evaluates ``num_chains`` chains at once correctly, else why not.

        The batched energies of the first chains (on one fixed minibatch) must equal the energies
        of the same points evaluated one by one. The points are the initial ones, each moved by
        its own random offset, so that chains differ and every twin differs from its site even
        where the run starts with equal chains and :math:`\theta_a = \theta` (a term that mixes
        chains, or the coupling, is zero there and would go unseen).
        """
        first = None if initial_params is None else {k: v[0] for k, v in initial_params.items()}
        try:
            # one chain's target first, outside the inner `try`: its errors (bad data, a discrete
            # latent, a subsampled plate for HMC, ...) are the user's to see, not a reason to fall back
            self.num_chains, self._pending_initial_params = None, first
            single = self.build_target(args, kwargs)
            try:
                single.initial_params(first)  # a wrong initial value is the user's error too
            except InitialShapeError as err:  # say it in the shapes the user passed: chains first
                raise InitialShapeError(err.name, (num_chains, *err.given), (num_chains, *err.expected)) from None
            single = getattr(single, "base", single)
            try:
                return self._compare_batched(single, num_chains, args, kwargs, initial_params)
            except Exception as err:  # any failure of the batched run means: not broadcastable
                return f"{type(err).__name__}: {err}".split("\n")[0]
        finally:
            self.num_chains, self._pending_initial_params = None, None

    def _compare_batched(self, single, num_chains, args, kwargs, initial_params) -> Optional[str]:
        self.num_chains, self._pending_initial_params = num_chains, initial_params
        batched = self.build_target(args, kwargs)
        params = batched.initial_params(
            {k: v for k, v in (initial_params or {}).items() if k in batched.sites}
        )
        batched = getattr(batched, "base", batched)
        start = {k: v for k, v in params.items() if k in batched.sites}
        generator = torch.Generator().manual_seed(0)  # leaves the global random stream alone
        moved = {k: v + 0.1 * (1 + v.abs()) * torch.randn(v.shape, generator=generator).to(v)
                 for k, v in start.items()}
        fixed = batched.fixed_batch()
        with torch.no_grad():
            for c in range(min(num_chains, 2)):
                # the moved point, unless it leaves the potential's domain (then the start)
                alone = float(single({k: v[c] for k, v in moved.items()}, fixed))
                points = moved if math.isfinite(alone) else start
                if points is start:
                    alone = float(single({k: v[c] for k, v in start.items()}, fixed))
                energies = batched(points, fixed)
                if energies.shape != (num_chains,):
                    return f"the potential returned shape {tuple(energies.shape)}, not ({num_chains},)"
                together = float(energies[c])
                if not math.isclose(together, alone, rel_tol=1e-4, abs_tol=1e-4):
                    return (f"chain {c}'s energy is {together:.6g} evaluated with the others but "
                            f"{alone:.6g} alone")
        return None

    # ----------------------------------------------------------------- helpers
    def _reset_chain_state(self, warmup_steps: int) -> None:
        self._warmup_steps = warmup_steps
        self._iteration = 0
        self._draws: List[Params] = []
        self._stats: Dict[str, list] = defaultdict(list)
        self._divergences: List[List[int]] = [[] for _ in range(self.num_chains or 1)]
        self._last_stats: dict = {}
        self._last_draw: Optional[Params] = None

    def _complete_stats(self) -> None:
        """Hook: statistics still owed for the last draw."""

    def _stack_stat(self, values: Sequence) -> torch.Tensor:
        dtype = torch.get_default_dtype()
        if self.num_chains is None:
            return torch.as_tensor([float(v) for v in values], dtype=dtype)
        # per-chain tensors (C,), or one number for all chains
        return torch.stack([torch.as_tensor(v).detach().to("cpu", dtype).expand(self.num_chains)
                            for v in values])

    def _record_draw(self, params: Params) -> None:
        self._last_draw = params
        if self.record_draws:
            self._draws.append(params)

    @property
    def partial_samples(self) -> List[Dict[str, torch.Tensor]]:
        """Post-warm-up draws of each chain run so far (finished chains, then the current ones)."""
        chains = list(self._completed_draws)
        if self._draws:
            chains.extend(self._stack_draws(self._draws))
        return chains

    def _stack_draws(self, draws: List[Params]) -> List[Dict[str, torch.Tensor]]:
        """``draws`` as one ``{site: (draw, ...)}`` dict per chain, in the constrained space."""
        transforms = self.transforms
        out = {}
        for name in draws[0]:
            z = torch.stack([d[name] for d in draws])
            out[name] = transforms[name].inv(z) if name in transforms else z
        chains = getattr(self, "_state_chains", None)
        if chains is None:
            return [out]
        return [{k: v[:, c] for k, v in out.items()} for c in range(chains)]


def inf_norm(params: Params) -> float:
    """The largest absolute coordinate of a state (NaN if it holds one), with one host sync."""
    return float(torch.stack(torch._foreach_norm(list(params.values()), math.inf)).amax())


def step_blow_up(energy: torch.Tensor, new_params: Params, norm_before: float,
                 max_growth: Optional[float]) -> Tuple[Optional[str], float]:
    """``(why the step is a divergence or None, the new state's largest |coordinate|)``; one host sync.

    A divergence is either a NaN/inf energy or state, or a finite blow-up: the largest absolute
    coordinate of the state growing more than ``max_growth`` times in one iteration,
    :math:`\\|\\theta_{k+1}\\|_\\infty > g \\max(1, \\|\\theta_k\\|_\\infty)`
    (``None`` turns that part off); ``norm_before`` is :math:`\\|\\theta_k\\|_\\infty`, the previous
    step's second value. The largest absolute value of each tensor (an inf-norm, which keeps NaN)
    is finite exactly when the tensor is: unlike a sum, it cannot overflow while every entry is finite.
    """
    norms = torch.stack(torch._foreach_norm([energy.reshape(-1), *new_params.values()], math.inf))
    energy_norm, norm_after = torch.stack([norms[0], norms[1:].amax()]).tolist()
    if not (math.isfinite(energy_norm) and math.isfinite(norm_after)):
        return "non-finite", norm_after
    if max_growth is not None and norm_after > max_growth * max(1.0, norm_before):
        return "growth", norm_after
    return None, norm_after


class StochasticGradientKernel(TargetKernel):
    """Base class: one gradient of the (minibatch) potential per iteration.

    Subclasses implement :meth:`update` ``(params, grads, step_size, temperature)``, the rule at
    this iteration's step size and temperature (0 in a cyclical schedule's exploration phase), and
    may override :meth:`build_target` (what is sampled; a target's ``last_stats`` become per-draw
    statistics).

    :param step_size: base step :math:`\\alpha > 0`.
    :param temperature: :math:`T > 0`; the target is :math:`\\propto \\exp(-U/T)`.
    :param schedule: ``None``, a positive float or a callable ``k -> factor`` (see
        :mod:`pyro_flat.schedules`); the step at iteration ``k`` is ``step_size * schedule(k)``.
    :param preconditioner: ``None``, ``"diagonal"``, ``"dense"`` or a fixed tensor: the metric
        :math:`M^{-1}` of :mod:`~pyro_flat.kernels.preconditioning`, estimated from the
        full-data curvature during warm-up and frozen for sampling. With one, ``step_size`` is in
        the metric's units (default :data:`~pyro_flat.kernels.preconditioning.DEFAULT_STEP_SIZE`);
        without one it is required.

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
    #: a step whose state's largest absolute coordinate grows more than this many times (from at
    #: least 1) is a divergence, like a NaN; ``None`` checks only for NaN/inf (see :func:`step_blow_up`)
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
        init_strategy: Callable = init_to_sample,
        record_draws: bool = True,
        jit_compile: Union[bool, str] = False,
    ):
        super().__init__(model, potential_fn=potential_fn, init_strategy=init_strategy,
                         record_draws=record_draws, jit_compile=jit_compile)
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

    supports_thinning = True

    def _compile_target(self, params: Params) -> None:
        """``jit_compile``: the whole iteration as one graph, built once a step size repeats."""
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

    def _transition(self, params: Params, step_size: float, temperature: float):
        steps = self._steps
        adapting = (self.preconditioner is not None and self.preconditioner.adaptive
                    and self._iteration < self._warmup_steps)  # the metric changes: stay eager
        out = None if steps is None or adapting else steps(params, step_size, temperature)
        return self.transition(params, step_size, temperature) if out is None else out

    def after_setup(self, params: Params) -> None:
        if self.preconditioner is not None:  # a Hessian-vector product costs about two gradients
            self.num_grad_evals += 2 * self.preconditioner.setup(
                self.target, params, num_chains=self.num_chains, warmup_steps=self._warmup_steps)

    def langevin(self, params: Params, grads: Params, step_size: float, temperature: float) -> Params:
        """The shared Langevin step, preconditioned when the kernel has a preconditioner."""
        if self.preconditioner is None:
            return langevin_step(params, grads, step_size, temperature)
        return self.preconditioner.step(params, grads, step_size, temperature)

    def sample(self, params: Params) -> Params:
        """One warm-up iteration, or after warm-up :attr:`steps_per_draw` sampling-phase iterations
        of which the last is the draw (thinning inside the kernel: the others are never stored).

        With a cyclical schedule (one with ``is_sampling(k)``, e.g.
        :class:`~pyro_flat.schedules.cyclical_cosine`) the iterations of each cycle's exploration
        phase are optimisation steps (no injected noise) and make no draw: after warm-up one call
        runs through them to the next sampling-phase iterations (cSGMCMC, Zhang et al. 2020).
        """
        sampling = self._iteration >= self._warmup_steps
        needed, j = (self.steps_per_draw if sampling else 1), 0
        while needed:
            k = self._iteration
            if self.preconditioner is not None and not sampling:
                self.num_grad_evals += 2 * self.preconditioner.adapt(k, params)
            explore = not self.in_sampling_phase(k)
            temperature = 0.0 if explore else self.temperature  # exploration: optimisation steps
            step_size = self.step_size * self._schedule_factor(k)
            new_params, energy, grads = self._transition(params, step_size, temperature)
            self.num_grad_evals += self.grads_per_iteration
            # the state's norm: the previous step's result, computed only for a state it did not make
            before = self._state_norm if params is self._normed_state else inf_norm(params)
            problem, self._state_norm = step_blow_up(energy, new_params, before, self.max_growth)
            self._normed_state = new_params
            if problem is not None:
                self._raise_divergence(params, grads, new_params, energy, step_size, problem)
            self._iteration += 1
            state_stats = {"potential_energy": energy, **self.target.last_stats}
            if j == 0 and k > self._warmup_steps:
                # `params` is the draw returned by the previous call: its statistics are known
                # now, at no extra cost (they come with this step's potential evaluation).
                self._record_state(state_stats)
            self._last_stats = {"step_size": step_size, **state_stats}
            params = new_params
            j += 1
            if not (sampling and explore):  # exploration iterations make no draw
                needed -= 1
        if sampling:
            self._stats["step_size"].append(self._last_stats["step_size"])  # one for all chains
            self._stats["grad_evals"].append(self.num_grad_evals)
            self._record_draw(params)
        return params

    def _schedule_factor(self, k: int) -> float:
        """``schedule(k)``, refused unless it is a positive finite number (a step of 0 freezes the
        chain; a negative or NaN one is no step)."""
        factor = self.schedule(k)
        try:
            value = float(factor)
        except (TypeError, ValueError):
            value = float("nan")
        if isinstance(factor, (bool, str, bytes)) or not (math.isfinite(value) and value > 0):
            raise ValueError(f"{type(self).__name__}: schedule({k}) returned {factor!r}; a schedule must give a "
                             "positive finite factor of step_size at every iteration k.")
        return value

    def in_sampling_phase(self, iteration: int) -> bool:
        """Whether ``iteration`` injects noise and may make a draw: always, unless the schedule
        has an ``is_sampling`` (a cyclical schedule's exploration phase says no)."""
        is_sampling = getattr(self.schedule, "is_sampling", None)
        return True if is_sampling is None else bool(is_sampling(iteration))

    def transition(self, params: Params, step_size: float, temperature: float):
        """One iteration at this step's size and temperature (0 in a cyclical schedule's
        exploration phase): ``(new_params, energy at params, gradient at params)``."""
        energy, grads = self.target.potential_and_grad(params)
        return self.update(params, grads, step_size, temperature), energy, grads

    def logging(self) -> Dict[str, str]:
        return {"step size": f"{self._last_stats.get('step_size', self.step_size):.2e}"}

    def _complete_stats(self) -> None:
        if self._last_draw is not None and len(self._stats["potential_energy"]) < len(
            self._stats["step_size"]
        ):
            energy, _ = self.target.potential_and_grad(self._last_draw)
            self._record_state({"potential_energy": energy, **self.target.last_stats})

    def _reset_chain_state(self, warmup_steps: int) -> None:
        super()._reset_chain_state(warmup_steps)
        self.num_grad_evals = 0  # per chain, warm-up included
        self._state_norm, self._normed_state = math.nan, None  # the last step's ‖θ‖∞ and its state

    def _record_state(self, state_stats: dict) -> None:
        for name, value in state_stats.items():
            self._stats[name].append(value)

    def update(self, params: Params, grads: Params, step_size: float, temperature: float) -> Params:
        raise NotImplementedError

    def _raise_divergence(self, params, grads, new_params, energy, step_size, problem="non-finite") -> None:
        chain, pick = self._chain, (lambda v: v)
        if problem == "growth":
            def per_chain(tensors):  # largest |coordinate| of each chain (or of the one chain)
                rows = [v.reshape(v.shape[0] if self.num_chains is not None else 1, -1).abs().amax(-1)
                        for v in tensors.values()]
                return torch.stack(rows).amax(0)
            before, after = per_chain(params), per_chain(new_params)
            ratio = after / before.clamp(min=1.0)
            c = int(ratio.argmax())
            if self.num_chains is not None:
                chain, pick = c, (lambda v: v[c])  # noqa: E731
            site = max(new_params, key=lambda n: float(pick(new_params[n]).abs().max()))
            where = (f"its largest absolute value grew from {float(before[c]):.3g} to {float(after[c]):.3g} "
                     f"in one iteration (site {site!r}), more than max_growth = {self.max_growth:g} times: a "
                     "finite blow-up (set kernel.max_growth = None to allow such jumps)")
        else:
            if self.num_chains is not None:  # name the first chain that went non-finite
                finite = torch.isfinite(energy)
                for tensors in (grads, new_params, params):
                    for value in tensors.values():
                        finite = finite & torch.isfinite(value.reshape(value.shape[0], -1)).all(-1)
                chain = int((~finite).nonzero()[0, 0])
                pick = lambda v: v[chain]  # noqa: E731  (that chain's slice of a batched tensor)
            site = None
            for label, tensors in (("gradient", grads), ("value", new_params), ("value", params)):
                for name, value in tensors.items():
                    if not bool(torch.isfinite(pick(value)).all()):
                        site, what = name, label
                        break
                if site is not None:
                    break
            if site is not None:
                where = f"the {what} of site {site!r} became NaN/inf"
            else:  # the energy overflowed first: name the site pushing hardest
                site = max(grads, key=lambda n: float(pick(grads[n]).norm()))
                where = (f"the potential energy became {float(pick(energy.reshape(-1)))} "
                         f"(largest gradient at site {site!r})")
        phase = "warm-up" if self._iteration < self._warmup_steps else "sampling"
        draws = self._stack_draws(self._draws) if self._draws else []
        n = len(self._draws)
        raise DivergenceError(
            f"{type(self).__name__}: chain {chain} diverged at iteration {self._iteration} "
            f"({phase}): {where} with step size {step_size:.3g}. Use a smaller "
            f"step_size (e.g. {self.step_size / 10:.3g}) or a schedule that decays it. "
            f"The {n} draw(s) made by this chain before it are kept in the exception's "
            "`.samples` (finished chains in `.completed_chains`).",
            site=site,
            iteration=self._iteration,
            chain=chain,
            step_size=step_size,
            samples=draws[chain] if self.num_chains is not None and draws else (draws[0] if draws else {}),
            completed_chains=list(self._completed_draws)
            + [d for c, d in enumerate(draws) if self.num_chains is not None and c != chain],
        )


def _check_driver_num_samples() -> None:
    """Refuse ``pyro.infer.MCMC(kernel, num_samples=0)`` before any work.

    Pyro's driver does not check ``num_samples`` and hands it to no kernel: with 0 it runs the
    warm-up, then fails on an empty stack. Its generator ``_gen_samples(kernel, warmup_steps,
    num_samples, ...)`` calls :meth:`TargetKernel.setup` directly, so the value is read there;
    any other caller (``pyro_flat.MCMC`` checks it itself) is left alone.
    """
    import sys

    caller = sys._getframe(2)  # setup's caller
    if caller.f_code.co_name == "_gen_samples" and "num_samples" in caller.f_locals:
        check_positive_int("num_samples", caller.f_locals["num_samples"],
                           hint="It is the number of draws kept per chain.")


def coupled_target(kernel: TargetKernel, args: tuple, kwargs: dict) -> CoupledPotential:
    """The Entropy-MCMC joint of ``kernel``'s target (its ``eta``, ``sites`` and ``suffix``).

    For a ``potential_fn`` the initial values may name twins (``name + suffix``): the base
    potential takes only the others.
    """
    given = kernel._pending_initial_params
    if kernel.model is None and given is not None:
        suffix = kernel.suffix
        theta = {k: v for k, v in given.items() if k[: -len(suffix)] not in given}
        base = CallablePotential(kernel.potential_fn, theta, kernel.num_chains)
    else:
        base = TargetKernel.build_target(kernel, args, kwargs)
    return CoupledPotential(base, kernel.eta, kernel.sites, kernel.suffix)
