r"""Stochastic-gradient Hamiltonian Monte Carlo (Chen et al., 2014) as a Pyro ``MCMCKernel``.

The momentum sampler of deep-learning practice (cyclical SG-MCMC's cSGHMC, SGD with momentum 0.9
plus noise), written as the BAOAB integrator of the underdamped Langevin diffusion
(:func:`~pyro_flat.kernels.integrators.underdamped_step`): one gradient per iteration, and on a
Gaussian target with exact gradients the draws follow the target **exactly** at any stable step,
where SGHMC's Euler form is biased by :math:`O(h)`.

**Parameterisation.** ``step_size`` :math:`\alpha` and ``momentum`` :math:`\mu` are those of
``torch.optim.SGD(lr=α, momentum=μ)``: at temperature 0 (a cyclical schedule's exploration phase)
and a constant step the update **is** heavy-ball SGD, :math:`\theta_{k+1} - \theta_k =
\mu(\theta_k - \theta_{k-1}) - \alpha\widehat{\nabla U}(\theta_k)`, from the second iteration on (the
first carries the chain's initial momentum, drawn at temperature :math:`T`; torch starts from zero).
Where the step changes, the carried momentum is the diffusion's :math:`p`, so the velocity scales
with :math:`h \propto \sqrt\alpha` where torch's scales with :math:`\alpha`. In the diffusion's units
``step_size`` and ``momentum`` are a time step :math:`h` and a friction :math:`\gamma`:

.. math:: \mu = e^{-\gamma h}, \qquad \alpha = \tfrac{1 + \mu}{2}\,h^2
          \qquad\Longleftrightarrow\qquad h = \sqrt{2\alpha/(1 + \mu)},\quad \gamma = -\ln(\mu)/h.

``friction=`` :math:`\gamma` instead of ``momentum=`` keeps :math:`\gamma` fixed and derives
:math:`\mu` from each iteration's step (a schedule that shrinks the step then raises the
momentum). The momenta :math:`p \sim \mathcal N(0, T M)` at stationarity are kept across a cyclical
schedule's phases (the exploration phase's SGD builds them up; the first sampling iterations'
friction brings them back to temperature) and drawn afresh only when a chain starts.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Tuple

import torch

from ..chains.shard import chain_randn_like_each
from ..targets import Params
from ..validation import check_positive
from .integrators import StepSize, sqrt, underdamped_step
from .stochastic_gradient import StochasticGradientKernel

#: ``momentum`` when neither it nor ``friction`` is given (``torch.optim.SGD``'s usual 0.9)
DEFAULT_MOMENTUM = 0.9
#: step sizes whose (h, μ) and stability check are kept (a decaying schedule's step changes at every iteration)
MAX_CACHED_STEPS = 256


def check_momentum(momentum, who: str = "SGHMC") -> float:
    """``momentum`` as a float in (0, 1) (a Python, numpy or one-element torch number), else a ``ValueError``
    that names ``who`` and says what the argument means."""
    try:
        value = None if isinstance(momentum, (bool, str, bytes)) else float(momentum)
    except (TypeError, ValueError, RuntimeError):
        value = None
    if value is None:
        raise ValueError(f"{who}: momentum must be a number in (0, 1), got {momentum!r}: the velocity's decay per "
                         "iteration, as torch.optim.SGD(momentum=...).")
    if not 0.0 < value < 1.0:
        langevin = who.replace("SGHMC", "SGLD")
        raise ValueError(f"{who}: momentum={value!r} must lie in (0, 1): the velocity's decay per iteration, as "
                         f"torch.optim.SGD(momentum=...) (1 would mean no friction; for no momentum use {langevin}).")
    return value


class SGHMC(StochasticGradientKernel):
    r"""Stochastic-gradient HMC with friction, BAOAB-integrated (see the module for the parameterisation).

    Per iteration, with :math:`h` and :math:`\mu` from ``step_size`` and ``momentum`` (or ``friction``),
    :math:`M^{-1} = I` or the ``preconditioner``'s metric, and :math:`\xi \sim \mathcal N(0, I)`:

    .. math::

        p' &= p - h\,\widehat{\nabla U}(q), \qquad
        p \leftarrow \mu\,p' + \sqrt{T(1 - \mu^2)}\,M^{1/2}\xi, \\
        q &\leftarrow q + \tfrac h2\,M^{-1}(p' + p),

    with :math:`\widehat{\nabla U}` the minibatch gradient (likelihood scaled by :math:`N/B`). With
    exact gradients the stationary law of :math:`q` on a Gaussian target is the target's, exactly, for
    every step with :math:`h^2 \lambda_{\max}(M^{-1}\nabla^2 U) < 4`, that is
    :math:`\alpha\lambda_{\max} < 2(1 + \mu)` (SGLD: :math:`\alpha\lambda_{\max} < 2`, with an
    :math:`O(\alpha)` bias). Minibatch noise adds :math:`h^2 C` to the momentum's covariance per
    step (:math:`C` the gradient noise's covariance), a bias of order :math:`\alpha/(1 - \mu)`, which no
    noise correction removes here. A fixed or warm-up-estimated ``preconditioner`` (frozen for
    sampling) keeps the law exact: it is the mass matrix :math:`M`.

    :param step_size: the learning rate :math:`\alpha` (as ``torch.optim.SGD``'s ``lr``; in the metric's
        units with a ``preconditioner``, where it must satisfy :math:`\alpha < 2(1 + \mu)`).
    :param momentum: the velocity's decay :math:`\mu \in (0, 1)` per iteration (default 0.9);
    :param friction: or the diffusion's friction :math:`\gamma > 0` (then :math:`\mu = e^{-\gamma h}`
        at each iteration's step); not both.

    Other arguments as :class:`~pyro_flat.SGLD` (``temperature``, ``schedule``, ``preconditioner``,
    ``jit_compile``...). :attr:`carried` holds the momenta (``{site: tensor}``, the sites' shapes).

    Example::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro.infer import MCMC
        >>> from pyro_flat import SGHMC
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0., 10.))
        ...     with pyro.plate("data", len(y), subsample_size=10) as idx:
        ...         pyro.sample("y", dist.Normal(mu, 1.), obs=y[idx])
        >>> mcmc = MCMC(SGHMC(model, step_size=1e-4, momentum=0.9), num_samples=200, warmup_steps=100,
        ...             disable_progbar=True)
        >>> mcmc.run(torch.randn(100) + 3.)
        >>> mcmc.get_samples()["mu"].shape
        torch.Size([200])
    """

    def __init__(self, model: Optional[Callable] = None, *, momentum: Optional[float] = None,
                 friction: Optional[float] = None, **kwargs):
        if momentum is not None and friction is not None:
            raise ValueError(f"{type(self).__name__}: pass momentum= (the decay per iteration, as torch.optim.SGD's) or "
                             "friction= (the diffusion's γ), not both.")
        self.friction = None if friction is None else check_positive(
            "friction", friction, hint="It is γ of dp = -∇U dt - γ p dt + √(2γT) dW; or pass momentum= in (0, 1).")
        self.momentum = None if friction is not None else check_momentum(
            DEFAULT_MOMENTUM if momentum is None else momentum, type(self).__name__)
        super().__init__(model, **kwargs)
        self._integrator: Dict[float, Tuple[float, float]] = {}  # (h, μ) per step size
        self._stable_steps: set = set()  # step sizes checked against the metric's limit

    @property
    def step_size_input(self) -> bool:
        """With ``friction=`` the momentum follows each step by a bisection in Python: a compiled graph is then
        built per step size (with ``momentum=`` the step is a graph input, see the base class)."""
        return self.friction is None

    def integrator(self, step_size: StepSize) -> Tuple[StepSize, float]:
        r"""``(h, μ)``: the time step and momentum decay of an iteration at ``step_size`` (see the module); a
        tensor step (a compiled graph's input) gives a tensor :math:`h`."""
        if isinstance(step_size, torch.Tensor):  # inside a graph: computed there, not cached
            return self._time_step_and_decay(step_size)
        found = self._integrator.get(step_size)
        if found is None:
            if len(self._integrator) >= MAX_CACHED_STEPS:  # a schedule that changes the step at every iteration
                self._integrator.clear()
            found = self._integrator[step_size] = self._time_step_and_decay(step_size)
        return found

    def _time_step_and_decay(self, alpha: StepSize) -> Tuple[StepSize, float]:
        if self.friction is None:
            return sqrt(2.0 * alpha / (1.0 + self.momentum)), self.momentum
        if isinstance(alpha, torch.Tensor):  # step_size_input is False with friction: never a graph input
            raise TypeError(f"{type(self).__name__}(friction=...) needs a Python number step_size, got a tensor.")
        low, high = 0.0, math.sqrt(2.0 * alpha)  # h^2 (1 + e^{-γh}) / 2 = α is increasing in h: bisect
        for _ in range(100):
            h = 0.5 * (low + high)
            low, high = (h, high) if h * h * (1.0 + math.exp(-self.friction * h)) < 2.0 * alpha else (low, h)
        return high, math.exp(-self.friction * high)

    def check_step_size(self, iteration: int, step_size: float) -> None:
        """With the ``"dense"`` preconditioner (the inverse Hessian at the warm-up's estimates), refuse a step at
        which BAOAB is unstable in the metric's units: it needs :math:`h^2 < 4/s`, :math:`s` the metric's
        :attr:`~pyro_flat.kernels.preconditioning.Preconditioner.stiffness`, checked once per step size. With
        another metric, or none, the curvature in the step's units is not known: a divergence reports it."""
        pre = self.preconditioner
        if pre is None or pre.spec != "dense" or step_size in self._stable_steps:
            return
        h, mu = self.integrator(step_size)
        limit = 4.0 / pre.stiffness
        if h * h >= limit:
            factor = step_size / self.step_size
            scheduled = "" if factor == 1 else f" (step_size {self.step_size:.4g} times the schedule's {factor:.4g})"
            raise ValueError(
                f"{type(self).__name__}: iteration {iteration} has step_size {step_size:.4g}{scheduled}, whose time step "
                f"h = {h:.4g} is unstable in the dense metric's units: BAOAB needs h² < {limit:.3g}, that is step_size "
                f"< {limit * (1.0 + mu) / 2.0:.3g} at momentum {mu:.3g}. Lower step_size"
                + (" or the schedule's largest factor." if scheduled else "."))
        if len(self._stable_steps) >= MAX_CACHED_STEPS:
            self._stable_steps.clear()
        self._stable_steps.add(step_size)

    def after_setup(self, params: Params) -> None:
        super().after_setup(params)
        self._stable_steps = set()  # a new metric: check the steps against it again
        self.carried = self._momentum_draw(params)

    def _momentum_draw(self, params: Params) -> Params:
        """The momenta's stationary law :math:`\\mathcal N(0, T M)`, a chain's start."""
        if self.preconditioner is not None:
            return self.preconditioner.momentum_draw(params, self.temperature)
        scale = math.sqrt(self.temperature)
        return dict(zip(params, torch._foreach_mul(chain_randn_like_each(params.values()), scale)))

    def update(self, params: Params, grads: Params, step_size: StepSize, temperature: float) -> Params:
        h, mu = self.integrator(step_size)  # the carried momenta have params' names: passed as they are
        if self.preconditioner is None:
            new, self.carried = underdamped_step(params, self.carried, grads, h, mu, temperature)
        else:
            new, self.carried = self.preconditioner.underdamped_step(params, self.carried, grads, h, mu, temperature)
        return new

    def logging(self) -> Dict[str, str]:
        out = super().logging()
        step = self._last_stats.get("step_size")
        if step is not None:
            out["momentum"] = f"{self.integrator(step)[1]:.3g}"
        return out


__all__ = ["SGHMC", "DEFAULT_MOMENTUM", "check_momentum"]
