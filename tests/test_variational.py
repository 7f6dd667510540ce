"""SAM_ELBO, SABMA_ELBO and transfer_model against computations written out by hand."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import pyro
import pyro.distributions as dist
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoDelta, AutoDiagonalNormal, AutoLowRankMultivariateNormal, AutoNormal
from pyro.infer.autoguide.initialization import init_to_value

from pyro_flat import SABMA_ELBO, SAM_ELBO, transfer_model

Y = torch.tensor([1.0, -0.5, 2.0, 0.3, -1.2, 0.8])
DIM = len(Y)


def quadratic_model():
    """ℓ(θ) = ½‖θ − y‖² + const, prior N(0, I)."""
    theta = pyro.sample("theta", dist.Normal(torch.zeros(DIM), 1.0).to_event(1))
    pyro.sample("y", dist.Normal(theta, 1.0).to_event(1), obs=Y)


def _initialised(guide_cls, model=quadratic_model, **kwargs):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    guide = guide_cls(model, **kwargs)
    guide()  # sets the parameters up (and consumes the initialisation's random numbers)
    return guide


def _params():
    return {k: v.unconstrained().detach().clone() for k, v in pyro.get_param_store().items()}


def test_sam_elbo_step_is_the_hand_computed_update():
    rho, lr = 0.5, 0.1
    guide = _initialised(AutoNormal)
    before = _params()
    pyro.set_rng_seed(1)
    SVI(quadratic_model, guide, pyro.optim.SGD({"lr": lr}), SAM_ELBO(rho)).step()
    after = _params()

    loc = before["AutoNormal.locs.theta"].clone().requires_grad_()
    s = before["AutoNormal.scales.theta"].clone().requires_grad_()
    pyro.set_rng_seed(1)
    xi = torch.randn(DIM)  # the guide's standard normal draw
    theta = loc + F.softplus(s) * xi
    g = (theta - Y).detach()
    eps = rho * g / g.norm()
    loss = (0.5 * ((theta + eps - Y) ** 2).sum() - dist.Normal(0.0, 1.0).log_prob(theta).sum()
            + dist.Normal(loc, F.softplus(s)).log_prob(theta).sum())
    g_loc, g_s = torch.autograd.grad(loss, (loc, s))
    assert torch.allclose(after["AutoNormal.locs.theta"], before["AutoNormal.locs.theta"] - lr * g_loc, atol=1e-6)
    assert torch.allclose(after["AutoNormal.scales.theta"], before["AutoNormal.scales.theta"] - lr * g_s, atol=1e-6)
    # and it is not the plain ELBO's step: the ascent moves the likelihood term
    plain = (0.5 * ((theta - Y) ** 2).sum() - dist.Normal(0.0, 1.0).log_prob(theta).sum()
             + dist.Normal(loc, F.softplus(s)).log_prob(theta).sum())
    plain_loc, = torch.autograd.grad(plain, loc)
    assert (plain_loc - g_loc).abs().max() > 0.1


def _family(guide, p):
    """The guide's Gaussian written out from its unconstrained parameters ``p`` (by name)."""
    name = guide._pyro_name
    if isinstance(guide, AutoNormal):
        return dist.Normal(p[f"{name}.locs.theta"], F.softplus(p[f"{name}.scales.theta"]))
    if isinstance(guide, AutoDiagonalNormal):
        return dist.Normal(p[f"{name}.loc"], F.softplus(p[f"{name}.scale"]))
    sigma = F.softplus(p[f"{name}.scale"])
    return torch.distributions.LowRankMultivariateNormal(p[f"{name}.loc"], p[f"{name}.cov_factor"] * sigma[:, None],
                                                         sigma ** 2)


def _ball_kl(guide, p, p0):
    """The KL whose ball SABMA_ELBO draws: the family's own for diagonal guides; for the low-rank one
    the loc's Mahalanobis term plus the KL of the factor model's complete data (z, ε), written out:
    Σ_i ½(r_i − 1 − log r_i) + ‖V_i − V0_i‖² / (2 λ0_i), V = σ W row-wise, λ = σ², r = λ/λ0."""
    q, q0 = _family(guide, p), _family(guide, p0)
    if not isinstance(guide, AutoLowRankMultivariateNormal):
        return torch.distributions.kl_divergence(q, q0).sum()
    loc_only = torch.distributions.LowRankMultivariateNormal(q.loc, q0.cov_factor, q0.cov_diag)
    r = q.cov_diag / q0.cov_diag
    rows = ((q.cov_factor - q0.cov_factor) ** 2).sum(-1) / (2 * q0.cov_diag)
    return torch.distributions.kl_divergence(loc_only, q0) + (0.5 * (r - 1 - torch.log(r)) + rows).sum()


