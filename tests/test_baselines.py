"""SGD, LocalEntropySGD and LocalEntropySGLD: each kernel's law after K steps equals the exact
linear-Gaussian recursion of its documented update (pyro_flat.theory.gaussian), gradient
evaluations are counted, and bad arguments are refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import pyro
import pyro.distributions as dist
from pyro_flat import MCMC, SGD, SGLD, EntropySGLD, LocalEntropySGD, LocalEntropySGLD
from pyro_flat.convergence import run_ensemble
from pyro_flat.convergence.references import exact_chain
from pyro_flat.diagnostics import mcmc_sample_stats
from pyro_flat.theory.problems import GaussianProblem

A = torch.tensor([[2.0, 0.6], [0.6, 1.0]])
MU = torch.tensor([1.0, -1.0])
CHAINS = 4000


def ensemble_z_scores(x: np.ndarray, mean: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """z-scores of the ensemble mean and covariance entries against N(mean, cov), exact for
    independent Gaussian draws: Var(x̄_i) = S_ii/n, Var(Ŝ_ij) = (S_ii S_jj + S_ij^2)/n."""
    n = len(x)
    z = list((x.mean(0) - mean) / np.sqrt(np.diag(cov) / n))
    c = x - mean
    for i in range(len(mean)):
        for j in range(i, len(mean)):
            se = math.sqrt((cov[i, i] * cov[j, j] + cov[i, j] ** 2) / n)
            z.append(((c[:, i] * c[:, j]).mean() - cov[i, j]) / se)
    return np.abs(np.array(z))


KERNELS = {
    "sgld": lambda fn: SGLD(potential_fn=fn, step_size=0.1),
    "sgd": lambda fn: SGD(potential_fn=fn, step_size=0.1),
    "entropy_sgld": lambda fn: EntropySGLD(potential_fn=fn, eta=0.5, step_size=0.1),
    "local_entropy_sgld": lambda fn: LocalEntropySGLD(potential_fn=fn, eta=0.5, step_size=0.2,
                                                      inner_step_size=0.1, num_inner_steps=4, mean_weight=0.3),
    "local_entropy_sgd": lambda fn: LocalEntropySGD(potential_fn=fn, eta=0.5, step_size=0.2,
                                                    inner_step_size=0.1, num_inner_steps=4, mean_weight=0.3,
                                                    temperature=0.5),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_law_matches_its_exact_gaussian_recursion(name):
    torch.manual_seed(0)
    problem = GaussianProblem(A, MU)
    kernel = KERNELS[name](problem.potential_fn())
    x0 = torch.tensor([3.0, 2.0])
    K = 6
    states = run_ensemble(kernel, x0, CHAINS, [K], progress_bar=False)[K]
    x = states["theta"].double().numpy()
    chain = exact_chain(problem, kernel)
    p = chain.B.shape[0]
    mean, cov = (np.concatenate([x0.numpy()] * (p // 2)) if p > 2 else x0.numpy()).astype(float), np.zeros((p, p))
    for _ in range(K):
        mean, cov = chain.step(mean, cov)
    if p > 2:
        x = np.concatenate([x, states["theta_aux"].double().numpy()], 1)
    if name == "sgd":  # deterministic: the iterate itself
        assert np.allclose(x, mean, atol=1e-5)
        return
    z = ensemble_z_scores(x, mean, cov)
    assert z.max() < 4.5, f"{name}: moments off by {z.max():.1f} sd ({np.round(z, 1)})"


def test_a_wrong_mean_weight_is_seen():
    """The check above can fail: the kernel with a = 0.3 against the recursion with a = 0.6."""
    torch.manual_seed(0)
    problem = GaussianProblem(A, MU)
    kernel = KERNELS["local_entropy_sgld"](problem.potential_fn())
    x0 = torch.tensor([3.0, 2.0])
    x = run_ensemble(kernel, x0, CHAINS, [6], progress_bar=False)[6]["theta"].double().numpy()
    kernel.mean_weight = 0.6
    chain = exact_chain(problem, kernel)
    mean, cov = x0.numpy().astype(float), np.zeros((2, 2))
    for _ in range(6):
        mean, cov = chain.step(mean, cov)
    assert ensemble_z_scores(x, mean, cov).max() > 6


def model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", len(y), subsample_size=10) as idx:
        pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


@pytest.mark.parametrize("chain_method", ["vectorized", "sequential"])
def test_gradient_evaluations_are_counted(chain_method):
    pyro.set_rng_seed(0)
    y = torch.randn(100) + 3.0
    for kernel, per_iter in ((LocalEntropySGLD(model, eta=0.1, step_size=1e-2, inner_step_size=1e-3,
                                               num_inner_steps=5), 5),
                             (SGLD(model, step_size=1e-3), 1), (SGD(model, step_size=1e-3), 1),
                             (EntropySGLD(model, eta=0.1, step_size=1e-3), 1)):
        mcmc = MCMC(kernel, num_samples=30, warmup_steps=20, num_chains=2, chain_method=chain_method,
                    disable_progbar=True)
        mcmc.run(y)
        stats = mcmc_sample_stats(mcmc)
        expected = per_iter * (20 + torch.arange(1, 31, dtype=torch.float))
        assert torch.equal(stats["grad_evals"][0].float(), expected), type(kernel).__name__
        assert kernel.num_grad_evals == per_iter * 50


def test_local_entropy_sgld_through_pyro_matches_its_exact_stationary_law():
    """Through Pyro's driver on a conjugate model (posterior N(m, v)): the draws follow the exact
    stationary law of the recursion, a widened flat posterior (finite L inflates it: 1.48 (v + eta)
    here, the bias the local-entropy bound's term A accounts for)."""
    from pyro_flat.theory import local_entropy_chain

    pyro.set_rng_seed(1)
    y = torch.randn(20) + 2.0

    def full(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        with pyro.plate("data", len(y)):
            pyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    eta, precision = 0.2, len(y) + 0.01
    post_mean = float(y.sum()) / precision
    kernel = LocalEntropySGLD(full, eta=eta, step_size=0.05, inner_step_size=0.01,
                              num_inner_steps=10, mean_weight=0.2)
    chain = local_entropy_chain(np.array([[precision]]), np.zeros(1), eta, 0.05, num_inner_steps=10,
                                inner_step_size=0.01, mean_weight=0.2)
    mean, cov = np.zeros(1), np.zeros((1, 1))
    for _ in range(2000):
        mean, cov = chain.step(mean, cov)
    stationary_var = float(cov[0, 0])
    assert 1.3 < stationary_var / (1 / precision + eta) < 1.7
    mcmc = MCMC(kernel, num_samples=1500, warmup_steps=100, num_chains=8, disable_progbar=True)
    mcmc.run(y)
    mu = mcmc.get_samples(group_by_chain=True)["mu"].numpy()
    import arviz as az

    ess = float(az.ess(mu, method="mean"))
    assert abs(mu.mean() - post_mean) < 4.5 * math.sqrt(stationary_var / ess)
    ess_sq = float(az.ess((mu - post_mean) ** 2, method="mean"))
    assert abs(mu.var() / stationary_var - 1) < 4.5 * math.sqrt(2 / ess_sq)


def test_bad_arguments_are_refused():
    fn = GaussianProblem(A, MU).potential_fn()
    with pytest.raises(ValueError, match="num_inner_steps"):
        LocalEntropySGLD(potential_fn=fn, eta=0.1, step_size=0.1, num_inner_steps=0)
    with pytest.raises(ValueError, match="mean_weight"):
        LocalEntropySGLD(potential_fn=fn, eta=0.1, step_size=0.1, mean_weight=1.5)
    with pytest.raises(ValueError, match="eta"):
        LocalEntropySGD(potential_fn=fn, eta=0.0, step_size=0.1)
    with pytest.raises(ValueError, match="inner_step_size"):
        LocalEntropySGLD(potential_fn=fn, eta=0.1, step_size=0.1, inner_step_size=-1.0)
    with pytest.raises(ValueError, match="SGD has no temperature"):
        SGD(potential_fn=fn, step_size=0.1, temperature=1.0)
    with pytest.raises(ValueError, match="step_size"):
        SGD(potential_fn=fn, step_size=0.0)
