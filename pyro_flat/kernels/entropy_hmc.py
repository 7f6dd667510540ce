r"""Entropy-HMC: Metropolis-corrected Hamiltonian Monte Carlo on the flat posterior's joint."""

from __future__ import annotations

import math
from typing import Callable, Dict, Iterable, NamedTuple, Optional, Union

import torch

from ..chains.shard import chain_rand_like, chain_randn_like, chains_all, chains_min
from ..targets import ChainLayout, CoupledPotential, Params, check_minibatches, coupling
from ..validation import check_eta, check_number, check_positive, check_positive_int
from .adaptation import StepSizeAdapter, WelfordCovariance, adaptation_windows
from .base import TargetKernel, coupled_target
from .curvature import hessian, inverse_curvature
from .integrators import leapfrog
from .mass_matrix import CoupledFactor, conditional_covariance, factor_from_covariance
from .nuts import nuts_transition

AUX_UPDATES = ("gibbs", "joint")
MAX_NUM_STEPS = 1000


class _Move(NamedTuple):
    """One trajectory's outcome per chain: the proposal ``q`` with ``f`` and its gradient, the
    Hamiltonian after the Metropolis test, and the test's statistics."""

    q: torch.Tensor
    f: torch.Tensor
    grad_f: torch.Tensor
    hamiltonian: torch.Tensor
    accept_prob: torch.Tensor
    accept: torch.Tensor
    diverging: torch.Tensor
    num_steps: int
    tree_depth: Optional[int]


