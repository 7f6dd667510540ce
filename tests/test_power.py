"""The image study's power: :func:`~pyro_flat.experiments.compare.power` and ``detectable_difference`` against a
simulation of paired t-tests with a known difference (the rule of :func:`~.compare.t_critical`)."""

import math

import numpy as np
import pytest

from pyro_flat.experiments.compare import detectable_difference, power, t_critical

TRIALS = 20_000


def simulated_power(difference: float, sd: float, n: int, seed: int = 0) -> float:
    """The share of TRIALS experiments, each n paired differences ~ N(difference, sd²), whose mean is beyond
    t_critical(n) standard errors of zero."""
    d = np.random.default_rng(seed).normal(difference, sd, size=(TRIALS, n))
    t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
    return float((np.abs(t) > t_critical(n)).mean())


@pytest.mark.parametrize("n", [3, 5, 8])
@pytest.mark.parametrize("in_se", [0.0, 2.0, 4.0])
def test_power_matches_a_simulation_of_the_paired_t_test(n, in_se):
    sd = 0.02
    difference = in_se * sd / math.sqrt(n)
    want, got = power(difference, sd, n), simulated_power(difference, sd, n)
    assert abs(got - want) < 4 * math.sqrt(want * (1 - want) / TRIALS) + 1e-3


@pytest.mark.parametrize("n", [3, 5])
def test_the_detectable_difference_is_detected_four_times_in_five(n):
    se = 0.004
    delta = detectable_difference(se, n)
    got = simulated_power(delta, se * math.sqrt(n), n, seed=n)
    assert abs(got - 0.8) < 4 * math.sqrt(0.16 / TRIALS)
    # the normal approximation (1.96 + 0.84 standard errors) claims a smaller one, which the t-test misses
    assert delta > (1.96 + 0.84) * se and simulated_power((1.96 + 0.84) * se, se * math.sqrt(n), n) < 0.75


def test_power_refuses_what_it_cannot_compute():
    with pytest.raises(ValueError, match="n >= 2"):
        power(0.1, 1.0, 1)
    with pytest.raises(ValueError, match="probability"):
        detectable_difference(1.0, 5, probability=1.0)
