"""Cyclical SG-MCMC (cSGMCMC, Zhang et al. 2020): exploration phases are noise-free optimisation
steps and make no draw; only sampling-phase states are kept, with thinning."""

import math

import torch

from pyro_flat import MCMC, SGLD, EntropySGLD, schedules
from pyro_flat.diagnostics import mcmc_sample_stats

STEP = 0.1


def potential(params):
    return 0.5 * (params["x"] ** 2).sum(-1)


def test_only_sampling_phase_iterations_make_draws():
    """Cycles of 20 iterations, the first 10 exploring: 30 draws take three cycles (60 iterations),
    and every kept draw comes from a sampling-phase step (cosine factor <= 1/2)."""
    schedule = schedules.cyclical_cosine(num_steps=60, num_cycles=3, exploration=0.5)
    kernel = SGLD(potential_fn=potential, step_size=STEP, schedule=schedule)
    mcmc = MCMC(kernel, num_samples=30, warmup_steps=0, initial_params={"x": torch.ones(1, 2)},
                num_chains=1, disable_progbar=True)
    mcmc.run()
    assert mcmc.get_samples()["x"].shape == (30, 1, 2)  # (draw, one vectorized chain, 2)
    assert kernel.num_grad_evals == 60
    sampling = [k for k in range(60) if schedule.is_sampling(k)]
    steps = mcmc_sample_stats(mcmc)["step_size"][0]
    expected = torch.tensor([STEP * schedule(k) for k in sampling], dtype=steps.dtype)
    assert torch.allclose(steps, expected)


def test_thinning_counts_sampling_phase_iterations():
    schedule = schedules.cyclical_cosine(num_steps=40, num_cycles=2, exploration=0.5)
    kernel = EntropySGLD(potential_fn=potential, eta=0.5, step_size=STEP, schedule=schedule)
    mcmc = MCMC(kernel, num_samples=20, warmup_steps=0, thinning=5, initial_params={"x": torch.ones(1, 2)},
                num_chains=1, disable_progbar=True)
    mcmc.run()
    assert mcmc.get_samples()["x"].shape == (4, 1, 2)  # 20 sampling-phase iterations, every 5th kept
    assert kernel.num_grad_evals == 40                # and the 20 exploration ones in between


def test_exploration_injects_no_noise():
    """4,000 chains from x = 3 explore for 10 noise-free steps (the warm-up), then one noisy step:
    the first draw is N((1 - α_10) x_10, 2 α_10) with x_10 = 3 Π (1 - α_k), the same for all chains.
    With noise during exploration its variance would be larger by the factor of the missing steps."""
    torch.manual_seed(0)
    schedule = schedules.cyclical_cosine(num_steps=40, num_cycles=2, exploration=0.5)
    chains = 4000
    kernel = SGLD(potential_fn=potential, step_size=STEP, schedule=schedule)
    mcmc = MCMC(kernel, num_samples=1, warmup_steps=10, initial_params={"x": torch.full((chains, 1), 3.0)},
                num_chains=chains, disable_progbar=True)
    mcmc.run()
    draw = mcmc.get_samples()["x"][:, 0].double()
    x10 = 3.0 * math.prod(1 - STEP * schedule(k) for k in range(10))
    alpha = STEP * schedule(10)
    mean, var = (1 - alpha) * x10, 2 * alpha
    assert abs(float(draw.mean()) - mean) < 4 * math.sqrt(var / chains)
    assert abs(float(draw.var()) / var - 1) < 4 * math.sqrt(2 / chains)


def test_exploration_noise_keeps_the_noise_in_the_exploration_phase():
    """The same run with ``exploration_noise=True`` (the official Entropy-MCMC code's rule): every one of the 11
    steps before the first draw is noisy, so the draw is N(x_11, v_11) with the exact Gaussian recursion
    x_{k+1} = (1 - α_k) x_k, v_{k+1} = (1 - α_k)² v_k + 2 α_k. The noise-free variance (one step's) is 4 times
    smaller than this one: a kernel that ignored the flag fails."""
    torch.manual_seed(1)
    schedule = schedules.cyclical_cosine(num_steps=40, num_cycles=2, exploration=0.5, exploration_noise=True)
    chains = 4000
    kernel = SGLD(potential_fn=potential, step_size=STEP, schedule=schedule)
    assert kernel.exploration_noise
    mcmc = MCMC(kernel, num_samples=1, warmup_steps=10, initial_params={"x": torch.full((chains, 1), 3.0)},
                num_chains=chains, disable_progbar=True)
    mcmc.run()
    draw = mcmc.get_samples()["x"][:, 0].double()
    mean, var = 3.0, 0.0
    for k in range(11):
        alpha = STEP * schedule(k)
        mean, var = (1 - alpha) * mean, (1 - alpha) ** 2 * var + 2 * alpha
    assert var > 4 * 2 * STEP * schedule(10)
    assert abs(float(draw.mean()) - mean) < 4 * math.sqrt(var / chains)
    assert abs(float(draw.var()) / var - 1) < 4 * math.sqrt(2 / chains)
