"""The kernels on CUDA tensors: the state, the draws and the statistics stay on the data's device.

Skipped without a GPU (CI has none); run on a GPU machine with ``python -m pytest tests/test_cuda.py``.
"""

import numpy as np
import pytest
import torch

import pyro
from pyro_flat import MCMC, SGLD, EntropyHMC, EntropySGLD
from pyro_flat.models import logistic_regression
from pyro_flat.roundoff import assert_close_roundoff

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _data(n=500, d=20):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, d, generator=g)
    y = torch.bernoulli(torch.sigmoid(X @ torch.ones(d) / d**0.5), generator=g)
    return X.cuda(), y.cuda()


@pytest.mark.parametrize("chains", [1, 16])
@pytest.mark.parametrize("make", [
    lambda: SGLD(logistic_regression, step_size=1e-3),
    lambda: EntropySGLD(logistic_regression, eta=0.05, step_size=1e-3),
    lambda: SGLD(logistic_regression, preconditioner="diagonal", step_size=0.1),
    lambda: EntropySGLD(logistic_regression, eta=0.05, preconditioner="dense", step_size=0.2),
], ids=["SGLD", "EntropySGLD", "SGLD-diagonal", "EntropySGLD-dense"])
def test_stochastic_gradient_kernels_on_cuda(make, chains):
    X, y = _data()
    kernel = make()
    mcmc = MCMC(kernel, 100, 50, num_chains=chains, disable_progbar=True)
    mcmc.run(X, y, batch_size=50)
    samples = mcmc.get_samples(group_by_chain=True)
    assert mcmc.chain_method == ("vectorized" if chains > 1 else "sequential")
    for value in samples.values():  # vectorized: the draws left the GPU as they were made (Pyro's driver keeps them)
        assert value.is_cuda == (chains == 1) and bool(torch.isfinite(value).all())
    # the posterior mean of the weights points along the true direction
    assert float(samples["w"].mean((0, 1)).sum()) > 0


@pytest.mark.parametrize("full_mass", [False, "hessian"])
def test_entropy_hmc_on_cuda(full_mass):
    X, y = _data()
    mcmc = MCMC(EntropyHMC(logistic_regression, eta=0.05, full_mass=full_mass), 100, 100,
                num_chains=8, disable_progbar=True)
    mcmc.run(X, y, batch_size=None)
    samples = mcmc.get_samples()
    assert mcmc.chain_method == "vectorized"
    assert all(not v.is_cuda and bool(torch.isfinite(v).all()) for v in samples.values())  # host memory
    assert all(v.is_cuda for v in mcmc.kernel.initial_params.values())  # the chains' state stayed on the GPU
    rate = torch.stack([torch.as_tensor(d["acceptance rate"]) for d in mcmc._diagnostics])
    assert 0.5 < float(rate.mean()) < 1.0
    pyro.clear_param_store()


def test_a_bayesian_module_cnn_runs_vectorized_on_cuda_and_its_draws_leave_the_gpu():
    from torch import nn
    from pyro_flat import bma_predict
    from pyro_flat.nn import BayesianModule

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(8 * 14 * 14, 10)).cuda()
    X, y = torch.randn(512, 1, 28, 28, device="cuda"), torch.randint(0, 10, (512,), device="cuda")
    model = BayesianModule(net)
    assert model.networks == "measure" and model.memory_format == "channels_last"
    mcmc = MCMC(EntropySGLD(model, eta=0.05, step_size=1e-6), 10, 10, num_chains=4, disable_progbar=True)
    mcmc.run(X, y, batch_size=64)
    from pyro_flat.nn.execution import Pass

    chosen = model.network_choices["sampling"][Pass(4, backward=True, autocast=None, inputs=(4, 64, 1, 28, 28))]  # timed on the GPU, then kept
    assert chosen.way in ("vmap", "loop") and set(chosen.seconds) == {"vmap", "loop"}
    samples = mcmc.get_samples()
    assert mcmc.chain_method == "vectorized"
    assert all(not v.is_cuda and bool(torch.isfinite(v).all()) for v in samples.values())
    # the draws as the run left them, in host memory: bma_predict moves them to the model's device
    probs = bma_predict(model, samples, X[:32], batchnorm_data=X[:256])
    assert probs.is_cuda
    # the mean over 40 draws of 10 classes' softmax: no matmul, so float32's round-off whatever TF32 may do
    assert_close_roundoff(probs.sum(-1), torch.ones(32, device="cuda"), length=40 * 10, tf32=False)
    # and the flatness measures, and a loss along a line between two draws, evaluate them there too
    from pyro_flat import flatness

    measured = flatness.flatness_at_samples(model, {k: v[-1:] for k, v in samples.items()}, X[:128], y[:128],
                                            k=1, num_probes=2, likelihood_only=True)
    assert np.isfinite(measured["top_eigenvalues"]).all() and np.isfinite(measured["trace"]).all()
    first, last = ({k: v[i] for k, v in samples.items() if not k.endswith("_aux")} for i in (0, -1))
    loss = flatness.FlatLoss.from_model(model, first, X[:128], y[:128], likelihood_only=True)
    curve = flatness.interpolation_curve(loss, loss.flatten(first), loss.flatten(last), num_points=3)
    assert loss.params.is_cuda and np.isfinite(curve.loss).all()


