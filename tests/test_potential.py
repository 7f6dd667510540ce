"""The fast potential agrees with Pyro's own trace-based density; the closed-form coupling agrees
with the flat_posterior model; per-draw statistics describe the draw they sit next to."""

import math

import torch

import pyro
import pyro.distributions as dist
from pyro.infer import MCMC
from pyro.infer.mcmc.util import initialize_model
from pyro_flat import SGLD, flat_posterior, to_arviz
from pyro_flat.targets import CoupledPotential, ModelPotential


def model(X, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", X.shape[0]):
        pyro.sample("y", dist.Normal(X @ w, s), obs=y)


X, Y = torch.randn(30, 3), torch.randn(30)


def test_matches_pyro_potential_fn_and_gradient():
    _, pyro_potential, _, _ = initialize_model(model, model_args=(X, Y))
    ours = ModelPotential(model, (X, Y))
    params = {"w": torch.randn(3), "s": torch.tensor(0.3)}
    e_ours, g_ours = ours.potential_and_grad(params)
    p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    e_pyro = pyro_potential(p)
    g_pyro = torch.autograd.grad(e_pyro, list(p.values()))
    assert torch.allclose(e_ours, e_pyro.detach())
    for (name, g), gp in zip(g_ours.items(), g_pyro):
        assert torch.allclose(g, gp), name


def test_closed_form_coupling_equals_flat_posterior_model():
    eta = 0.2
    coupled = CoupledPotential(ModelPotential(model, (X, Y)), eta)
    as_model = ModelPotential(flat_posterior(model, eta), (X, Y))
    params = {"w": torch.randn(3), "s": torch.tensor(-0.4),
              "w_aux": torch.randn(3), "s_aux": torch.tensor(0.1)}
    e1, g1 = coupled.potential_and_grad(params)
    e2, g2 = as_model.potential_and_grad(params)
    normaliser = 4 * 0.5 * math.log(2 * math.pi * eta)  # 4 coupled coordinates
    assert torch.allclose(e1 + normaliser, e2)
    for name in params:
        assert torch.allclose(g1[name], g2[name]), name
    dist_ = torch.sqrt(((params["w"] - params["w_aux"]) ** 2).sum() + (params["s"] - params["s_aux"]) ** 2)
    energy, grads, stats = coupled.evaluate(params)  # the statistics come with the evaluation
    assert torch.allclose(stats["coupling_distance"], dist_)
    assert torch.equal(energy, e1) and not hasattr(coupled, "last_stats")
    assert torch.allclose(coupled(params), e1)  # the energy alone


def test_potential_energy_stat_belongs_to_its_draw():
    mcmc = MCMC(SGLD(model, step_size=1e-3), num_samples=25, warmup_steps=5, disable_progbar=True)
    mcmc.run(X, Y)
    energy = to_arviz(mcmc).sample_stats["potential_energy"].values[0]
    samples = mcmc.get_samples()
    target = ModelPotential(model, (X, Y))
    for i in (0, 11, 24):
        u = {"w": samples["w"][i], "s": samples["s"][i].log()}
        expected, _ = target.potential_and_grad(u)
        assert math.isclose(energy[i], float(expected), rel_tol=1e-5), i


def test_logistic_potential_is_the_logistic_model_potential():
    """The batched hand-written potential of the theory problems is the Pyro model's, up to the
    prior's normaliser; its per-chain minibatches cover the data once per epoch and differ."""
    from pyro_flat.models import LogisticRegressionPotential, logistic_regression

    torch.manual_seed(0)
    X, y = torch.randn(40, 3), torch.randint(0, 2, (40,)).float()
    scale = 0.7
    fast = LogisticRegressionPotential(torch.cat([X, torch.ones(40, 1)], 1), y, 1 / scale**2)
    slow = ModelPotential(logistic_regression, (X, y), {"batch_size": None, "prior_scale": scale})
    theta = torch.randn(4)
    normaliser = 4 * (math.log(scale) + 0.5 * math.log(2 * math.pi))
    expected = slow({"w": theta[:3], "b": theta[3]}) - normaliser
    assert torch.allclose(fast({"theta": theta}), expected, atol=1e-5)

    # minibatches of 10: one epoch (4 calls) averages to the full potential exactly, per chain,
    # and chains at the same point see different minibatches
    batched = LogisticRegressionPotential(X, y, 1.0, batch_size=10)
    full = LogisticRegressionPotential(X, y, 1.0)
    point = {"theta": torch.randn(3).expand(5, 3)}
    epoch = torch.stack([batched(point) for _ in range(4)])
    assert torch.allclose(epoch.mean(0), full(point), atol=1e-4)
    assert epoch[0].unique().numel() > 1


def test_every_target_keeps_the_written_contract():
    """ModelPotential, CallablePotential, CoupledPotential and CompiledTarget all satisfy `Target`;
    a coupled target says so through `coupling`, the others say None."""
    from pyro_flat.targets import CallablePotential, Target, compile_target

    model_target = ModelPotential(model, (X, Y))
    callable_target = CallablePotential(lambda p: (p["x"] ** 2).sum(), {"x": torch.zeros(2)})
    coupled = CoupledPotential(ModelPotential(model, (X, Y)), 0.5)
    compiled, why_not = compile_target(ModelPotential(model, (X, Y)), model_target.initial_params(), backend="fx")
    assert why_not is None
    for target in (model_target, callable_target, coupled, compiled):
        assert isinstance(target, Target), type(target).__name__
        params = target.initial_params()
        energy, grads, stats = target.evaluate(params, target.fixed_batch())
        assert set(grads) == set(params) and energy.shape == ()
        assert torch.allclose(target(params, target.fixed_batch()).detach(), energy, rtol=1e-5)
    assert [t.coupling for t in (model_target, callable_target, compiled)] == [None] * 3
    assert coupled.coupling.eta == 0.5 and coupled.coupling.pairs == {"w_aux": "w", "s_aux": "s"}
    assert [t.is_compiled for t in (model_target, coupled, compiled)] == [False, False, True]
    coupled_compiled, why_not = compile_target(CoupledPotential(ModelPotential(model, (X, Y)), 0.5),
                                               coupled.initial_params(), backend="fx")
    assert why_not is None and coupled_compiled.is_compiled  # a coupled target is compiled through its base
    assert "coupling_distance" in coupled_compiled.evaluate(coupled.initial_params()).stats
