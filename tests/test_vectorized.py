"""Vectorized chains: batched potentials equal per-chain ones, samplers give the closed-form moments,
runs are reproducible, and models that do not broadcast fall back to Pyro's driver (or fail
clearly when vectorization was demanded)."""

import math
import time

import numpy as np
import pytest
import torch

import pyro
import pyro.distributions as dist
from pyro.infer import NUTS
from pyro_flat import MCMC, SGLD, DivergenceError, EntropySGLD, flat_potential, schedules, to_arviz
from pyro_flat.diagnostics import chain_correlation
from pyro_flat.targets import ModelPotential
from pyro_flat.models import logistic_regression
from pyro_flat.roundoff import assert_close_roundoff

from moments import assert_moments, sgld_stationary_covariance


def _data(n=60, d=4):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, d, generator=g)
    y = torch.bernoulli(torch.sigmoid(X.sum(-1)), generator=g)
    return X, y


@pytest.mark.parametrize("minibatches", ["per_chain", "shared"])
def test_batched_potential_equals_per_chain_potentials(minibatches):
    """Energy and gradient of C chains at once = each chain alone on its own minibatch (plates,
    subsampling, a constrained site with its Jacobian)."""

    def model(X, y):
        with pyro.plate("features", X.shape[1]):
            w = pyro.sample("w", dist.Normal(0.0, 1.0))
        s = pyro.sample("s", dist.Gamma(2.0, 2.0))  # positive: log transform + Jacobian
        with pyro.plate("data", X.shape[0], subsample_size=20) as idx:
            mean = (X[idx] * w.unsqueeze(-2)).sum(-1)  # (B,) or, per chain, (C, B)
            pyro.sample("y", dist.Normal(mean, s), obs=y[idx])

    X, y = _data()
    batched = ModelPotential(model, (X, y), num_chains=3, minibatches=minibatches)
    single = ModelPotential(model, (X, y))
    params = batched.initial_params()
    assert params["w"].shape == (3, 4) and params["s"].shape == (3,)
    fixed = batched.fixed_batch()
    per_chain = minibatches == "per_chain"
    assert fixed["data"].shape == ((3, 20) if per_chain else (20,))
    assert batched.draw_indices()["data"].shape == fixed["data"].shape
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    energies = batched(leaves, fixed)
    grads = torch.autograd.grad(energies.sum(), list(leaves.values()))
    for c in range(3):
        chain = {k: v[c].clone().requires_grad_(True) for k, v in params.items()}
        e = single(chain, batched.batches.for_chain(fixed, c))
        g = torch.autograd.grad(e, list(chain.values()))
        # C chains at once against one sum in other orders: 20 rows' products with 4 weights (and the priors')
        assert_close_roundoff(energies[c], e, length=20 * 4)
        for a, b in zip(grads, g):
            assert_close_roundoff(a[c], b, length=20 * 4)
    if per_chain:  # and each chain's data are its own: chain 0's minibatch gives chain 1 another energy
        other = single({k: v[1] for k, v in params.items()}, batched.batches.for_chain(fixed, 0))
        assert not torch.allclose(energies[1], other, rtol=1e-5, atol=1e-4)


def gaussian_potential(p):  # batched or not: sums the last dim only
    x = p["x"]
    return 0.5 * ((x - 1.0) ** 2 / torch.tensor([1.0, 4.0], dtype=x.dtype)).sum(-1)


def test_entropy_sgld_vectorized_closed_form_and_reproducible():
    """64 vectorized EntropySGLD chains on N(1, diag(1, 4)), η = 0.5: θ and θa moments against the exact
    stationary law of the discretised joint (step 0.05: SGLD's Lyapunov equation on the joint's Hessian;
    the slowest mode mixes in about 300 iterations, so 1,000 warm-up and 2,000 draws)."""
    eta, step = 0.5, 0.05

    def run():
        pyro.set_rng_seed(5)
        kernel = EntropySGLD(potential_fn=gaussian_potential, eta=eta, step_size=step)
        mcmc = MCMC(kernel, 2000, 1000, num_chains=64, disable_progbar=True,
                    initial_params={"x": torch.zeros(64, 2, dtype=torch.float64)})
        mcmc.run()
        return mcmc

    mcmc = run()
    assert mcmc.chain_method == "vectorized" and mcmc.num_chains == 64
    s = mcmc.get_samples(group_by_chain=True)
    x = torch.cat([s["x"], s["x_aux"]], -1).numpy()
    var, eye = np.array([1.0, 4.0]), np.eye(2)
    hessian = np.block([[np.diag(1 / var + 1 / eta), -eye / eta], [-eye / eta, eye / eta]])
    assert_moments(x, np.ones(4), sgld_stationary_covariance(hessian, step, np.zeros((4, 4))))
    again = run().get_samples(group_by_chain=True)
    assert all(torch.equal(s[k], again[k]) for k in s)
    idata = to_arviz(mcmc)
    assert idata.posterior["x_aux"].shape == (64, 2000, 2)
    assert idata.sample_stats["coupling_distance"].shape == (64, 2000)


