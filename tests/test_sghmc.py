"""SGHMC and EntropySGHMC (BAOAB) against exact laws.

On a Gaussian target with exact gradients BAOAB's draws follow the target exactly at any stable step
(h²λ < 4), so the moments are compared with the target itself, at steps where SGLD would be far off;
with minibatches the stationary covariance solves the discrete Lyapunov equation of the linear chain
(``moments.baoab_stationary_covariance``), whose bias must stay below one Monte-Carlo sd. At
temperature 0 the update is heavy-ball SGD: ``torch.optim.SGD(momentum=μ)`` is the oracle.
"""

import math

import numpy as np
import pytest
import torch

import pyro
from pyro.infer import MCMC as PyroMCMC
from pyro_flat import MCMC, SGHMC, SGLD, EntropySGHMC
from pyro_flat.kernels import kernel_settings, make_kernel

from moments import assert_moments, baoab_stationary_covariance, minibatch_noise_covariance
from test_minibatch import B, D, N, data, model, posterior

# a correlated 2-D Gaussian: precision A (eigenvalues 0.79 and 4.2), mean m
A = torch.tensor([[4.0, 0.8], [0.8, 1.0]], dtype=torch.float64)
M = torch.tensor([1.0, -2.0], dtype=torch.float64)
COV = torch.linalg.inv(A).numpy()
LAMBDA_MAX = float(torch.linalg.eigvalsh(A).max())


def gaussian(params):
    r = params["x"] - M
    return 0.5 * ((r @ A) * r).sum(-1)


def run_gaussian(kernel, chains=64, samples=1500, warmup=300, thinning=1):
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, num_samples=samples, warmup_steps=warmup, num_chains=chains, thinning=thinning,
                initial_params={"x": torch.zeros(chains, 2, dtype=torch.float64)}, disable_progbar=True)
    mcmc.run()
    return mcmc.get_samples(group_by_chain=True)


def step_for(h_squared_lambda: float, momentum: float, curvature: float = LAMBDA_MAX) -> float:
    """The learning rate α at which h²λ equals ``h_squared_lambda`` (α = (1 + μ) h² / 2)."""
    return (1 + momentum) / 2 * h_squared_lambda / curvature


@pytest.mark.parametrize("settings, h2l", [
    (dict(momentum=0.5), 2.5),
    (dict(momentum=0.9), 3.0),
    (dict(friction=1.0), 1.5),
    (dict(momentum=0.5, jit_compile="fx"), 2.5),  # fused graphs of 4 iterations with thinning 4
])
def test_sghmc_follows_a_gaussian_target_exactly_at_a_large_step(settings, h2l):
    """At h²λ_max up to 3 (SGLD at the same α would inflate the stiff variance by 1/(1 - αλ/2), or
    diverge), θ's mean and covariance are the target's within Monte-Carlo error."""
    momentum = settings.get("momentum", 0.5)
    if "friction" in settings:  # h solves h²(1 + e^{-γh})/2 = α: take h from h²λ, then α
        h = math.sqrt(h2l / LAMBDA_MAX)
        step = h * h * (1 + math.exp(-settings["friction"] * h)) / 2
    else:
        step = step_for(h2l, momentum)
    thinning = 4 if "jit_compile" in settings else 1
    kernel = SGHMC(potential_fn=gaussian, step_size=step, **settings)
    x = run_gaussian(kernel, thinning=thinning, samples=1500 * thinning)["x"].numpy()
    if "jit_compile" in settings:
        assert kernel.is_compiled
    if "friction" in settings:
        h, mu = kernel.integrator(step)
        assert h * h * LAMBDA_MAX == pytest.approx(h2l) and mu == pytest.approx(math.exp(-settings["friction"] * h))
    assert_moments(x, M.numpy(), COV)


def test_the_momenta_follow_their_stationary_law():
    """The carried momenta of 4,000 chains after 300 iterations: N(0, T I) (BAOAB's exact momentum law)."""
    kernel = SGHMC(potential_fn=gaussian, step_size=step_for(2.0, 0.7), momentum=0.7, temperature=2.0)
    run_gaussian(kernel, chains=4000, samples=1)
    p = kernel.carried["x"].numpy()
    assert np.abs(p.mean(0)).max() < 4 * math.sqrt(2.0 / 4000)
    np.testing.assert_allclose(np.cov(p.T), 2.0 * np.eye(2), atol=4 * 2.0 * math.sqrt(2 / 4000))


