"""pyro_flat.nn: any nn.Module as a Bayesian model, against the conjugate posterior, with BatchNorm
and vectorized chains, and its bad inputs."""

import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pyro
import pyro.distributions as dist
from pyro.infer import SVI, Predictive
from pyro.infer.autoguide import AutoNormal
from pyro_flat import MCMC, SABMA_ELBO, SAM_ELBO, SGLD, EntropyHMC, EntropySGLD, bma_predict, flat_posterior, flatness
from pyro_flat.kernels import KERNELS, kernel_settings, make_kernel
from pyro_flat.diagnostics import chain_correlation
from pyro_flat.nn import Batches, BayesianModule, random_crop_flip, update_batchnorm
from pyro_flat.targets import is_subsample_site
from pyro_flat.roundoff import assert_close_roundoff

from moments import assert_moments, minibatch_noise_covariance, sgld_stationary_covariance

N, D, B, SIGMA, TAU = 2000, 3, 100, 1.0, 1.0
STEP = 3e-6


def _regression():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(N, D, generator=g, dtype=torch.float64)
    y = X @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + 0.3 + SIGMA * torch.randn(N, generator=g,
                                                                                            dtype=torch.float64)
    return X, y


def _linear_model():
    return BayesianModule(nn.Linear(D, 1).double(), prior=TAU,
                          likelihood=lambda out: dist.Normal(out.squeeze(-1), SIGMA))


def test_a_linear_module_gives_the_conjugate_posterior_and_its_smoothing_in_each_vectorized_chain():
    """θ = (weight, bias) of an nn.Linear: its marginal is the conjugate posterior N(m, P⁻¹); θa - θ is
    N(0, η) independent of θ (the joint's covariance [[Σ, Σ], [Σ, Σ + η]]), with SGLD's known step-size
    bias (the discrete Lyapunov equation with the minibatch noise at m) accounted for. Four vectorized
    chains, each on its own minibatches: together they have that law, and they are uncorrelated."""
    X, y = _regression()
    Z = torch.cat([X, torch.ones(N, 1, dtype=X.dtype)], 1)  # the bias is one more coordinate
    d = D + 1
    P = (Z.T @ Z / SIGMA ** 2 + torch.eye(d, dtype=X.dtype) / TAU ** 2).numpy()
    cov = np.linalg.inv(P)
    mean = cov @ (Z.T @ y).numpy() / SIGMA ** 2
    eta = 1e-3
    model = _linear_model()
    pyro.set_rng_seed(2)
    mcmc = MCMC(EntropySGLD(model, eta=eta, step_size=STEP, init_strategy=pyro.infer.autoguide.init_to_median),
                num_samples=12_000, warmup_steps=1_000, num_chains=4, disable_progbar=True)
    mcmc.run(X, y, batch_size=B)
    assert mcmc.chain_method == "vectorized" and mcmc.minibatches == "per_chain"
    s = mcmc.get_samples(group_by_chain=True)
    theta = np.concatenate([s["weight"].reshape(4, -1, D).numpy(), s["bias"].reshape(4, -1, 1).numpy()], -1)
    aux = np.concatenate([s["weight_aux"].reshape(4, -1, D).numpy(), s["bias_aux"].reshape(4, -1, 1).numpy()], -1)
    eye = np.eye(d)
    H = np.block([[P + eye / eta, -eye / eta], [-eye / eta, eye / eta]])
    resid = (y - Z @ torch.as_tensor(mean)).numpy()
    g = Z.numpy() * resid[:, None] / SIGMA ** 2
    C = np.zeros((2 * d, 2 * d))
    C[:d, :d] = minibatch_noise_covariance(g, N, B)
    sigma = sgld_stationary_covariance(H, STEP, C)
    joint = np.block([[cov, cov], [cov, cov + eta * eye]])
    x = np.concatenate([theta, aux], -1)
    assert_moments(x, np.concatenate([mean, mean]), joint, known_bias=sigma - joint)
    corr = chain_correlation(s["weight"].reshape(4, -1, D))
    assert abs(corr["z"]) < 4, corr  # independent chains (shared minibatches give a positive z)