def test_vectorized_constrained_site():
    """Gamma(3, 2) through its log transform, 128 vectorized SGLD chains: mean 1.5, var 0.75."""

    def model():
        pyro.sample("s", dist.Gamma(3.0, 2.0))

    mcmc = MCMC(SGLD(model, step_size=1e-2), 400, 300, num_chains=128, disable_progbar=True)
    mcmc.run()
    s = mcmc.get_samples(group_by_chain=True)["s"]
    assert mcmc.chain_method == "vectorized" and s.shape == (128, 400) and (s > 0).all()
    import arviz as az

    ess = float(az.ess(s.numpy(), method="mean"))  # ~100 relaxation times in all: ESS ≈ 10³
    assert abs(float(s.mean()) - 1.5) < 4.5 * math.sqrt(0.75 / ess)
    # the Euler bias in log-space, O(step x curvature 3) = 3 %, is within this band


def test_logistic_regression_vectorizes_with_minibatches():
    X, y = _data(200)
    kernel = EntropySGLD(logistic_regression, eta=0.1, step_size=1e-3)
    mcmc = MCMC(kernel, 50, 20, num_chains=6, disable_progbar=True)
    mcmc.run(X, y, batch_size=20)
    assert mcmc.chain_method == "vectorized"
    assert mcmc.get_samples(group_by_chain=True)["w_aux"].shape == (6, 50, 4)
    assert len(mcmc.diagnostics()["divergences"]) == 6


def _regression(X, y):
    """Linear regression whose minibatch gradient noise dwarfs the injected noise (B = 5 of 1,000)."""
    with pyro.plate("features", X.shape[1]):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
    with pyro.plate("data", X.shape[0], subsample_size=5) as idx:
        pyro.sample("y", dist.Normal((X[idx] * w.unsqueeze(-2)).sum(-1), 1.0), obs=y[idx])