def test_a_bayesian_mlp_moved_to_cuda_draws_its_prior_there_and_its_minibatch_indices_too():
    from pyro_flat.models import BayesianMLP

    net = BayesianMLP(20, [16], 3).cuda()
    X, y = torch.randn(200, 20, device="cuda"), torch.randint(0, 3, (200,), device="cuda")
    trace = pyro.poutine.trace(net).get_trace(X, y, batch_size=50)
    assert trace.nodes["layers.0.weight"]["value"].is_cuda and trace.nodes["data"]["value"].is_cuda
    mcmc = MCMC(SGLD(net, step_size=1e-4), 20, 0, num_chains=4, disable_progbar=True)
    mcmc.run(X, y, batch_size=50)
    assert all(bool(torch.isfinite(v).all()) for v in mcmc.get_samples().values())


@pytest.fixture
def without_tf32():
    """float32 matmuls and cuDNN convolutions in float32, not TF32, during the test (the flags put back after):
    TF32's round-off bound (u = 2^-11, :mod:`pyro_flat.roundoff`) on a run's draws would exceed the noise a test
    tells apart."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = matmul.allow_tf32, cudnn.allow_tf32
    matmul.allow_tf32 = cudnn.allow_tf32 = False
    yield
    matmul.allow_tf32, cudnn.allow_tf32 = before


@pytest.mark.parametrize("chains, streams", [(1, "shared"), (4, "shared"), (4, "per_chain")])
def test_a_compiled_iteration_replays_as_a_cuda_graph_and_repeats_the_eager_draws(chains, streams, without_tf32):
    """jit_compile on a GPU captures the iteration as a CUDA graph (no warning that the capture failed),
    and a seeded run gives the eager run's draws up to round-off: the replay draws the same noise (with
    per-chain streams, drawn before each replay and copied in as the graph's inputs)."""
    import warnings
    from torch import nn
    from pyro_flat.nn import BayesianModule

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                        nn.Linear(4 * 8 * 8, 3)).cuda()
    X, y = torch.randn(256, 1, 8, 8, device="cuda"), torch.randint(0, 3, (256,), device="cuda")
    draws = {}
    for jit in (False, "fx"):
        pyro.set_rng_seed(1)
        kernel = EntropySGLD(BayesianModule(net), eta=0.05, step_size=1e-4, jit_compile=jit)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mcmc = MCMC(kernel, 20, 5, num_chains=chains, disable_progbar=True, random_streams=streams)
            mcmc.run(X, y, batch_size=32)
        assert kernel.is_compiled == bool(jit)
        assert not [w for w in caught if "CUDA graph" in str(w.message) or "runs eagerly" in str(w.message)]
        draws[jit] = mcmc.get_samples()
    for site, value in draws[False].items():  # 25 iterations, each the convolution's gradient over 32 * 8 * 8 pixels
        assert_close_roundoff(draws["fx"][site].cpu(), value.cpu(), length=25 * 32 * 8 * 8, tf32=False, msg=site)


def test_a_dense_preconditioner_takes_a_model_whose_plate_draws_its_indices_on_the_cpu():
    """The full-data pass of the preconditioner's warm-up evaluates blocks of the data: a user's plate without
    ``device=`` (indices on the CPU) with CUDA data must work there as it does for minibatches."""
    import pyro.distributions as dist

    def model(X, y=None, batch_size=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(X.shape[1], device=X.device), 1.0).to_event(1))
        with pyro.plate("data", X.shape[0], subsample_size=batch_size) as idx:
            pyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=None if y is None else y[idx])

    X, y = _data()
    mcmc = MCMC(EntropySGLD(model, eta=0.1, preconditioner="dense", step_size=0.2), 20, 20, disable_progbar=True)
    mcmc.run(X, y, batch_size=50)
    assert all(bool(torch.isfinite(v).all()) for v in mcmc.get_samples().values())


def _potential_on_cuda(rank):
    start = torch.zeros(2, 3, device="cuda")
    mcmc = MCMC(SGLD(potential_fn=lambda p: 0.5 * (p["x"] ** 2).sum(-1), step_size=0.1), 5, 2, num_chains=2,
                chain_method="distributed", initial_params={"x": start}, disable_progbar=True)
    mcmc.run()
    return mcmc.backend


@pytest.mark.skipif(not torch.distributed.is_nccl_available(), reason="this torch has no nccl")
def test_a_potential_whose_initial_params_are_on_the_gpu_runs_on_nccl():
    """No model argument is a tensor: the run's device (and so nccl) comes from initial_params."""
    from ranks import run_ranks

    assert run_ranks(_potential_on_cuda, 1, timeout=120).values() == ["nccl"]


def test_the_images_study_runs_on_the_gpu_compiled(tmp_path):
    """``pyro-flat images --device cuda --jit fx``: the data, networks, draws and scores on the GPU (the
    report names it), every iteration through a CUDA graph, the numbers finite."""
    import json
    from pyro_flat.experiments.cli import main

    out = tmp_path / "images"
    args = ["--network", "tiny-resnet", "--epochs", "2", "--cycles", "1", "--seeds", "1", "--train-size", "160",
            "--test-size", "40", "--flatness-images", "32", "--trace-probes", "2", "--batch-size", "32", "--lr",
            "0.05", "--inner-steps", "2", "--no-progress", "--methods", "sgd", "emcmc"]
    assert main(["images", *args, "--device", "cuda", "--jit", "fx", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert "cuda" in report["device"] and report["config"]["jit"] == "fx"
    for row in report["rows"]:
        assert all(np.isfinite(row[k]) for k in ("accuracy", "nll", "ood_auroc"))
