import math

import matplotlib

matplotlib.use("Agg")

import arviz as az
import numpy as np
import pytest
import torch

import pyro
import pyro.distributions as dist
from pyro.infer import MCMC
from pyro_flat import EntropySGLD, SGLD, bma_predict, metrics, schedules, to_arviz


def logistic(X, y=None):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    s = pyro.sample("s", dist.LogNormal(0.0, 0.3))
    with pyro.plate("data", X.shape[0], subsample_size=20) as idx:
        obs = None if y is None else y.index_select(0, idx)
        pyro.sample("y", dist.Bernoulli(logits=s * (X.index_select(0, idx) @ w)), obs=obs)


@pytest.fixture(scope="module")
def fitted():
    pyro.set_rng_seed(0)
    X = torch.randn(200, 3)
    y = torch.bernoulli(torch.sigmoid(X @ torch.tensor([2.0, -1.0, 0.0])))
    mcmc = MCMC(EntropySGLD(logistic, eta=0.05, step_size=1e-3), num_samples=300,
                warmup_steps=100, num_chains=2, disable_progbar=True)
    mcmc.run(X, y)
    return mcmc, X, y


def test_samples_and_constrained_sites(fitted):
    mcmc, _, _ = fitted
    s = mcmc.get_samples(group_by_chain=True)
    assert set(s) == {"w", "w_aux", "s", "s_aux"}
    assert s["w"].shape == s["w_aux"].shape == (2, 300, 3)
    assert (s["s"] > 0).all()  # returned in the constrained space
    assert (s["s_aux"] < 0).any()  # the twin lives in the unconstrained (log) space


def test_to_arviz_shapes_stats_and_plots(fitted):
    mcmc, _, _ = fitted
    idata = to_arviz(mcmc)
    assert idata.posterior["w"].shape == (2, 300, 3)
    assert idata.posterior["w_aux"].shape == (2, 300, 3)
    stats = idata.sample_stats
    for name in ("step_size", "potential_energy", "coupling_distance", "lp"):
        assert stats[name].shape == (2, 300)
    assert np.allclose(stats["step_size"], 1e-3)
    # coupling distance is ||θ - θa|| over all coupled sites, recomputed from the draws
    s = mcmc.get_samples(group_by_chain=True)
    dist2 = ((s["w"] - s["w_aux"]) ** 2).sum(-1) + (s["s"].log() - s["s_aux"]) ** 2
    assert np.allclose(stats["coupling_distance"], dist2.sqrt().numpy(), rtol=1e-4, atol=1e-5)
    summary = az.summary(idata)
    assert np.isfinite(summary["ess_bulk"]).all() and np.isfinite(summary["r_hat"]).all()
    axes = az.plot_trace(idata, var_names=["w", "w_aux"])
    assert axes.shape[0] == 2
    az.plot_rank(idata, var_names=["s"])
    matplotlib.pyplot.close("all")


def test_to_arviz_from_dict():
    idata = to_arviz({"a": torch.randn(50, 2)}, group_by_chain=False)
    assert idata.posterior["a"].shape == (1, 50, 2)
    with pytest.raises(ValueError, match="same"):
        to_arviz({"a": torch.randn(2, 50), "b": torch.randn(3, 50)})


def test_bma_averages_probabilities_not_logits():
    def model(X, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([1]).to_event(1))
        with pyro.plate("data", X.shape[0], subsample_size=2) as idx:
            pyro.sample("y", dist.Bernoulli(logits=X.index_select(0, idx) @ w), obs=y)

    X = torch.tensor([[1.0], [2.0], [-1.0]])  # 3 points, blocks of 2: the last block overlaps
    draws = {"w": torch.tensor([[4.0], [-2.0]]), "w_aux": torch.tensor([[0.0], [1.0]])}
    p_theta = bma_predict(model, draws, X, use="theta")
    expected = (torch.sigmoid(X[:, 0] * 4.0) + torch.sigmoid(-X[:, 0] * 2.0)) / 2
    assert p_theta.shape == (3,)  # the subsampling plate is switched off for prediction
    assert torch.allclose(p_theta, expected)
    assert not torch.allclose(p_theta, torch.sigmoid(X[:, 0] * 1.0))  # mean logit would be 1
    p_aux = bma_predict(model, draws, X, use="aux")
    assert torch.allclose(p_aux, (0.5 + torch.sigmoid(X[:, 0])) / 2)
    p_both = bma_predict(model, draws, X, use="both")
    assert torch.allclose(p_both, (p_theta + p_aux) / 2)
    with pytest.raises(ValueError, match="use"):
        bma_predict(model, draws, X, use="logits")
    with pytest.raises(ValueError, match="use='theta'"):
        bma_predict(model, {"w": draws["w"]}, X, use="aux")


