"""Per-chain random streams (``random_streams="per_chain"``): a chain's numbers depend on the run's seed and
the chain's number alone, the streams are independent standard normals, and a run continues them exactly.

The cross-rank equality of whole runs is in ``tests/test_distributed.py`` (the "per-chain streams" cases);
resuming a killed run that uses them, in ``tests/test_checkpoint.py``.
"""

import numpy as np
import pytest
import torch

import pyro
from pyro_flat import MCMC, SGHMC, EntropySGLD
from pyro_flat.chains.streams import ChainStreams, drawing_from
from pyro_flat.chains import chain_rand_like, chain_randn_like, chain_randn_like_each
from pyro_flat.roundoff import assert_close_roundoff

from moments import assert_moments, sgld_stationary_covariance


def _draws(streams, shapes):
    """Two iterations of each kind of draw, as the kernels make them."""
    with drawing_from(streams):
        out = []
        for _ in range(2):
            out += [chain_randn_like(torch.zeros(shapes[0])), chain_rand_like(torch.zeros(shapes[0]))]
            out += chain_randn_like_each([torch.zeros(s) for s in shapes])
    return out


@pytest.mark.parametrize("split", [(0, 1, 5), (0, 3, 5), (0, 2, 4, 5)])
def test_each_block_of_chains_draws_the_rows_of_the_whole_runs_numbers(split):
    """5 chains split into blocks as ranks would hold them: every draw of a block is the block's rows of the
    draw of all 5 chains, for normal and uniform numbers, one tensor or several at once."""
    shapes = [(5, 3, 2), (5, 7), (5,)]
    whole = _draws(ChainStreams(seed=11, chains=range(5)), shapes)
    for start, stop in zip(split[:-1], split[1:]):
        part = _draws(ChainStreams(seed=11, chains=range(start, stop)), [(stop - start, *s[1:]) for s in shapes])
        for mine, full in zip(part, whole):
            assert torch.equal(mine, full[start:stop])


def test_the_streams_are_independent_standard_normals_and_uniforms():
    """64 chains' numbers, 20,000 each: the normals' mean 0 and covariance I between the first 6 chains
    (4.5 Monte-Carlo sd per entry); the uniforms in [0, 1) with mean 1/2, variance 1/12 and fourth central
    moment 1/80; and no pair of the 64 chains correlated, for either kind, beyond 5.5 null sds (2,016 pairs,
    Bonferroni). Chains that share a stream (a seed that ignores, or wraps, the chain's number) fail."""
    n = 20_000
    with drawing_from(ChainStreams(seed=3, chains=range(64))):
        normal = chain_randn_like(torch.zeros(64, n, dtype=torch.float64))
        uniform = chain_rand_like(torch.zeros(64, n, dtype=torch.float64))
    assert_moments(normal[:6].T[None].numpy(), np.zeros(6), np.eye(6))
    u = uniform.reshape(-1)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    m = u.numel()
    central = u - 0.5
    # E (U - 1/2)^k = 2^-k / (k + 1) for even k: the sd of each estimate's terms from the 2k-th moment
    for moment, truth, sd in [(u.mean(), 0.5, (1 / 12) ** 0.5),
                              (central.pow(2).mean(), 1 / 12, (1 / 80 - 1 / 144) ** 0.5),
                              (central.pow(4).mean(), 1 / 80, (1 / 2304 - 1 / 6400) ** 0.5)]:
        assert abs(float(moment) - truth) < 4.5 * sd / m ** 0.5, (float(moment), truth)
    for draws in (normal, uniform):
        r = np.corrcoef(draws.numpy())
        worst = np.abs(r[~np.eye(64, dtype=bool)]).max() * n ** 0.5
        assert worst < 5.5, worst


def test_the_streams_follow_their_seed():
    def draw(seed):
        with drawing_from(ChainStreams(seed=seed, chains=range(64))):
            return chain_randn_like(torch.zeros(64, 5, dtype=torch.float64))

    assert torch.equal(draw(3), draw(3)) and not torch.equal(draw(4), draw(3))


def test_saved_streams_continue_exactly_and_refuse_other_chains():
    streams = ChainStreams(seed=9, chains=range(2, 4))
    _draws(streams, [(2, 3)])
    saved = streams.state_dict()
    after = _draws(streams, [(2, 3)])
    again = ChainStreams(seed=9, chains=range(2, 4))
    again.load_state_dict(saved)
    assert all(torch.equal(a, b) for a, b in zip(_draws(again, [(2, 3)]), after))
    with pytest.raises(ValueError, match="chains 0..1 of seed 9; the saved ones are chains 2..3 of seed 9"):
        ChainStreams(seed=9, chains=range(0, 2)).load_state_dict(saved)


def _gaussian(p):
    return 0.5 * ((p["x"] - 1.0) ** 2 / torch.tensor([1.0, 4.0], dtype=p["x"].dtype)).sum(-1)


