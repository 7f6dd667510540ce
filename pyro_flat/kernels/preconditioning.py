r"""Preconditioned Langevin steps: a fixed metric :math:`M^{-1}` learnt from curvature during warm-up.

.. math:: z \leftarrow z - \alpha\, M^{-1}\widehat{\nabla U}(z) + \sqrt{2\alpha T}\, L\,\xi,
          \qquad M^{-1} = L L^\top,\quad \xi \sim \mathcal N(0, I).

For a constant :math:`M^{-1}` this is the Euler-Maruyama step of a Langevin diffusion whose
stationary law is still :math:`\propto e^{-U/T}`, so no correction term is needed as
:math:`\alpha \to 0`. The metric is therefore estimated during warm-up only and **frozen** when
sampling starts (an adaptive-while-sampling pSGLD, e.g. RMSprop-style, would leave that law
biased unless a :math:`\Gamma` correction term is added; pyro-flat does not offer one).

The metric is the inverse curvature of the potential :math:`f` of the model's sites, evaluated on
**all** the data (:mod:`~pyro_flat.kernels.curvature`), per chain, at the chain's current point:

- ``"dense"``: :math:`|\nabla^2 f|^{-1}` (``D`` Hessian-vector products per estimate; up to
  :data:`MAX_DENSE_DIM` coordinates);
- ``"diagonal"``: :math:`1/\max_{k}|\mathrm{diag}\,\nabla^2 f(z_k)|`, the largest absolute curvature of
  each coordinate over **all** the warm-up points :math:`z_k` estimated so far (exact up to 1,024
  coordinates, else Hutchinson's estimate from 32 probes; entries floored at a tenth of their
  median); see *Non-convex targets* below;
- a tensor: a fixed ``(D,)`` variance or ``(D, D)`` covariance of the model's sites, flattened in
  the order of the model's latent sites (coupled sites first for Entropy-MCMC with ``sites=``).

It is estimated at the start and re-estimated at warm-up iterations 10, 25, 50 and at half the
warm-up (curvature needs no draws, so early and often; the second half of the warm-up runs with the
final metric); ``"diagonal"`` also at iterations 1 and 3 (:data:`DIAGONAL_EARLY_ITERATIONS`).

**Non-convex targets** (``"diagonal"``). Along a coordinate with variance :math:`v_i` the step is
stable where :math:`\alpha\, v_i\, |\partial_i^2 f| < 2`, and the curvature at one point says little
about the curvature elsewhere: between a well and a saddle it passes through 0 (an inflection), and
:math:`1/|\partial_i^2 f|` estimated there is a step hundreds of times too large for the well. On
:math:`f(x) = \sum_i (x_i^2 - 1)^2` (curvature 8 at the minima, -4 at the saddle) the metric of the
last estimate alone diverged in 59 of 90 runs (SGLD and EntropySGLD, 2 chains, default step,
5 seeds, starts 0, 1 and random, warm-ups 100, 200 and 500): variances of 11.5 and 542 had been
estimated at :math:`|x_i| \approx 0.58`, where the curvature is near 0. The rule is therefore the
**largest** :math:`|\partial_i^2 f|` of each coordinate (and chain) over all the warm-up estimates,
:math:`v_i = 1/\max_k|\partial_i^2 f(z_k)|`, so a re-estimate can only shrink a variance: the step is
stable (by the margin :math:`2/\alpha`, 20 at the default step) wherever the chain was at the
estimates, and one estimate near an inflection no longer sets it (0 of the 90 runs diverged). The
max needs several points: forgetting the estimates of the first 10 iterations at iteration 10
diverged in 30 of 120 runs. A start point has no other estimate beside it, hence the re-estimates at
iterations 1 and 3 (two more estimates: ``D`` Hessian-vector products each up to 1,024
coordinates, 32 above), before a metric fitted to a near-flat start carries the chain into a well:
without them 4 of 80 random starts diverged within 10 iterations, with them 0 of 300. The price: a
start or a transient in a region steeper than the typical set keeps the steps that small (slower
mixing, never unstable; a 5-feature logistic regression started from a prior draw got variances 0.2 to
0.7 times those of the last estimate), and Hutchinson's noise raises the max a little (smaller
steps again). On a quadratic target the curvature is the same everywhere, so the metric is that of
one estimate. ``"dense"`` keeps the latest estimate (a matrix has no single largest curvature and
its estimates are unchanged by this rule): it is meant for log-concave targets such as the logistic
regression; on a non-convex one use ``"diagonal"`` or a fixed tensor.

For Entropy-MCMC the metric acts on the **joint** :math:`(\theta, \theta_a)`, whose Hessian is
:math:`\begin{pmatrix} H + I/\eta & -I/\eta\\ -I/\eta & I/\eta\end{pmatrix}` (:math:`H = \nabla^2 f`,
:math:`\Sigma = H^{-1}`). The metrics, chosen by ``coupling_metric``:

- ``"joint"`` (:class:`~pyro_flat.kernels.mass_matrix.CoupledFactor`): the exact inverse Hessian,
  :math:`M^{-1} = \begin{pmatrix}\Sigma & \Sigma\\ \Sigma & \Sigma + \eta I\end{pmatrix}`
  (:math:`\theta_a = \theta + \sqrt\eta\,\xi`). Every direction relaxes at rate :math:`\alpha`,
  but with :math:`c = (\theta - \theta_a)/\eta` the drift is
  :math:`M^{-1}\nabla U = (\Sigma\nabla f,\ \Sigma\nabla f - (\theta - \theta_a))`: **θ's update is
  exactly preconditioned SGLD on f and never feels θa**; θa is θ plus an AR(1) noise. Its marginals
  are right, but it does not run Entropy-MCMC's dynamics; it is the preconditioned SGLD baseline's
  equivalent.
- a pull strength :math:`\varepsilon \in [0, 1]` (``"pulled"`` is :data:`DEFAULT_PULL`, the default;
  :class:`~pyro_flat.kernels.mass_matrix.PulledFactor`): the joint metric with
  :math:`\varepsilon K` taken off its cross-covariance, :math:`K = (H + I/\eta)^{-1}` (the
  covariance of :math:`\theta \mid \theta_a`),
  :math:`M^{-1} = \begin{pmatrix}\Sigma & \Sigma - \varepsilon K\\ \Sigma - \varepsilon K & \Sigma + \eta I\end{pmatrix}`.
  θ's drift becomes :math:`-\alpha\,[\Sigma\nabla f + \varepsilon K(\theta - \theta_a)/\eta]`: the
  SGLD drift plus a pull toward θa which, along a direction of curvature :math:`\lambda`, closes a
  fraction :math:`\alpha\varepsilon r` of the gap per step, :math:`r = 1/(1 + \lambda\eta)`. The
  flat directions (:math:`\lambda\eta \ll 1`, where θa's smoothing matters) are pulled at full
  strength, the stiff ones (where the coupling is negligible beside the curvature) hardly at all.
  The drift matrix has eigenvalues :math:`1 + \varepsilon(r \pm \sqrt r)`, within
  :math:`[1 - \varepsilon/4,\ 1 + 2\varepsilon]` **whatever** :math:`\lambda\eta`: the common move of θ and
  θa keeps the exact metric's rate (about :math:`\alpha`), and the update is stable for
  :math:`\alpha < 2/(1 + 2\varepsilon)`. **The trade-off:** the gap :math:`\theta - \theta_a` is the fast
  mode (eigenvalue up to :math:`1 + 2\varepsilon`), so its stationary variance carries the
  discretisation factor :math:`1/(1 - \alpha(1 + 2\varepsilon)/2)` instead of the exact metric's
  :math:`1/(1 - \alpha/2)`; θ's own marginal keeps the exact metric's. On ``pyro-flat mnist79``'s
  spectrum at :math:`\alpha = 0.2`: :math:`\varepsilon = 1` inflates the gap's variance by 1.41 (the
  exact metric 1.11), θ's by 1.11, and slows the slowest direction from rate 0.20 to 0.15 per step.
- ``"block"`` (:class:`~pyro_flat.kernels.mass_matrix.BlockFactor`): block-Jacobi,
  :math:`M^{-1} = \mathrm{blockdiag}((H + I/\eta)^{-1},\ \eta I)`. The drift of :math:`\theta` is
  :math:`-\alpha(H + I/\eta)^{-1}(\nabla f + (\theta - \theta_a)/\eta)`: :math:`\theta` is pulled
  toward :math:`\theta_a`, as in Entropy-MCMC's plain update, and :math:`\theta_a` relaxes toward
  :math:`\theta` at rate :math:`\alpha`. The price is mixing: along a direction of curvature
  :math:`\lambda` the drift matrix :math:`M^{-1}\nabla^2 U` has eigenvalues
  :math:`1 \pm (1 + \lambda\eta)^{-1/2}`, so :math:`\theta` and :math:`\theta_a` move together at
  the slow rate :math:`\alpha(1 - (1 + \lambda\eta)^{-1/2}) \approx \alpha\lambda\eta/2` per step
  (it is a Gibbs sampler of two strongly correlated blocks), and the update is stable for
  :math:`\alpha < 2/(1 + (1 + \lambda\eta)^{-1/2})`, about 1 (not 2).

An earlier κ-mixed metric (the cross-covariance :math:`\kappa\Sigma`) is gone: its eigenvalues
:math:`1 + q \pm \sqrt{q(1 - \kappa + q)}`, :math:`q = (1 - \kappa)/(\lambda\eta)`, grow without bound in
the flat directions, so a flat enough target made any fixed step unstable (and at :math:`\kappa = 0.9`,
:math:`\alpha = 0.2` on ``mnist79`` it inflated the gap's variance 2.3-fold).

**What** ``step_size`` **means with a preconditioner:** :math:`\alpha` is measured in units of the
metric, so on a Gaussian target with the exact metric every direction contracts by
:math:`1 - \alpha` per step, whatever the condition number; the chain is stable for
:math:`\alpha < 2` and its stationary variance is :math:`1/(1 - \alpha/2)` times the target's
(plus the minibatch noise). :data:`DEFAULT_STEP_SIZE` is the default.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from ..chains.shard import chain_randn_like
from ..targets import ChainLayout, FullDataTarget, Params
from .curvature import (EXACT_DIAGONAL_DIM, absolute_curvature, absolute_spectrum, hessian, hessian_diagonal,
                        inverse_diagonal)
from .integrators import StepSize
from .mass_matrix import BlockFactor, CoupledFactor, PrecisionFactor, PulledFactor, factor_from_covariance

PRECONDITIONERS = ("diagonal", "dense")
#: named metrics of a coupled (Entropy-MCMC) target: the pulled joint metric, the joint's exact inverse
#: Hessian, block-Jacobi (see the module)
COUPLING_METRICS = ("pulled", "joint", "block")
#: the pull strength ε of ``coupling_metric="pulled"``
DEFAULT_PULL = 1.0
#: the largest dimension for which ``"dense"`` forms the Hessian
MAX_DENSE_DIM = 4096
#: the step size of a preconditioned kernel when none is given (see the module)
DEFAULT_STEP_SIZE = 0.1
#: warm-up iterations (besides the start) at which the metric is re-estimated
ADAPTATION_ITERATIONS = (10, 25, 50)
#: further re-estimates of ``"diagonal"`` (one estimate at the start is not trusted alone; see the module)
DIAGONAL_EARLY_ITERATIONS = (1, 3)

Spec = Union[None, str, torch.Tensor]


def check_preconditioner(spec: Spec) -> Spec:
    """``spec`` if it is ``None``, ``"diagonal"``, ``"dense"`` or a floating ``(D,)`` / ``(D, D)``
    tensor with positive variances (its shape is checked against the model at setup)."""
    if spec is None or (isinstance(spec, str) and spec in PRECONDITIONERS):
        return spec
    if isinstance(spec, str):
        raise ValueError(f"preconditioner={spec!r} is not known; use one of {PRECONDITIONERS}, a "
                         "tensor (a (D,) variance or a (D, D) covariance) or None.")
    if not torch.is_tensor(spec):
        raise ValueError(f"preconditioner must be None, {PRECONDITIONERS} or a tensor, got "
                         f"{type(spec).__name__}; convert it with torch.as_tensor(..., dtype=torch.float32).")
    if not spec.is_floating_point():
        raise ValueError(f"preconditioner has dtype {spec.dtype}; pass a floating tensor "
                         "(e.g. preconditioner.float()).")
    if spec.dim() not in (1, 2) or (spec.dim() == 2 and spec.shape[0] != spec.shape[1]):
        raise ValueError(f"preconditioner has shape {tuple(spec.shape)}; pass a (D,) variance or a "
                         "(D, D) covariance over the model's flattened sites.")
    if not bool(torch.isfinite(spec).all()):
        raise ValueError("preconditioner has NaN/inf entries.")
    if spec.dim() == 1 and not bool((spec > 0).all()):
        raise ValueError("preconditioner (a variance vector) must be positive in every entry; got "
                         f"a smallest entry {float(spec.min()):.3g}.")
    if spec.dim() == 2:
        if not torch.allclose(spec, spec.T, rtol=1e-5, atol=1e-8 * float(spec.abs().max())):
            raise ValueError("preconditioner (a covariance) must be symmetric.")
        if torch.linalg.cholesky_ex(spec.double()).info.item() != 0:
            raise ValueError("preconditioner (a covariance) is not positive definite; add a multiple "
                             "of the identity or pass its diagonal.")
    return spec


def check_coupling_metric(metric: Union[str, float]) -> Union[str, float]:
    """``metric`` if it is ``"pulled"``, ``"joint"``, ``"block"`` or a pull strength ε in [0, 1] (see the module)."""
    if isinstance(metric, str) and metric in COUPLING_METRICS:
        return metric
    if isinstance(metric, (int, float)) and not isinstance(metric, bool) and 0.0 <= metric <= 1.0:
        return float(metric)
    raise ValueError(f"coupling_metric={metric!r} is not known; use 'pulled' (θ pulled by θa at strength "
                     f"{DEFAULT_PULL:g}, the exact metric's mixing kept), a pull strength ε in [0, 1], 'joint' (the "
                     "joint's exact inverse Hessian, ε = 0: θ moves as preconditioned SGLD on f and ignores θa) or "
                     "'block' (block-Jacobi: θ pulled, slow mixing); see pyro_flat.kernels.preconditioning.")


def pull_strength(metric: Union[str, float]) -> Optional[float]:
    """The ε of a joint metric (``"joint"``: 0), ``None`` for ``"block"``."""
    return {"block": None, "joint": 0.0, "pulled": DEFAULT_PULL}.get(metric, metric)


class Preconditioner:
    r"""The metric of one kernel's chains over its target's flat vector (see the module).

    :param spec: ``"diagonal"``, ``"dense"`` or a fixed tensor.
    :param num_probes: Hutchinson probes for a ``"diagonal"`` estimate above 1,024 coordinates.

    After :meth:`setup`, :meth:`step` is the preconditioned Langevin step and :meth:`covariance`
    the current :math:`M^{-1}` (dense, of chain ``c``). :attr:`num_hvp` counts the
    Hessian-vector products spent on the estimates (per chain).

    Update rule of an adaptive metric, at the start and at each of :attr:`adaptation_iterations`
    of the warm-up (then frozen), per chain, at the chain's point :math:`z_k`:

    - ``"dense"``: :math:`M^{-1} = |\nabla^2 f(z_k)|^{-1}` (the latest estimate replaces the earlier);
    - ``"diagonal"``: :math:`c \leftarrow \max(c, |\mathrm{diag}\,\nabla^2 f(z_k)|)` elementwise
      (:attr:`curvature`; :math:`c` starts as the estimate at the start point), then
      :math:`M^{-1} = 1/c` with :func:`~pyro_flat.kernels.curvature.inverse_diagonal`'s floors.
      In words: each coordinate's variance is the inverse of the **largest** curvature the chain
      met at the estimates so far, so a re-estimate can only shrink it, and a point of near-zero
      curvature (an inflection of a non-convex target) cannot make the step unstable where the
      chain has already been. :attr:`curvature` restarts at each :meth:`setup`.
    """

    def __init__(self, spec: Spec, *, num_probes: int = 32, coupling_metric: Union[str, float] = "pulled"):
        self.spec = check_preconditioner(spec)
        self.coupling_metric = check_coupling_metric(coupling_metric)
        self.num_probes = num_probes
        self.factor = None
        self.num_hvp = 0
        #: ``"diagonal"``: the ``(C, D)`` largest ``|diag H|`` over this run's estimates (see above)
        self.curvature = None

    @property
    def adaptive(self) -> bool:
        return isinstance(self.spec, str)

    def state_dict(self) -> dict:
        """The metric as it stands (a checkpoint's part): the factor, the diagonal's largest curvatures, the
        Hessian-vector products spent."""
        return {"factor": self.factor, "curvature": self.curvature, "num_hvp": self.num_hvp}

    def load_state_dict(self, state: dict) -> None:
        self.factor, self.curvature, self.num_hvp = state["factor"], state["curvature"], state["num_hvp"]

    def setup(self, target, params: Params, *, num_chains: Optional[int], warmup_steps: int) -> int:
        """Lay out the sites, then estimate the metric at ``params`` (or install the fixed one);
        returns the Hessian-vector products spent (per chain)."""
        batched = num_chains is not None
        link = target.coupling  # an Entropy-MCMC joint says so (see pyro_flat.targets.Target)
        self.coupled = link is not None
        base = target.base if self.coupled else target
        coupled = link.sites if self.coupled else []
        names = coupled + [n for n in base.sites if n not in coupled]
        self.theta = ChainLayout({n: base.sites[n].shape for n in names}, names, batched)
        self.aux = (ChainLayout({n: target.sites[n].shape for n in link.twins}, link.twins, batched)
                    if self.coupled else None)
        self.eta = link.eta if self.coupled else None
        evaluate = base.full_data if isinstance(base, FullDataTarget) else base
        self._energy = lambda x: evaluate(self.theta.unpack(x)).reshape(-1)
        dim = self.theta.dim
        if self.spec == "dense" and dim > MAX_DENSE_DIM:
            raise ValueError(f"preconditioner='dense' forms a {dim} x {dim} Hessian per chain; above "
                             f"{MAX_DENSE_DIM} coordinates use preconditioner='diagonal'.")
        half = warmup_steps // 2
        self.curvature = None  # a new run (or chain) starts from its own start point
        early = DIAGONAL_EARLY_ITERATIONS if self.spec == "diagonal" else ()
        self.adaptation_iterations = {k for k in (*early, *ADAPTATION_ITERATIONS, half)
                                      if 0 < k < warmup_steps}
        if self.adaptive:
            return self.estimate(params)
        spec = self.spec
        if spec.shape[0] != dim:
            raise ValueError(f"preconditioner has {spec.shape[0]} rows but the sites {names} have "
                             f"{dim} coordinates together (flattened in that order).")
        x = self.theta.pack(params)
        self._install(factor_from_covariance(spec.to(x).expand(x.shape[0], *spec.shape).clone()))
        return 0

    def adapt(self, iteration: int, params: Params) -> int:
        """Re-estimate at ``params`` if ``iteration`` is one of the warm-up's adaptation points;
        returns the Hessian-vector products spent (per chain)."""
        if self.adaptive and iteration in self.adaptation_iterations:
            return self.estimate(params)
        return 0

    def estimate(self, params: Params) -> int:
        """Estimate the metric at ``params``; returns the Hessian-vector products spent."""
        x = self.theta.pack(params).detach()
        dim = x.shape[-1]
        if self.spec == "dense":
            spent = dim
            # in double precision: float32's eigenvectors were 0.6% off on mnist79's Hessian (condition
            # number 7,600), and a round-off change of H moved the metric 100 times more than in float64
            H = hessian(self._energy, x).double()
            magnitude, basis = absolute_spectrum(H)  # the pulled metric's eigenbasis too
            precision = absolute_curvature(H, spectrum=(magnitude, basis)).to(x.dtype)
            self._install(PrecisionFactor(precision), (magnitude.to(x.dtype), basis.to(x.dtype)))
        else:
            spent = dim if dim <= EXACT_DIAGONAL_DIM else self.num_probes
            magnitude = hessian_diagonal(self._energy, x, num_probes=self.num_probes).abs()
            if self.curvature is not None:  # the largest curvature met so far (see the class)
                magnitude = torch.maximum(magnitude, self.curvature)
            self.curvature = magnitude
            self._install(factor_from_covariance(inverse_diagonal(magnitude)))
        self.num_hvp += spent
        return spent

    def _install(self, inner, spectrum=None) -> None:
        """Use the metric ``inner`` over θ (with the coupling added for the joint: see the module);
        ``spectrum``: the eigenvalues and eigenvectors of a dense ``inner``'s precision, when known."""
        if not self.coupled:
            self.factor = inner
        elif self.coupling_metric == "block":
            self.factor = BlockFactor(inner, self.eta, self.aux.dim)
        elif pull_strength(self.coupling_metric) == 0.0:
            self.factor = CoupledFactor(inner, self.eta, self.aux.dim)
        else:
            self.factor = PulledFactor(inner, self.eta, self.aux.dim, pull_strength(self.coupling_metric),
                                       spectrum=spectrum)

    def _pack(self, tensors: Params) -> torch.Tensor:
        flat = self.theta.pack(tensors)
        return torch.cat([flat, self.aux.pack(tensors)], -1) if self.coupled else flat

    def _unpack(self, flat: torch.Tensor) -> Params:
        if not self.coupled:
            return self.theta.unpack(flat)
        dim = self.theta.dim
        return {**self.theta.unpack(flat[:, :dim]), **self.aux.unpack(flat[:, dim:])}

    def step(self, params: Params, grads: Params, step_size: StepSize, temperature: float) -> Params:
        r""":math:`z - \alpha M^{-1}\nabla U + \sqrt{2\alpha T} L\xi` for every chain."""
        z, g = self._pack(params), self._pack(grads)
        if temperature == 0:  # SGD, or a cyclical schedule's exploration phase: the drift alone
            return self._unpack(z - step_size * self.factor.velocity(g))
        noise = (2.0 * step_size * temperature) ** 0.5
        return self._unpack(z + self.factor.increment(g, chain_randn_like(z), step_size, noise))

    def underdamped_step(self, params: Params, momenta: Params, grads: Params, time_step: StepSize, decay: float,
                         temperature: float):
        r""":func:`~pyro_flat.kernels.integrators.underdamped_step` with mass matrix :math:`M`: the kick
        :math:`p' = p - h\nabla U`, :math:`p'' = c\,p' + \sqrt{T(1 - c^2)}\,L^{-\top}\xi` (a draw of
        covariance :math:`M`), :math:`q + \tfrac h2 M^{-1}(p' + p'')`. Returns ``(params, momenta)``."""
        z, p = self._pack(params), self._pack(momenta)
        kicked = p - time_step * self._pack(grads)
        new_p = decay * kicked
        noise_scale = (temperature * (1.0 - decay ** 2)) ** 0.5
        if noise_scale > 0:
            new_p = new_p + noise_scale * self.factor.solve_lt(chain_randn_like(z))
        new_z = z + (0.5 * time_step) * self.factor.velocity(kicked + new_p)
        return self._unpack(new_z), self._unpack(new_p)

    def momentum_draw(self, params: Params, temperature: float) -> Params:
        r""":math:`p \sim \mathcal N(0, T M)`, shaped as ``params``: the stationary law of the momenta."""
        z = self._pack(params)
        return self._unpack(temperature ** 0.5 * self.factor.solve_lt(chain_randn_like(z)))

    @property
    def stiffness(self) -> float:
        r"""The largest eigenvalue of :math:`M^{-1}\nabla^2 U` when the metric is exact (a Gaussian target):
        1, or for Entropy-MCMC's joint :math:`1 + 2\varepsilon` (pulled) and 2 (block); see the module."""
        if not self.coupled:
            return 1.0
        strength = pull_strength(self.coupling_metric)
        return 2.0 if strength is None else 1.0 + 2.0 * strength

    def covariance(self, chain: int = 0) -> torch.Tensor:
        """The current :math:`M^{-1}` of ``chain`` as a dense matrix over the target's flat vector."""
        inner = self.factor.inner if self.coupled else self.factor
        like = inner.variance if hasattr(inner, "variance") else inner.tril
        dim = self.theta.dim + (self.aux.dim if self.coupled else 0)
        eye = torch.eye(dim, dtype=like.dtype, device=like.device)
        columns = self.factor.velocity(eye.unsqueeze(1).expand(dim, like.shape[0], dim))  # (D, C, D)
        return columns[:, chain, :]