@pytest.mark.parametrize("settings", [
    dict(),
    dict(jit_compile="fx"),
    dict(preconditioner="dense"),               # the pulled joint metric (stiffness 3)
    dict(preconditioner="diagonal", coupling_metric="block"),
])
def test_entropy_sghmc_follows_the_joint_exactly(settings):
    """θ keeps the target N(m, Σ); θa its smoothed law N(m, Σ + ηI); their covariance is Σ."""
    eta = 0.5
    if "preconditioner" in settings:
        step = 0.5  # metric units: h² = 2α/(1 + μ) = 0.67 < 4/3 (pulled) and 2 (block)
    else:
        step = step_for(2.0, 0.5, curvature=LAMBDA_MAX + 2 / eta)
    kernel = EntropySGHMC(potential_fn=gaussian, eta=eta, step_size=step, momentum=0.5, **settings)
    s = run_gaussian(kernel)
    x = np.concatenate([s["x"].numpy(), s["x_aux"].numpy()], -1)
    joint = np.block([[COV, COV], [COV, COV + eta * np.eye(2)]])
    assert_moments(x, np.concatenate([M.numpy(), M.numpy()]), joint)


@pytest.mark.parametrize("metric", ["fixed dense", "fixed diagonal", "adaptive dense"])
def test_preconditioned_sghmc_is_exact_with_a_constant_mass_matrix(metric):
    """A metric M⁻¹ is BAOAB's mass matrix: any constant one keeps the law exact. α = 1.2 in the units of
    the exact metric (h² = 1.6 at μ = 0.5); a wrong metric, within its own stability limit, too."""
    spec = {"fixed dense": torch.tensor([[1.0, 0.3], [0.3, 2.0]], dtype=torch.float64),
            "fixed diagonal": torch.tensor([0.25, 1.0], dtype=torch.float64), "adaptive dense": "dense"}[metric]
    step = 1.2 if metric == "adaptive dense" else 0.3
    kernel = SGHMC(potential_fn=gaussian, step_size=step, momentum=0.5, preconditioner=spec)
    assert_moments(run_gaussian(kernel)["x"].numpy(), M.numpy(), COV)


@pytest.mark.parametrize("driver", ["pyro", "vectorized"])
def test_minibatch_sghmc_on_linear_regression_has_the_known_gradient_noise_bias(driver):
    """N = 2,000, B = 100: the minibatch gradient's noise enters the momentum (h²C per step); the
    stationary covariance then solves BAOAB's Lyapunov equation with C the without-replacement
    covariance at the posterior mean. Through Pyro's driver and as vectorized chains."""
    X, y = data()
    mean, cov, P = posterior(X, y)
    momentum, step = 0.5, 1.2e-6  # the gradient noise's bias grows fast with α (h²C against T(1 - μ²) per step)
    kernel = SGHMC(model, step_size=step, momentum=momentum, init_strategy=pyro.infer.autoguide.init_to_median)
    h, mu = kernel.integrator(step)
    g = X.numpy() * (y - X @ torch.as_tensor(mean)).numpy()[:, None]  # per-datum likelihood gradients
    bias = baoab_stationary_covariance(P, h, mu, minibatch_noise_covariance(g, N, B)) - cov
    assert (np.diag(bias) / np.diag(cov)).min() > 0.04  # the bias is real (+4% on every variance), accounted for
    pyro.set_rng_seed(1)
    driver_class = PyroMCMC if driver == "pyro" else MCMC
    chains = 2 if driver == "pyro" else 4
    mcmc = driver_class(kernel, num_samples=8000, warmup_steps=1000, num_chains=chains, disable_progbar=True)
    mcmc.run(X, y)
    assert_moments(mcmc.get_samples(group_by_chain=True)["w"].numpy(), mean, cov, known_bias=bias)


