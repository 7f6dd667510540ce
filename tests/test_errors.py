"""Bad input gets a ValueError naming the argument; a diverging chain stops and keeps its draws."""

import pickle

import pytest
import torch

import pyro
import pyro.distributions as dist
from pyro.infer import MCMC
from pyro_flat import SGLD, DivergenceError, EntropySGLD


def gaussian():
    pyro.sample("theta", dist.Normal(torch.zeros(3), torch.tensor([1.0, 0.5, 0.25])).to_event(1))


def logistic(X, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0], subsample_size=5) as idx:
        pyro.sample("y", dist.Bernoulli(logits=X.index_select(0, idx) @ w), obs=y[idx])


def run(kernel, *args, num_samples=20, warmup=5):
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup, disable_progbar=True)
    mcmc.run(*args)
    return mcmc


@pytest.mark.parametrize("eta", [0.0, -0.1, float("nan")])
def test_eta(eta):
    with pytest.raises(ValueError, match="eta"):
        EntropySGLD(gaussian, eta=eta, step_size=0.1)


@pytest.mark.parametrize("step", [0.0, -1e-3, float("nan"), float("inf"), "big"])
def test_step_size(step):
    with pytest.raises(ValueError, match="step_size"):
        SGLD(gaussian, step_size=step)


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan")])
def test_temperature(temperature):
    with pytest.raises(ValueError, match="temperature"):
        EntropySGLD(gaussian, eta=0.1, step_size=0.1, temperature=temperature)


def test_model_and_potential_fn_exclusive():
    with pytest.raises(ValueError, match="exactly one of model= or potential_fn="):
        SGLD(gaussian, potential_fn=lambda p: p["x"].sum(), step_size=0.1)
    with pytest.raises(ValueError, match="exactly one"):
        SGLD(step_size=0.1)


def test_potential_fn_needs_initial_params():
    with pytest.raises(ValueError, match="initial_params"):
        run(SGLD(potential_fn=lambda p: (p["x"] ** 2).sum(), step_size=0.1))


def test_no_continuous_latent():
    def model(y):
        pyro.sample("y", dist.Normal(0.0, 1.0), obs=y)

    with pytest.raises(ValueError, match="no continuous latent site"):
        run(SGLD(model, step_size=0.1), torch.tensor(1.0))


def test_discrete_latent():
    def model():
        pyro.sample("mu", dist.Normal(0.0, 1.0))
        pyro.sample("z", dist.Bernoulli(0.5))

    with pytest.raises(ValueError, match="'z' is discrete"):
        run(SGLD(model, step_size=0.1))


def test_sites_naming_missing_site():
    with pytest.raises(ValueError, match="'nope'"):
        run(EntropySGLD(gaussian, eta=0.1, step_size=0.1, sites=["nope"]))


def test_nan_in_data():
    X, y = torch.randn(20, 2), torch.ones(20)
    X[3, 1] = float("nan")
    with pytest.raises(ValueError, match="argument 0 holds 1 NaN"):
        run(SGLD(logistic, step_size=0.01), X, y)


def test_local_latent_in_subsampled_plate():
    def model(y):
        with pyro.plate("data", len(y), subsample_size=2):
            z = pyro.sample("z", dist.Normal(0.0, 1.0))
            pyro.sample("y", dist.Normal(z, 1.0), obs=torch.zeros(2))

    with pytest.raises(ValueError, match="inside the subsampled plate"):
        run(SGLD(model, step_size=0.1), torch.zeros(10))


def test_non_finite_initial_point():
    def model():
        pyro.sample("x", dist.Normal(0.0, 1.0))

    kernel = SGLD(potential_fn=lambda p: (p["x"] ** 2).sum() / 0.0, step_size=0.1)
    with pytest.raises(ValueError, match="initial point"):
        MCMC(kernel, num_samples=2, initial_params={"x": torch.ones(1, 1)}, disable_progbar=True).run()


