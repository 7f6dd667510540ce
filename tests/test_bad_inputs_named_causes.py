"""Issue 72, "Nothing lost, every cause named": a NaN prior in a plain Pyro model, a ``sampled=`` predicate that
raises, ``low_rank_adapters(targets=3)``, and three messages mended (an empty ``checkpoint=``, a bf16 checkpoint
resumed without autocast, a ``sampled=`` pattern that takes adapted layers' frozen base weights). Each test checks
the words of the message and that nothing of the user's (network, tensors, files) changed."""

import warnings

import pytest
import torch

import pyro
import pyro.distributions as dist
import pyro.infer
import pyro_flat
from pyro_flat import MCMC, EntropySGLD
from pyro_flat.nn import BayesianModule, low_rank_adapters
from pyro_flat.storage.checkpoint import CheckpointError
from pyro_flat.storage.fingerprint import differences

from linear_regression import data as regression_data
from linear_regression import model as regression_model

NAN = float("nan")


def net():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def snapshot(module: torch.nn.Module):
    """What a user would notice changed in ``module``: its structure, its weights and which of them train."""
    return (repr(module), [n for n, _ in module.named_modules()],
            {n: (t.clone(), getattr(t, "requires_grad", None)) for n, t in module.state_dict(keep_vars=True).items()})


def assert_unchanged(module: torch.nn.Module, before) -> None:
    after = snapshot(module)
    assert after[:2] == before[:2]
    assert after[2].keys() == before[2].keys()
    for name, (value, grad) in before[2].items():
        assert torch.equal(after[2][name][0], value) and after[2][name][1] == grad, name


# ----------------------------------------------------------------------------- a NaN prior in a Pyro model
def nan_prior_model(X, y):
    w = pyro.sample("w", dist.Normal(torch.full((4,), NAN), 1.0))
    with pyro.plate("data", X.shape[0]):
        pyro.sample("obs", dist.Normal(X @ w, 1.0), obs=y)


@pytest.mark.parametrize("driver, options", [
    (pyro_flat.MCMC, {}),  # one chain through Pyro's driver: validation off, the trace draws NaN starts
    (pyro_flat.MCMC, dict(disable_validation=False)),  # torch refuses the Normal, not naming the site
    (pyro_flat.MCMC, dict(num_chains=2)),
    (pyro.infer.MCMC, {}),
    (pyro.infer.MCMC, dict(disable_validation=False)),
])
def test_a_nan_prior_loc_in_a_pyro_model_names_the_site_under_entropy_sgld(driver, options):
    torch.manual_seed(0)
    X, y = torch.randn(20, 4), torch.randn(20)
    X0, y0 = X.clone(), y.clone()
    with pytest.raises(ValueError) as raised:
        driver(EntropySGLD(nan_prior_model, step_size=1e-3, eta=1e-2), num_samples=3, warmup_steps=2,
               disable_progbar=True, **options).run(X, y)
    message = str(raised.value)
    assert message.startswith("the prior of latent site 'w' has parameters that are not finite: its Normal's loc "
                              "holds NaN or inf. Give pyro.sample('w', ...) a distribution of finite parameters")
    assert "Expected parameter" not in message and "initial point" not in message
    assert torch.equal(X, X0) and torch.equal(y, y0)


# ----------------------------------------------------------------------------- sampled= and low_rank_adapters
def test_a_sampled_predicate_that_raises_says_it_came_from_sampled_and_on_which_parameter():
    network = net()
    before = snapshot(network)
    with pytest.raises(ValueError, match=r"^sampled=, the predicate \(name, parameter\) -> bool, raised "
                                         r"ZeroDivisionError \(division by zero\) when called on parameter '0.weight' "
                                         r"\(shape \(8, 4\)\): fix the predicate") as raised:
        BayesianModule(network, sampled=lambda name, p: 1 / 0)
    assert isinstance(raised.value.__cause__, ZeroDivisionError)
    assert_unchanged(network, before)


