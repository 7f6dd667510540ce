"""SGLD and EntropySGLD on a Gaussian target against the closed form (docs/theory.md, section 1).

f(θ) = ½(θ-μ)ᵀA(θ-μ)  ⇒  θ ~ N(μ, A⁻¹),  θa ~ N(μ, A⁻¹ + ηI),  Cov(θ, θa) = A⁻¹.

The step size is chosen so that the Euler discretisation bias, computed exactly from the chain's
linear recursion (stationary covariance in each eigen-direction λ of the joint Hessian is
1 / (λ (1 - αλ/2))), stays below a quarter of the Monte-Carlo tolerance; the test asserts this too.
"""

import numpy as np
import pytest
import torch

import pyro
import pyro.distributions as dist
from pyro.infer import MCMC
from pyro_flat import SGLD, EntropySGLD
from pyro_flat.kernels.integrators import langevin_step

from moments import assert_moments, moment_errors

D, ETA, STEP = 5, 0.3, 0.015
NUM_SAMPLES, WARMUP, CHAINS = 12_000, 500, 2


def _problem():
    g = torch.Generator().manual_seed(1)
    Q, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64))
    A = Q @ torch.diag(torch.linspace(2.0, 4.0, D, dtype=torch.float64)) @ Q.T
    mu = torch.linspace(-1.0, 1.0, D, dtype=torch.float64)
    return A, mu


A, MU = _problem()
COV = torch.linalg.inv(A)
SCALE_TRIL = torch.linalg.cholesky(COV).float()


def gaussian_model():
    pyro.sample("theta", dist.MultivariateNormal(MU.float(), scale_tril=SCALE_TRIL))


def joint_truth():
    eye = torch.eye(D, dtype=torch.float64)
    cov = torch.cat([torch.cat([COV, COV], 1), torch.cat([COV, COV + ETA * eye], 1)], 0)
    return torch.cat([MU, MU]).numpy(), cov.numpy()


def discrete_bias(hessian: torch.Tensor, step: float = STEP) -> np.ndarray:
    """Σ_α - Σ for the ULA chain on ½zᵀHz (exact, from the eigen-decomposition)."""
    lam, V = torch.linalg.eigh(hessian)
    exact = V @ torch.diag(1 / lam) @ V.T
    discrete = V @ torch.diag(1 / (lam * (1 - step * lam / 2))) @ V.T
    return (discrete - exact).numpy()


def joint_hessian() -> torch.Tensor:
    eye = torch.eye(D, dtype=torch.float64)
    return torch.cat([torch.cat([A + eye / ETA, -eye / ETA], 1), torch.cat([-eye / ETA, eye / ETA], 1)], 0)


def run(kernel):
    mcmc = MCMC(kernel, num_samples=NUM_SAMPLES, warmup_steps=WARMUP, num_chains=CHAINS,
                disable_progbar=True)
    mcmc.run()
    return mcmc.get_samples(group_by_chain=True)


def test_sgld_matches_gaussian():
    s = run(SGLD(gaussian_model, step_size=STEP))
    assert_moments(s["theta"].double().numpy(), MU.numpy(), COV.numpy(), known_bias=discrete_bias(A))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_entropy_sgld_matches_joint_gaussian(jit_compile):
    kernel = EntropySGLD(gaussian_model, eta=ETA, step_size=STEP, jit_compile=jit_compile)
    s = run(kernel)
    assert kernel.is_compiled == jit_compile
    x = torch.cat([s["theta"], s["theta_aux"]], -1).double().numpy()
    mean, cov = joint_truth()
    assert_moments(x, mean, cov, known_bias=discrete_bias(joint_hessian()))


class SqrtTwoNoiseBug(EntropySGLD):
    """The update with noise sqrt(4αT) instead of sqrt(2αT): a classic convention slip."""

    def update(self, params, grads, step_size, temperature):
        return langevin_step(params, grads, step_size, 2 * self.temperature)