def _kl_curvature(guide, delta):
    """½ d²/dt² of the ball's KL at t = 0 along δ, the ball's exact KL at t = 1, and the family's own
    exact KL at t = 1 (autograd)."""
    names = list(delta)
    params = {n: pyro.get_param_store().get_param(n).unconstrained().detach() for n in names}
    t = torch.zeros((), requires_grad=True)
    moved = lambda shift: {n: params[n] + shift * delta[n] for n in names}  # noqa: E731
    kl = lambda shift: _ball_kl(guide, moved(shift), params)  # noqa: E731
    first, = torch.autograd.grad(kl(t), t, create_graph=True)
    second, = torch.autograd.grad(first, t)
    own = torch.distributions.kl_divergence(_family(guide, moved(1.0)), _family(guide, params)).sum()
    return 0.5 * float(second), float(kl(torch.ones(()))), float(own)


def _dense_natural_direction(guide, grads):
    """F⁻¹ g from the dense Hessian of the ball's exact KL (independent of pyro_flat's Fisher code)."""
    names = list(grads)
    params = {n: pyro.get_param_store().get_param(n).unconstrained().detach() for n in names}
    sizes = [params[n].numel() for n in names]
    flat0 = torch.cat([params[n].reshape(-1) for n in names]).double()

    def unflat(flat):
        parts = dict(zip(names, torch.split(flat, sizes)))
        return {n: parts[n].reshape(params[n].shape) for n in names}

    fisher = torch.autograd.functional.hessian(lambda x: _ball_kl(guide, unflat(x), unflat(flat0)), flat0)
    g = torch.cat([grads[n].reshape(-1) for n in names]).double()
    x = torch.linalg.solve(fisher, g)  # the ball's Fisher is nonsingular for every family here
    return unflat(x), float(g @ x)


def _ascent_gradient(guide, seed):
    """The gradient SABMA_ELBO's first evaluation takes, from the same random numbers."""
    names = list(pyro.get_param_store().keys())
    pyro.set_rng_seed(seed)
    loss = Trace_ELBO().differentiable_loss(quadratic_model, guide)
    tensors = [pyro.get_param_store().get_param(n).unconstrained() for n in names]
    return dict(zip(names, torch.autograd.grad(loss, tensors)))


@pytest.mark.parametrize("guide_cls", [AutoNormal, AutoDiagonalNormal, AutoLowRankMultivariateNormal])
def test_sabma_perturbation_is_the_natural_gradient_on_the_kl_ball(guide_cls):
    gamma = 0.01
    kwargs = {"rank": 2} if guide_cls is AutoLowRankMultivariateNormal else {}
    guide = _initialised(guide_cls, **kwargs)
    store = pyro.get_param_store()
    with torch.no_grad():  # generic scales (and covariance), not the initial ones
        store.get_param(f"{guide._pyro_name}.{'scales.theta' if guide_cls is AutoNormal else 'scale'}"
                        ).unconstrained().copy_(torch.linspace(-0.5, 1.0, DIM))
        if guide_cls is AutoLowRankMultivariateNormal:
            store.get_param(f"{guide._pyro_name}.cov_factor").unconstrained().copy_(torch.randn(DIM, 2))
    grads = _ascent_gradient(guide, seed=2)
    elbo = SABMA_ELBO(gamma)
    pyro.set_rng_seed(2)
    SVI(quadratic_model, guide, pyro.optim.SGD({"lr": 0.0}), elbo).step()
    direction, quadratic = _dense_natural_direction(guide, grads)
    for n in grads:
        expected = math.sqrt(2 * gamma) * direction[n] / math.sqrt(quadratic)
        assert torch.allclose(elbo.last_perturbation[n].double(), expected, rtol=1e-3, atol=1e-6), n
    second_order, exact, own = _kl_curvature(guide, elbo.last_perturbation)
    assert second_order == pytest.approx(gamma, rel=1e-4)  # on the ball, to second order
    assert exact == pytest.approx(gamma, rel=0.2)  # the exact KL is close: O(γ^{3/2}) apart
    assert own <= exact * (1 + 1e-5)  # and the family's own KL is at most the ball's