def _cnn():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Dropout(0.1), nn.Linear(8, 3))


@pytest.fixture(scope="module")
def cnn_run():
    torch.manual_seed(0)
    X, y = torch.randn(120, 1, 8, 8), torch.randint(0, 3, (120,))
    model = BayesianModule(_cnn(), prior=1.0)
    pyro.set_rng_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to Pyro's driver, no vmap fallback
        mcmc = MCMC(EntropySGLD(model, eta=0.1, step_size=1e-4), num_samples=6, warmup_steps=6, num_chains=4,
                    disable_progbar=True)
        mcmc.run(X, y, batch_size=32)
    return model, mcmc, X


def test_a_cnn_with_batchnorm_runs_four_chains_vectorized_with_finite_draws(cnn_run):
    model, mcmc, _ = cnn_run
    assert mcmc.chain_method == "vectorized"
    samples = mcmc.get_samples(group_by_chain=True)
    assert samples["0.weight"].shape == (4, 6, 4, 1, 3, 3) and samples["0.weight_aux"].shape == (4, 6, 4, 1, 3, 3)
    assert all(bool(torch.isfinite(v).all()) for v in samples.values())
    chains = samples["10.weight"].reshape(4, 6, -1)
    assert not torch.equal(chains[0], chains[1])  # each chain its own noise and minibatches


def test_a_draw_predicts_as_the_plain_module_with_its_weights_and_recomputed_batchnorm_statistics(cnn_run):
    model, mcmc, X = cnn_run
    theta = {k: v[:3] for k, v in mcmc.get_samples().items() if not k.endswith("_aux")}
    stats = update_batchnorm(model, theta, X)
    assert sorted(stats) == ["1.running_mean", "1.running_var", "5.running_mean", "5.running_var"]
    X_test = torch.randn(10, 1, 8, 8)
    plain = _cnn().eval()
    expected = []
    for i in range(3):
        plain.load_state_dict({**{k: v[i] for k, v in theta.items()}, **{k: v[i] for k, v in stats.items()}},
                              strict=False)
        with torch.no_grad():
            expected.append(torch.softmax(plain(X_test), -1))
            # the statistics are those of the draw's network over X in training mode, averaged over the pass
            features = plain[0](X)
        assert torch.allclose(stats["1.running_mean"][i], features.mean((0, 2, 3)), atol=1e-5)
    probs = bma_predict(model, theta, X_test, batchnorm_data=X)
    assert torch.allclose(probs, torch.stack(expected).mean(0), atol=1e-5)
    with pytest.raises(ValueError, match="BatchNorm layers .* batchnorm_data=X_train"):
        bma_predict(model, theta, X_test)


def test_vmap_and_a_loop_over_the_networks_give_the_same_draws():
    X, y = torch.randn(64, 1, 6, 6), torch.randint(0, 3, (64,))
    draws = []
    for networks in ("vmap", "loop"):
        torch.manual_seed(0)
        model = BayesianModule(_cnn(), networks=networks)
        pyro.set_rng_seed(0)
        mcmc = MCMC(EntropySGLD(model, eta=0.1, step_size=1e-3), num_samples=5, warmup_steps=5, num_chains=3,
                    disable_progbar=True)
        mcmc.run(X, y, batch_size=16)
        draws.append(mcmc.get_samples())
    for name in draws[0]:  # 10 iterations, each a first-layer gradient (and BatchNorm) over 16 * 6 * 6 pixels
        assert_close_roundoff(draws[0][name], draws[1][name], length=10 * 16 * 36, msg=name)
    with pytest.raises(ValueError, match="networks must be one of .*'measure'"):
        BayesianModule(_cnn(), networks="pmap")


