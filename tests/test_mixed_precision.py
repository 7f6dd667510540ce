"""Mixed precision in the stochastic-gradient kernels (``autocast=torch.bfloat16``, pyro_flat/targets/precision.py):
the potential's forward and backward in bf16, the state and the update in fp32. The law stays exact up to the
gradient's rounding; a run whose state (and so its update) is bf16 — the mutant the fp32 update guards against —
fails the same tolerances. On the CPU: bf16 autocast runs there too."""

import math
import warnings

import pytest
import torch

import pyro
from pyro_flat import MCMC
from pyro_flat.kernels import make_kernel
from pyro_flat.models import logistic_regression
from pyro_flat.roundoff import assert_close_roundoff

D, CHAINS, T, ALPHA = 8, 2000, 1e-4, 0.05


def _precision_matrix():
    g = torch.Generator().manual_seed(0)
    q = torch.linalg.qr(torch.randn(D, D, generator=g))[0]
    return q @ torch.diag(torch.linspace(0.5, 2.0, D)) @ q.T


A, MU = _precision_matrix(), torch.ones(D)


def gaussian_potential(params):
    """½ (x − μ)ᵀ A (x − μ), its product a matmul (which autocast runs in bf16)."""
    z = params["x"] - MU
    return 0.5 * ((z @ A) * z).sum(-1)


def _last_states(kernel_name, autocast, state_dtype=torch.float32, **settings):
    kernel = make_kernel(kernel_name, potential_fn=gaussian_potential, step_size=ALPHA, temperature=T,
                         autocast=autocast, **settings)
    pyro.set_rng_seed(0)
    start = {"x": MU.expand(CHAINS, D).clone().to(state_dtype)}
    mcmc = MCMC(kernel, num_samples=1, warmup_steps=300, num_chains=CHAINS, initial_params=start, disable_progbar=True)
    mcmc.run()
    return mcmc.get_samples(group_by_chain=True)["x"][:, -1]


def _worst_errors(x):
    """The largest standardised error of the mean and relative error of the variance against SGLD's exact
    stationary law at this step: x' = x − αA(x − μ) + √(2αT) ξ has covariance T (A − αA²/2)⁻¹."""
    exact = T * torch.linalg.inv(A - ALPHA * A @ A / 2)
    sd = exact.diagonal().sqrt()
    mean_z = ((x.float().mean(0) - MU) / (sd / math.sqrt(CHAINS))).abs().max()
    var_ratio = (x.float().var(0) / exact.diagonal() - 1).abs().max()
    return float(mean_z), float(var_ratio)


def test_bf16_autocast_keeps_sgld_on_its_exact_gaussian_law_and_a_bf16_update_leaves_it():
    # tolerances from Monte Carlo error over 2,000 independent chains and 8 coordinates: 4.5 standard errors of
    # the mean, and of the variance (its relative se is √(2/C) = 0.032)
    mean_tol, var_tol = 4.5, 4.5 * math.sqrt(2 / CHAINS)
    fp32 = _last_states("sgld", None)
    bf16 = _last_states("sgld", torch.bfloat16)
    for x in (fp32, bf16):
        mean_z, var_err = _worst_errors(x)
        assert mean_z < mean_tol and var_err < var_tol, (mean_z, var_err)
    assert bf16.dtype == torch.float32 and not torch.equal(bf16, fp32)  # autocast ran, in an fp32 state
    # the mutant: the state, and so the update, in bf16 (the noise √(2αT) = 3e-3 against bf16's spacing of 8e-3
    # near μ = 1): measured a variance 8-11 times the law's, the mean 1.9 sd off
    mean_z, var_err = _worst_errors(_last_states("sgld", None, state_dtype=torch.bfloat16))
    assert mean_z > mean_tol or var_err > var_tol, (mean_z, var_err)


def test_bf16_autocast_entropy_sgld_follows_the_fp32_chains_up_to_the_gradients_rounding():
    """The coupled joint (θ and θa) under autocast against the same chains in fp32 (the same noise): their variances
    agree within 2 %, which the bf16-state mutant misses by far."""
    settings = dict(eta=0.5)
    fp32 = _last_states("entropy-sgld", None, **settings)
    bf16 = _last_states("entropy-sgld", torch.bfloat16, **settings)
    mutant = _last_states("entropy-sgld", None, state_dtype=torch.bfloat16, **settings)
    ratio = lambda x: (x.float().var(0) / fp32.var(0) - 1).abs().max()  # noqa: E731
    assert ratio(bf16) < 0.02
    assert ratio(mutant) > 0.5