def test_divergence_stops_chain_and_keeps_draws():
    kernel = EntropySGLD(gaussian, eta=0.1, step_size=3.0)  # 3 * 16 >> 2: unstable
    mcmc = MCMC(kernel, num_samples=500, warmup_steps=3, disable_progbar=True)
    with pytest.raises(DivergenceError) as info:
        mcmc.run()
    err = info.value
    assert err.site in ("theta", "theta_aux")
    assert "smaller step_size" in str(err) and f"iteration {err.iteration}" in str(err)
    kept = err.samples["theta"]
    assert kept.shape[0] == err.iteration - 3 and kept.shape[0] > 5
    assert torch.isfinite(kept).all() and torch.isfinite(err.samples["theta_aux"]).all()
    assert torch.equal(kernel.partial_samples[-1]["theta"], kept)
    clone = pickle.loads(pickle.dumps(err))  # crosses Pyro's worker processes
    assert clone.iteration == err.iteration and torch.equal(clone.samples["theta"], kept)


def test_divergence_in_second_chain_keeps_first_chain():
    calls = {"n": 0}

    def potential(p):
        calls["n"] += 1
        boom = float("nan") if calls["n"] > 60 else 0.0
        return 0.5 * (p["x"] ** 2).sum() + boom

    kernel = SGLD(potential_fn=potential, step_size=0.1)
    mcmc = MCMC(kernel, num_samples=40, warmup_steps=0, num_chains=2,
                initial_params={"x": torch.zeros(2, 2)}, disable_progbar=True)
    with pytest.raises(DivergenceError) as info:
        mcmc.run()
    assert info.value.chain == 1
    assert info.value.completed_chains[0]["x"].shape == (40, 2)
    assert info.value.site == "x" and "potential energy became nan" in str(info.value)


def test_initial_params_twins_start_at_their_site_unless_given():
    kernel = EntropySGLD(gaussian, eta=0.1, step_size=0.1)
    kernel.initial_params = {"theta": torch.tensor([1.0, 2.0, 3.0])}
    kernel.setup(0)
    assert torch.equal(kernel.initial_params["theta_aux"], torch.tensor([1.0, 2.0, 3.0]))
    kernel.initial_params = {"theta": torch.zeros(3), "theta_aux": torch.ones(3)}
    kernel.setup(0)
    assert torch.equal(kernel.initial_params["theta"], torch.zeros(3))
    assert torch.equal(kernel.initial_params["theta_aux"], torch.ones(3))
    kernel.initial_params = {"thetta": torch.zeros(3)}
    with pytest.raises(ValueError, match="'thetta'"):
        kernel.setup(0)


def _logistic_full(X, y, subsample_size=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(X.shape[1]), 1.0).to_event(1))
    with pyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        pyro.sample("y", dist.Bernoulli(logits=X.index_select(0, idx) @ w), obs=y[idx])


@pytest.mark.parametrize("chain_method", ["vectorized", "sequential"])
@pytest.mark.parametrize("case, needle", [
    ("empty", r"model argument 0 is empty \(shape \(0, 3\)\)"),
    ("subsample", r"subsample_size=50 but only 20 data points; pass subsample_size <= 20"),
    # vectorized: the shapes passed, chains first; Pyro's driver hands each chain its row
    ("initial_params", r"initial_params\['w'\] has shape \((2, 5|5,)\), but the site's unconstrained value has "
                       r"shape \((2, 3|3,)\)"),
])
def test_bad_data_and_initial_values_name_the_argument_in_both_drivers(chain_method, case, needle):
    from pyro_flat import MCMC as FlatMCMC

    X, y = torch.randn(20, 3), torch.ones(20)
    args, kwargs = (X, y), {}
    if case == "empty":
        args = (X[:0], y[:0])
    if case == "subsample":
        kwargs = {"subsample_size": 50}
    init = {"w": torch.zeros(2, 5)} if case == "initial_params" else None
    mcmc = FlatMCMC(SGLD(_logistic_full, step_size=1e-3), 5, 2, num_chains=2, chain_method=chain_method,
                    initial_params=init, disable_progbar=True)
    with pytest.raises(ValueError, match=needle):
        mcmc.run(*args, **kwargs)


