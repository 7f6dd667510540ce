r"""Check a sampler's convergence against its 2-Wasserstein bound, on a problem with known constants.

:func:`check_convergence` runs many independent chains from one starting point, estimates
:math:`W_2(\nu_k, \pi)` from the ensemble at checkpoints :math:`k` (the ensemble *is* a sample of
:math:`\nu_k`), evaluates the bound of :mod:`pyro_flat.theory.bounds` with the problem's constants,
and says whether the estimate stays below it. :func:`~pyro_flat.convergence.runner.run_ensemble` is
the loop underneath; :class:`~pyro_flat.convergence.result.ConvergenceResult` holds the outcome.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import List, Optional, Union

import numpy as np
import torch

from .result import ConvergenceError, ConvergenceResult
from .runner import run_ensemble
from ..kernels import KERNELS, SGD, SGLD, EntropySGLD, LocalEntropySGLD, kernel_class
from ..kernels.stochastic_gradient import StochasticGradientKernel
from ..theory import joint_hessian, preconditioned_constants
from ..theory import bounds as B
from ..flatness.probes import check_seed
from ..theory.estimators import METHODS, W2Estimate, W2Estimator
from ..validation import check_positive_int
from .references import exact_chain, reference_law
from ..theory.problems import SITE, GaussianProblem, Problem

__all__ = ["check_convergence", "TARGET_OF", "MIN_CHAINS", "FEW_CHAINS",
           # from pyro_flat.convergence.result and pyro_flat.convergence.runner, where they moved
           "ConvergenceResult", "ConvergenceError", "run_ensemble"]

#: the law each kernel targets (EntropySGLD: its bound is on the joint)
TARGET_OF = {SGLD: "posterior", EntropySGLD: "joint", LocalEntropySGLD: "flat", SGD: "mode"}
MIN_CHAINS, FEW_CHAINS = 10, 100


def _kernel(sampler, problem: Problem, batch_size, kernel_kwargs) -> StochasticGradientKernel:
    if isinstance(sampler, str):
        cls = kernel_class(sampler)
    elif isinstance(sampler, type) and issubclass(sampler, StochasticGradientKernel):
        cls = sampler
    else:
        raise TypeError(f"sampler must be a name ({', '.join(KERNELS)}) or a kernel class such as "
                        f"pyro_flat.EntropySGLD, got {sampler!r}.")
    kwargs = dict(kernel_kwargs)
    if "temperature" not in getattr(cls, "fixed_settings", ()):
        kwargs.setdefault("temperature", problem.temperature)
    return cls(potential_fn=problem.potential_fn(batch_size), **kwargs)


def _target_of(kernel) -> str:
    if isinstance(kernel, LocalEntropySGLD) and not kernel.outer_noise:
        raise ValueError(f"{type(kernel).__name__} has no convergence bound in pyro-flat: it is an "
                         "optimiser of the local entropy, whose minimiser is not known in closed "
                         "form. Compare it in the MNIST study (benchmarks/bench_convergence.py) instead.")
    for cls in type(kernel).__mro__:  # the most specific known class decides
        if cls in TARGET_OF:
            return TARGET_OF[cls]
    raise ValueError(f"{type(kernel).__name__} has no convergence bound in pyro-flat; subclass one of "
                     f"{[c.__name__ for c in TARGET_OF]}.")


def _check_fixed_metric(kernel) -> None:
    pre = getattr(kernel, "preconditioner", None)
    if pre is not None and pre.adaptive:
        raise ValueError(
            f"check_convergence needs a fixed metric, got preconditioner={pre.spec!r} (estimated during "
            "warm-up, and every iteration here is measured): pass preconditioner=<tensor>, e.g. "
            "torch.linalg.inv(the Hessian at the mode).")


def _metric_factor(kernel) -> Optional[np.ndarray]:
    """``L`` with ``LLᵀ`` the kernel's own metric over its flat vector (θ, then θa for the joint),
    or ``None`` without a preconditioner."""
    pre = getattr(kernel, "preconditioner", None)
    if pre is None:
        return None
    return np.linalg.cholesky(pre.covariance(0).double().cpu().numpy())


def _whitening(factor: np.ndarray):
    """``x -> L⁻¹x`` on rows of draws, and on a ``(mean, cov)`` reference."""
    inv = np.linalg.inv(factor)

    def whiten(x):
        if isinstance(x, tuple):
            return inv @ np.asarray(x[0], dtype=float), inv @ np.asarray(x[1], dtype=float) @ inv.T
        return np.asarray(x, dtype=float) @ inv.T

    return whiten


def _bound(kernel, target: str, problem: Problem, iterations, initial_w2: float, batch_size,
           radius: float, factor: Optional[np.ndarray] = None) -> B.W2Bound:
    m, M = problem.constants()
    T, d = problem.temperature, problem.dim
    noise = problem.gradient_noise(batch_size)
    if factor is not None:  # plain Langevin on U(Ly): the preconditioned potential's constants
        lower, upper = problem.curvature_bounds()
        if target == "joint":
            lower, upper = joint_hessian(lower, kernel.eta), joint_hessian(upper, kernel.eta)
        m, M = preconditioned_constants(lower, upper, factor, T)
        noise *= float(np.linalg.norm(factor[:d, :d], 2))  # ∇_y U = Lᵀ∇_z U; noise in θ only
        if target == "mode":
            return B.sgd_bound(m * T, M * T, kernel.step_size, d, iterations, initial_w2, gradient_noise=noise)
        return B.langevin_w2_bound(m, M, kernel.step_size, factor.shape[0], iterations, initial_w2,
                                   temperature=T, gradient_noise=noise)
    if target == "joint":
        return B.entropy_mcmc_w2_bound(m, M, kernel.eta, kernel.step_size, d, iterations,
                                       initial_w2, temperature=T, gradient_noise=noise)
    if target == "flat":
        return B.local_entropy_w2_bound(
            m, M, kernel.eta, kernel.step_size, d, iterations, initial_w2,
            num_inner_steps=kernel.num_inner_steps, inner_step_size=kernel.inner_step_size,
            mean_weight=kernel.mean_weight, radius=radius, temperature=T, gradient_noise=noise)
    if target == "mode":
        return B.sgd_bound(m * T, M * T, kernel.step_size, d, iterations, initial_w2,
                           gradient_noise=noise)
    return B.sgld_w2_bound(m, M, kernel.step_size, d, iterations, initial_w2, temperature=T,
                           gradient_noise=noise)


def check_convergence(
    problem: Problem,
    sampler: Union[str, type],
    *,
    num_chains: int = 256,
    num_iterations: int = 2000,
    batch_size: Optional[int] = None,
    num_checkpoints: int = 21,
    estimator: str = "auto",
    initial_point=None,
    reference=None,
    num_bootstrap: int = 50,
    progress_bar: bool = True,
    raise_on_violation: bool = False,
    seed: Optional[int] = 0,
    **kernel_kwargs,
) -> ConvergenceResult:
    r"""Run many chains of ``sampler`` on ``problem`` and compare their :math:`W_2` to the bound.

    :param problem: a :class:`~pyro_flat.theory.problems.GaussianProblem`,
        :class:`~pyro_flat.theory.problems.LogisticRegressionProblem` or another
        :class:`~pyro_flat.theory.problems.Problem` (the bound needs its constants).
    :param sampler: ``"sgld"``, ``"entropy_sgld"``, ``"local_entropy_sgld"``, ``"sgd"`` or the kernel
        class; ``kernel_kwargs`` (``step_size``, ``eta``, ``num_inner_steps``, ...) build it.
        Targets and bounds: SGLD → posterior (:func:`~pyro_flat.theory.sgld_w2_bound`),
        EntropySGLD → the joint (:func:`~pyro_flat.theory.entropy_mcmc_w2_bound`),
        LocalEntropySGLD → the flat posterior (:func:`~pyro_flat.theory.local_entropy_w2_bound`, its
        radius :math:`r` estimated from the ensemble: the largest root-mean-square distance to
        the reference mean), SGD → the mode (:func:`~pyro_flat.theory.sgd_bound`).
    :param num_chains: independent chains (vectorized; per-chain minibatches); at least 10.
    :param num_iterations: iterations per chain, all from ``initial_point`` (default: the
        problem's, zeros), the twins of EntropySGLD starting there too.
    :param batch_size: minibatch size (``None``: full batch); its gradient noise bound enters the bound.
    :param estimator: ``"gaussian"``, ``"marginal"``, ``"exact"``, ``"sliced"``
        (:func:`~pyro_flat.theory.empirical_w2`) or ``"auto"``: ``"gaussian"`` when the dimension
        is at most ``num_chains / 4``, else ``"marginal"`` (a lower bound of :math:`W_2` with a
        small floor: a violation it reports is real).
    :param reference: the target law as ``(mean, cov)`` or samples; default ``problem.reference``
        (closed form for Gaussians, a long :class:`~pyro_flat.EntropyHMC` run for logistic regression).
    :param raise_on_violation: raise :class:`ConvergenceError` instead of returning a failed result.
    :param seed: ``torch`` and bootstrap seed (``None``: leave the global RNG alone).
    :returns: a :class:`ConvergenceResult`; ``result.plot()`` draws the figure.
    :raises ValueError: fewer than 10 chains, a non-strongly-convex problem, unknown names.

    A step size above the admissible :math:`2/((m+M)T)` (of the joint, for EntropySGLD) does not
    raise: the chains run, ``result.bound`` is ``None``, ``result.passed`` is ``None`` and
    ``result.warnings`` says why (a :class:`UserWarning` is emitted too).

    Example::

        >>> import torch
        >>> from pyro_flat import check_convergence
        >>> from pyro_flat.theory.problems import GaussianProblem
        >>> problem = GaussianProblem(torch.diag(torch.tensor([1.0, 4.0])), mean=torch.ones(2))
        >>> result = check_convergence(problem, "entropy_sgld", eta=0.5, step_size=0.05,
        ...                            num_chains=200, num_iterations=100, progress_bar=False)
        >>> result.passed, result.target
        (True, 'joint')
    """
    _check_arguments(problem, num_chains, num_iterations)
    if estimator not in ("auto",) + METHODS:
        raise ValueError(f"estimator must be 'auto' or one of {METHODS}, got estimator={estimator!r}.")
    check_positive_int("num_checkpoints", num_checkpoints, minimum=2,
                       hint="The checkpoints include the start and the end, e.g. num_checkpoints=21.")
    check_positive_int("num_bootstrap", num_bootstrap, minimum=2,
                       hint="The bootstrap needs 2 resamples for a standard error, e.g. num_bootstrap=50.")
    seed = check_seed(seed)
    x0 = _initial_point(problem, initial_point)
    if seed is not None:
        torch.manual_seed(seed)
    kernel = _kernel(sampler, problem, batch_size, kernel_kwargs)
    target = _target_of(kernel)
    _check_fixed_metric(kernel)
    notes: List[str] = []
    if num_chains < FEW_CHAINS:
        notes.append(f"only {num_chains} chains: the W2 estimate has a large floor and wide error bars; "
                     f"use num_chains >= {FEW_CHAINS}.")
    dim = problem.dim * (2 if target == "joint" else 1)
    if estimator == "auto":
        estimator = "gaussian" if dim <= num_chains // 4 else "marginal"
    if reference is None:
        reference = reference_law(problem, target, getattr(kernel, "eta", None))
    checkpoints = np.unique(np.linspace(0, num_iterations, num_checkpoints).round().astype(int))

    t0 = time.perf_counter()
    states = run_ensemble(kernel, x0, num_chains, checkpoints, progress_bar=progress_bar)
    t_run = time.perf_counter() - t0

    factor = _metric_factor(kernel)
    whiten = (lambda x: x) if factor is None else _whitening(factor)
    if factor is not None:
        reference = whiten(reference)
        notes.append("preconditioned: W2 and its bound are measured in the metric's coordinates "
                     "y = L⁻¹z (M⁻¹ = LLᵀ), where the chain is plain Langevin on U(Ly).")
    ref_mean, ref_trace = _mean_and_trace(reference)
    start = np.concatenate([x0.numpy(), x0.numpy()]) if target == "joint" else x0.numpy().astype(float)
    start = whiten(start[None])[0]
    initial_w2 = math.sqrt(float(((start - ref_mean) ** 2).sum()) + ref_trace)
    ensembles = [whiten(_ensemble_view(states[k], target)) for k in checkpoints]
    w2, se, floor, radius = _estimate_w2(ensembles, target, reference, ref_mean, estimator,
                                         num_bootstrap, 0 if seed is None else seed)
    t_est = time.perf_counter() - t0 - t_run

    bound, terms, constants = None, {}, {}
    try:
        b = _bound(kernel, target, problem, checkpoints, initial_w2, batch_size, radius, factor)
    except ValueError as err:
        notes.append(f"no bound: {err}")
        warnings.warn(f"check_convergence: {err}", UserWarning, stacklevel=2)
    else:
        bound, constants = b.total, dict(b.constants)
        terms = {"contraction_at_0": float(b.contraction[0]), "discretization": b.discretization,
                 "gradient_bias": b.gradient_bias, "gradient_noise": b.gradient_noise,
                 "asymptote": b.asymptote}
        if target == "flat":
            notes.append(f"the local-entropy bound uses the radius r = {radius:.4g} measured on the "
                         "ensemble (largest RMS distance to the reference mean), a plug-in.")
    base = ("m", "M") if factor is None else ("m_unpreconditioned", "M_unpreconditioned")
    constants.update({base[0]: problem.constants()[0], base[1]: problem.constants()[1],
                      "gradient_noise_bound": problem.gradient_noise(batch_size)})

    exact = None
    if isinstance(problem, GaussianProblem) and batch_size is None and type(kernel) in TARGET_OF:
        # only for pyro-flat's own updates, whose exact law is known
        chain = exact_chain(problem, kernel)
        if factor is None:
            exact = problem.exact_w2(chain, target, checkpoints, x0, getattr(kernel, "eta", None))
        else:  # the same chain seen in y = L⁻¹z, against the whitened reference
            exact = chain.whitened(factor).w2_trajectory(start, np.zeros((len(start),) * 2), checkpoints, reference)

    result = ConvergenceResult(
        sampler=type(kernel).__name__, target=target, estimator=estimator if target != "mode" else "rms distance",
        num_chains=num_chains, iterations=checkpoints, grad_evals=checkpoints * kernel.grads_per_iteration,
        w2=w2, w2_stderr=se, w2_floor=floor, bound=bound, bound_terms=terms, constants=constants,
        exact_w2=exact, warnings=notes, wall_time={"sampling": t_run, "estimation": t_est},
    )
    if bound is not None:
        lower = result.w2_debiased - 3.0 * se
        result.violations = [int(k) for k, lo, b in zip(checkpoints, lower, bound) if lo > b]
    if raise_on_violation and result.passed is False:
        raise ConvergenceError(str(result), result)
    return result


def _check_arguments(problem, num_chains, num_iterations) -> None:
    if not isinstance(problem, Problem):
        raise TypeError(
            f"problem must be a pyro_flat.theory.problems.Problem (GaussianProblem, "
            f"LogisticRegressionProblem), got {type(problem).__name__}: the bound needs the "
            "problem's strong-convexity constants, which a bare Pyro model does not state.")
    if isinstance(num_chains, bool) or not isinstance(num_chains, int) or num_chains < MIN_CHAINS:
        raise ValueError(f"num_chains={num_chains!r} is too few for a W2 estimate: the ensemble of "
                         f"chains is the sample of the chain's law. Use num_chains >= {FEW_CHAINS} "
                         f"(at least {MIN_CHAINS}).")
    if isinstance(num_iterations, bool) or not isinstance(num_iterations, int) or num_iterations < 1:
        raise ValueError(f"num_iterations must be an integer >= 1, got {num_iterations!r}.")
    problem.constants()  # raises for a non-strongly-convex problem before any work


def _initial_point(problem, initial_point) -> torch.Tensor:
    """The chains' common start: ``problem.initial_point()`` or ``initial_point``, a finite ``(dim,)`` point."""
    if initial_point is None:
        return torch.as_tensor(problem.initial_point(), dtype=torch.get_default_dtype()).reshape(problem.dim)
    try:
        x0 = torch.as_tensor(initial_point, dtype=torch.get_default_dtype())
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"initial_point must be a tensor of shape ({problem.dim},), got "
                        f"{type(initial_point).__name__} initial_point={initial_point!r}.") from err
    if x0.numel() != problem.dim:
        raise ValueError(f"initial_point has shape {tuple(x0.shape)}, but the problem has dimension "
                         f"{problem.dim}: pass one point of shape ({problem.dim},), shared by every chain.")
    if not torch.isfinite(x0).all():
        raise ValueError(f"initial_point holds NaN or inf: {x0.reshape(-1).tolist()}; pass a finite point "
                         f"of shape ({problem.dim},), or None for the problem's own.")
    return x0.reshape(problem.dim)