def test_fisher_sam_perturbation_is_the_diagonal_empirical_fisher_step():
    gamma, fisher_eta = 0.01, 2.0
    guide = _initialised(AutoNormal)
    grads = _ascent_gradient(guide, seed=5)
    elbo = SABMA_ELBO(gamma, ball="fisher-sam", fisher_eta=fisher_eta)
    pyro.set_rng_seed(5)
    SVI(quadratic_model, guide, pyro.optim.SGD({"lr": 0.0}), elbo).step()
    direction = {n: g / (1 + fisher_eta * g ** 2) for n, g in grads.items()}
    norm = math.sqrt(sum(float((g * direction[n]).sum()) for n, g in grads.items()))
    for n in grads:
        assert torch.allclose(elbo.last_perturbation[n], math.sqrt(2 * gamma) * direction[n] / norm, atol=1e-6), n


def _one_step_perturbation(elbo, guide_cls=AutoNormal, **kwargs):
    guide = _initialised(guide_cls, **kwargs)
    pyro.set_rng_seed(3)
    SVI(quadratic_model, guide, pyro.optim.SGD({"lr": 0.1}), elbo).step()
    return elbo.last_perturbation, _params()


def test_sam_and_fisher_sam_are_special_cases_of_sabma():
    sigma0 = 0.1  # AutoNormal's initial scale: every coordinate the same
    gamma = 0.02
    kl_loc, after_kl = _one_step_perturbation(SABMA_ELBO(gamma, params="loc"), init_scale=sigma0)
    sam, after_sam = _one_step_perturbation(SABMA_ELBO(gamma * sigma0 ** 2, ball="euclidean", params="loc"),
                                            init_scale=sigma0)
    for n in kl_loc:  # the KL ball on the loc with equal scales σ0 is SAM's ball of radius σ0 √(2γ)
        assert torch.allclose(kl_loc[n], sam[n], atol=1e-6)
        assert torch.allclose(after_kl[n], after_sam[n], atol=1e-6)
    fisher0, _ = _one_step_perturbation(SABMA_ELBO(gamma, ball="fisher-sam", fisher_eta=0.0, params="loc"))
    euclid, _ = _one_step_perturbation(SABMA_ELBO(gamma, ball="euclidean", params="loc"))
    for n in fisher0:
        assert torch.allclose(fisher0[n], euclid[n], atol=1e-7)
    assert euclid["AutoNormal.scales.theta"].abs().max() == 0  # params="loc" leaves the scales alone


def test_euclidean_loc_ball_is_sam_on_the_variational_mean():
    gamma, lr = 0.05, 0.1
    guide = _initialised(AutoNormal)
    before = _params()
    pyro.set_rng_seed(4)
    SVI(quadratic_model, guide, pyro.optim.SGD({"lr": lr}), SABMA_ELBO(gamma, ball="euclidean", params="loc")).step()
    after = _params()
    # SAM by hand: gradient at φ, ascend the loc by √(2γ) g/‖g‖, gradient there, applied at φ
    guide = _initialised(AutoNormal)
    store = pyro.get_param_store()
    loc = store.get_param("AutoNormal.locs.theta").unconstrained()
    pyro.set_rng_seed(4)
    g, = torch.autograd.grad(Trace_ELBO().differentiable_loss(quadratic_model, guide), loc)
    with torch.no_grad():
        loc.add_(math.sqrt(2 * gamma) * g / g.norm())
    tensors = [store.get_param(n).unconstrained() for n in before]
    grads = torch.autograd.grad(Trace_ELBO().differentiable_loss(quadratic_model, guide), tensors)
    for n, grad in zip(before, grads):
        assert torch.allclose(after[n], before[n] - lr * grad, atol=1e-6), n


def _equal_depth_model():
    """A sharp well at -2 (sd 0.1) and a flat one at +2 (sd 1) of equal depth (peak heights)."""
    t = pyro.sample("t", dist.Normal(0.0, 10.0))
    logp = torch.logsumexp(torch.stack([math.log(1 / 11) + dist.Normal(-2.0, 0.1).log_prob(t),
                                        math.log(10 / 11) + dist.Normal(2.0, 1.0).log_prob(t)]), 0)
    pyro.factor("energy", logp)


