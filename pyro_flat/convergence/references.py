r"""Reference laws that need a kernel: they sit above :mod:`pyro_flat.kernels` and :mod:`pyro_flat.theory`.

- :func:`exact_chain`: the exact :class:`~pyro_flat.theory.LinearGaussianChain` of one of
  pyro-flat's full-batch kernels on a :class:`~pyro_flat.theory.GaussianProblem` (the kernel's
  settings, read off the kernel, enter the closed-form recursion of :mod:`pyro_flat.theory.gaussian`).
- :func:`reference_draws`: draws of the Entropy-MCMC joint of a
  :class:`~pyro_flat.theory.LogisticRegressionProblem` by :class:`~pyro_flat.EntropyHMC`
  (exact, Metropolis-corrected), stored on the problem so ``problem.reference(...)`` can use them.
- :func:`reference_law`: ``problem.reference(target, eta)``, drawing the logistic reference first.
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch

from ..kernels import SGD, SGLD, EntropyHMC, EntropySGLD, LocalEntropySGLD
from ..infer.mcmc import MCMC
from ..theory import (
    GaussianProblem,
    LinearGaussianChain,
    LogisticRegressionProblem,
    Problem,
    entropy_langevin_chain,
    langevin_chain,
    local_entropy_chain,
)
from ..theory.problems import SITE


def exact_chain(problem: GaussianProblem, kernel) -> LinearGaussianChain:
    """The exact law of ``kernel``'s full-batch chain on ``problem``, one iteration at a time
    (with the kernel's frozen preconditioner of chain 0, once it has one: after a run).

    >>> import torch
    >>> from pyro_flat import SGLD
    >>> problem = GaussianProblem(torch.eye(2))
    >>> exact_chain(problem, SGLD(potential_fn=problem.potential_fn(), step_size=0.1)).B.shape
    (2, 2)
    """
    T, alpha = kernel.temperature, kernel.step_size
    metric = None if kernel.preconditioner is None else kernel.preconditioner.covariance(0).double().cpu().numpy()
    if isinstance(kernel, LocalEntropySGLD):
        return local_entropy_chain(problem.A, problem.mean, kernel.eta, alpha,
                                   num_inner_steps=kernel.num_inner_steps,
                                   inner_step_size=kernel.inner_step_size,
                                   mean_weight=kernel.mean_weight, temperature=T,
                                   outer_noise=kernel.outer_noise)
    if isinstance(kernel, EntropySGLD):
        return entropy_langevin_chain(problem.A, problem.mean, kernel.eta, alpha, T, preconditioner=metric)
    if isinstance(kernel, (SGLD, SGD)):
        return langevin_chain(problem.A, problem.mean, alpha, T, preconditioner=metric)
    raise TypeError(f"no exact Gaussian law for {type(kernel).__name__}.")


def reference_draws(problem: LogisticRegressionProblem, eta: float, *, num_chains: int = 4,
                    num_samples: int = 1000, warmup_steps: int = 300,
                    progress_bar: bool = False) -> Dict[str, np.ndarray]:
    """``{"theta", "theta_aux"}`` draws ``(num_chains * num_samples, d)`` of the Entropy-MCMC joint
    by :class:`~pyro_flat.EntropyHMC` (full batch, Hessian metric, vectorized chains, started at
    the MAP), stored on ``problem`` per ``eta``. ``theta`` follows the posterior, ``theta_aux``
    the flat one."""
    stored = problem.stored_reference(eta)
    if stored is not None:
        return stored
    kernel = EntropyHMC(potential_fn=problem.potential_fn(None), eta=eta, full_mass="hessian",
                        temperature=problem.temperature)
    start = torch.as_tensor(problem.mode(), dtype=problem.X.dtype)
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup_steps, num_chains=num_chains,
                initial_params={SITE: start.expand(num_chains, -1).clone()},
                disable_progbar=not progress_bar, chain_method="vectorized")
    mcmc.run()
    draws = {k: v.double().numpy() for k, v in mcmc.get_samples().items()}
    problem.store_reference(eta, draws)
    return draws


def reference_law(problem: Problem, target: str, eta: Optional[float] = None):
    """``problem.reference(target, eta)``; for logistic regression the EntropyHMC draws are made
    first (:func:`reference_draws`) when the problem has none for this ``eta``."""
    if isinstance(problem, LogisticRegressionProblem) and target != "mode":
        reference_draws(problem, problem.reference_eta(eta))
    return problem.reference(target, eta)