def test_injected_noise_bug_is_caught():
    s = run(SqrtTwoNoiseBug(gaussian_model, eta=ETA, step_size=STEP))
    x = torch.cat([s["theta"], s["theta_aux"]], -1).double().numpy()
    mean, cov = joint_truth()
    z_mean, z_cov, _ = moment_errors(x, mean, cov)
    assert np.abs(z_cov).max() > 2 * 4.5  # fails by a wide margin, not by luck
    with pytest.raises(AssertionError, match="Monte-Carlo sd"):
        assert_moments(x, mean, cov)


def test_potential_fn_path_matches_joint_gaussian():
    A32, mu32 = A.float(), MU.float()

    def potential(p):
        r = p["theta"] - mu32
        return 0.5 * r @ (A32 @ r)

    kernel = EntropySGLD(potential_fn=potential, eta=ETA, step_size=STEP)
    mcmc = MCMC(kernel, num_samples=NUM_SAMPLES, warmup_steps=WARMUP, num_chains=CHAINS,
                initial_params={"theta": torch.zeros(CHAINS, D)}, disable_progbar=True)
    mcmc.run()
    s = mcmc.get_samples(group_by_chain=True)
    x = torch.cat([s["theta"], s["theta_aux"]], -1).double().numpy()
    mean, cov = joint_truth()
    assert_moments(x, mean, cov, known_bias=discrete_bias(joint_hessian()))


def test_temperature_tempers_the_whole_joint():
    """At temperature T the joint is exp(-U/T): every covariance above scales by T."""
    T, lam, eta, step = 0.5, 2.0, 0.4, 0.02

    def potential(p):
        return 0.5 * lam * (p["x"] ** 2).sum()

    kernel = EntropySGLD(potential_fn=potential, eta=eta, step_size=step, temperature=T)
    mcmc = MCMC(kernel, num_samples=20_000, warmup_steps=300, num_chains=2,
                initial_params={"x": torch.zeros(2, 2)}, disable_progbar=True)
    mcmc.run()
    s = mcmc.get_samples(group_by_chain=True)
    x = torch.cat([s["x"], s["x_aux"]], -1).double().numpy()
    eye = np.eye(2)
    cov = T * np.block([[eye / lam, eye / lam], [eye / lam, eye / lam + eta * eye]])
    H = torch.tensor(np.block([[(lam + 1 / eta) * eye, -eye / eta], [-eye / eta, eye / eta]]))
    assert_moments(x, np.zeros(4), cov, known_bias=T * discrete_bias(H, step))


def test_aux_prior_sd_gives_theta_a_its_own_normal_prior():
    """``aux_prior_sd=s`` adds ‖θa‖²/(2s²): the joint precision becomes [[A + I/η, -I/η], [-I/η, I/η + I/s²]]
    and the mean shrinks toward 0 (the official code's weight decay on θa). Without the prior the joint
    covariance of ``joint_truth`` is off by many Monte-Carlo errors here, so a kernel that ignored it fails."""
    s_aux = 1.0
    kernel = EntropySGLD(gaussian_model, eta=ETA, step_size=STEP, aux_prior_sd=s_aux)
    mcmc = MCMC(kernel, num_samples=8_000, warmup_steps=WARMUP, num_chains=CHAINS, disable_progbar=True)
    mcmc.run()  # 8,000 draws: the plain joint's worst error was 11-13 Monte-Carlo sd at 6,000 (seeds 0, 1)
    s = mcmc.get_samples(group_by_chain=True)
    x = torch.cat([s["theta"], s["theta_aux"]], -1).double().numpy()
    eye = torch.eye(D, dtype=torch.float64)
    H = joint_hessian() + torch.block_diag(0 * eye, eye / s_aux**2)
    cov = torch.linalg.inv(H)
    mean = cov @ torch.cat([A @ MU, torch.zeros(D, dtype=torch.float64)])
    assert_moments(x, mean.numpy(), cov.numpy(), known_bias=discrete_bias(H))
    plain_mean, plain_cov = joint_truth()
    z_mean, z_cov, _ = moment_errors(x, plain_mean, plain_cov)
    assert max(np.abs(z_mean).max(), np.abs(z_cov).max()) > 2 * 4.5