def _fit(elbo, start=-1.8, steps=1500):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    guide = AutoNormal(_equal_depth_model, init_loc_fn=init_to_value(values={"t": torch.tensor(start)}),
                       init_scale=0.05)
    svi = SVI(_equal_depth_model, guide, pyro.optim.Adam({"lr": 0.02}), elbo)
    for _ in range(steps):
        svi.step()
    loc, scale = guide._get_loc_and_scale("t")
    return float(loc.detach()), float(scale.detach())


def test_where_each_fitted_q_ends_on_a_sharp_and_a_flat_well():
    """All start in the sharp well (-1.8). Measured: the ELBO stays there (loc -1.97, sd 0.10); SAM with
    ρ = 0.6 stays but moves up the flat side (-1.47, sd 0.15); SA-BMA with γ = 8 crosses to the flat
    well (1.66, sd 0.90), with γ = 0.05 it stays (sd 0.12)."""
    loc, scale = _fit(Trace_ELBO())
    assert abs(loc + 2) < 0.1 and abs(scale - 0.1) < 0.03
    sam_loc, sam_scale = _fit(SAM_ELBO(0.6))
    assert -1.7 < sam_loc < -1.2 and sam_scale > scale
    big_loc, big_scale = _fit(SABMA_ELBO(8.0))
    assert big_loc > 1.0 and big_scale > 0.6
    small_loc, _ = _fit(SABMA_ELBO(0.05))
    assert small_loc < -1.5


def test_transfer_model_trains_only_the_named_submodule():
    def model(x, y=None):
        body = pyro.sample("body.weight", dist.Normal(torch.zeros(2, 3), 1.0).to_event(2))
        head = pyro.sample("head.weight", dist.Normal(torch.zeros(2), 1.0).to_event(1))
        with pyro.plate("data", len(x)):
            pyro.sample("y", dist.Normal((x @ body.T) @ head, 0.1), obs=y)

    pretrained = {"body.weight": torch.eye(2, 3)}
    x = torch.randn(50, 3)
    y = (x @ pretrained["body.weight"].T) @ torch.tensor([1.5, -0.5])
    fitted = transfer_model(model, pretrained, variational=["head"])
    pyro.clear_param_store()
    guide = AutoNormal(fitted)
    svi = SVI(fitted, guide, pyro.optim.Adam({"lr": 0.05}), SAM_ELBO(0.01))
    for _ in range(400):
        svi.step(x, y)
    assert sorted(pyro.get_param_store().keys()) == ["AutoNormal.locs.head.weight", "AutoNormal.scales.head.weight"]
    assert torch.allclose(guide.median()["head.weight"], torch.tensor([1.5, -0.5]), atol=0.05)
    trace = pyro.poutine.trace(fitted).get_trace(x, y)
    assert torch.equal(trace.nodes["body.weight"]["value"], pretrained["body.weight"])


def test_bad_settings_say_what_to_change():
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="rho must be a positive finite number"):
            SAM_ELBO(bad)
        with pytest.raises(ValueError, match="gamma must be a positive finite number"):
            SABMA_ELBO(bad)
    with pytest.raises(ValueError, match="ball must be one of"):
        SABMA_ELBO(0.1, ball="l2")
    with pytest.raises(ValueError, match="vectorize_particles=False"):
        SAM_ELBO(0.1, base=Trace_ELBO(num_particles=2, vectorize_particles=True))
    guide = _initialised(AutoDelta)
    with pytest.raises(ValueError, match="SABMA_ELBO needs a Gaussian autoguide.*got AutoDelta"):
        SVI(quadratic_model, guide, pyro.optim.SGD({"lr": 0.1}), SABMA_ELBO(0.1)).step()
    with pytest.raises(ValueError, match="not reparameterisable"):
        def guide_discrete():
            pyro.sample("theta", dist.Bernoulli(0.5).expand([DIM]).to_event(1))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            SAM_ELBO(0.1).loss(quadratic_model, guide_discrete)
    fitted = transfer_model(quadratic_model, {}, variational=["thetas"])
    with pytest.raises(ValueError, match="variational entry 'thetas' matches no latent site.*'theta'"):
        fitted()
    with pytest.raises(ValueError, match="no pretrained value for the latent site 'theta'"):
        transfer_model(_equal_depth_model_with_two(), {}, variational=["u"])()


def _equal_depth_model_with_two():
    def model():
        pyro.sample("theta", dist.Normal(0.0, 1.0))
        pyro.sample("u", dist.Normal(0.0, 1.0))
    return model


