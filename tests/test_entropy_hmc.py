"""EntropyHMC against closed forms and against Pyro's NUTS; its bad-input errors and divergences.

Gaussian target f(θ) = ½(θ-μ)ᵀA(θ-μ) with an ill-conditioned A (condition number 100):
θ ~ N(μ, A⁻¹), θa ~ N(μ, A⁻¹ + ηI), Cov(θ, θa) = A⁻¹ (docs/theory.md, section 1). HMC is exact, so the
only tolerance is the Monte-Carlo error (ESS-based, tests/moments.py).
"""

import numpy as np
import pytest
import torch

import pyro
import pyro.distributions as dist
from pyro.infer import NUTS
from pyro_flat import MCMC, EntropyHMC
from pyro_flat.datasets import load_mnist79
from pyro_flat.models import logistic_regression

from moments import assert_moments, moment_errors

D = 10


def _problem():
    g = torch.Generator().manual_seed(3)
    Q, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64))
    A = Q @ torch.diag(torch.logspace(0, 2, D, dtype=torch.float64)) @ Q.T
    return A, torch.linspace(-1.0, 1.0, D, dtype=torch.float64)


A, MU = _problem()
COV = torch.linalg.inv(A)
SCALE_TRIL = torch.linalg.cholesky(COV)


def gaussian_model():
    pyro.sample("theta", dist.MultivariateNormal(MU, scale_tril=SCALE_TRIL))


def joint_truth(eta):
    eye = torch.eye(D, dtype=torch.float64)
    cov = torch.cat([torch.cat([COV, COV], 1), torch.cat([COV, COV + eta * eye], 1)], 0)
    return torch.cat([MU, MU]).numpy(), cov.numpy()


def run_gaussian(eta, aux_update, full_mass=False, chains=16, draws=400, warmup=300, jit_compile=False):
    kernel = EntropyHMC(gaussian_model, eta=eta, aux_update=aux_update, full_mass=full_mass,
                        jit_compile=jit_compile)
    mcmc = MCMC(kernel, draws, warmup, num_chains=chains, disable_progbar=True)
    mcmc.run()
    assert mcmc.chain_method == "vectorized"
    assert kernel.is_compiled == jit_compile
    s = mcmc.get_samples(group_by_chain=True)
    return torch.cat([s["theta"], s["theta_aux"]], -1).numpy(), mcmc


@pytest.mark.parametrize("aux_update,eta,jit_compile", [("joint", 0.1, False), ("joint", 10.0, False),
                                                        ("gibbs", 0.1, False), ("gibbs", 10.0, False),
                                                        ("joint", 0.1, True)])
def test_gaussian_joint_moments(eta, aux_update, jit_compile):
    x, mcmc = run_gaussian(eta, aux_update, jit_compile=jit_compile)
    mean, cov = joint_truth(eta)
    assert_moments(x, mean, cov)
    stats = mcmc.diagnostics()
    assert sum(len(v) for v in stats["divergences"].values()) == 0
    rate = float(torch.stack([torch.as_tensor(v) for v in stats["acceptance rate"].values()]).mean())
    assert 0.6 < rate < 0.99


@pytest.mark.parametrize("full_mass", [True, "hessian"])
def test_gaussian_dense_metrics(full_mass):
    x, mcmc = run_gaussian(0.1, "joint", full_mass=full_mass, chains=8, warmup=400)
    mean, cov = joint_truth(0.1)
    assert_moments(x, mean, cov)
    if full_mass == "hessian":  # the exact metric of a Gaussian: a few steps suffice
        assert int(mcmc.kernel._last_stats["n_steps"][0]) <= 6