def _increment_correlation(minibatches: str, seed: int = 0):
    """``chain_correlation`` of 4 vectorized SGLD chains' draws (increments' correlation between chains)."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(1000, 2, generator=g, dtype=torch.float64)
    y = X @ torch.tensor([1.0, -1.0], dtype=torch.float64) + torch.randn(1000, generator=g, dtype=torch.float64)
    pyro.set_rng_seed(seed)
    mcmc = MCMC(SGLD(_regression, step_size=1e-4), 2000, 200, num_chains=4, minibatches=minibatches,
                disable_progbar=True)
    mcmc.run(X, y)
    assert mcmc.chain_method == "vectorized" and mcmc.minibatches == minibatches
    return chain_correlation(mcmc.get_samples(group_by_chain=True)["w"])


def test_vectorized_chains_draw_their_own_minibatches_and_are_independent():
    """By default the chains' increments are uncorrelated: within 4 null sds of 0, where the null sd
    (about 0.0065 here: 2,000 draws, 6 pairs, 2 coordinates) is measured by shifting chains in time."""
    r = _increment_correlation("per_chain")
    assert abs(r["z"]) < 4 and 0.003 < r["null_sd"] < 0.013, r


def test_shared_minibatches_correlate_the_chains():
    """With one minibatch for all chains they share the gradient noise (here ~10x the injected
    noise): clearly correlated, the same statistic far beyond its null band."""
    r = _increment_correlation("shared")
    assert r["z"] > 20 and r["mean"] > 0.5, r


def _gathered_by_index_select(X, y):  # broadcasts over chains, but needs a 1-D index
    with pyro.plate("features", X.shape[1]):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
    with pyro.plate("data", X.shape[0], subsample_size=10) as idx:
        logits = (X.index_select(0, idx) * w.unsqueeze(-2)).sum(-1)
        pyro.sample("y", dist.Bernoulli(logits=logits), obs=y.index_select(0, idx))


def test_a_model_that_cannot_gather_per_chain_says_how_to_fix_it():
    X, y = _data()
    mcmc = MCMC(SGLD(_gathered_by_index_select, step_size=1e-3), 20, 5, num_chains=3, disable_progbar=True)
    with pytest.warns(UserWarning, match=r"cannot draw their own minibatches.*X\[idx\].*minibatches='shared'"):
        mcmc.run(X, y)
    assert mcmc.chain_method == "sequential"  # Pyro's driver: independent chains all the same
    assert mcmc.minibatches == "per_chain"
    shared = MCMC(SGLD(_gathered_by_index_select, step_size=1e-3), 20, 5, num_chains=3, minibatches="shared",
                  disable_progbar=True)
    shared.run(X, y)
    assert shared.chain_method == "vectorized"
    demanded = MCMC(SGLD(_gathered_by_index_select, step_size=1e-3), 20, 5, num_chains=3,
                    chain_method="vectorized", disable_progbar=True)
    with pytest.raises(ValueError, match="chain_method='vectorized': 3 chains cannot draw their own minibatches"):
        demanded.run(X, y)
    with pytest.raises(ValueError, match="minibatches must be 'per_chain'"):
        MCMC(SGLD(_gathered_by_index_select, step_size=1e-3), 20, num_chains=3, minibatches="chains")


def _not_broadcasting(X, y):
    w = pyro.sample("w", dist.Normal(torch.zeros(X.shape[1]), 1.0).to_event(1))
    with pyro.plate("data", X.shape[0]):
        pyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)  # X @ (C, 1, d): not a batch


def test_fallback_when_the_model_does_not_broadcast():
    X, y = _data()
    mcmc = MCMC(SGLD(_not_broadcasting, step_size=1e-3), 30, 10, num_chains=3, disable_progbar=True)
    with pytest.warns(UserWarning, match="not vectorized"):
        mcmc.run(X.float(), y.float())
    assert mcmc.chain_method == "sequential"
    assert mcmc.get_samples(group_by_chain=True)["w"].shape == (3, 30, 4)
    asked_shared = MCMC(SGLD(_not_broadcasting, step_size=1e-3), 5, 2, num_chains=2, minibatches="shared",
                        disable_progbar=True)
    with pytest.warns(UserWarning, match="not vectorized"):
        asked_shared.run(X.float(), y.float())
    assert asked_shared.minibatches == "per_chain"  # what ran: Pyro's driver, one chain per setup
    demanded = MCMC(SGLD(_not_broadcasting, step_size=1e-3), 30, 10, num_chains=3,
                    chain_method="vectorized", disable_progbar=True)
    with pytest.raises(ValueError, match="does not broadcast.*chain_method='sequential'"):
        demanded.run(X.float(), y.float())


def test_bad_chain_arguments():
    with pytest.raises(ValueError, match="chain_method"):
        MCMC(SGLD(_not_broadcasting, step_size=1e-3), 10, num_chains=2, chain_method="gpu")
    with pytest.raises(ValueError, match="pyro-flat kernel"):
        MCMC(NUTS(_not_broadcasting), 10, num_chains=2, chain_method="vectorized")
    with pytest.raises(ValueError, match="num_chains"):
        MCMC(SGLD(_not_broadcasting, step_size=1e-3), 10, num_chains=0)


def test_divergence_names_the_chain_and_keeps_draws():
    """One of 4 vectorized chains starts where the potential explodes."""

    def potential(p):
        x = p["x"]
        return (x**4).sum(-1)

    start = torch.tensor([[0.1], [0.2], [30.0], [0.3]])
    kernel = SGLD(potential_fn=potential, step_size=0.01)
    mcmc = MCMC(kernel, 20, 0, initial_params={"x": start}, num_chains=4, disable_progbar=True)
    with pytest.raises(DivergenceError, match="chain 2") as info:
        mcmc.run()
    assert info.value.chain == 2


def test_user_errors_are_raised_not_a_reason_to_fall_back(recwarn):
    X, y = _data()
    X[3, 1] = float("nan")
    mcmc = MCMC(SGLD(logistic_regression, step_size=1e-3), 10, 5, num_chains=3, disable_progbar=True)
    with pytest.raises(ValueError, match="NaN"):
        mcmc.run(X, y)
    assert not [w for w in recwarn if "not vectorized" in str(w.message)]


@pytest.mark.parametrize("num_chains, chain_method", [(3, "vectorized"), (2, "sequential")])
def test_thinning_keeps_every_kth_draw_of_the_same_run(num_chains, chain_method):
    """Same seed, same iterations: the thinned run's draws and statistics are the unthinned run's
    draws k-1, 2k-1, ... bit for bit (minibatches included), and only those are stored."""
    X, y = _data(100)
    runs = {}
    for thinning in (1, 5):
        pyro.set_rng_seed(3)
        kernel = EntropySGLD(logistic_regression, eta=0.1, step_size=1e-3)
        mcmc = MCMC(kernel, 40, 7, num_chains=num_chains, chain_method=chain_method,
                    thinning=thinning, disable_progbar=True)
        mcmc.run(X, y, batch_size=10)
        runs[thinning] = mcmc
    full, thin = runs[1].get_samples(group_by_chain=True), runs[5].get_samples(group_by_chain=True)
    assert thin["w_aux"].shape == (num_chains, 8, 4)
    for name in full:
        assert torch.equal(thin[name], full[name][:, 4::5]), name
    full_stats, thin_stats = to_arviz(runs[1]).sample_stats, to_arviz(runs[5]).sample_stats
    for stat in ("potential_energy", "grad_evals", "coupling_distance"):
        np.testing.assert_array_equal(thin_stats[stat].values, full_stats[stat].values[:, 4::5])
    assert int(thin_stats["grad_evals"].values[0, -1]) == 47


def test_bad_thinning():
    kernel = SGLD(_not_broadcasting, step_size=1e-3)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="thinning must be a positive int"):
            MCMC(kernel, 10, thinning=bad)
    with pytest.raises(ValueError, match="num_samples >= thinning"):
        MCMC(kernel, 3, thinning=4)
    with pytest.raises(ValueError, match="NUTS makes one iteration per draw"):
        MCMC(NUTS(_not_broadcasting), 10, thinning=2)


def test_bayesian_mlp_runs_its_chains_as_one_batched_network():
    """The MLP broadcasts over chains: batched energies equal per-chain ones (the check inside
    MCMC), and a vectorized run matches per-chain logits."""
    from pyro_flat.models import BayesianMLP

    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(40, 6, generator=g), torch.randint(0, 3, (40,), generator=g)
    net = BayesianMLP(6, [5, 4], 3)
    mcmc = MCMC(SGLD(net, step_size=1e-3), 20, 5, num_chains=3, chain_method="vectorized",
                thinning=4, disable_progbar=True)
    mcmc.run(X, y, batch_size=8)
    draws = mcmc.get_samples(group_by_chain=True)
    assert draws["layers.2.weight"].shape == (3, 5, 3, 4)
    last = [(draws[f"layers.{i}.weight"][:, -1, None], draws[f"layers.{i}.bias"][:, -1, None])
            for i in range(3)]  # (C, 1, out, in) and (C, 1, out): the vectorized layout
    batched = net.logits(X, last)
    assert batched.shape == (3, 40, 3)
    for c in range(3):
        one = net.logits(X, [(w[c, 0], b[c, 0]) for w, b in last])
        assert_close_roundoff(batched[c], one, length=6 * 3)  # the largest fan-in (6) times the depth (3)
    with pytest.raises(ValueError, match="weight.unsqueeze"):
        net.logits(X, [(w[:, 0], b[:, 0]) for w, b in last])


def _sgld_stationary_cov(hessian: np.ndarray, step: float) -> np.ndarray:
    """Exact stationary covariance of z <- z - step H z + sqrt(2 step) xi (discrete Lyapunov)."""
    from scipy.linalg import solve_discrete_lyapunov

    a = np.eye(len(hessian)) - step * hessian
    return solve_discrete_lyapunov(a, 2 * step * np.eye(len(hessian)))


def test_flat_potential_couples_each_chain_to_its_own_twin():
    """SGLD on flat_potential(U = x²/2 per chain), 8 vectorized chains from one point: θ, θa and
    θ − θa follow the exact law of the update (Var(θ − θa) ≈ η = 1). Summing the coupling over the
    chain axis as well gave Var(θ − θa) ≈ 0.15."""
    eta, step, C = 1.0, 0.02, 8
    U = flat_potential(lambda p: 0.5 * (p["x"] ** 2).sum(-1), eta=eta, sites=["x"])
    pyro.set_rng_seed(0)
    start = torch.zeros(C, 2, dtype=torch.float64)
    mcmc = MCMC(SGLD(potential_fn=U, step_size=step), 4000, 500, num_chains=C, disable_progbar=True,
                initial_params={"x": start, "x_aux": start.clone()})
    mcmc.run()
    assert mcmc.chain_method == "vectorized"
    s = mcmc.get_samples(group_by_chain=True)
    # per coordinate the joint Hessian is [[1 + 1/η, -1/η], [-1/η, 1/η]]; order (x0, xa0)
    h = np.array([[1 + 1 / eta, -1 / eta], [-1 / eta, 1 / eta]])
    cov = _sgld_stationary_cov(h, step)
    for i in range(2):
        pair = torch.stack([s["x"][..., i], s["x_aux"][..., i]], -1).numpy()
        assert_moments(pair, np.zeros(2), cov)
    diff = (s["x"] - s["x_aux"]).reshape(-1, 2).var(0)
    exact = cov[0, 0] + cov[1, 1] - 2 * cov[0, 1]
    assert torch.allclose(diff, torch.full((2,), exact, dtype=diff.dtype), rtol=0.15)


def _coupled_across_chains(p):
    """A hand-written joint that sums the coupling over the chain axis too (the old bug)."""
    return 0.5 * (p["x"] ** 2).sum(-1) + 0.5 * (p["x"] - p["x_aux"]).square().sum()


def test_probe_sees_a_potential_that_mixes_chains_where_chains_start_equal():
    """All chains start at one point with θa = θ, where the mixing term is zero: the probe moves
    the points apart before it compares, so it falls back (auto) or refuses (vectorized)."""
    start = {"x": torch.zeros(4, 2), "x_aux": torch.zeros(4, 2)}
    mcmc = MCMC(SGLD(potential_fn=_coupled_across_chains, step_size=0.01), 5, 2, num_chains=4,
                initial_params=start, disable_progbar=True)
    with pytest.warns(UserWarning, match="evaluated with the others"):
        mcmc.run()
    assert mcmc.chain_method == "sequential"
    demanded = MCMC(SGLD(potential_fn=_coupled_across_chains, step_size=0.01), 5, 2, num_chains=4,
                    initial_params=start, chain_method="vectorized", disable_progbar=True)
    with pytest.raises(ValueError, match="does not broadcast"):
        demanded.run()


def test_divergence_when_the_chains_energies_overflow_their_sum():
    """float32: the sum of the chains' energies overflows before any one chain's energy does;
    the check must still name the chain that diverged and keep the draws."""

    def model():
        pyro.sample("x", dist.Normal(torch.zeros(3), 1.0).to_event(1))

    pyro.set_rng_seed(1)
    mcmc = MCMC(SGLD(model, step_size=2.5), num_samples=400, warmup_steps=0, num_chains=4,
                disable_progbar=True)
    with pytest.raises(DivergenceError) as info:
        mcmc.run()
    err = info.value
    assert err.site == "x" and 0 <= err.chain < 4 and err.iteration > 0
    assert f"chain {err.chain} diverged at iteration {err.iteration}" in str(err)
    n = err.samples["x"].shape[0]
    assert n == err.iteration and torch.isfinite(err.samples["x"]).all()
    assert len(err.completed_chains) == 3


@pytest.mark.parametrize("chain_method", ["vectorized", "sequential"])
def test_run_twice_gives_what_a_new_object_gives(chain_method):
    X, y = _data(100)

    def new():
        kernel = EntropySGLD(logistic_regression, eta=0.1, step_size=1e-3)
        return MCMC(kernel, 20, 10, num_chains=3, chain_method=chain_method, thinning=2,
                    disable_progbar=True)

    mcmc = new()
    pyro.set_rng_seed(4)
    mcmc.run(X, y, batch_size=10)
    first = mcmc.get_samples()
    pyro.set_rng_seed(4)
    mcmc.run(X, y, batch_size=10)  # used to raise "stack expects a non-empty TensorList"
    second = mcmc.get_samples()
    fresh = new()
    pyro.set_rng_seed(4)
    fresh.run(X, y, batch_size=10)
    assert mcmc.chain_method == chain_method and second["w"].shape == (30, 4)
    for name in first:
        assert torch.equal(first[name], second[name]) and torch.equal(second[name], fresh.get_samples()[name])
    assert len(mcmc.kernel.partial_samples) == 3  # the second run's chains only


def test_entropy_hmc_runs_twice_identically():
    from pyro_flat import EntropyHMC

    X, y = _data(60)

    def run(mcmc):
        pyro.set_rng_seed(2)
        mcmc.run(X, y)
        return mcmc.get_samples()

    mcmc = MCMC(EntropyHMC(logistic_regression, eta=0.1, num_steps=4), 15, 15, num_chains=2,
                chain_method="vectorized", disable_progbar=True)
    first, second = run(mcmc), run(mcmc)
    for name in first:
        assert torch.equal(first[name], second[name])


def test_acceptance_rate_is_a_float_per_chain_in_both_drivers():
    from pyro_flat import EntropyHMC

    X, y = _data(60)
    for chain_method in ("vectorized", "sequential"):
        mcmc = MCMC(EntropyHMC(logistic_regression, eta=0.1, num_steps=4), 5, 5, num_chains=2,
                    chain_method=chain_method, disable_progbar=True)
        mcmc.run(X, y)
        rates = mcmc.diagnostics()["acceptance rate"]
        assert set(rates) == {"chain 0", "chain 1"}
        assert all(type(r) is float and 0 <= r <= 1 for r in rates.values()), (chain_method, rates)


def test_the_progress_bar_counts_every_iteration_while_logging_seldom(monkeypatch):
    """The bar advances by every iteration (warm-up, and thinning's skipped ones), while the kernel's
    ``logging()`` (a JSON record each) runs at most every 0.1 s and at each phase's end."""
    import pyro_flat.infer.mcmc
    from pyro.infer.mcmc.logger import ProgressBar

    counted, logged = [], []

    class Counting(ProgressBar):
        def update(self, n=1):
            counted.append(n)

    monkeypatch.setattr(pyro_flat.infer.mcmc, "ProgressBar", Counting)
    kernel = SGLD(_regression, step_size=1e-4)
    monkeypatch.setattr(kernel, "logging", lambda: logged.append(1) or {"step size": "1e-4"})
    X, y = _data()
    start = time.perf_counter()
    MCMC(kernel, 40, 7, num_chains=3, thinning=4, disable_progbar=True).run(X, y)
    seconds = time.perf_counter() - start
    assert sum(counted) == 7 + 40
    assert 2 <= len(logged) <= 2 + seconds / 0.1


@pytest.mark.parametrize("warmup, total", [(7, 190), (80, 195)])
def test_the_progress_bar_counts_a_cyclical_schedules_exploration_iterations(monkeypatch, warmup, total):
    """A cyclical schedule (4 cycles of 100 iterations, the last 25 of each sampling) makes no draw while
    it explores: the bar's total and its count are every iteration the kernel makes: the warm-up, then
    through the cycles up to the 40th sampling iteration after it (7 warm-up: iterations 75-99 and
    175-189, 190 in all; 80 warm-up: 80-99 and 175-194, 195)."""
    import pyro_flat.infer.mcmc
    from pyro.infer.mcmc.logger import ProgressBar

    counted, totals = [], []

    class Counting(ProgressBar):
        def __init__(self, warmup_steps, num_samples, **kwargs):
            totals.append(warmup_steps + num_samples)
            super().__init__(warmup_steps, num_samples, **kwargs)

        def update(self, n=1):
            counted.append(n)

    monkeypatch.setattr(pyro_flat.infer.mcmc, "ProgressBar", Counting)
    schedule = schedules.cyclical_cosine(num_steps=400, num_cycles=4, exploration=0.75)
    kernel = SGLD(_regression, step_size=1e-4, schedule=schedule)
    MCMC(kernel, 40, warmup, num_chains=3, thinning=4, disable_progbar=True).run(*_data())
    assert kernel.iteration == total and totals == [total] and sum(counted) == total


def test_a_bayesian_mlp_moved_by_to_takes_its_prior_along():
    """``net.double()`` (or ``net.to("cuda")``) moves the prior: its scale is a buffer of the module."""
    from pyro_flat.models import BayesianMLP

    net = BayesianMLP(4, [8], 3, prior_scale=0.5).double()
    X, y = torch.randn(30, 4, dtype=torch.float64), torch.randint(0, 3, (30,))
    trace = pyro.poutine.trace(net).get_trace(X, y, batch_size=10)
    weight = trace.nodes["layers.0.weight"]
    assert weight["value"].dtype == torch.float64 and bool((weight["fn"].base_dist.scale == 0.5).all())
    trace.compute_log_prob()
    assert trace.nodes["y"]["log_prob"].dtype == torch.float64
