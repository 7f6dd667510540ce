import math

import pytest
import torch

import pyro
import pyro.distributions as dist
from pyro import poutine
from pyro.infer import Predictive
from pyro.nn import PyroModule, PyroSample
from pyro_flat import flat_posterior, flat_potential

ETA = 0.3


def regression(X, y=None):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    s = pyro.sample("s", dist.Gamma(2.0, 2.0))  # constrained: coupled through log
    with pyro.plate("data", X.shape[0]):
        pyro.sample("y", dist.Normal(X @ w, s), obs=y)


def test_log_density_matches_hand_computation():
    X, y = torch.randn(7, 3), torch.randn(7)
    flat = flat_posterior(regression, ETA)
    tr = poutine.trace(flat).get_trace(X, y)
    w, s = tr.nodes["w"]["value"], tr.nodes["s"]["value"]
    w_aux, s_aux = tr.nodes["w_aux"]["value"], tr.nodes["s_aux"]["value"]
    assert w_aux.shape == w.shape and s_aux.shape == s.shape
    hand = (
        dist.Normal(0.0, 1.0).log_prob(w).sum()
        + dist.Gamma(2.0, 2.0).log_prob(s)
        + dist.Normal(X @ w, s).log_prob(y).sum()
        # log N(θa; t^{-1}(θ), ηI): the Gamma site is coupled in log space
        - ((w - w_aux) ** 2).sum() / (2 * ETA) - 3 * 0.5 * math.log(2 * math.pi * ETA)
        - (s.log() - s_aux) ** 2 / (2 * ETA) - 0.5 * math.log(2 * math.pi * ETA)
    )
    assert torch.allclose(tr.log_prob_sum(), hand, atol=1e-4)


def test_original_sites_unchanged_and_order():
    X = torch.randn(4, 2)
    tr = poutine.trace(flat_posterior(regression, ETA)).get_trace(X, torch.zeros(4))
    latents = [n for n, s in tr.nodes.items() if s["type"] == "sample" and not s["is_observed"]
               and n != "data"]
    assert latents == ["w", "w_aux", "s", "s_aux"]
    assert tr.nodes["y"]["is_observed"]


def test_sites_argument_and_missing_site():
    X, y = torch.randn(4, 2), torch.randn(4)
    tr = poutine.trace(flat_posterior(regression, ETA, sites=["w"])).get_trace(X, y)
    assert "w_aux" in tr.nodes and "s_aux" not in tr.nodes
    with pytest.raises(ValueError, match="'nope'"):
        flat_posterior(regression, ETA, sites=["nope"])(X, y)


def test_conditioned_site_is_not_coupled():
    """Conditioning inside flat_posterior makes a site data; outside it only fixes a latent's
    value (Pyro's HMC potential conditions every latent), and its twin stays."""
    X, y = torch.randn(4, 2), torch.randn(4)
    inside = flat_posterior(poutine.condition(regression, data={"s": torch.tensor(1.0)}), ETA)
    tr = poutine.trace(inside).get_trace(X, y)
    assert "s_aux" not in tr.nodes and "w_aux" in tr.nodes
    outside = poutine.condition(flat_posterior(regression, ETA), data={"s": torch.tensor(1.0)})
    tr = poutine.trace(outside).get_trace(X, y)
    assert tr.nodes["s"]["value"] == 1.0 and "s_aux" in tr.nodes


def test_pyro_nuts_samples_the_flat_posterior():
    """θa - θ ~ N(0, η) under the joint: Pyro's own NUTS on flat_posterior must show it."""

    def model():
        with pyro.plate("dim", 3):  # latents in a plate: conditioned by NUTS's potential
            pyro.sample("x", dist.Normal(0.0, 1.0))

    mcmc = pyro.infer.MCMC(pyro.infer.NUTS(flat_posterior(model, 0.5)), 400, 200, disable_progbar=True)
    mcmc.run()
    s = mcmc.get_samples()
    delta = (s["x_aux"] - s["x"]).reshape(-1)
    # 1,200 values, nearly independent: the variance estimate has sd ≈ 0.5 sqrt(2/1200) ≈ 0.02
    assert abs(float(delta.var()) - 0.5) < 0.1 and abs(float(s["x_aux"].var()) - 1.5) < 0.4


@pytest.mark.parametrize("eta", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_eta(eta):
    with pytest.raises(ValueError, match="eta"):
        flat_posterior(regression, eta)


class MLP(PyroModule):
    def __init__(self):
        super().__init__()
        self.fc = PyroModule[torch.nn.Linear](2, 3)
        self.fc.weight = PyroSample(dist.Normal(0.0, 1.0).expand([3, 2]).to_event(2))
        self.fc.bias = PyroSample(dist.Normal(0.0, 1.0).expand([3]).to_event(1))

    def forward(self, x, y=None):
        logits = self.fc(x)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Categorical(logits=logits), obs=y)
        return logits


def test_pyromodule_weights_get_twins_and_predictive_works():
    net = MLP()
    flat = flat_posterior(net, ETA)
    x = torch.randn(5, 2)
    tr = poutine.trace(flat).get_trace(x, torch.zeros(5, dtype=torch.long))
    assert tr.nodes["fc.weight_aux"]["value"].shape == (3, 2)
    assert tr.nodes["fc.bias_aux"]["value"].shape == (3,)
    hand = sum(
        dist.Normal(tr.nodes[n]["value"], math.sqrt(ETA)).log_prob(tr.nodes[n + "_aux"]["value"]).sum()
        for n in ("fc.weight", "fc.bias")
    )
    aux_lp = sum(tr.nodes[n + "_aux"]["fn"].log_prob(tr.nodes[n + "_aux"]["value"]).sum()
                 for n in ("fc.weight", "fc.bias"))
    assert torch.allclose(aux_lp, hand)
    samples = {n: torch.randn(10, *tr.nodes[n]["value"].shape)
               for n in ("fc.weight", "fc.bias", "fc.weight_aux", "fc.bias_aux")}
    pred = Predictive(flat, posterior_samples=samples, return_sites=["y", "_RETURN"])(x)
    assert pred["y"].shape == (10, 5)
    # the twin does not change the network's output: logits use θ, not θa
    expected = x @ samples["fc.weight"][3].T + samples["fc.bias"][3]
    assert torch.allclose(pred["_RETURN"][3], expected, atol=1e-5)


def test_flat_potential_adds_coupling():
    U = flat_potential(lambda p: (p["a"] ** 2).sum(), eta=0.5, sites=["a"])
    val = U({"a": torch.tensor([1.0, 2.0]), "a_aux": torch.tensor([0.0, 0.0])})
    assert torch.isclose(val, torch.tensor(5.0 + 5.0))


def test_kernels_and_bma_run_on_a_pyromodule():
    from pyro.infer import MCMC
    from pyro_flat import EntropySGLD, bma_predict

    net = MLP()
    x = torch.randn(40, 2)
    y = (x[:, 0] > 0).long()
    mcmc = MCMC(EntropySGLD(net, eta=0.1, step_size=1e-3), num_samples=30, warmup_steps=10,
                disable_progbar=True)
    mcmc.run(x, y)
    s = mcmc.get_samples()
    assert s["fc.weight"].shape == s["fc.weight_aux"].shape == (30, 3, 2)
    probs = bma_predict(net, s, x, use="both")
    assert probs.shape == (40, 3) and torch.allclose(probs.sum(-1), torch.ones(40))