def test_entropy_sgld_on_per_chain_streams_samples_the_joint_and_repeats_its_draws():
    """64 EntropySGLD chains on N(1, diag(1, 4)), eta = 0.5, each chain on its own stream: the moments of
    theta and theta_a against the exact stationary law of the discretised joint (step 0.05: the Lyapunov
    equation of SGLD on the joint's Hessian; its slowest mode mixes in about 300 iterations, so 1,000
    warm-up and 2,000 draws). The same seed repeats the draws, and they differ from the shared stream's."""
    eta, step = 0.5, 0.05

    def run(streams):
        pyro.set_rng_seed(5)
        mcmc = MCMC(EntropySGLD(potential_fn=_gaussian, eta=eta, step_size=step), 2000, 1000, num_chains=64,
                    disable_progbar=True, initial_params={"x": torch.zeros(64, 2, dtype=torch.float64)},
                    random_streams=streams)
        mcmc.run()
        return mcmc.get_samples(group_by_chain=True)

    s = run("per_chain")
    x = torch.cat([s["x"], s["x_aux"]], -1).numpy()
    var, eye = np.array([1.0, 4.0]), np.eye(2)
    hessian = np.block([[np.diag(1 / var + 1 / eta), -eye / eta], [-eye / eta, eye / eta]])
    assert_moments(x, np.ones(4), sgld_stationary_covariance(hessian, step, np.zeros((4, 4))))
    assert all(torch.equal(v, run("per_chain")[k]) for k, v in s.items())
    assert not torch.equal(s["x"], run("shared")["x"])


def _runs(chains, streams, seed=5):
    pyro.set_rng_seed(seed)
    mcmc = MCMC(EntropySGLD(potential_fn=_gaussian, eta=0.5, step_size=0.05), 20, 5, num_chains=chains,
                disable_progbar=True, initial_params={"x": torch.zeros(chains, 2, dtype=torch.float64)},
                random_streams=streams)
    mcmc.run()
    return mcmc.get_samples(group_by_chain=True)["x"]


def test_a_chains_draws_depend_on_the_seed_and_its_number_not_on_how_many_chains_run():
    """Per-chain streams: 3 chains' first two are the 2-chain run's, bit for bit (so the streams are used,
    not the shared one, where a third chain's rows shift the others' numbers), and another seed gives
    other draws."""
    two, three = _runs(2, "per_chain"), _runs(3, "per_chain")
    assert torch.equal(three[:2], two)
    assert not torch.equal(_runs(2, "per_chain", seed=6), two)
    assert not torch.equal(_runs(3, "shared")[:2], _runs(2, "shared"))


@pytest.mark.parametrize("kernel, thinning", [("SGHMC", 1), ("EntropySGLD", 4)])
def test_a_compiled_kernel_takes_the_per_chain_streams_numbers_as_inputs_and_repeats_the_eager_draws(kernel, thinning):
    """jit_compile="fx" with per-chain streams: the numbers go into the graph as inputs, drawn before each call
    (thinning 4: 4 fused iterations' at once), and the draws equal the eager run's."""
    from pyro_flat.models import logistic_regression

    X = torch.randn(300, 5, generator=torch.Generator().manual_seed(0))
    y = torch.bernoulli(torch.sigmoid(X.sum(-1)), generator=torch.Generator().manual_seed(1))

    def run(jit):
        pyro.set_rng_seed(0)
        settings = dict(eta=0.01) if kernel == "EntropySGLD" else {}
        k = (EntropySGLD if kernel == "EntropySGLD" else SGHMC)(logistic_regression, step_size=1e-3, jit_compile=jit,
                                                                 **settings)
        mcmc = MCMC(k, 24, 10, num_chains=3, thinning=thinning, disable_progbar=True, random_streams="per_chain")
        mcmc.run(X, y, batch_size=50)
        return mcmc.get_samples(group_by_chain=True), k.is_compiled

    (eager, _), (compiled, is_compiled) = run(False), run("fx")
    assert is_compiled
    for site, value in eager.items():  # 34 iterations, each a gradient over 50 rows' products with 5 weights
        assert_close_roundoff(compiled[site], value, length=34 * 50 * 5, msg=site)


@pytest.mark.parametrize("value, hint", [("chain", ""), (None, ""), ("Per-Chain", " Did you mean 'per_chain'?")])
def test_an_unknown_random_streams_is_refused_by_name(value, hint):
    with pytest.raises(ValueError) as err:
        MCMC(SGHMC(potential_fn=_gaussian, step_size=0.01), 5, num_chains=2, random_streams=value)
    assert str(err.value).startswith("random_streams must be 'shared' (one random stream for all chains")
    assert str(err.value).endswith(f"got {value!r}.{hint}")


def test_chains_in_pyros_driver_say_that_per_chain_streams_do_not_apply():
    pyro.set_rng_seed(0)
    mcmc = MCMC(SGHMC(potential_fn=_gaussian, step_size=0.01), 5, 2, disable_progbar=True,
                initial_params={"x": torch.zeros(2)}, random_streams="per_chain")
    with pytest.warns(UserWarning, match="chains are in Pyro's driver .* global random stream"):
        mcmc.run()
    assert mcmc.chain_method == "sequential"
