r"""Convergence theory for flat posteriors on strongly convex problems.

- :mod:`~pyro_flat.theory.constants`: :math:`(m, M)` of Bayesian logistic regression, of the
  Entropy-MCMC joint and of the local entropy; admissible step sizes; minibatch gradient noise.
- :mod:`~pyro_flat.theory.bounds`: the 2-Wasserstein bounds (Dalalyan & Karagulyan's form) for
  Entropy-MCMC, SGLD, SGD and the local-entropy methods.
- :mod:`~pyro_flat.theory.gaussian`: the exact law of each chain on a Gaussian target and the
  closed-form Gaussian :math:`W_2`.
- :mod:`~pyro_flat.theory.estimators`: empirical :math:`W_2` (Gaussian/Bures, exact optimal
  transport, sliced) with bootstrap error bars.

- :mod:`~pyro_flat.theory.problems`: Gaussian and logistic-regression problems with their
  constants and reference laws.

:func:`pyro_flat.check_convergence` puts them together.
"""

from .bounds import (
    W2Bound,
    entropy_mcmc_w2_bound,
    langevin_w2_bound,
    local_entropy_gradient_error,
    local_entropy_w2_bound,
    sgd_bound,
    sgld_w2_bound,
)
from .constants import (
    admissible_step_size,
    check_step_size,
    joint_constants,
    joint_hessian,
    local_entropy_constants,
    logistic_gradient_noise,
    logistic_regression_constants,
    preconditioned_constants,
)
from .estimators import W2Estimate, W2Estimator, empirical_w2
from .problems import GaussianProblem, LogisticRegressionProblem, Problem
from .gaussian import (
    LinearGaussianChain,
    entropy_langevin_chain,
    gaussian_targets,
    gaussian_w2,
    langevin_chain,
    local_entropy_chain,
)

__all__ = [
    "logistic_regression_constants",
    "joint_constants",
    "joint_hessian",
    "preconditioned_constants",
    "local_entropy_constants",
    "admissible_step_size",
    "check_step_size",
    "logistic_gradient_noise",
    "W2Bound",
    "langevin_w2_bound",
    "sgld_w2_bound",
    "sgd_bound",
    "entropy_mcmc_w2_bound",
    "local_entropy_gradient_error",
    "local_entropy_w2_bound",
    "gaussian_w2",
    "gaussian_targets",
    "LinearGaussianChain",
    "langevin_chain",
    "entropy_langevin_chain",
    "local_entropy_chain",
    "W2Estimate",
    "Problem",
    "GaussianProblem",
    "LogisticRegressionProblem",
    "W2Estimator",
    "empirical_w2",
]