# Gibbs at η = 0.1 moves the weakest direction (precision 1) by 1/(1 + 0.1) per iteration: 600 NUTS
# draws would hold ~30 effective ones, too few to estimate the tolerance; η = 10 mixes fast.
@pytest.mark.parametrize("aux_update,eta", [("joint", 0.1), ("gibbs", 10.0)])
def test_nuts_trajectories(aux_update, eta):
    kernel = EntropyHMC(gaussian_model, eta=eta, aux_update=aux_update, use_nuts=True)
    mcmc = MCMC(kernel, 300, 200, num_chains=2, disable_progbar=True)
    with pytest.warns(UserWarning, match="NUTS trees grow differently"):
        mcmc.run()  # NUTS runs chains one at a time, and says so
    assert mcmc.chain_method == "sequential"
    s = mcmc.get_samples(group_by_chain=True)
    assert_moments(torch.cat([s["theta"], s["theta_aux"]], -1).numpy(), *joint_truth(eta))
    depth = mcmc._diagnostics[0]["sample_stats"]["tree_depth"]
    assert 2 <= float(depth.mean()) <= 8


def test_gaussian_check_can_fail():
    """The same draws fail against a wrong η: the tolerance is tight enough to see a bias."""
    x, _ = run_gaussian(0.1, "joint", chains=8)
    mean, wrong = joint_truth(0.15)
    with pytest.raises(AssertionError):
        assert_moments(x, mean, wrong)


def _small_mnist(n=400):
    X, y = load_mnist79(None, split="train")
    X = torch.nn.functional.avg_pool2d(X.reshape(-1, 1, 28, 28), 7).reshape(len(X), -1)  # 4x4 pixels
    X = (X - X.mean(0)) / X.std(0)
    return X[:n].double(), y[:n].double()


def _per_coordinate(x: torch.Tensor) -> np.ndarray:
    return x.reshape(x.shape[:2] + (-1,)).numpy()  # (chain, draw, k)


def _ess(x: np.ndarray) -> np.ndarray:
    import arviz as az

    return np.array([max(float(az.ess(x[..., i], method="mean")), 10.0) for i in range(x.shape[-1])])


def test_logistic_regression_matches_pyro_nuts():
    """θ marginal of EntropyHMC = Pyro NUTS on the original model; θa - θ has variance η."""
    X, y = _small_mnist()
    eta = 0.05
    pyro.set_rng_seed(1)
    nuts = pyro.infer.MCMC(NUTS(logistic_regression), 500, 300, num_chains=1, disable_progbar=True)
    nuts.run(X, y, batch_size=None)
    reference = nuts.get_samples(group_by_chain=True)

    pyro.set_rng_seed(2)
    kernel = EntropyHMC(logistic_regression, eta=eta, full_mass="hessian")
    mcmc = MCMC(kernel, 250, 200, num_chains=4, disable_progbar=True)
    mcmc.run(X, y, batch_size=None)
    ours = mcmc.get_samples(group_by_chain=True)

    for site in ("w", "b"):
        a, b = _per_coordinate(ours[site]), _per_coordinate(reference[site])
        ess_a, ess_b = _ess(a), _ess(b)
        a2, b2 = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
        z = (a2.mean(0) - b2.mean(0)) / np.sqrt(a2.var(0) / ess_a + b2.var(0) / ess_b)
        assert np.abs(z).max() < 4.5, f"{site}: means differ by {np.abs(z).max():.1f} MC sd"
        ratio = a2.std(0) / b2.std(0)  # the sd of an sd estimate is about sd / sqrt(2 ESS)
        tol = 4.5 * np.sqrt(1 / (2 * ess_a) + 1 / (2 * ess_b))
        assert np.all(np.abs(np.log(ratio)) < tol), f"{site}: sds differ, ratios {np.round(ratio, 2)}"
    delta = _per_coordinate(ours["w_aux"] - ours["w"])
    ess = _ess(delta**2)  # of the squares, whose mean estimates the variance: sd ≈ η sqrt(2 / ESS)
    ratio = (delta**2).reshape(-1, delta.shape[-1]).mean(0) / eta
    assert np.all(np.abs(ratio - 1) < 4.5 * np.sqrt(2 / ess)), np.round(ratio, 2)