def test_a_trained_networks_state_dict_starts_every_chain():
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
    model = BayesianModule(net)
    X, y = torch.randn(50, 4), torch.randint(0, 2, (50,))
    start = model.initial_params(net.state_dict(), num_chains=3)  # a state dict: shared by every chain
    assert sorted(start) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    mcmc = MCMC(SGLD(model, step_size=1e-12), num_samples=1, warmup_steps=0, num_chains=3,
                initial_params=start, disable_progbar=True)
    mcmc.run(X, y)
    first = mcmc.get_samples(group_by_chain=True)["0.weight"][:, 0]
    assert torch.allclose(first, net[0].weight.detach().expand(3, 6, 4), atol=1e-4)


def test_a_layer_vmap_cannot_map_falls_back_with_a_warning_that_names_it():
    class DataDependent(nn.Module):
        def forward(self, x):
            return x if float(x.sum()) > -1e9 else -x  # Python control flow on a value: vmap cannot map it

    model = BayesianModule(nn.Sequential(nn.Linear(3, 2), DataDependent()), networks="vmap")
    X, y = torch.randn(40, 3), torch.randint(0, 2, (40,))
    with pytest.warns(RuntimeWarning, match=r"cannot map layer 1 \(DataDependent\)"):
        mcmc = MCMC(SGLD(model, step_size=1e-3), num_samples=3, warmup_steps=2, num_chains=2, disable_progbar=True)
        mcmc.run(X, y, batch_size=10)
    assert mcmc.chain_method == "vectorized"  # the networks run one by one, inside one batched kernel


def test_a_frozen_parameter_is_left_out_and_said():
    net = nn.Linear(3, 2)
    net.bias.requires_grad_(False)
    with pytest.warns(UserWarning, match=r"\['bias'\] have requires_grad=False"):
        model = BayesianModule(net)
    trace = pyro.poutine.trace(model).get_trace(torch.randn(5, 3), torch.randint(0, 2, (5,)))
    latent = [n for n, s in trace.nodes.items() if s["type"] == "sample" and not s["is_observed"]
              and not is_subsample_site(s)]
    assert latent == ["weight"]


@pytest.mark.parametrize("make, error, match", [
    (lambda: BayesianModule(nn.ReLU()), ValueError, "has no parameters"),
    (lambda: BayesianModule("net"), TypeError, "module must be a torch.nn.Module"),
    (lambda: BayesianModule(nn.Linear(3, 2), likelihood="poisson"), ValueError, "likelihood must be one of"),
    (lambda: BayesianModule(nn.Linear(3, 2), prior=lambda n, p: dist.Normal(0.0, 1.0).expand([3])), ValueError,
     r"prior\('weight', parameter\) has batch shape \(3,\)"),
    (lambda: BayesianModule(nn.Linear(3, 2), prior=-1.0), ValueError, "prior must be a positive prior sd"),
])
def test_bad_arguments_are_named(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("x, y, match", [
    (torch.randn(5, 3), torch.tensor([0, 1, 2, 0, 1]), r"labels outside 0..1"),
    (torch.randn(5, 3), torch.tensor([0, 1]), "one label per row of x"),
    (torch.randn(5, 3, device="meta"), None, "x is on meta and the module on cpu"),
])
def test_bad_data_are_named(x, y, match):
    model = BayesianModule(nn.Linear(3, 2))
    with pytest.raises(ValueError, match=match):
        pyro.poutine.trace(model).get_trace(x, y)


def test_random_crop_flip_moves_each_image_by_its_own_offset_and_flips_half():
    torch.manual_seed(0)
    x = torch.rand(400, 2, 6, 6) + 1.0  # no zero inside an image: the padding shows where it moved
    out = random_crop_flip(x, padding=2)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    flips = 0
    for i in range(x.shape[0]):
        windows = [padded[i, :, r:r + 6, c:c + 6] for r in range(5) for c in range(5)]
        plain = any(torch.equal(out[i], w) for w in windows)
        mirrored = any(torch.equal(out[i], w.flip(-1)) for w in windows)
        assert plain or mirrored
        flips += mirrored and not plain
    assert abs(flips - 200) < 4 * 10  # Binomial(400, 1/2): sd 10
    assert random_crop_flip(x[:2].unsqueeze(0), padding=2).shape == (1, 2, 2, 6, 6)  # leading chain dims


def _mlp_data():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)), torch.randn(64, 4), torch.randint(0, 3, (64,))


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_every_kernel_samples_a_module_with_vectorized_chains(name):
    net, X, y = _mlp_data()
    own = {k: v for k, v in dict(step_size=1e-3, eta=0.1, rho=0.05, sigma=0.01).items() if k in kernel_settings(name)}
    mcmc = MCMC(make_kernel(name, BayesianModule(net), **own), num_samples=3, warmup_steps=3, num_chains=2,
                disable_progbar=True)
    mcmc.run(X, y, batch_size=None if name == "entropy-hmc" else 16)
    assert mcmc.chain_method == "vectorized"
    assert all(bool(torch.isfinite(v).all()) for v in mcmc.get_samples().values())


