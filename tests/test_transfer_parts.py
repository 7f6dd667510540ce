"""The Bayesian part of a pre-trained network (``BayesianModule(sampled=..., prior_mean=...)``) and low-rank
adapters as that part (:func:`pyro_flat.nn.low_rank_adapters`), checked against the layers' own algebra and
Pyro's distributions; the samplers, checkpoints and ``bma_predict`` run on them unchanged."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pyro
import pyro.distributions as dist
from pyro_flat import MCMC, EntropySGLD, bma_predict
from pyro_flat.nn import BayesianModule, LowRankAdapter, low_rank_adapters
from pyro_flat.targets import ModelPotential


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 6, 3, stride=2), nn.ReLU(),
                         nn.Flatten(), nn.Linear(6 * 3 * 3, 3))


def _randomise(adapted):
    with torch.no_grad():
        for m in adapted.modules():
            if isinstance(m, LowRankAdapter):
                m.lora_A.normal_()
                m.lora_B.normal_()


def test_an_adapted_layer_is_its_base_plus_the_scaled_product_of_its_factors():
    net, x = _net().double(), torch.randn(5, 1, 8, 8, dtype=torch.float64)  # float64: the two orders of summation agree
    adapted = low_rank_adapters(net, rank=2, alpha=3.0)
    assert torch.equal(adapted(x), net(x))  # B = 0
    _randomise(adapted)
    merged = []
    for i in (0, 2, 5):
        layer, adapter = net[i], adapted[i]
        A, B = adapter.lora_A, adapter.lora_B
        if isinstance(layer, nn.Linear):
            merged.append(nn.Linear(layer.in_features, layer.out_features, dtype=torch.float64))
            weight = layer.weight + 1.5 * B @ A  # alpha / rank = 3 / 2
        else:  # a kxk convolution into r channels, then 1x1 out of them: one kxk convolution of weight B A
            merged.append(nn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride,
                                    layer.padding, dtype=torch.float64))
            weight = layer.weight + 1.5 * torch.einsum("or,rikl->oikl", B[:, :, 0, 0], A)
        with torch.no_grad():
            merged[-1].weight.copy_(weight)
            merged[-1].bias.copy_(layer.bias)
    reference = nn.Sequential(merged[0], nn.ReLU(), merged[1], nn.ReLU(), nn.Flatten(), merged[2])
    torch.testing.assert_close(adapted(x), reference(x), rtol=1e-10, atol=1e-10)


def test_the_factors_are_the_sample_sites_and_the_pretrained_weights_stay_fixed():
    net, x = _net(), torch.randn(7, 1, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the adapters' frozen bases are meant: no warning
        model = BayesianModule(low_rank_adapters(net, rank=2, targets=["2", "5"]))
    assert list(model.shapes) == ["2.lora_A", "2.lora_B", "5.lora_A", "5.lora_B"]
    assert model.shapes["2.lora_A"] == (2, 4, 3, 3) and model.shapes["5.lora_B"] == (3, 2)
    start = model.initial_params(num_chains=3)
    assert all(torch.count_nonzero(start[n]) == 0 for n in ("2.lora_B", "5.lora_B"))  # every chain: the base net
    assert len({tuple(start["2.lora_A"][c].flatten()[:3].tolist()) for c in range(3)}) == 3  # A: its own per chain
    probs = bma_predict(model, {n: v for n, v in start.items()}, x)
    torch.testing.assert_close(probs, F.softmax(net(x), -1))


def test_entropy_sgld_samples_the_adapters_in_vectorized_chains_and_checkpoints_them(tmp_path):
    net = _net()
    X, y = torch.randn(64, 1, 8, 8), torch.randint(0, 3, (64,))
    model = BayesianModule(low_rank_adapters(net, rank=2), prior=0.5)

    def run():
        pyro.set_rng_seed(0)
        mcmc = MCMC(EntropySGLD(model, eta=0.05, step_size=1e-4), num_samples=6, warmup_steps=4, num_chains=2,
                    checkpoint=tmp_path / "run.ckpt", disable_progbar=True)
        mcmc.run(X, y, batch_size=16)
        return mcmc

    mcmc = run()
    assert mcmc.chain_method == "vectorized"
    draws = mcmc.get_samples()
    assert sorted(draws) == sorted([f"{i}.lora_{f}{t}" for i in (0, 2, 5) for f in "AB" for t in ("", "_aux")])
    assert draws["5.lora_B"].shape == (12, 3, 2) and torch.count_nonzero(draws["5.lora_B"]) > 0
    again = run().get_samples()  # the finished run from its checkpoint
    assert all(torch.equal(again[n], v) for n, v in draws.items())
    probs = bma_predict(model, draws, X[:5], use="both")
    assert probs.shape == (5, 3) and torch.allclose(probs.sum(-1), torch.ones(5))


@pytest.mark.parametrize("sampled, expected", [
    ("5.*", ["5.weight", "5.bias"]),
    (["0.weight", "5.*"], ["0.weight", "5.weight", "5.bias"]),
    (lambda name, p: name.endswith("bias"), ["0.bias", "2.bias", "5.bias"]),
])
def test_sampled_chooses_the_bayesian_part_and_the_rest_keeps_the_modules_values(sampled, expected):
    net, x = _net(), torch.randn(4, 1, 8, 8)
    model = BayesianModule(net, sampled=sampled)
    assert list(model.shapes) == expected
    assert sorted(model.fixed) == sorted(set(dict(net.named_parameters())) - set(expected))
    own = dict(net.named_parameters())
    torch.testing.assert_close(bma_predict(model, {n: own[n].detach()[None] for n in expected}, x),
                               F.softmax(net(x), -1))


def test_prior_mean_module_centres_the_prior_on_the_pretrained_weights():
    """The model's log density at a point: Pyro's Normal(w0, s) on every sampled weight, plus the likelihood."""
    net = nn.Linear(3, 2)
    x, y = torch.randn(10, 3), torch.randint(0, 2, (10,))
    w0 = {n: p.detach().clone() for n, p in net.named_parameters()}
    point = {n: v + torch.randn_like(v) for n, v in w0.items()}
    expected = sum(dist.Normal(w0[n], 0.3).log_prob(point[n]).sum() for n in w0)
    expected = expected + dist.Categorical(logits=F.linear(x, point["weight"], point["bias"])).log_prob(y).sum()
    for prior_mean, shift in (("module", 0.0), ("zero", None)):
        model = BayesianModule(net, prior=0.3, prior_mean=prior_mean)
        conditioned = pyro.poutine.condition(model, data=point)
        got = pyro.poutine.trace(conditioned).get_trace(x, y).log_prob_sum()
        if shift is None:  # centred at 0: another density
            assert not torch.isclose(got, expected)
        else:
            torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("kwargs, named", [
    (dict(rank=0), "rank must be a positive integer"),
    (dict(rank=5), "rank=5 is more than the smaller side of layer '0' \\(4\\): pass a rank of at most 4"),
    (dict(rank=1, targets="layer9.*"), "targets \\['layer9.\\*'\\] match no Linear or Conv2d layer"),
    (dict(rank=1, alpha=-1.0), "alpha must be a positive number"),
])
def test_bad_adapter_arguments_are_refused_by_name(kwargs, named):
    with pytest.raises((ValueError, TypeError), match=named):
        low_rank_adapters(_net(), **kwargs)


@pytest.mark.parametrize("module, named", [
    (nn.Sequential(nn.Conv2d(4, 4, 3, groups=2), nn.Flatten()), "layer '0' is a convolution with groups=2"),
    (nn.Sequential(nn.Embedding(10, 4), nn.LayerNorm(4)), "Sequential has no Linear or Conv2d layer to adapt"),
])
def test_adapters_on_an_unsupported_layer_are_refused_by_name(module, named):
    with pytest.raises(ValueError, match=named):
        low_rank_adapters(module, rank=1)


@pytest.mark.parametrize("kwargs, named", [
    (dict(sampled="head.*"), "sampled: \\['head.\\*'\\] match no parameter of Sequential"),
    (dict(sampled=lambda n, p: 1), "must return True or False"),
    (dict(sampled=lambda n, p: False), "sampled chose none of the parameters"),
    (dict(sampled=3), "sampled must be a parameter name or fnmatch pattern"),
    (dict(prior_mean="pretrained"), "prior_mean must be 'zero' or 'module'"),
    (dict(prior=lambda n, p: dist.Normal(0.0, 1.0).expand(p.shape), prior_mean="module"), "prior_mean='module'"),
])
def test_bad_choices_of_the_bayesian_part_are_refused_by_name(kwargs, named):
    with pytest.raises((ValueError, TypeError), match=named):
        BayesianModule(_net(), **kwargs)