def test_vectorized_matches_sequential_and_is_reproducible():
    def run(method, seed):
        pyro.set_rng_seed(seed)
        kernel = EntropyHMC(gaussian_model, eta=1.0, num_steps=5)
        mcmc = MCMC(kernel, 300, 200, num_chains=4, chain_method=method, disable_progbar=True)
        mcmc.run()
        return mcmc

    vec, seq = run("vectorized", 0), run("sequential", 0)
    assert (vec.chain_method, seq.chain_method) == ("vectorized", "sequential")
    x = {}
    for m in (vec, seq):
        s = m.get_samples(group_by_chain=True)
        x[m.chain_method] = torch.cat([s["theta"], s["theta_aux"]], -1)
    mean, cov = joint_truth(1.0)
    for draws in x.values():
        assert draws.shape == (4, 300, 2 * D)
        assert_moments(draws.numpy(), mean, cov)
    z_vec, _, _ = moment_errors(x["vectorized"].numpy(), x["sequential"].numpy().mean((0, 1)), cov)
    assert np.abs(z_vec).max() < 4.5 * np.sqrt(2)  # two-sample: both carry MC error
    again = run("vectorized", 0)
    for site, value in vec.get_samples(group_by_chain=True).items():
        assert torch.equal(value, again.get_samples(group_by_chain=True)[site])
    assert torch.equal(vec._diagnostics[1]["sample_stats"]["energy"],
                       again._diagnostics[1]["sample_stats"]["energy"])


# ----------------------------------------------------------------------------- bad input
def test_bad_arguments():
    with pytest.raises(ValueError, match="not both"):
        EntropyHMC(gaussian_model, eta=0.1, num_steps=5, trajectory_length=1.0)
    with pytest.raises(ValueError, match="aux_update"):
        EntropyHMC(gaussian_model, eta=0.1, aux_update="metropolis")
    with pytest.raises(ValueError, match="eta"):
        EntropyHMC(gaussian_model, eta=0.0)
    with pytest.raises(ValueError, match="step_size"):
        EntropyHMC(gaussian_model, eta=0.1, step_size=-1.0)
    with pytest.raises(ValueError, match="num_steps"):
        EntropyHMC(gaussian_model, eta=0.1, num_steps=0)
    with pytest.raises(ValueError, match="full_mass"):
        EntropyHMC(gaussian_model, eta=0.1, full_mass="lbfgs")
    with pytest.raises(ValueError, match="use_nuts"):
        EntropyHMC(gaussian_model, eta=0.1, use_nuts=True, num_steps=3)


def test_subsampled_plate_points_to_entropy_sgld():
    X, y = _small_mnist(100)
    mcmc = pyro.infer.MCMC(EntropyHMC(logistic_regression, eta=0.1), 5, 5, disable_progbar=True)
    with pytest.raises(ValueError, match="EntropySGLD"):
        mcmc.run(X, y, batch_size=10)


def test_discrete_site_and_nonfinite_start():
    def discrete():
        pyro.sample("k", dist.Poisson(3.0))

    with pytest.raises(ValueError, match="discrete"):
        pyro.infer.MCMC(EntropyHMC(discrete, eta=0.1), 5, 5, disable_progbar=True).run()

    def potential(p):
        return torch.where(p["x"] > 0, 0.5 * p["x"] ** 2, torch.full_like(p["x"], float("inf"))).sum()

    mcmc = pyro.infer.MCMC(EntropyHMC(potential_fn=potential, eta=0.1), 5, 5,
                           initial_params={"x": -torch.ones(2)}, disable_progbar=True)
    with pytest.raises(ValueError, match="initial point"):
        mcmc.run()