def test_a_module_works_with_flat_posterior_svi_predictive_bma_and_flatness():
    net, X, y = _mlp_data()
    model = BayesianModule(net)
    trace = pyro.poutine.trace(flat_posterior(model, eta=0.1)).get_trace(X, y)
    assert {"0.weight_aux", "2.bias_aux"} <= set(trace.nodes)
    pyro.clear_param_store()
    guide = AutoNormal(model)
    for loss in (SAM_ELBO(rho=0.05), SABMA_ELBO(gamma=0.01)):
        svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), loss)
        losses = [svi.step(X, y, batch_size=16) for _ in range(3)]
        assert all(np.isfinite(losses))
    for parallel in (False, True):
        predicted = Predictive(model, guide=guide, num_samples=7, parallel=parallel)(X)
        assert predicted["y"].shape == (7, 64)
    draws = {k: v for k, v in predicted.items() if k != "y"}
    probs = bma_predict(model, draws, X)
    assert probs.shape == (64, 3) and torch.allclose(probs.sum(-1), torch.ones(64))
    one = {k: v[0].reshape(model.shapes[k]) for k, v in draws.items()}
    loss = flatness.FlatLoss.from_model(model, one, X, y, likelihood_only=True)
    net_at = _mlp_data()[0]
    net_at.load_state_dict(one)
    expected = nn.functional.cross_entropy(net_at(X), y, reduction="sum")
    assert torch.allclose(loss.fn(loss.flatten(one)), expected, rtol=1e-5)


def test_a_shuffling_dataloader_feeds_the_chains_the_conjugate_posterior():
    """SGLD on an nn.Linear fed by a shuffling DataLoader (Batches): the conjugate posterior, with the
    step-size bias of without-replacement minibatches accounted for as for in-memory data."""
    X, y = _regression()
    Z = torch.cat([X, torch.ones(N, 1, dtype=X.dtype)], 1)
    d = D + 1
    P = (Z.T @ Z / SIGMA ** 2 + torch.eye(d, dtype=X.dtype) / TAU ** 2).numpy()
    cov = np.linalg.inv(P)
    mean = cov @ (Z.T @ y).numpy() / SIGMA ** 2
    g = Z.numpy() * (y - Z @ torch.as_tensor(mean)).numpy()[:, None] / SIGMA ** 2
    bias = sgld_stationary_covariance(P, STEP, minibatch_noise_covariance(g, N, B)) - cov
    loader = DataLoader(TensorDataset(X, y), batch_size=B, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(0))
    pyro.set_rng_seed(0)
    mcmc = MCMC(SGLD(_linear_model(), step_size=STEP, init_strategy=pyro.infer.autoguide.init_to_median),
                num_samples=5_000, warmup_steps=500, num_chains=2, disable_progbar=True)
    mcmc.run(Batches(loader))
    assert mcmc.chain_method == "vectorized"
    s = mcmc.get_samples(group_by_chain=True)
    theta = np.concatenate([s["weight"].reshape(2, -1, D).numpy(), s["bias"].reshape(2, -1, 1).numpy()], -1)
    assert_moments(theta, mean, cov, known_bias=bias)