def test_bf16_autocast_logistic_regression_matches_fp32_up_to_rounding():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(400, 10, generator=g)
    y = torch.bernoulli(torch.sigmoid(X @ torch.linspace(-1, 1, 10)), generator=g)

    def draws(autocast):
        kernel = make_kernel("sgld", logistic_regression, step_size=1e-3, autocast=autocast)
        pyro.set_rng_seed(0)
        mcmc = MCMC(kernel, num_samples=400, warmup_steps=200, num_chains=8, disable_progbar=True)
        mcmc.run(X, y, batch_size=100)
        return mcmc.get_samples(), mcmc.diagnostics()

    (fp32, _), (bf16, _) = draws(None), draws("bf16")
    w32, w16 = fp32["w"].reshape(-1, 10), bf16["w"].reshape(-1, 10)
    assert w16.dtype == torch.float32 and not torch.equal(w16, w32)
    sd = w32.std(0)
    assert float(((w16.mean(0) - w32.mean(0)) / sd).abs().max()) < 0.05  # the same chains, bf16 gradients
    assert float((w16.std(0) / sd - 1).abs().max()) < 0.05


@pytest.mark.parametrize("kernel, settings, named", [
    ("sgld", dict(autocast=torch.float16), "fp16 gradients underflow"),
    ("sgld", dict(autocast="fp8"), "autocast must be None or torch.bfloat16"),
])
def test_bad_autocast_settings_are_refused_by_name(kernel, settings, named):
    with pytest.raises(ValueError, match=named):
        make_kernel(kernel, potential_fn=gaussian_potential, step_size=0.01, **settings)


def test_the_exact_kernels_take_no_autocast():
    with pytest.raises(TypeError, match="autocast"):
        make_kernel("entropy-hmc", potential_fn=gaussian_potential, eta=1.0, step_size=0.1, autocast="bf16")


def test_the_image_study_trains_under_bf16_autocast_when_asked():
    from dataclasses import replace

    from pyro_flat.experiments.images import study as images
    from pyro_flat.experiments.images.config import ImagesConfig

    config = ImagesConfig.reduced(methods=("emcmc",), seeds=1, precision="bf16", progress=False, train_size=64,
                                  batch_size=16)
    data = images.load_image_data(config)
    fits = {p: images.fit_method("emcmc", replace(config, precision=p), data, seed=0) for p in ("bf16", "fp32")}
    for name, value in fits["bf16"].samples.items():
        assert value.dtype == torch.float32 and bool(torch.isfinite(value).all())
    assert any(not torch.equal(v, fits["fp32"].samples[k]) for k, v in fits["bf16"].samples.items())
    replace(config, jit="fx").validate()  # --precision bf16 with --jit: the graph records autocast's casts
    # scored in the precision it was sampled in: the same fit's predictions and losses under bf16 are fp32's up to
    # rounding; its curvature is measured in fp32 either way (bf16 moved the top eigenvalue by 29 % here)
    from pyro_flat.experiments.images.data import first_of_each_class
    from pyro_flat.experiments.images.scores import evaluate

    rows = first_of_each_class(data.y_train, config.flatness_images)
    flat = (data.X_train[rows], data.y_train[rows])
    scored = {p: evaluate(fits["bf16"], replace(config, precision=p), data, flat, seed=0)["theta"] for p in ("bf16", "fp32")}
    for name in ("nll", "train_nll"):
        fp32, bf16 = scored["fp32"][name], scored["bf16"][name]
        assert fp32 != bf16 and abs(bf16 / fp32 - 1) < 0.01, (name, fp32, bf16)
    assert scored["fp32"]["top_eigenvalue"] == scored["bf16"]["top_eigenvalue"]


def test_bma_predict_under_bf16_autocast_averages_in_fp32_and_matches_fp32_predictions():
    from pyro_flat import bma_predict
    from pyro_flat.nn import BayesianModule

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 4))
    model = BayesianModule(net, prior=1.0)
    X = torch.randn(200, 1, 8, 8)
    draws = {k: v.expand(6, *v.shape).clone() + 0.05 * torch.randn(6, *v.shape) for k, v in model.initial_params().items()}
    fp32 = bma_predict(model, draws, X, batchnorm_data=X)
    bf16 = bma_predict(model, draws, X, batchnorm_data=X, autocast="bf16")
    assert bf16.dtype == torch.float32 and not torch.equal(bf16, fp32)
    # a probability vector, summed in fp32: the mean over 6 draws of 4 classes' softmax
    assert_close_roundoff(bf16.sum(-1), torch.ones(200), length=6 * 4)
    assert float((bf16 - fp32).abs().max()) < 0.02  # bf16's rounding of the products, not another model
    with pytest.raises(ValueError, match="fp16 gradients underflow"):
        bma_predict(model, draws, X, batchnorm_data=X, autocast=torch.float16)