def test_divergent_trajectories_are_rejected_and_counted():
    """A wall (infinite energy for x < 0) and a fixed large step: many trajectories hit it."""

    def potential(p):
        x = p["x"]
        return torch.where(x > 0, 0.5 * (x - 1.0) ** 2, torch.full_like(x, float("nan"))).sum(-1)

    kernel = EntropyHMC(potential_fn=potential, eta=0.5, step_size=0.8, num_steps=4,
                        adapt_step_size=False, adapt_mass_matrix=False)
    mcmc = MCMC(kernel, 300, 0, initial_params={"x": torch.ones(4, 1)}, num_chains=4,
                disable_progbar=True)
    mcmc.run()
    assert mcmc.chain_method == "vectorized"  # potential_fn maps (4, 1) to (4,)
    samples = mcmc.get_samples()
    assert torch.isfinite(samples["x"]).all() and (samples["x"] > 0).all()
    divergences = mcmc.diagnostics()["divergences"]
    count = sum(len(v) for v in divergences.values())
    flagged = sum(float(d["sample_stats"]["diverging"].sum()) for d in mcmc._diagnostics)
    assert count > 0 and count == flagged


def test_short_warmup_still_adapts_the_step_size():
    """With 50 warm-up steps Stan's schedule leaves 5 for dual averaging after the metric's last
    change; its average is then still near the prox-centre (10x the searched step) and some
    chains stop moving (acceptance 0 in 2 of 128 chains before the final buffer got 25 steps)."""

    def model():
        with pyro.plate("d", 2):
            pyro.sample("x", dist.Normal(0.0, 1.0))

    for seed in range(4):
        pyro.set_rng_seed(seed)
        mcmc = MCMC(EntropyHMC(model, eta=0.5, num_steps=3), 100, 50, num_chains=32,
                    disable_progbar=True)
        mcmc.run()
        rates = torch.tensor(list(mcmc.diagnostics()["acceptance rate"].values()))
        assert float(rates.min()) > 0.5, (seed, rates)


def test_metropolis_correction_removes_the_leapfrog_bias():
    """A fixed step of 1.1 on N(0, I): leapfrog alone overshoots (its draws are too wide); the
    Metropolis test makes the joint exact. With adapted steps the bias of a missing test hides
    under the Monte-Carlo error, so this is the test that sees it."""

    def potential(p):
        return 0.5 * (p["x"] ** 2).sum(-1)

    kernel = EntropyHMC(potential_fn=potential, eta=1.0, step_size=1.1, num_steps=3,
                        adapt_step_size=False, adapt_mass_matrix=False)
    mcmc = MCMC(kernel, 300, 50, initial_params={"x": torch.zeros(64, 2)}, num_chains=64,
                disable_progbar=True)
    mcmc.run()
    s = mcmc.get_samples(group_by_chain=True)
    eye = np.eye(2)
    assert_moments(torch.cat([s["x"], s["x_aux"]], -1).numpy(), np.zeros(4),
                   np.block([[eye, eye], [eye, 2 * eye]]))


def test_nuts_multinomial_sampling_with_a_large_fixed_step():
    """Step 1.2 on N(0, I), no adaptation: the trajectory's points carry very different energies,
    so drawing from them with weights e^{-H} is what keeps the joint exact."""

    def potential(p):
        return 0.5 * (p["x"] ** 2).sum(-1)

    kernel = EntropyHMC(potential_fn=potential, eta=1.0, step_size=1.2, use_nuts=True,
                        adapt_step_size=False, adapt_mass_matrix=False)
    mcmc = MCMC(kernel, 800, 50, initial_params={"x": torch.zeros(2, 2)}, num_chains=2,
                chain_method="sequential", disable_progbar=True)
    mcmc.run()
    s = mcmc.get_samples(group_by_chain=True)
    eye = np.eye(2)
    assert_moments(torch.cat([s["x"], s["x_aux"]], -1).numpy(), np.zeros(4),
                   np.block([[eye, eye], [eye, 2 * eye]]))