def test_a_loader_with_the_wrong_structure_or_a_full_data_kernel_is_named():
    X, y = torch.randn(40, 3), torch.randint(0, 2, (40,))
    model = BayesianModule(nn.Linear(3, 2))
    singles = Batches(DataLoader(TensorDataset(X), batch_size=10))
    with pytest.raises(ValueError, match=r"must yield \(x, y\) pairs of tensors; it yielded list of 1"):
        pyro.poutine.trace(model).get_trace(singles)
    with pytest.raises(ValueError, match="the labels and the batch size come from the loader"):
        pyro.poutine.trace(model).get_trace(Batches(DataLoader(TensorDataset(X, y), batch_size=10)), y)
    mcmc = MCMC(EntropyHMC(model, eta=0.1), num_samples=2, warmup_steps=0, disable_progbar=True)
    with pytest.raises(ValueError, match="subsampl"):  # HMC needs the whole data: tensors, not batches
        mcmc.run(Batches(DataLoader(TensorDataset(X, y), batch_size=10)))
    with pytest.raises(ValueError, match="Batches needs batch_size"):
        Batches([(X, y)], num_data=40)


def test_vectorized_chains_of_a_module_compile_once():
    net, X, y = _mlp_data()
    kernel = EntropySGLD(BayesianModule(net), eta=0.1, step_size=1e-3, jit_compile="fx")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback to eager
        mcmc = MCMC(kernel, num_samples=4, warmup_steps=4, num_chains=3, thinning=2, disable_progbar=True)
        mcmc.run(X, y, batch_size=16)
    assert mcmc.chain_method == "vectorized" and kernel.is_compiled  # one kernel, one set of graphs, 3 chains


@pytest.mark.parametrize("make, x, y, error, match", [
    (lambda: BayesianModule(nn.Linear(3, 2)), torch.randn(8, 3), torch.randint(0, 2, (8, 1)), ValueError,
     r"y has shape \(8, 1\): they must match"),  # a (N, 1) label would be scored against every row
    (lambda: BayesianModule(nn.Linear(3, 1), likelihood=lambda out: dist.Normal(out, 1.0)), torch.randn(8, 3),
     torch.randn(8), ValueError, r"batch shape \(8, 1\).*out.squeeze\(-1\)"),
    (lambda: BayesianModule(nn.Linear(3, 2)), torch.randn(8, 3), torch.randint(0, 2, (8,)).float(), ValueError,
     r"integer class indices.*y.long\(\)"),
    (lambda: BayesianModule(nn.Linear(3, 2)), torch.randn(8, 3).double(), torch.randint(0, 2, (8,)), ValueError,
     r"x is torch.float64 and the module's weights torch.float32"),
    (lambda: BayesianModule(nn.Linear(3, 2), likelihood="bernoulli"), torch.randn(8, 3), torch.randint(0, 2, (8,)),
     ValueError, "needs a network with one output"),
    (lambda: BayesianModule(nn.Linear(3, 2), likelihood=lambda out: out), torch.randn(8, 3), None, TypeError,
     "likelihood must return the distribution of y"),
])
def test_shapes_and_dtypes_that_would_score_the_wrong_thing_are_named(make, x, y, error, match):
    with pytest.raises(error, match=match):
        pyro.poutine.trace(make()).get_trace(x, y)


def test_integer_labels_feed_a_bernoulli_likelihood():
    model = BayesianModule(nn.Linear(3, 1), likelihood="bernoulli")
    trace = pyro.poutine.trace(model).get_trace(torch.randn(8, 3), torch.randint(0, 2, (8,)))
    assert trace.nodes["y"]["fn"].batch_shape == (8,)