def _mean_and_trace(reference):
    """The reference law's mean and the trace of its covariance, from ``(mean, cov)`` or draws."""
    if isinstance(reference, tuple):
        return np.asarray(reference[0], dtype=float), float(np.trace(reference[1]))
    ref = np.asarray(reference, dtype=float)
    return ref.mean(0), float(ref.var(0).sum())


def _ensemble_view(params, target: str) -> np.ndarray:
    """``(chains, d)`` θ, or ``(chains, 2d)`` (θ, θa) for the joint."""
    theta = params[SITE].double().numpy()
    if target == "joint":
        return np.concatenate([theta, params[SITE + "_aux"].double().numpy()], 1)
    return theta


def _estimate_w2(ensembles, target, reference, ref_mean, estimator, num_bootstrap, seed):
    """``W2`` with its bootstrap stderr at each checkpoint, the estimator's floor, and the largest
    root-mean-square distance of the ensemble to the reference mean (the local-entropy radius)."""
    w2, se, floor, radius = [], [], 0.0, 0.0
    if target != "mode":
        w2_of = W2Estimator(reference, method=estimator, num_bootstrap=num_bootstrap, seed=seed)
    for i, x in enumerate(ensembles):
        radius = max(radius, math.sqrt(float(((x - ref_mean) ** 2).sum(1).mean())))
        est = _distance_to_point(x, ref_mean, num_bootstrap, seed + i) if target == "mode" else w2_of(x)
        floor = est.floor
        w2.append(est.value)
        se.append(est.stderr)
    return np.array(w2), np.array(se), floor, radius


def _distance_to_point(x, point, num_bootstrap: int, seed: int) -> W2Estimate:
    """:math:`W_2` to a point mass: the ensemble's root-mean-square distance (exact for the
    ensemble), its bootstrap stderr, and as floor the float rounding of the chains' arithmetic."""
    dist = np.sqrt(((x - point) ** 2).sum(1).mean())
    boot = np.random.default_rng(seed)
    draws = [np.sqrt(((x[j] - point) ** 2).sum(1).mean())
             for j in boot.integers(0, len(x), (num_bootstrap, len(x)))]
    rounding = 8 * torch.finfo(torch.get_default_dtype()).eps * math.sqrt(float((point**2).sum()) + len(point))
    return W2Estimate(float(dist), float(np.std(draws, ddof=1)), "rms distance", len(x), floor=rounding)
