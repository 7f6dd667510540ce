"""Minibatch SGLD / EntropySGLD on Bayesian linear regression against the analytic posterior.

N = 2000, B = 100. The posterior is N(m, P⁻¹), P = XᵀX/σ² + I/τ². SGLD's stationary covariance
with constant gradient-noise covariance C solves the discrete Lyapunov equation
Σ = (I - αP) Σ (I - αP)ᵀ + 2αI + α²C; with C the without-replacement minibatch covariance at m
this gives the sampler's known bias, which must stay below one Monte-Carlo sd (see moments.py).
"""

import numpy as np
import pytest
import torch

import pyro
import pyro.distributions as dist
from pyro.infer import MCMC
from pyro_flat import MCMC as VectorizedMCMC
from pyro_flat import SGLD, EntropySGLD

from moments import assert_moments, minibatch_noise_covariance, sgld_stationary_covariance

N, D, B, SIGMA, TAU = 2000, 3, 100, 1.0, 1.0
STEP = 3e-6


def data():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(N, D, generator=g, dtype=torch.float64)
    w = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    y = X @ w + SIGMA * torch.randn(N, generator=g, dtype=torch.float64)
    return X, y


def model(X, y):
    w = pyro.sample("w", dist.Normal(torch.zeros(D, dtype=X.dtype), TAU).to_event(1))
    with pyro.plate("data", X.shape[0], subsample_size=B) as idx:
        # (B, D) data against w (D,), or per chain (C, B, D) against (C, 1, D)
        pyro.sample("y", dist.Normal((X[idx] * w).sum(-1), SIGMA), obs=y[idx])


def posterior(X, y):
    P = X.T @ X / SIGMA**2 + torch.eye(D, dtype=X.dtype) / TAU**2
    cov = torch.linalg.inv(P)
    return (cov @ X.T @ y / SIGMA**2).numpy(), cov.numpy(), P.numpy()


def sgld_bias(X, y, mean, cov, P, step=STEP):
    resid = (y - X @ torch.as_tensor(mean)).numpy()
    g = X.numpy() * resid[:, None] / SIGMA**2  # per-datum likelihood gradients at the mean
    return sgld_stationary_covariance(P, step, minibatch_noise_covariance(g, N, B)) - cov


@pytest.mark.parametrize("driver", ["pyro", "vectorized"])
def test_sgld_minibatch_matches_analytic_posterior(driver):
    """Through Pyro's driver, and as vectorized chains that each draw their own minibatches: each
    chain's law is the one-chain law."""
    X, y = data()
    mean, cov, P = posterior(X, y)
    bias = sgld_bias(X, y, mean, cov, P)
    assert np.abs(bias).max() > 0  # the bias is real, and accounted for below
    pyro.set_rng_seed(1)
    driver_class = MCMC if driver == "pyro" else VectorizedMCMC
    mcmc = driver_class(SGLD(model, step_size=STEP, init_strategy=pyro.infer.autoguide.init_to_median),
                        num_samples=12_000, warmup_steps=1_000, num_chains=2, disable_progbar=True)
    mcmc.run(X, y)
    if driver == "vectorized":
        assert mcmc.chain_method == "vectorized" and mcmc.minibatches == "per_chain"
    w = mcmc.get_samples(group_by_chain=True)["w"].numpy()
    assert_moments(w, mean, cov, known_bias=bias)
    sd = w.reshape(-1, D).std(0)
    assert np.allclose(sd, np.sqrt(np.diag(cov)), rtol=0.2)  # a readable cross-check


@pytest.mark.parametrize("jit_compile", [False, True])
def test_entropy_sgld_minibatch_theta_marginal_and_coupling(jit_compile):
    """θ keeps the posterior; θa - θ ~ N(0, η) per coordinate, independent of the minibatch; the
    same through the compiled graph (the minibatch indices are its input)."""
    X, y = data()
    mean, cov, P = posterior(X, y)
    eta = 1e-3
    pyro.set_rng_seed(2)
    kernel = EntropySGLD(model, eta=eta, step_size=STEP, init_strategy=pyro.infer.autoguide.init_to_median,
                         jit_compile=jit_compile)
    mcmc = MCMC(kernel, num_samples=12_000, warmup_steps=1_000, num_chains=2, disable_progbar=True)
    mcmc.run(X, y)
    assert kernel.is_compiled == jit_compile
    s = mcmc.get_samples(group_by_chain=True)
    w, w_aux = s["w"].numpy(), s["w_aux"].numpy()
    # theta marginal: SGLD bias on the joint is computed the same way, on the joint Hessian
    eye = np.eye(D)
    H = np.block([[P + eye / eta, -eye / eta], [-eye / eta, eye / eta]])
    resid = (y - X @ torch.as_tensor(mean)).numpy()
    g = X.numpy() * resid[:, None] / SIGMA**2
    C = np.zeros((2 * D, 2 * D))
    C[:D, :D] = minibatch_noise_covariance(g, N, B)
    sigma = sgld_stationary_covariance(H, STEP, C)
    joint_cov = np.block([[cov, cov], [cov, cov + eta * eye]])
    x = np.concatenate([w, w_aux], -1)
    assert_moments(x, np.concatenate([mean, mean]), joint_cov, known_bias=sigma - joint_cov)