@pytest.mark.parametrize("chain_method", ["vectorized", "sequential"])
@pytest.mark.parametrize("kwargs, needle", [
    (dict(num_samples=0), "num_samples must be a positive integer, got num_samples=0"),
    (dict(num_samples=-3), "num_samples must be a positive integer"),
    (dict(num_samples=10, warmup_steps=-1), "warmup_steps must be a non-negative integer, got warmup_steps=-1"),
    (dict(num_samples=10, initial_params={"theta": torch.zeros(3)}),
     r"initial_params\['theta'\] has shape \(3,\); with num_chains=2 each value needs a leading chain dimension"),
])
def test_bad_run_lengths_are_refused_alike_by_both_drivers(chain_method, kwargs, needle):
    from pyro_flat import MCMC as FlatMCMC

    with pytest.raises(ValueError, match=needle):
        FlatMCMC(SGLD(gaussian, step_size=0.1), num_chains=2, chain_method=chain_method, **kwargs)


@pytest.mark.parametrize("chain_method", ["vectorized", "sequential"])
def test_initial_params_naming_an_unknown_site(chain_method):
    from pyro_flat import MCMC as FlatMCMC

    mcmc = FlatMCMC(EntropySGLD(gaussian, eta=0.1, step_size=0.1), 5, 2, num_chains=2,
                    chain_method=chain_method, initial_params={"tehta": torch.zeros(2, 3)},
                    disable_progbar=True)
    with pytest.raises(ValueError, match=r"initial_params names \['tehta'\], which are not latent sites"):
        mcmc.run()


def test_make_kernel_refuses_a_setting_the_kernel_does_not_take_and_names_it():
    from pyro_flat.kernels import kernel_settings, make_kernel

    potential = lambda p: (p["x"] ** 2).sum()  # noqa: E731
    with pytest.raises(TypeError) as refused:
        make_kernel("entropy-sgld", potential_fn=potential, step_size=0.01, eta=0.1, setp_size=0.02)
    text = str(refused.value)
    assert "EntropySGLD takes no setting 'setp_size' (did you mean 'step_size'?)" in text
    assert "its settings: " + ", ".join(kernel_settings("entropy-sgld")) in text
    with pytest.raises(TypeError, match=r"SGLD takes no settings 'eta', 'rho'; its settings: step_size, "):
        make_kernel("sgld", potential_fn=potential, step_size=0.01, eta=0.1, rho=0.5)
    with pytest.raises(TypeError, match=r"SGD takes no setting 'temperature' \(SGD fixes it itself\)"):
        make_kernel("sgd", potential_fn=potential, step_size=0.01, temperature=1.0)
    assert "temperature" not in kernel_settings("sam-sgd") and "rho" in kernel_settings("sam-sgd")
    assert {"eta", "full_mass", "step_size"} <= set(kernel_settings("entropy-hmc"))
    assert "model" not in kernel_settings("sgld") and "potential_fn" not in kernel_settings("sgld")
    kernel = make_kernel("sasgld", potential_fn=potential, step_size=0.01, rho=0.3, temperature=0.5)
    assert (kernel.rho, kernel.temperature) == (0.3, 0.5)


def test_a_divergence_read_a_step_late_is_named_before_the_next_steps_own_error():
    """The eager divergence check is read one step late (no host wait per step on a GPU). The step after a diverged
    one can fail on its own (as Pyro's check of a NaN location does), and within a draw of 7 iterations it has run by
    the time the check is read: the error is still the divergence, at its iteration, and no diverged state is kept."""
    def potential(p):
        x = p["x"]
        if not bool(torch.isfinite(x).all()):
            raise ValueError("the model's own error at a non-finite x")
        tails = torch.where(x.abs() > 2.5, float("nan"), 0.0)  # NaN, and a NaN gradient, out in the tails
        return (0.5 * x ** 2 + x * tails).sum()

    from pyro_flat import MCMC as FlatMCMC

    pyro.set_rng_seed(0)
    mcmc = FlatMCMC(SGLD(potential_fn=potential, step_size=0.1), num_samples=100, warmup_steps=0, thinning=7,
                    initial_params={"x": torch.zeros(2)}, disable_progbar=True)
    with pytest.raises(DivergenceError) as info:
        mcmc.run()
    err = info.value
    assert f"diverged at iteration {err.iteration}" in str(err) and err.iteration > 7
    assert err.samples["x"].shape[0] == err.iteration // 7 and torch.isfinite(err.samples["x"]).all()
    assert err.iteration % 7 != 6, "the diverged step must not be the draw's last: the next step has to run"