class EntropyHMC(TargetKernel):
    r"""Exact (Metropolis-corrected) HMC on the Entropy-MCMC joint, a Pyro ``MCMCKernel``.

    The target is :math:`\propto \exp(-U/T)`, :math:`U(\theta, \theta_a) = f(\theta) +
    \lVert\theta - \theta_a\rVert^2/(2\eta)` with :math:`f` the model's potential (full batch).
    One iteration, by ``aux_update``:

    - ``"joint"``: an HMC trajectory on :math:`(\theta, \theta_a)` together, with the coupled mass
      matrix of :mod:`~pyro_flat.kernels.mass_matrix`: :math:`M^{-1}` is the joint covariance
      implied by an adapted covariance :math:`\Sigma` of :math:`\theta` and the exact coupling,
      so the stiff direction :math:`\theta - \theta_a` costs no extra steps;
    - ``"gibbs"``: an exact draw :math:`\theta_a \sim \mathcal N(\theta, T\eta I)`, then an HMC
      trajectory on :math:`\theta \mid \theta_a` (potential :math:`U(\cdot, \theta_a)`, mass
      matrix :math:`(\Sigma^{-1} + I/\eta)^{-1}`). Directions where :math:`\theta` is weakly
      determined (posterior precision :math:`\lambda \ll 1/\eta`) then move by a factor
      :math:`1/(1 + \lambda\eta)` per iteration only: prefer ``"joint"`` for small :math:`\eta`.

    Each trajectory is ``num_steps`` leapfrog steps (:func:`~pyro_flat.kernels.integrators.leapfrog`)
    of a step size jittered by ±10 % per iteration, followed by the Metropolis test
    :math:`\min(1, e^{H_0 - H_1})`. During warm-up the step size follows dual averaging
    towards ``target_accept_prob`` and :math:`\Sigma` (diagonal, or dense with ``full_mass``) is
    re-estimated at the end of Stan's windows, one estimate per chain. A trajectory whose energy
    error exceeds ``max_energy_error`` or becomes NaN/inf is *divergent*: it is rejected (the chain
    stays put), counted in ``diagnostics()["divergences"]`` and flagged in ``sample_stats``.

    :param model: a Pyro model without subsampled plates (or ``potential_fn``, as in
        :class:`~pyro_flat.SGLD`).
    :param eta: coupling variance :math:`\eta > 0`.
    :param step_size: initial step size (default 1, then adapted) or the fixed one.
    :param num_steps: leapfrog steps per iteration; or ``trajectory_length`` (default 2, a little
        over a quarter period :math:`\pi/2` of a unit-variance direction in the adapted metric,
        which mixed best on logistic regression in ``benchmarks/bench_hmc.py``), each iteration's
        length drawn uniformly in [0.5, 1.5] times it against periodicity, the steps being
        ``ceil(length / step_size)`` (at most 1000; the largest over vectorized chains).
    :param adapt_step_size, adapt_mass_matrix: warm-up adaptation switches.
    :param full_mass: how :math:`\Sigma` is estimated: ``False``, the variances of the warm-up
        draws (Stan's diagonal metric); ``True``, their dense covariance; ``"hessian"``, the
        inverse Hessian of :math:`f` at the chain's current point (eigenvalues taken in absolute
        value and floored), computed with one Hessian-vector product per coordinate at the start,
        after 10, 25 and 50 iterations and at mid-warm-up. ``"hessian"`` suits near-Gaussian posteriors of moderate
        dimension (logistic regression: ~40x fewer leapfrog steps than the diagonal metric).
    :param aux_update: ``"joint"`` or ``"gibbs"`` (above).
    :param temperature: :math:`T > 0`.
    :param target_accept_prob: the acceptance rate dual averaging aims for.
    :param max_energy_error: energy error beyond which a trajectory is divergent.
    :param use_nuts: replace the fixed trajectory by a No-U-Turn one
        (:mod:`~pyro_flat.kernels.nuts`; one chain at a time, ``tree_depth`` in ``sample_stats``).
    :param max_tree_depth: NUTS stops doubling after ``2**max_tree_depth`` steps.
    :param sites, suffix: coupled sites and the auxiliary names, as in :class:`~pyro_flat.EntropySGLD`.
    :param jit_compile: the trajectories' gradients from one traced graph, as in
        :class:`~pyro_flat.kernels.base.TargetKernel`.

    ``sample_stats`` (ArviZ names): ``potential_energy`` (:math:`U`), ``energy`` (the Hamiltonian),
    ``acceptance_rate``, ``step_size``, ``n_steps``, ``diverging``, ``coupling_distance``.

    Example::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro.infer import MCMC
        >>> from pyro_flat import EntropyHMC
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0., 10.))
        ...     with pyro.plate("data", len(y)):
        ...         pyro.sample("y", dist.Normal(mu, 1.), obs=y)
        >>> mcmc = MCMC(EntropyHMC(model, eta=0.1, num_steps=5), num_samples=200, warmup_steps=100,
        ...             disable_progbar=True)
        >>> mcmc.run(torch.randn(100) + 3.)
        >>> sorted(mcmc.get_samples())
        ['mu', 'mu_aux']
    """

    def __init__(
        self,
        model: Optional[Callable] = None,
        *,
        potential_fn: Optional[Callable[[Params], torch.Tensor]] = None,
        eta: float,
        step_size: Optional[float] = None,
        num_steps: Optional[int] = None,
        trajectory_length: Optional[float] = None,
        adapt_step_size: bool = True,
        adapt_mass_matrix: bool = True,
        full_mass: bool = False,
        aux_update: str = "joint",
        temperature: float = 1.0,
        target_accept_prob: float = 0.8,
        max_energy_error: float = 1000.0,
        use_nuts: bool = False,
        max_tree_depth: int = 10,
        sites: Optional[Iterable[str]] = None,
        suffix: str = "_aux",
        init_strategy: Optional[Callable] = None,
        record_draws: bool = True,
        jit_compile: Union[bool, str] = False,
    ):
        super().__init__(model, potential_fn=potential_fn, init_strategy=init_strategy,
                         record_draws=record_draws, jit_compile=jit_compile)
        self.eta = check_eta(eta)
        self.step_size = 1.0 if step_size is None else check_positive("step_size", step_size)
        if num_steps is not None and trajectory_length is not None:
            raise ValueError(
                "EntropyHMC takes num_steps or trajectory_length, not both: the number of leapfrog "
                "steps is either fixed or trajectory_length / step_size."
            )
        self.num_steps = None if num_steps is None else check_positive_int(
            "num_steps", num_steps, hint="It is the number of leapfrog steps per iteration.")
        self.trajectory_length = (
            2.0 if trajectory_length is None
            else check_positive("trajectory_length", trajectory_length)
        )
        if aux_update not in AUX_UPDATES:
            raise ValueError(
                f"aux_update must be 'joint' (HMC on θ and θa together) or 'gibbs' (exact θa | θ "
                f"draw, then HMC on θ | θa), got aux_update={aux_update!r}."
            )
        self.aux_update = aux_update
        self.temperature = check_positive("temperature", temperature)
        if not 0.0 < check_number("target_accept_prob", target_accept_prob, "0.8") < 1.0:
            raise ValueError(f"target_accept_prob must lie in (0, 1), got {target_accept_prob!r}.")
        self.target_accept_prob = float(target_accept_prob)
        self.max_energy_error = check_positive("max_energy_error", max_energy_error)
        self.adapt_step_size, self.adapt_mass_matrix = adapt_step_size, adapt_mass_matrix
        if full_mass not in (False, True, "hessian"):
            raise ValueError(f"full_mass must be False, True or 'hessian', got full_mass={full_mass!r}.")
        self.full_mass = full_mass
        self.sites = None if sites is None else tuple(sites)
        self.suffix = suffix
        if use_nuts and (num_steps is not None or trajectory_length is not None):
            raise ValueError("use_nuts=True chooses the trajectory length itself: drop num_steps "
                             "and trajectory_length.")
        max_tree_depth = check_positive_int("max_tree_depth", max_tree_depth,
                                            hint="NUTS stops doubling after 2**max_tree_depth steps.")
        self.use_nuts, self.max_tree_depth = bool(use_nuts), max_tree_depth

    def vectorization_error(self, num_chains, args, kwargs, initial_params=None, minibatches="per_chain", *,
                            num_draws=0):
        if self.use_nuts:
            check_minibatches(minibatches)
            return "NUTS trees grow differently per chain: use_nuts=True runs one chain at a time"
        return super().vectorization_error(num_chains, args, kwargs, initial_params, minibatches, num_draws=num_draws)

    # ----------------------------------------------------------------- target and state
    def build_target(self, args: tuple, kwargs: dict, *, num_chains: Optional[int] = None,
                     initial_params: Optional[Params] = None) -> CoupledPotential:
        target = coupled_target(self, args, kwargs, num_chains=num_chains, initial_params=initial_params)
        if target.subsampled_plates:
            name, (size, batch) = next(iter(target.subsampled_plates.items()))
            raise ValueError(
                f"EntropyHMC needs the full-batch potential, but plate {name!r} subsamples {batch} of "
                f"{size}: drop subsample_size (e.g. batch_size=None) or use EntropySGLD, which is "
                "built for minibatches."
            )
        return target

    #: the adaptation's state and the metric (see :meth:`TargetKernel.state_dict`)
    run_state = ("_theta_cov", "_metric", "_step", "_windows", "_welford", "_adapter", "_cache", "_accept_sum",
                 "_needs_step_search", "_last_f")

    def after_setup(self, params: Params) -> None:
        target, link = self.target, self.target.coupling
        coupled = link.sites
        names = coupled + [n for n in target.base.sites if n not in coupled]
        batched = self.num_chains is not None
        self._theta = ChainLayout({n: target.base.sites[n].shape for n in names}, names, batched)
        self._aux = ChainLayout({n: target.sites[n].shape for n in link.twins}, link.twins, batched)
        self._num_coupled = self._aux.dim
        chains = self.num_chains or 1
        x = self._theta.pack(params)
        self._theta_cov = torch.ones_like(x) if not self.full_mass else (
            torch.eye(x.shape[-1], dtype=x.dtype, device=x.device).expand(chains, -1, -1).clone())
        self._set_metric()
        self._step = torch.full((chains, 1), self.step_size, dtype=x.dtype, device=x.device)
        windows = adaptation_windows(self._warmup_steps) if self.adapt_mass_matrix else []
        if windows and self.full_mass == "hessian":  # no draws needed: early and often, and
            half = self._warmup_steps // 2           # the second half for the step size
            windows = sorted({w for w in (9, 24, 49) if w < half} | {half - 1})
            self._theta_cov = self._inverse_hessian(x)
            self._set_metric()
        self._windows = set(windows)
        self._welford = WelfordCovariance(diagonal=self.full_mass is False)
        self._adapter = StepSizeAdapter(self.target_accept_prob)
        self._cache = None
        self._accept_sum = 0.0
        self._needs_step_search = self.adapt_step_size

    def _set_metric(self) -> None:
        cov = self._theta_cov
        if self.aux_update == "joint":
            self._metric = CoupledFactor(factor_from_covariance(cov), self.eta * self.temperature,
                                         self._num_coupled)
        else:
            self._metric = factor_from_covariance(
                conditional_covariance(cov, self.eta * self.temperature, self._num_coupled))

    def _f(self, x: torch.Tensor):
        """:math:`f` and its gradient at flat ``x`` ``(chains, D)``."""
        energy, grads = self.target.base.potential_and_grad(self._theta.unpack(x))
        return energy.reshape(-1), self._theta.pack(grads)

    def _joint_energy(self, x, a, f, grad_f):
        """:math:`U/T` and its gradient in :math:`x` and :math:`a`, from :math:`f` at :math:`x`."""
        terms = coupling([x[:, : self._num_coupled] - a], self.eta, batch_dims=1)
        (grad_coupling,) = terms.grad_theta
        grad_x = grad_f.clone()
        grad_x[:, : self._num_coupled] += grad_coupling
        T = self.temperature
        return (f + terms.energy) / T, grad_x / T, -grad_coupling / T

    def _potential(self, a: Optional[torch.Tensor]):
        """``q -> (U/T, ∇U/T)`` over the moving block: ``(x, a)`` (joint) or ``x`` with ``a`` fixed."""
        dim = self._theta.dim

        def potential_and_grad(q):
            x = q[:, :dim]
            f, grad_f = self._f(x)
            aux = q[:, dim:] if a is None else a
            energy, grad_x, grad_a = self._joint_energy(x, aux, f, grad_f)
            self._last_f = (f, grad_f)
            return energy, (torch.cat([grad_x, grad_a], -1) if a is None else grad_x)

        return potential_and_grad

    # ----------------------------------------------------------------- one iteration
    def sample(self, params: Params) -> Params:
        k = self._iteration
        x, a, f, grad_f = self._state(params)
        if self.aux_update == "gibbs":
            a = x[:, : self._num_coupled] + math.sqrt(self.temperature * self.eta) * chain_randn_like(a)
            q, fixed_aux = x, a
        else:
            q, fixed_aux = torch.cat([x, a], -1), None
        potential = self._potential(fixed_aux)
        energy, grad, grad_a = self._joint_energy(x, a, f, grad_f)
        if self.aux_update == "joint":
            grad = torch.cat([grad, grad_a], -1)
        if self._needs_step_search:
            self._step = self._find_step_size(q, energy, grad, potential)
            self._adapter.reset(self._step[:, 0])
            self._needs_step_search = False

        step = self._step * (1.0 + 0.2 * (chain_rand_like(self._step) - 0.5))  # ±10 % jitter
        move = self._trajectory(q, energy, grad, (f, grad_f), step, potential)
        keep = move.accept.unsqueeze(-1)
        dim = self._theta.dim
        x = torch.where(keep, move.q[:, :dim], x)
        if self.aux_update == "joint":
            a = torch.where(keep, move.q[:, dim:], a)
        f = torch.where(move.accept, move.f, f)
        grad_f = torch.where(keep, move.grad_f, grad_f)

        if k < self._warmup_steps:
            self._adapt(k, x, move.accept_prob)
        self._iteration += 1
        new_params = {**self._theta.unpack(x), **self._aux.unpack(a)}
        self._cache = (new_params, x, a, f, grad_f)
        self._record(k, new_params, self._statistics(x, a, f, step, move), move.diverging, move.accept_prob)
        return new_params

    def _state(self, params: Params):
        """``(x, a, f, grad_f)`` at ``params``: cached from the last transition when it is the same."""
        if self._cache is not None and self._cache[0] is params:
            return self._cache[1:]
        x, a = self._theta.pack(params), self._aux.pack(params)
        return (x, a, *self._f(x))

    def _trajectory(self, q, energy, grad, f_and_grad, step, potential) -> "_Move":
        """One HMC (fixed length, Metropolis test) or NUTS transition of every chain from ``q``."""
        momentum = self._metric.solve_lt(chain_randn_like(q))
        h0 = energy + self._kinetic(momentum)
        if self.use_nuts:
            q1, _, _, (f1, grad_f1), accept_prob, num_steps, diverging, depth = nuts_transition(
                q, momentum, energy, grad, f_and_grad, step, self._velocity, self._kinetic,
                lambda z: (*potential(z), self._last_f), self.max_tree_depth, self.max_energy_error)
            accept_prob = torch.full_like(h0, accept_prob)
            diverging = torch.full_like(h0, diverging, dtype=torch.bool)
            return _Move(q1, f1, grad_f1, h0, accept_prob, torch.ones_like(diverging), diverging,
                         num_steps, depth)
        num_steps = self.num_steps or self._random_num_steps()
        q1, r1, energy1, _ = leapfrog(q, momentum, grad, step, num_steps, self._velocity, potential)
        f1, grad_f1 = self._last_f
        h1 = energy1 + self._kinetic(r1)
        delta = h1 - h0
        diverging = ~torch.isfinite(delta) | (delta > self.max_energy_error)
        accept_prob = torch.where(diverging, torch.zeros_like(delta), torch.exp(torch.clamp(-delta, max=0.0)))
        accept = (chain_rand_like(delta) < accept_prob) & ~diverging
        return _Move(q1, f1, grad_f1, torch.where(accept, h1, h0), accept_prob, accept, diverging,
                     num_steps, None)

    def _random_num_steps(self) -> int:
        """``ceil(length / step)`` for a length uniform in [0.5, 1.5] x ``trajectory_length``: a
        fixed length near half a period of some direction (π in the adapted metric's units) makes
        HMC nearly periodic there, with a tail ESS of a few dozen (measured on MNIST 7 vs 9 with
        the Hessian metric at length 3: R-hat 1.32); a random length cannot stay there."""
        length = self.trajectory_length * (0.5 + float(torch.rand(())))
        return min(MAX_NUM_STEPS, max(1, math.ceil(length / float(chains_min(self._step)))))

    def _statistics(self, x, a, f, step, move: "_Move") -> Dict[str, torch.Tensor]:
        terms = coupling([x[:, : self._num_coupled] - a], self.eta, batch_dims=1)
        stats = {
            "potential_energy": f + terms.energy,
            "energy": move.hamiltonian,
            "acceptance_rate": move.accept_prob,
            "step_size": step[:, 0],
            "n_steps": torch.full_like(f, move.num_steps),
            "diverging": move.diverging.to(f.dtype),
            "coupling_distance": terms.distance,
        }
        if move.tree_depth is not None:
            stats["tree_depth"] = torch.full_like(f, move.tree_depth)
        return stats

    def _record(self, k: int, params: Params, stats, diverging, accept_prob) -> None:
        """Keep the statistics, divergences and draw of a sampling iteration."""
        self._last_stats = stats
        if k < self._warmup_steps:
            return
        draw = k - self._warmup_steps
        for c in diverging.nonzero()[:, 0].tolist():
            self._divergences[c].append(draw)
        self._accept_sum += accept_prob
        for name, value in stats.items():
            self._stats[name].append(value if self.num_chains is not None else value[0])
        self._record_draw(params)

    def _adapt(self, k: int, x: torch.Tensor, accept_prob: torch.Tensor) -> None:
        if self.adapt_step_size:
            self._step = self._adapter.update(accept_prob).unsqueeze(-1)
        if self._windows:
            if self.full_mass != "hessian":
                self._welford.update(x)
            if k in self._windows:
                if self.full_mass == "hessian":
                    self._theta_cov = self._inverse_hessian(x)
                else:
                    self._theta_cov = self._welford.covariance()
                    self._welford.reset()
                self._set_metric()
                self._needs_step_search = self.adapt_step_size
        if k == self._warmup_steps - 1 and self.adapt_step_size:
            self._step = self._adapter.final().unsqueeze(-1)

    def _inverse_hessian(self, x: torch.Tensor) -> torch.Tensor:
        """:math:`|\nabla^2 f(x)|^{-1}` per chain, ``(C, D, D)`` (:mod:`~pyro_flat.kernels.curvature`)."""
        base, batch = self.target.base, self.target.base.fixed_batch()
        return inverse_curvature(hessian(lambda z: base(self._theta.unpack(z), batch).reshape(-1), x))

    def _velocity(self, r: torch.Tensor) -> torch.Tensor:
        return self._metric.velocity(r)  # M⁻¹ r

    def _kinetic(self, r: torch.Tensor) -> torch.Tensor:
        return 0.5 * (r * self._metric.velocity(r)).sum(-1)

    def _find_step_size(self, q, energy, grad, potential) -> torch.Tensor:
        """Double or halve each chain's step until one leapfrog step's acceptance crosses 0.8
        (Hoffman & Gelman's heuristic, as Pyro's HMC)."""
        step = self._step.clone()
        threshold = math.log(0.8)
        direction, done = None, torch.zeros(step.shape[0], dtype=torch.bool, device=step.device)
        for _ in range(60):
            r = self._metric.solve_lt(chain_randn_like(q))
            _, r1, energy1, _ = leapfrog(q, r, grad, step, 1, self._velocity, potential)
            log_accept = energy + self._kinetic(r) - (energy1 + self._kinetic(r1))
            log_accept = torch.nan_to_num(log_accept, nan=-math.inf)
            up = log_accept > threshold
            if direction is None:
                direction = up
            done = done | (up != direction)
            if chains_all(done):
                break
            factor = torch.where(direction, 2.0, 0.5).to(step.dtype).unsqueeze(-1)
            step = torch.where(done.unsqueeze(-1), step, step * factor)
        return step

    # ----------------------------------------------------------------- reporting
    def logging(self) -> Dict[str, str]:
        stats = self._last_stats
        if not stats:
            return {}
        drawn = max(self._iteration - self._warmup_steps, 0)
        accept = (float(self._accept_sum.mean()) / drawn if drawn and torch.is_tensor(self._accept_sum)
                  else float(stats["acceptance_rate"].mean()))
        return {"step size": f"{float(stats['step_size'].mean()):.2e}", "acc. prob": f"{accept:.3f}",
                "steps": str(int(stats["n_steps"][0]))}

    def diagnostics(self) -> dict:
        out = super().diagnostics()
        drawn = max(self._iteration - self._warmup_steps, 0)
        if drawn and torch.is_tensor(self._accept_sum):
            rate = (self._accept_sum / drawn).cpu()
            out["acceptance rate"] = float(rate[0]) if self.num_chains is None else rate
        return out