def test_the_exploration_phase_is_torch_sgd_with_momentum():
    """A schedule whose first 30 iterations explore (temperature 0): from the second iteration on, the
    states are those of torch.optim.SGD(lr=α, momentum=μ) started with the first iteration's velocity,
    on a non-quadratic loss."""

    def loss(x):
        return torch.log(torch.cosh(3 * x[..., 0] - x[..., 1])).sum(-1) + 0.1 * (x ** 2).sum(-1) + x[..., 1] ** 4

    class Explore:
        def __call__(self, k):
            return 1.0

        def is_sampling(self, k):
            return k >= 30

    alpha, mu = 0.05, 0.9
    kernel = SGHMC(potential_fn=lambda p: loss(p["x"]), step_size=alpha, momentum=mu, schedule=Explore())
    kernel.configure(num_chains=1)
    kernel.initial_params = {"x": torch.tensor([[1.5, -0.7]], dtype=torch.float64)}
    kernel.setup(30)
    states = [kernel.initial_params["x"]]
    for _ in range(30):
        states.append(kernel.sample({"x": states[-1]})["x"])
    x = torch.nn.Parameter(states[1].clone())
    optimizer = torch.optim.SGD([x], lr=alpha, momentum=mu)
    optimizer.state[x]["momentum_buffer"] = -(states[1] - states[0]) / alpha
    for want in states[2:]:
        optimizer.zero_grad()
        loss(x).sum().backward()
        optimizer.step()
        torch.testing.assert_close(x.detach(), want, rtol=1e-10, atol=1e-12)


def test_a_cyclical_run_keeps_the_momenta_across_phases_and_draws_in_the_sampling_phase():
    """Exploration makes no draw; the momenta the exploration built are the sampling phase's start,
    not a fresh draw (the first sampling iteration starts from them)."""
    from pyro_flat import schedules

    schedule = schedules.cyclical_cosine(num_steps=60, num_cycles=3, exploration=0.5)
    kernel = SGHMC(potential_fn=gaussian, step_size=0.1, schedule=schedule)
    mcmc = MCMC(kernel, num_samples=30, warmup_steps=0, num_chains=2, disable_progbar=True,
                initial_params={"x": torch.zeros(2, 2, dtype=torch.float64)})
    mcmc.run()
    assert mcmc.get_samples()["x"].shape == (60, 2) and kernel.num_grad_evals == 60


def test_sghmc_through_pyros_driver_with_a_model_and_make_kernel():
    X, y = data()
    kernel = make_kernel("entropy-sghmc", model, eta=0.1, step_size=1e-5, momentum=0.9)
    assert type(kernel) is EntropySGHMC and {"eta", "momentum", "friction", "step_size"} <= set(
        kernel_settings("entropy-sghmc"))
    mcmc = PyroMCMC(kernel, num_samples=20, warmup_steps=10, disable_progbar=True)
    mcmc.run(X, y)
    assert set(mcmc.get_samples()) == {"w", "w_aux"} and mcmc.get_samples()["w"].shape == (20, D)


@pytest.mark.parametrize("settings, match", [
    (dict(momentum=0.0), "momentum=0.0 must lie in \\(0, 1\\)"),
    (dict(momentum=1.0), "momentum=1.0 must lie in \\(0, 1\\)"),
    (dict(momentum=-0.5), "must lie in \\(0, 1\\)"),
    (dict(momentum=True), "momentum must be a number in \\(0, 1\\), got True"),
    (dict(momentum="0.9"), "momentum must be a number"),
    (dict(friction=0.0), "friction"),
    (dict(friction=-1.0), "friction"),
    (dict(friction=float("nan")), "friction"),
    (dict(momentum=0.9, friction=1.0), "not both"),
])
def test_bad_momentum_or_friction_is_refused_by_name(settings, match):
    with pytest.raises(ValueError, match=match):
        SGHMC(potential_fn=gaussian, step_size=0.1, **settings)