def _cnn_draws(autocast, jit_compile):
    from pyro_flat.nn import BayesianModule

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 4))
    X, y = torch.randn(256, 1, 8, 8), torch.randint(0, 4, (256,))
    kernel = make_kernel("entropy-sgld", BayesianModule(net, prior=1.0), step_size=1e-4, eta=1.0, temperature=1e-4,
                         autocast=autocast, jit_compile=jit_compile)
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, num_samples=6, warmup_steps=6, thinning=4, disable_progbar=True)  # thinning: fused graphs
    mcmc.run(X, y, batch_size=64)
    assert kernel.is_compiled == bool(jit_compile)
    return torch.cat([v.reshape(v.shape[0], -1) for v in mcmc.get_samples().values()], 1)


def test_the_compiled_and_fused_iterations_run_under_bf16_autocast_to_the_eager_bf16_draws():
    """``jit_compile`` with ``autocast``: the traced graph records autocast's casts, so the compiled (one-iteration
    and fused) run gives the eager bf16 draws up to round-off, not the fp32 ones (a graph traced without autocast
    would give fp32's)."""
    eager16, eager32 = _cnn_draws("bf16", False), _cnn_draws(None, False)
    compiled16, compiled32 = _cnn_draws("bf16", "fx"), _cnn_draws(None, "fx")
    rounding = float((eager16 - eager32).abs().max())  # bf16's effect on the draws (measured 1e-5 to 1e-4)
    assert rounding > 1e-6
    assert float((compiled16 - eager16).abs().max()) < 0.05 * rounding
    assert float((compiled32 - eager32).abs().max()) < 0.05 * rounding


def test_flatness_under_bf16_autocast_measures_the_fp32_curvature_up_to_rounding():
    """The top Hessian eigenvalue and the Hutchinson trace (the same probes) of a CNN's training NLL, forward under
    bf16 autocast: within 1 % of fp32's (measured 0.05 % and 0.03 %), and not fp32's own numbers (autocast ran)."""
    from pyro_flat import flatness
    from pyro_flat.nn import BayesianModule

    for batchnorm in (False, True):  # with BatchNorm the products go reverse-over-reverse (no forward mode in bf16)
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1),
                                  torch.nn.BatchNorm2d(8) if batchnorm else torch.nn.Identity(), torch.nn.ReLU(),
                                  torch.nn.Conv2d(8, 4, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(4 * 8 * 8, 4))
        model = BayesianModule(net, prior=1.0)
        X, y = torch.randn(200, 1, 8, 8), torch.randint(0, 4, (200,))
        draw = {k: v[None] for k, v in model.initial_params().items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the reverse-over-reverse products are not vmap-ed
            measured = {a: flatness.flatness_at_samples(model, draw, X, y, num_probes=20, likelihood_only=True,
                                                        autocast=a) for a in (None, "bf16")}
        for name in ("top_eigenvalues", "trace"):
            fp32, bf16 = float(measured[None][name].ravel()[0]), float(measured["bf16"][name].ravel()[0])
            assert fp32 != bf16 and abs(bf16 / fp32 - 1) < 0.01, (batchnorm, name, fp32, bf16)
    loss = flatness.FlatLoss.from_model(model, {k: v[0] for k, v in draw.items()}, X, y, likelihood_only=True)
    assert loss.under_autocast(None) is loss
    forward, backward = flatness.HessianOperator(loss), flatness.HessianOperator(loss)
    backward.forward_mode = False  # the same products by reverse-over-reverse (fp32: forward mode works)
    v = torch.randn(loss.dim)
    # the same products in another order: the largest fan-in (4 * 8 * 8) times the depth (3), over 200 images
    assert_close_roundoff(backward.matvec(v), forward.matvec(v), length=200 * 256 * 3)
    assert forward.forward_mode
    with pytest.raises(ValueError, match="fp16 gradients underflow"):
        loss.under_autocast(torch.float16)