def _broadcasting(X, y=None):
    """Takes a leading dimension of draws: w (K, d) gives logits (K, N)."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0], subsample_size=7) as idx:
        pyro.sample("y", dist.Bernoulli(logits=(X.index_select(0, idx) * w.unsqueeze(-2)).sum(-1)), obs=y)


def _mixing(X, y=None):
    """Broadcasts without an error but mixes the draws of a block (each logit also reads the mean weight)."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0]):
        pyro.sample("y", dist.Bernoulli(logits=(X * w.unsqueeze(-2)).sum(-1) + w.mean()), obs=y)


def _matrix(X, y=None):
    """Cannot take a leading dimension: X @ w needs w of shape (d,)."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0]):
        pyro.sample("y", dist.Bernoulli(logits=torch.mv(X, w)), obs=y)


@pytest.mark.parametrize("model", [_broadcasting, _mixing, _matrix])
def test_bma_in_blocks_of_draws_is_the_average_over_every_draw(model, monkeypatch):
    """Blocks of draws where the model broadcasts, one at a time where it fails or mixes the draws: the
    same average of each draw's probabilities (written out), with blocks that do not divide the draws."""
    import pyro_flat.predictive as predictive

    g = torch.Generator().manual_seed(0)
    X, draws = torch.randn(20, 3, generator=g), {"w": torch.randn(11, 3, generator=g)}
    shift = draws["w"].mean(-1, keepdim=True) if model is _mixing else 0.0  # each draw's own mean weight
    expected = torch.sigmoid(draws["w"] @ X.T + shift).mean(0)
    monkeypatch.setattr(predictive, "BLOCK_ELEMENTS", 4 * 20)  # blocks of 4 draws: 4 + 4 + 3
    assert torch.allclose(bma_predict(model, draws, X), expected, atol=1e-6)


def test_bma_on_fitted_model_beats_chance(fitted):
    mcmc, X, y = fitted
    probs = bma_predict(logistic, mcmc.get_samples(), X, use="both")
    assert probs.shape == (200,)
    assert metrics.accuracy(probs, y) > 0.75


def test_metrics_against_hand_values():
    p = torch.tensor([0.9, 0.2, 0.6, 0.7])
    y = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert metrics.accuracy(p, y) == pytest.approx(0.75)
    assert metrics.nll(p, y) == pytest.approx(-(math.log(0.9) + math.log(0.8) + math.log(0.4) + math.log(0.7)) / 4)
    assert metrics.brier(p, y) == pytest.approx((0.01 + 0.04 + 0.36 + 0.09) / 4)
    # confidences 0.9, 0.8, 0.6, 0.7; correct 1, 1, 0, 1
    # width bins of 0.5: [0.5, 1.0) holds all -> |0.75 - 0.75| = 0
    assert metrics.ece(p, y, n_bins=2) == pytest.approx(0.0, abs=1e-6)
    # 4 width bins: [.5,.75): conf .6,.7 acc .5 -> |.5-.65|; [.75,1): conf .9,.8 acc 1 -> |1-.85|
    assert metrics.ece(p, y, n_bins=4) == pytest.approx(0.5 * 0.15 + 0.5 * 0.15)
    # 2 mass bins: {.6,.7} and {.8,.9}: same split here
    assert metrics.ece(p, y, n_bins=2, binning="mass") == pytest.approx(0.15)
    pc = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    yc = torch.tensor([0, 1])
    assert metrics.brier(pc, yc) == pytest.approx(((0.09 + 0.04 + 0.01) + (0.01 + 0.81 + 0.64)) / 2)
    with pytest.raises(ValueError, match="binning"):
        metrics.ece(p, y, binning="quantile")


