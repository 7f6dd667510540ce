"""check_convergence: passes a correct sampler, fails a biased one, and says what is wrong with
bad input (issue 4)."""

from __future__ import annotations


import matplotlib

matplotlib.use("Agg")
import numpy as np
import pytest
import torch

from pyro_flat import ConvergenceError, EntropySGLD, check_convergence
from pyro_flat.kernels.integrators import langevin_step
from pyro_flat.theory.problems import GaussianProblem, LogisticRegressionProblem

A = torch.tensor([[3.0, 1.0], [1.0, 2.0]])
MU = torch.tensor([1.0, -2.0])


class NoisyEntropySGLD(EntropySGLD):
    """Entropy-MCMC with 4x the Langevin noise: targets a law 16x too wide."""

    def update(self, params, grads, step_size, temperature):
        return langevin_step(params, grads, step_size, 16.0 * self.temperature)


@pytest.fixture
def problem():
    return GaussianProblem(A, MU)


def test_correct_sampler_passes_and_tracks_the_exact_w2(problem):
    result = check_convergence(problem, "entropy_sgld", eta=0.3, step_size=0.04, num_chains=1000,
                               num_iterations=200, progress_bar=False)
    assert result.passed is True and result.violations == []
    assert result.target == "joint" and result.estimator == "gaussian"
    # the ensemble estimate follows the exact distance (floor removed), checkpoint by checkpoint
    err = np.abs(result.w2_debiased - result.exact_w2)
    assert (err < 4 * result.w2_stderr + result.w2_floor).all(), np.c_[result.w2_debiased, result.exact_w2]
    assert result.bound[0] >= result.w2[0] and np.all(np.diff(result.bound) <= 0)
    assert result.grad_evals[-1] == 200
    fig = result.plot()
    assert len(fig.axes[0].lines) >= 3
    assert "within the bound" in str(result)


def test_biased_sampler_fails_the_check(problem):
    kwargs = dict(eta=0.3, step_size=0.002, num_chains=1000, num_iterations=3000, progress_bar=False)
    result = check_convergence(problem, NoisyEntropySGLD, **kwargs)
    assert result.target == "joint" and result.exact_w2 is None  # a subclass: its law is unknown
    assert result.passed is False and result.violations
    assert result.violations[-1] == 3000
    with pytest.raises(ConvergenceError, match="VIOLATES") as info:
        check_convergence(problem, NoisyEntropySGLD, raise_on_violation=True, **kwargs)
    assert info.value.result.passed is False
    # the same settings with the right noise pass
    assert check_convergence(problem, "entropy_sgld", **kwargs).passed is True


@pytest.mark.parametrize("sampler,kwargs,target", [
    ("sgld", dict(step_size=0.1), "posterior"),
    ("local_entropy_sgld", dict(eta=0.3, step_size=0.1, inner_step_size=0.05, num_inner_steps=5), "flat"),
    ("sgd", dict(step_size=0.1), "mode"),
])
def test_each_sampler_is_checked_against_its_own_target(problem, sampler, kwargs, target):
    result = check_convergence(problem, sampler, num_chains=400, num_iterations=150,
                               progress_bar=False, **kwargs)
    assert result.target == target and result.passed is True
    assert abs(result.w2_debiased[-1] - result.exact_w2[-1]) < 4 * result.w2_stderr[-1] + result.w2_floor + 1e-6


def test_logistic_regression_with_minibatches_and_an_entropy_hmc_reference():
    torch.manual_seed(0)
    X = torch.randn(60, 3)
    y = (torch.rand(60) < torch.sigmoid(X @ torch.tensor([1.0, -1.0, 0.5]))).float()
    problem = LogisticRegressionProblem(X, y, prior_precision=1.0)
    m, M = problem.constants()
    result = check_convergence(problem, "sgld", step_size=0.5 / (m + M), batch_size=10,
                               num_chains=200, num_iterations=300, progress_bar=False)
    assert result.passed is True
    assert result.constants["gradient_noise_bound"] > 0
    assert result.bound_terms["gradient_noise"] > 0
    assert result.w2[-1] < 0.5 * result.w2[0]  # it converges
    # independent minibatches per chain: two chains at one point see different gradients
    fn = problem.potential_fn(batch_size=10)
    theta = torch.zeros(2, problem.dim, requires_grad=True)
    grad, = torch.autograd.grad(fn({"theta": theta}).sum(), theta)
    assert not torch.allclose(grad[0], grad[1])


def test_bad_input_is_explained(problem):
    with pytest.raises(ValueError, match="prior_precision must be > 0"):
        LogisticRegressionProblem(torch.randn(10, 2), torch.ones(10), prior_precision=0.0)
    with pytest.raises(ValueError, match="too few for a W2 estimate"):
        check_convergence(problem, "sgld", step_size=0.1, num_chains=5, progress_bar=False)
    with pytest.raises(TypeError, match="strong-convexity constants"):
        check_convergence(lambda: None, "sgld", step_size=0.1)
    with pytest.raises(ValueError, match="unknown sampler"):
        check_convergence(problem, "hmc", step_size=0.1)
    with pytest.raises(ValueError, match="optimiser of the local entropy"):
        check_convergence(problem, "local_entropy_sgd", eta=0.3, step_size=0.1, progress_bar=False)
    with pytest.raises(ValueError, match="positive definite"):
        GaussianProblem(torch.diag(torch.tensor([1.0, 0.0])))
    # a step above 2/(m+M): the chains run, the result says why there is no bound
    with pytest.warns(UserWarning, match="admissible"):
        result = check_convergence(problem, "sgld", step_size=0.6, num_chains=20, num_iterations=20,
                                   progress_bar=False)
    assert result.bound is None and result.passed is None
    assert any("admissible" in w for w in result.warnings)
    assert any("only 20 chains" in w for w in result.warnings)
    assert "no bound" in str(result)