@pytest.mark.parametrize("batch_size", [0, -5, "32"])
def test_a_bad_batch_size_is_named(batch_size):
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        pyro.poutine.trace(BayesianModule(nn.Linear(3, 2))).get_trace(torch.randn(8, 3), torch.randint(0, 2, (8,)),
                                                                      batch_size=batch_size)


def test_passing_the_class_names_the_fix():
    with pytest.raises(TypeError, match=r"got the class Linear: pass an instance, BayesianModule\(Linear\(...\)\)"):
        BayesianModule(nn.Linear)


def test_an_augmentation_is_drawn_once_per_minibatch_so_chains_still_vectorize():
    X, y = torch.rand(64, 1, 6, 6), torch.randint(0, 3, (64,))
    model = BayesianModule(_cnn(), transform=random_crop_flip)
    idx = torch.arange(16).reshape(2, 8)
    first, again = model._augment(X[idx], idx), model._augment(X[idx], idx)  # evaluated twice: the same images
    assert torch.equal(first, again) and not torch.equal(first, X[idx])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to Pyro's driver
        mcmc = MCMC(EntropySGLD(model, eta=0.1, step_size=1e-4), num_samples=3, warmup_steps=2, num_chains=3,
                    disable_progbar=True)
        mcmc.run(X, y, batch_size=16)
    assert mcmc.chain_method == "vectorized"


def test_a_loader_over_a_subset_counts_the_rows_it_covers_and_cannot_predict():
    X, y = torch.randn(300, 3), torch.randint(0, 2, (300,))
    loader = DataLoader(TensorDataset(X, y), batch_size=20, drop_last=True,
                        sampler=torch.utils.data.SubsetRandomSampler(range(100)))
    data = Batches(loader)
    assert data.num_data == 100
    model = BayesianModule(nn.Linear(3, 2))
    draws = {"weight": torch.randn(4, 2, 3), "bias": torch.randn(4, 2)}
    with pytest.raises(ValueError, match="Pass the data as tensors"):
        bma_predict(model, draws, data)


