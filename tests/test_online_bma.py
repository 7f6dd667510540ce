"""OnlineBMA: the running average of each draw's class probabilities equals the Bayesian model average
of the stored draws (bma_predict) after every draw, and its accuracy and NLL curve is running_bma's."""

import numpy as np
import pytest
import torch

import pyro
import pyro.distributions as dist
from pyro.infer import MCMC as PyroMCMC
from pyro_flat import MCMC, SGLD, EntropySGLD, OnlineBMA, bma_predict, metrics


def model(X, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(3, dtype=X.dtype), 1.0).to_event(1))
    s = pyro.sample("s", dist.LogNormal(torch.zeros((), dtype=X.dtype), 0.5))  # a constrained site
    with pyro.plate("data", X.shape[0]):
        pyro.sample("y", dist.Bernoulli(logits=(X * w).sum(-1) * s), obs=y)


def data():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(300, 3, generator=g, dtype=torch.float64)
    y = torch.bernoulli(torch.sigmoid(X @ torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64)), generator=g)
    return X[:200], y[:200], X[200:], y[200:]


def test_the_running_average_is_the_stored_draws_bma_after_every_draw():
    X, y, X_test, y_test = data()
    pyro.set_rng_seed(0)
    bma = OnlineBMA(model, X_test, y=y_test)
    seen = []
    bma_update = bma.update

    def keep(draws):  # the average after each draw, to compare with the stored draws' average
        bma_update(draws)
        seen.append({u: p.clone() for u, p in bma.probs.items()})

    bma.update = keep
    mcmc = MCMC(EntropySGLD(model, eta=0.1, step_size=2e-3), num_samples=30, warmup_steps=20, num_chains=3,
                thinning=2, hook_fn=bma, disable_progbar=True)
    mcmc.run(X, y)
    assert bma.uses == ("theta", "aux", "both") and bma.num_draws == 15 and len(bma.history["aux"]) == 15
    draws = mcmc.get_samples(group_by_chain=True)
    for k in (1, 7, 15):
        first_k = {site: v[:, :k].reshape(-1, *v.shape[2:]) for site, v in draws.items()}
        for use in ("theta", "aux", "both"):
            want = bma_predict(model, first_k, X_test, use=use).double()
            torch.testing.assert_close(seen[k - 1][use], want, rtol=1e-10, atol=1e-12)
    probs = torch.stack([bma_predict(model, {s: v[c, j:j + 1] for s, v in draws.items()}, X_test, use="theta")
                         for c in range(3) for j in range(15)]).reshape(3, 15, -1)
    curve = metrics.running_bma(probs, y_test, num_points=15)
    np.testing.assert_allclose([h["accuracy"] for h in bma.history["theta"]], curve["accuracy"], atol=1e-12)
    np.testing.assert_allclose([h["nll"] for h in bma.history["theta"]], curve["nll"], rtol=1e-8)
    # the studies' curve (every few draws, against a cost) is running_bma's, standard errors included
    cost = np.arange(1, 16) * 7.0
    for points in (15, 6):
        want = metrics.running_bma(probs, y_test, warmup=20, thin=2, num_points=points, cost=cost)
        got = bma.curve("theta", warmup=20, thin=2, num_points=points, cost=cost)
        assert set(got) == set(want)
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value, rtol=1e-8, atol=1e-12, err_msg=key)
    with pytest.raises(ValueError, match="use='nope'"):
        bma.curve("nope")


def test_through_pyros_driver():
    X, y, X_test, y_test = data()
    pyro.set_rng_seed(1)
    bma = OnlineBMA(model, X_test, y=y_test)
    mcmc = PyroMCMC(SGLD(model, step_size=2e-3), num_samples=24, warmup_steps=10, hook_fn=bma, disable_progbar=True)
    mcmc.run(X, y)
    assert bma.uses == ("theta",) and bma.num_draws == 24
    torch.testing.assert_close(bma.probs["theta"], bma_predict(model, mcmc.get_samples(), X_test).double(),
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kwargs, named", [
    (dict(uses=["theta", "tehta"]), "uses=\\['theta', 'tehta'\\]"),
    (dict(uses=[]), "uses=\\[\\]"),
    (dict(y=[0, 1]), "y must be a tensor"),
])
def test_bad_arguments_are_named(kwargs, named):
    X_test, y_test = data()[2:]
    settings = dict(y=y_test)
    settings.update(kwargs)
    with pytest.raises(ValueError, match=named):
        OnlineBMA(model, X_test, **settings)


def test_labels_of_another_length_are_refused_at_the_first_draw():
    X, y, X_test, y_test = data()
    bma = OnlineBMA(model, X_test, y=y_test[:50])
    mcmc = MCMC(SGLD(model, step_size=2e-3), num_samples=3, warmup_steps=2, num_chains=2, hook_fn=bma,
                disable_progbar=True)
    with pytest.raises(ValueError, match="y has 50 labels but the model predicts 100 points"):
        mcmc.run(X, y)


def test_sequential_chains_and_a_resumed_run_reach_the_average_of_every_draw(tmp_path):
    """Pyro's driver names a chain's phase "Sample [c]"; a run resumed from a checkpoint hands the hook the
    restored draws first: both give the average of all the draws."""
    X, y, X_test, y_test = data()
    pyro.set_rng_seed(2)
    bma = OnlineBMA(model, X_test, y=y_test)
    mcmc = MCMC(SGLD(model, step_size=2e-3), num_samples=10, warmup_steps=5, num_chains=2, chain_method="sequential",
                hook_fn=bma, disable_progbar=True)
    mcmc.run(X, y)
    assert bma.num_draws == 20
    torch.testing.assert_close(bma.probs["theta"], bma_predict(model, mcmc.get_samples(), X_test).double())

    def run(hook, checkpoint=None):
        pyro.set_rng_seed(3)
        mcmc = MCMC(EntropySGLD(model, eta=0.1, step_size=2e-3), num_samples=40, warmup_steps=10, num_chains=2,
                    hook_fn=hook, checkpoint=checkpoint, checkpoint_every=1e-9, disable_progbar=True)
        mcmc.run(X, y)

    whole = OnlineBMA(model, X_test, y=y_test)
    run(whole)
    plain = MCMC(EntropySGLD(model, eta=0.1, step_size=2e-3), num_samples=40, warmup_steps=10, num_chains=2,
                 disable_progbar=True)
    pyro.set_rng_seed(3)
    plain.run(X, y)  # the hook draws no number from the run's stream: the same chains as without it
    torch.testing.assert_close(whole.probs["both"], bma_predict(model, plain.get_samples(), X_test).double())
    first = OnlineBMA(model, X_test, y=y_test)

    def stop_at_25(kernel, params, stage, i):
        first(kernel, params, stage, i)
        if stage == "Sample" and i == 25:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(stop_at_25, tmp_path / "run.ckpt")
    resumed = OnlineBMA(model, X_test, y=y_test)
    run(resumed, tmp_path / "run.ckpt")
    assert resumed.num_draws == 40
    for use in ("theta", "aux", "both"):
        torch.testing.assert_close(resumed.probs[use], whole.probs[use], rtol=1e-12, atol=1e-12)