@pytest.mark.parametrize("jit_compile, warmup, thinning", [(False, 5, 1), ("fx", 2, 4)])
def test_a_schedule_that_makes_the_preconditioned_step_unstable_is_named_at_its_first_iteration(
        jit_compile, warmup, thinning):
    """In the metric's units BAOAB needs h² < 4 (α < 2(1 + μ) = 3 at μ = 0.5): a schedule that doubles a
    step of 2 at iteration 7 stops there, with the iteration, the step and the limit in the message; also
    when iteration 7 would run inside a fused graph of 4 iterations (6 to 9)."""
    kernel = SGHMC(potential_fn=gaussian, step_size=2.0, momentum=0.5, preconditioner="dense",
                   schedule=lambda k: 1.0 if k < 7 else 2.0, jit_compile=jit_compile)
    with pytest.raises(ValueError, match=r"iteration 7 has step_size 4 .*step_size < 3 at momentum 0.5"):
        run_gaussian(kernel, chains=2, samples=20, warmup=warmup, thinning=thinning)


def test_sgld_at_the_same_step_is_biased_where_sghmc_is_not():
    """The point of the exact integrator, as a check that the Gaussian tests can fail: SGLD at the
    α of the first case (αλ = 1.9) inflates the stiff direction's variance far beyond Monte-Carlo error."""
    step = step_for(2.5, 0.5)
    x = run_gaussian(SGLD(potential_fn=gaussian, step_size=step))["x"].numpy()
    with pytest.raises(AssertionError, match="moments off"):
        assert_moments(x, M.numpy(), COV)


def test_momentum_takes_numpy_and_torch_numbers_and_names_the_kernel_when_refused():
    assert SGHMC(potential_fn=gaussian, step_size=0.1, momentum=np.float32(0.75)).momentum == 0.75
    assert SGHMC(potential_fn=gaussian, step_size=0.1, momentum=torch.tensor(0.5)).momentum == 0.5
    with pytest.raises(ValueError, match="EntropySGHMC: momentum must be a number in \\(0, 1\\), got '0.9'"):
        EntropySGHMC(potential_fn=gaussian, eta=0.1, step_size=0.1, momentum="0.9")
    with pytest.raises(ValueError, match="EntropySGHMC: momentum=0.0 .*for no momentum use EntropySGLD"):
        EntropySGHMC(potential_fn=gaussian, eta=0.1, step_size=0.1, momentum=0)


def test_the_constructors_show_every_setting_and_a_missing_eta_is_named():
    """help() and IDEs see the settings passed on through **kwargs (step_size, momentum, ...)."""
    import inspect

    shown = inspect.signature(EntropySGHMC).parameters
    assert {"eta", "momentum", "friction", "step_size", "preconditioner", "coupling_metric"} <= set(shown)
    assert "temperature" not in inspect.signature(pyro_flat_sgd()).parameters  # SGD fixes it itself
    with pytest.raises(TypeError, match="EntropySGHMC needs eta="):
        EntropySGHMC(potential_fn=gaussian, step_size=0.1)


def pyro_flat_sgd():
    from pyro_flat import SGD

    return SGD


def test_only_the_dense_metric_is_held_to_its_stability_limit():
    """A fixed metric says nothing of the curvature in its units: a stable step above 2(1 + μ) in them runs
    (variances 0.1 / precisions 4.2 and 0.8: curvature at most 0.42 in the metric's units, h² = 10.5)."""
    kernel = SGHMC(potential_fn=gaussian, step_size=10.0, momentum=0.9,
                   preconditioner=torch.tensor([0.1, 0.1], dtype=torch.float64))
    assert run_gaussian(kernel, chains=2, samples=20, warmup=5)["x"].shape == (2, 20, 2)


def test_a_schedule_that_never_samples_is_refused_not_run_forever(monkeypatch):
    from pyro_flat import schedules
    from pyro_flat.kernels import stochastic_gradient

    with pytest.raises(ValueError, match="exploration=0.95 leaves no sampling iteration in a cycle of 10"):
        schedules.cyclical_cosine(num_steps=100, num_cycles=10, exploration=0.95)

    class NeverSamples:
        def __call__(self, k):
            return 1.0

        def is_sampling(self, k):
            return False

    monkeypatch.setattr(stochastic_gradient, "MAX_EXPLORATION_RUN", 50)
    with pytest.raises(ValueError, match="is_sampling\\(k\\) was False for 50 iterations in a row"):
        run_gaussian(SGHMC(potential_fn=gaussian, step_size=0.01, schedule=NeverSamples()), chains=2, samples=3,
                     warmup=2)