def test_a_model_error_of_one_chain_is_raised_not_taken_for_a_broadcasting_failure():
    """Before the vectorization check, one chain's evaluation runs where its error reaches the user: no
    "does not broadcast" warning and fallback to Pyro's driver for an error that has nothing to do with chains."""
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 2)

        def forward(self, x):
            raise RuntimeError("the user's own bug")

    X, y = torch.randn(40, 3), torch.randint(0, 2, (40,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match="the user's own bug"):
            MCMC(SGLD(BayesianModule(Broken()), step_size=1e-3), num_samples=2, num_chains=2,
                 disable_progbar=True).run(X, y, batch_size=10)


def test_the_default_prior_is_the_generic_normal_in_value_gradient_and_curvature():
    """IsotropicNormal (BayesianModule's prior s) against Normal(0, s).expand(shape).to_event: the log-density of
    batched values (chains, 1, *shape), its gradient and a Hessian-vector product (the flatness measures' use)."""
    import pyro.distributions as dist
    from pyro_flat.nn.prior import IsotropicNormal

    shape, s = (3, 4), 0.7
    ours, generic = IsotropicNormal(s, shape, dtype=torch.float64), dist.Normal(
        torch.tensor(0.0, dtype=torch.float64), s).expand(shape).to_event(2)
    w = torch.randn(5, 1, *shape, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(ours.log_prob(w), generic.log_prob(w), rtol=1e-12, atol=1e-12)
    assert ours.log_prob(w).shape == (5, 1)
    v = torch.randn_like(w)
    results = []
    for d in (ours, generic):
        (g,) = torch.autograd.grad(d.log_prob(w).sum(), w, create_graph=True)
        (hv,) = torch.autograd.grad((g * v).sum(), w)
        results.append((g.detach(), hv))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-12, atol=1e-12)
    assert ours.rsample((1000,)).std().item() == pytest.approx(s, rel=0.05)


def _augmented_run(jit, thinning, seed=0, kernel="sgld", memo=None):
    """30 draws of a small BatchNorm CNN with random_crop_flip (3 vectorized chains, each its own minibatches)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(144, 3))
    X, y = torch.rand(96, 1, 6, 6), torch.randint(0, 3, (96,))
    model = BayesianModule(net, transform=lambda x: random_crop_flip(x, padding=2))
    own = dict(step_size=1e-2, eta=0.1, rho=0.05) if kernel == "sasgld" else dict(step_size=1e-2)
    k = make_kernel(kernel, model, jit_compile=jit, **{n: v for n, v in own.items() if n in kernel_settings(kernel)})
    pyro.set_rng_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback to eager
        mcmc = MCMC(k, num_samples=30, warmup_steps=4, num_chains=3, thinning=thinning, disable_progbar=True)
        mcmc.run(X, y, batch_size=16)
    assert k.is_compiled == bool(jit)
    return mcmc.get_samples()


@pytest.mark.parametrize("kernel, thinning", [("sgld", 1), ("sgld", 4), ("sasgld", 1)])
def test_an_augmentation_is_drawn_inside_the_compiled_step_as_in_the_eager_one(kernel, thinning):
    """A transform's random draws are part of the compiled iteration (one graph, or 4 fused), in the eager order:
    the compiled draws equal the eager ones up to round-off. Memoised across steps (the trace keeping the probe's
    augmented images as a constant) they were 0.998 apart; another seed moves them by far more than round-off.
    SASGLD evaluates each minibatch twice (its ascent and its gradient): both see the same augmented images."""
    eager = _augmented_run(False, thinning, kernel=kernel)
    compiled = _augmented_run("fx", thinning, kernel=kernel)
    other = _augmented_run(False, thinning, seed=1, kernel=kernel)
    for name, want in eager.items():  # 34 iterations of up to 2 gradients, each convolution's over 16 * 6 * 6 pixels
        assert_close_roundoff(compiled[name], want, length=34 * 2 * 16 * 36, msg=name)
        assert (other[name] - want).abs().max() > 1e-3, name


@pytest.mark.parametrize("kernel", ["sgld", "sasgld"])
def test_each_step_augments_each_chains_minibatch_once(kernel):
    """A new step draws new images; SASGLD's two evaluations of a step (its ascent and its gradient) share them:
    20 more iterations of 3 chains cost 60 more calls of the transform, for either kernel."""
    calls = []

    def counted(x):
        calls.append(x.shape[0])
        return random_crop_flip(x, padding=2)

    X, y = torch.rand(96, 1, 6, 6), torch.randint(0, 3, (96,))
    counts = []
    for iterations in (10, 30):
        calls.clear()
        model = BayesianModule(_cnn(), transform=counted)
        own = dict(step_size=1e-3, rho=0.05) if kernel == "sasgld" else dict(step_size=1e-3)
        mcmc = MCMC(make_kernel(kernel, model, **own), num_samples=iterations, warmup_steps=0, num_chains=3,
                    disable_progbar=True)
        mcmc.run(X, y, batch_size=16)
        assert set(calls) == {16}  # one chain's minibatch per call
        counts.append(len(calls))
    assert counts[1] - counts[0] == 20 * 3, counts


def test_a_bad_label_in_a_later_loader_batch_is_named_as_the_loader_yields_it():
    """Loader batches' labels are checked on the host as they come (no step waits on the device): a label out of
    range in the 4th batch stops the run there, by name."""
    X, y = torch.rand(96, 1, 6, 6), torch.randint(0, 3, (96,))
    y[60] = 7
    model = BayesianModule(_cnn())
    loader = DataLoader(TensorDataset(X, y), batch_size=16, shuffle=False, drop_last=True)
    mcmc = MCMC(SGLD(model, step_size=1e-4), num_samples=10, warmup_steps=0, disable_progbar=True)
    with pytest.raises(ValueError, match=r"y holds labels outside 0..2 .*max 7"):
        mcmc.run(Batches(loader))