def test_bma_by_ensemble_size_ends_at_the_full_average():
    from pyro_flat import bma_predict, metrics
    from pyro_flat.experiments.bnn.study import bma_by_ensemble_size
    from pyro_flat.models import BayesianMLP

    torch.manual_seed(0)
    net = BayesianMLP(4, [5], 3)
    samples = {"layers.0.weight": torch.randn(6, 5, 4), "layers.0.bias": torch.randn(6, 5),
               "layers.1.weight": torch.randn(6, 3, 5), "layers.1.bias": torch.randn(6, 3)}
    X, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    curve = bma_by_ensemble_size(net, samples, X, y)
    with torch.no_grad():
        full = bma_predict(net, samples, X, use="theta")
        first = bma_predict(net, {k: v[:1] for k, v in samples.items()}, X, use="theta")
    assert curve["models"] == [1, 2, 3, 4, 5, 6]
    assert curve["nll"][-1] == pytest.approx(metrics.nll(full, y), rel=1e-5)
    assert curve["nll"][0] == pytest.approx(metrics.nll(first, y), rel=1e-5)


@pytest.mark.parametrize("make_elbo", [lambda: SAM_ELBO(0.1), lambda: SABMA_ELBO(0.01)], ids=["sam", "sabma"])
def test_both_evaluations_of_a_step_see_one_minibatch(make_elbo):
    seen = []
    data = torch.randn(100)

    def model():
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("data", 100, subsample_size=5) as idx:
            seen.append(idx.clone())
            pyro.sample("y", dist.Normal(mu, 1.0), obs=data[idx])

    pyro.clear_param_store()
    guide = AutoNormal(model)
    guide()
    for _ in range(3):
        seen.clear()
        SVI(model, guide, pyro.optim.SGD({"lr": 0.01}), make_elbo()).step()
        assert len(seen) >= 2 and all(torch.equal(idx, seen[0]) for idx in seen)
    steps = [seen[0]]
    seen.clear()
    SVI(model, guide, pyro.optim.SGD({"lr": 0.01}), make_elbo()).step()
    assert not torch.equal(seen[0], steps[0])  # a new step, a new minibatch


def test_sam_perturbs_a_constrained_latent_in_its_unconstrained_coordinates():
    """s ~ LogNormal: the ascent step is taken in log s, s' = s exp(ρ g_u / ‖g‖), g_u = s ∂ℓ/∂s."""
    from pyro import poutine

    def model():
        t = pyro.sample("t", dist.Normal(0.0, 1.0))
        s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
        pyro.sample("y", dist.Normal(t, s), obs=torch.tensor([1.5, -0.2, 0.7]))

    t0, s0 = torch.tensor(0.3, requires_grad=True), torch.tensor(0.7, requires_grad=True)

    def delta_guide():
        pyro.sample("t", dist.Delta(t0))
        pyro.sample("s", dist.Delta(s0))

    trace = poutine.trace(poutine.replay(model, trace=poutine.trace(delta_guide).get_trace())).get_trace()
    trace.compute_log_prob()
    nll = -trace.nodes["y"]["log_prob_sum"]
    rho = 0.2
    out = SAM_ELBO(rho)._perturbed_values(trace, ["t", "s"], nll)
    g_t, g_s = torch.autograd.grad(-dist.Normal(t0, s0).log_prob(torch.tensor([1.5, -0.2, 0.7])).sum(), (t0, s0))
    g_u = s0.detach() * g_s
    norm = torch.sqrt(g_t ** 2 + g_u ** 2)
    assert torch.allclose(out["t"], t0 + rho * g_t / norm, atol=1e-6)
    assert torch.allclose(out["s"], s0 * torch.exp(rho * g_u / norm), atol=1e-6)


def test_transfer_model_matches_whole_submodule_names_and_takes_a_module():
    def model():
        pyro.sample("fc.weight", dist.Normal(torch.zeros(2, 3), 1.0).to_event(2))
        pyro.sample("fc2.weight", dist.Normal(torch.zeros(2, 3), 1.0).to_event(2))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc2 = torch.nn.Linear(3, 2, bias=False)

    net = Net()
    fitted = transfer_model(model, net, variational=["fc"])  # "fc" is not a prefix of "fc2"
    trace = pyro.poutine.trace(fitted).get_trace()
    assert not trace.nodes["fc.weight"]["is_observed"] and trace.nodes["fc2.weight"]["is_observed"]
    assert torch.equal(trace.nodes["fc2.weight"]["value"], net.fc2.weight.detach())