@pytest.mark.parametrize("targets, error, named", [
    (3, TypeError, "got int 3"),
    ([], ValueError, "got an empty list, which adapts no layer"),
    (["2", 0], TypeError, r"got \['2', 0\], whose 0 is of type int, not str"),
])
def test_low_rank_adapters_with_targets_3_names_targets_and_what_it_takes(targets, error, named):
    network = net()
    before = snapshot(network)
    with pytest.raises(error, match=r"^targets= takes the layers to adapt: a layer name or fnmatch pattern \(str\) "
                                    r"from module.named_modules\(\), a list of them \(e.g. targets=\['layer4.\*', "
                                    r"'fc'\]\), or None \(the default\) for every Linear and Conv2d layer; " + named):
        low_rank_adapters(network, rank=2, targets=targets)
    assert_unchanged(network, before)


def test_sampled_0_star_over_adapters_warns_that_frozen_base_weights_were_chosen():
    adapted = low_rank_adapters(net(), rank=2)
    before = snapshot(adapted)
    with pytest.warns(UserWarning, match=r"BayesianModule: sampled='0.\*' also chose 2 frozen base weight\(s\) of the "
                                         r"layers low_rank_adapters adapted \('0.base.weight', '0.base.bias'\): they "
                                         r"are sampled, not kept at their pre-trained values. To sample only the "
                                         r"adapters \(the factors '<layer>.lora_A' and '<layer>.lora_B'\), pass "
                                         r"sampled='0.lora_\*', or sampled=None"):
        model = BayesianModule(adapted, sampled="0.*")
    assert list(model.shapes) == ["0.lora_A", "0.lora_B", "0.base.weight", "0.base.bias"]  # what the pattern means
    assert_unchanged(adapted, before)
    with pytest.warns(UserWarning, match=r"sampled= \(the predicate\) also chose 4 frozen base weight\(s\) .*"
                                         r"\('0.base.weight', '0.base.bias', '2.base.weight', '2.base.bias'\).* pass "
                                         r"sampled=\['0.lora_\*', '2.lora_\*'\]"):
        BayesianModule(adapted, sampled=lambda name, p: True)
    with warnings.catch_warnings():  # the adapters alone, or base weights named on purpose: no warning
        warnings.simplefilter("error")
        for sampled in ("0.lora_*", None, ["0.base.weight", "*.lora_*"], "0.base.*"):
            BayesianModule(adapted, sampled=sampled)
    assert_unchanged(adapted, before)


# ----------------------------------------------------------------------------- checkpoints
def test_an_empty_checkpoint_path_says_it_is_empty_and_what_to_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as raised:
        MCMC(EntropySGLD(regression_model, step_size=1e-4, eta=0.1), num_samples=3, checkpoint="")
    assert str(raised.value) == ("checkpoint='' is an empty path; pass the file the run keeps its checkpoint in (e.g. "
                                 "checkpoint='run.ckpt'), or checkpoint=None for no checkpoints.")
    assert list(tmp_path.iterdir()) == []  # nothing written where it ran


def _bf16_run(path, **autocast):
    pyro.set_rng_seed(0)
    X, y = regression_data()
    MCMC(EntropySGLD(regression_model, step_size=1e-4, eta=0.1, **autocast), num_samples=3, warmup_steps=2,
         num_chains=2, checkpoint=path, disable_progbar=True).run(X, y)


def test_a_bf16_checkpoint_resumed_without_autocast_names_torch_bfloat16(tmp_path):
    path = tmp_path / "run.ckpt"
    _bf16_run(path, autocast=torch.bfloat16)
    written = path.read_bytes()
    with pytest.raises(CheckpointError) as raised:
        _bf16_run(path)
    message = str(raised.value)
    assert f"checkpoint '{path}' was written by another run configuration: EntropySGLD.autocast: None here, " \
           "torch.bfloat16 in the checkpoint. Pass the same settings" in message
    assert "dtype" not in message
    assert path.read_bytes() == written and sorted(p.name for p in tmp_path.iterdir()) == ["run.ckpt"]
    # a checkpoint written before dtypes were named ('dtype') still continues the same run
    assert differences({"kernel": "EntropySGLD", "EntropySGLD.autocast": "dtype", "args[0]": ["dtype", 1]},
                       {"kernel": "EntropySGLD", "EntropySGLD.autocast": "torch.bfloat16",
                        "args[0]": ["torch.float64", 1]}) == []