def test_schedules():
    s = schedules.cyclical_cosine(num_steps=100, num_cycles=4)
    assert s(0) == 1.0 and s(25) == 1.0 and s(12) < 0.6 and s(24) < 0.01
    assert not s.is_sampling(5) and s.is_sampling(20)
    d = schedules.polynomial_decay(b=10, gamma=1.0)
    assert d(0) == 1.0 and d(10) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        schedules.cyclical_cosine(num_steps=3, num_cycles=5)


def test_schedule_drives_step_size():
    def model():
        pyro.sample("x", dist.Normal(0.0, 1.0))

    sched = schedules.polynomial_decay(b=5, gamma=1.0)
    mcmc = MCMC(SGLD(model, step_size=0.1, schedule=sched), num_samples=10, warmup_steps=5,
                disable_progbar=True)
    mcmc.run()
    steps = to_arviz(mcmc).sample_stats["step_size"].values[0]
    assert np.allclose(steps, [0.1 * sched(k) for k in range(5, 15)])


def test_dtype_follows_model():
    def model():
        pyro.sample("x", dist.Normal(torch.zeros(2, dtype=torch.float64), 1.0).to_event(1))

    mcmc = MCMC(EntropySGLD(model, eta=0.1, step_size=0.1), num_samples=5, disable_progbar=True)
    mcmc.run()
    assert mcmc.get_samples()["x"].dtype == torch.float64
    assert mcmc.get_samples()["x_aux"].dtype == torch.float64


def test_reliability_curve_is_the_calibration_behind_the_ece():
    """Labels drawn from the predicted probabilities are calibrated: every bin's accuracy matches its
    confidence within binomial error; a model that is 0.99 sure and right 80 % of the time is not."""
    g = torch.Generator().manual_seed(0)
    p = torch.rand(20000, generator=g)
    y = torch.bernoulli(p, generator=g)
    curve = metrics.reliability_curve(p, y, n_bins=10, binning="mass")
    se = np.sqrt(curve["accuracy"] * (1 - curve["accuracy"]) / curve["count"]) + 1e-3
    assert (np.abs(curve["accuracy"] - curve["confidence"]) < 4 * se).all()
    assert curve["count"].sum() == 20000
    weights = curve["count"] / curve["count"].sum()
    assert metrics.ece(p, y, 10, "mass") == pytest.approx(
        float((weights * np.abs(curve["accuracy"] - curve["confidence"])).sum()))
    sure = torch.full((1000,), 0.99)
    wrong = (torch.arange(1000) % 5 == 0).float()  # a fifth of the labels are 0: the top class (1) is right 80 %
    over = metrics.reliability_curve(sure, 1 - wrong, n_bins=5)
    assert over["confidence"] == pytest.approx([0.99]) and over["accuracy"] == pytest.approx([0.8])


def _rounded_when_batched(X, y=None):
    """Broadcasts, and a block of draws rounds its logits as bf16 would (another precision's round-off, as a GPU's
    TF32 or autocast gives a block against one draw)."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    logits = (X * w.unsqueeze(-2)).sum(-1)
    if w.dim() > 1:
        logits = logits.to(torch.bfloat16).float()
    with pyro.plate("data", X.shape[0]):
        pyro.sample("y", dist.Bernoulli(logits=logits), obs=y)




@pytest.mark.parametrize("model, blocks", [(_rounded_when_batched, True), (_mixing, False)])
def test_blocks_of_draws_allow_the_round_off_of_the_precision_they_run_in(model, blocks, monkeypatch):
    """Under bf16 autocast a block's probabilities differ from one draw's by bf16's round-off: still blocks (a
    float32 tolerance sent it one draw at a time); a model that mixes the draws still goes one at a time."""
    import pyro_flat.predictive as predictive

    g = torch.Generator().manual_seed(0)
    X, draws = torch.randn(20, 3, generator=g), {"w": torch.randn(11, 3, generator=g)}
    monkeypatch.setattr(predictive, "BLOCK_ELEMENTS", 4 * 20)
    counted = []
    wrapped = lambda X, y=None: counted.append(1) or model(X, y)  # noqa: E731
    probs = bma_predict(wrapped, draws, X, autocast="bf16")
    assert (len(counted) < 11) == blocks, len(counted)  # 3 blocks, or each of the 11 draws alone
    shift = draws["w"].mean(-1, keepdim=True) if model is _mixing else 0.0
    assert torch.allclose(probs, torch.sigmoid(draws["w"] @ X.T + shift).mean(0), atol=1e-2)
