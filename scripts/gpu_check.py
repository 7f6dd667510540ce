"""Everything pyro-flat runs, on one device, as one table: ``python scripts/gpu_check.py [--device cuda:N]``.

Every kernel (4 vectorized chains of Bayesian logistic regression, minibatch 100), EntropyHMC on the
full data, per-chain random streams; the compiled iteration (``jit_compile``: inductor, and ``"fx"`` for
EntropySGHMC, SAMSGD and LocalEntropySGLD, fused graphs of 4 iterations, a divergence inside a fused graph)
against the eager one; a run stopped part-way and resumed from its checkpoint; a ``BayesianModule`` CNN with
BatchNorm (4 vectorized chains, ``bma_predict`` with each draw's BatchNorm statistics), in channels_last memory
(vmap against a loop), a network that cannot take it (NCHW with a warning), an augmentation inside the
compiled step, batches from a ``DataLoader``; bf16 autocast (the kernels, inductor, a CNN and its prediction,
the flatness loss) against fp32; the flatness measures (Hessian trace and top eigenvalue of a Bayesian MLP),
the SVI objectives (SAM_ELBO, SABMA_ELBO), the image study's Entropy-MCMC fit compiled (``--jit fx``)
against eager, and a 1-rank process group (nccl on a GPU, gloo on a CPU) running
``chain_method="distributed"``. A check passes when it runs, its results are finite, the chains' state
stays on the device (the draws of vectorized chains go to host memory as they are made, by design: device
memory does not grow with the draws), and what it compares agrees (up to round-off,
``pyro_flat/roundoff.py``, or bit for bit where the library promises it); a ``jit_compile`` warning (a
graph that falls back to eager, an inductor build that fails) fails the check with its text. The table gives
the time per iteration (per step, per measure) after the first. ``--device cpu`` runs the same checks on the
CPU (the test suite does, with ``--quick``); ``--list`` prints the checks' names, ``--only TEXT ...`` runs those whose
names contain a text (a short rerun). Exit status 1 if any check
failed.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import tempfile
import time
import traceback
import warnings
from functools import partial
from typing import Callable, Dict, List, Tuple

import torch
from torch import nn

import pyro
from pyro.infer import SVI
from pyro.infer.autoguide import AutoNormal
from pyro_flat import MCMC, SABMA_ELBO, SAM_ELBO, SGLD, DivergenceError, EntropyHMC, bma_predict, flatness
from pyro_flat.kernels import KERNELS, kernel_class, kernel_settings, make_kernel
from pyro_flat.models import BayesianMLP, logistic_regression
from pyro_flat.nn import BayesianModule
from pyro_flat.roundoff import assert_close_roundoff, roundoff_tolerance, tf32_allowed

SETTINGS = dict(step_size=1e-3, eta=0.05, rho=0.05, sigma=0.01)


def _on(device: torch.device, values) -> None:
    for value in values:
        if value.device.type != device.type or (device.type == "cuda" and device.index is not None
                                                and value.device.index != device.index):
            raise AssertionError(f"a result is on {value.device}, not on {device}")
        _finite([value])


def _finite(values) -> None:
    if not all(bool(torch.isfinite(value).all()) for value in values):
        raise AssertionError("a result is not finite")


def _logistic(device, n=2000, d=20):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, d, generator=g)
    y = torch.bernoulli(torch.sigmoid(X @ torch.ones(d) / d ** 0.5), generator=g)
    return X.to(device), y.to(device)


def _timed_mcmc(kernel_maker, args, kwargs, iterations, chains=4, **mcmc_kwargs) -> float:
    """Seconds per iteration of a run of ``iterations`` beyond a run of a third as many (set-up cancels),
    after an untimed run of 2 (the GPU's first calls pick kernels and allocate: a negative time else)."""
    times, samples = [], None
    for n in (2, max(iterations // 3, 2), iterations):
        pyro.set_rng_seed(0)
        mcmc = MCMC(kernel_maker(), num_samples=n, warmup_steps=0, num_chains=chains, disable_progbar=True,
                    **mcmc_kwargs)
        start = time.perf_counter()
        mcmc.run(*args, **kwargs)
        _sync()
        times.append(time.perf_counter() - start)
        samples = mcmc.get_samples() if getattr(mcmc, "rank", 0) == 0 else {}
        state = mcmc.kernel.initial_params
    _finite(samples.values())
    _on(args[0].device, state.values())  # the chains' state; the draws are in host memory
    return (times[2] - times[1]) / (iterations - max(iterations // 3, 2))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _kernel_names() -> List[str]:
    return sorted(set(kernel_class(k).__name__ for k in KERNELS))


def kernel_check(name: str, device, quick: bool) -> float:
    """``name``'s 4 chains (EntropyHMC on the full data, the others on minibatches of 100): finite draws, the
    state on the device."""
    X, y = _logistic(device)
    iterations = 30 if quick else 300
    if name == "EntropyHMC":
        maker = lambda: EntropyHMC(logistic_regression, eta=0.05, num_steps=5)  # noqa: E731
        return _timed_mcmc(maker, (X, y), {"batch_size": None}, iterations // 3)
    own = {k: v for k, v in SETTINGS.items() if k in kernel_settings(name)}
    return _timed_mcmc(lambda: make_kernel(name, logistic_regression, **own), (X, y), {"batch_size": 100}, iterations)


def streams_check(device, quick: bool) -> float:
    """Per-chain random streams on the device: chains 2-3 drawn alone equal the rows of all 4 chains' draws;
    then the time per iteration of EntropySGLD's 4 chains drawing from them."""
    from pyro_flat.chains.streams import ChainStreams, drawing_from
    from pyro_flat.chains import chain_randn_like_each

    shapes = [(4, 30, 7), (4, 5)]
    with drawing_from(ChainStreams(3, range(4))):
        whole = chain_randn_like_each([torch.zeros(s, device=device) for s in shapes])
    with drawing_from(ChainStreams(3, range(2, 4))):
        half = chain_randn_like_each([torch.zeros((2, *s[1:]), device=device) for s in shapes])
    if not all(torch.equal(h, w[2:]) for h, w in zip(half, whole)):
        raise AssertionError("chains 2-3 drawn alone differ from their rows of all 4 chains' draws")
    _on(device, half)
    X, y = _logistic(device)
    return _timed_mcmc(lambda: make_kernel("EntropySGLD", logistic_regression, step_size=1e-3, eta=0.05), (X, y),
                       {"batch_size": 100}, 30 if quick else 300, random_streams="per_chain")


def flatness_check(device, quick: bool) -> float:
    torch.manual_seed(0)
    X, y = torch.randn(500, 20, device=device), torch.randint(0, 3, (500,), device=device)
    model = BayesianMLP(20, [32], 3).to(device)
    trace = pyro.poutine.trace(model).get_trace(X, y)
    draw = {n: site["value"] for n, site in trace.nodes.items() if n.startswith("layers.")}
    _on(device, draw.values())
    loss = flatness.FlatLoss.from_model(model, draw, X, y)
    here = loss.at(loss.flatten(draw))
    start = time.perf_counter()
    trace = flatness.hessian_trace(here, num_probes=5 if quick else 50)
    top = flatness.top_eigenvalues(here, k=1, tol=1e-3)
    _sync()
    if not (torch.isfinite(torch.tensor([trace.value, top[0]])).all()):
        raise AssertionError("a flatness measure is not finite")
    return time.perf_counter() - start


def svi_check(device, loss, quick: bool) -> float:
    X, y = _logistic(device)
    pyro.clear_param_store()
    guide = AutoNormal(logistic_regression)
    svi = SVI(logistic_regression, guide, pyro.optim.Adam({"lr": 0.01}), loss)
    svi.step(X, y, batch_size=100)
    steps = 10 if quick else 200
    start = time.perf_counter()
    for _ in range(steps):
        svi.step(X, y, batch_size=100)
    _sync()
    _on(device, [p for p in pyro.get_param_store().values()])
    return (time.perf_counter() - start) / steps


def _cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 7 * 7, 10))


def cnn_check(device, quick: bool) -> float:
    torch.manual_seed(0)
    X, y = torch.randn(1024, 1, 28, 28, device=device), torch.randint(0, 10, (1024,), device=device)
    model = BayesianModule(_cnn().to(device))
    maker = lambda: make_kernel("entropy-sgld", model, eta=0.05, step_size=1e-6)  # noqa: E731
    seconds = _timed_mcmc(maker, (X, y), {"batch_size": 128}, 6 if quick else 60)
    pyro.set_rng_seed(0)
    mcmc = MCMC(maker(), num_samples=2, warmup_steps=0, num_chains=4, disable_progbar=True)
    mcmc.run(X, y, batch_size=128)
    if mcmc.chain_method != "vectorized":
        raise AssertionError(f"the chains ran {mcmc.chain_method}, not vectorized")
    probs = bma_predict(model, mcmc.get_samples(), X[:64], batchnorm_data=X[:256])
    _finite([probs])
    return seconds


def images_check(device, quick: bool) -> float:
    """One Entropy-MCMC fit of ``pyro-flat images`` (its reduced run: a tiny ResNet, a cosine schedule) on the
    device, eager and compiled (``--jit fx``: on a GPU one CUDA graph per phase, the step size an input): the
    compiled draws must equal the eager ones up to round-off. The time is the compiled fit's per iteration,
    its compiling left out."""
    from pyro_flat.experiments.images import study as images
    from pyro_flat.experiments.images.config import ImagesConfig

    fits = []
    for jit in ("off", "fx"):
        config = ImagesConfig.reduced(methods=("emcmc",), seeds=1, device=str(device), jit=jit, progress=False,
                                      **({"train_size": 64, "batch_size": 16} if quick else {}))
        data = images.load_image_data(config).to(device)
        fits.append(images.fit_method("emcmc", config, data, seed=0))
    for name, want in fits[0].samples.items():
        _on(device, [fits[1].samples[name]])
        torch.testing.assert_close(fits[1].samples[name], want, rtol=1e-3, atol=1e-4)
    if fits[1].compile_seconds <= 0:
        raise AssertionError("the --jit fx fit compiled nothing")
    return (fits[1].seconds - fits[1].compile_seconds) / fits[1].iterations


def cifar_images_check(device, quick: bool) -> float:
    """``pyro-flat images`` on generated files of CIFAR-10's official layout, on the device with ``--jit fx`` and
    ``--precision bf16`` (a ``BayesianModule`` on a GPU: channels_last, vmap or a loop by measurement): the compiled
    bf16 draws must equal the eager bf16 ones up to round-off. The time is the compiled fit's per iteration."""
    import tempfile

    import numpy as np

    from pyro_flat.data.cifar_files import write_cifar
    from pyro_flat.experiments.images import study as images
    from pyro_flat.experiments.images.config import ImagesConfig

    rng = np.random.default_rng(0)
    labels = np.arange(200) % 10
    pixels = (rng.integers(0, 40, size=(200, 3, 32, 32)) + (labels * 20)[:, None, None, None]).astype(np.uint8)
    fits = []
    with tempfile.TemporaryDirectory() as folder:
        write_cifar(folder, "cifar10", "train", pixels, labels, parts=5)
        write_cifar(folder, "cifar10", "test", pixels[:50], labels[:50])
        for jit in ("off", "fx"):
            config = ImagesConfig.reduced(methods=("emcmc",), seeds=1, device=str(device), jit=jit, precision="bf16",
                                          dataset="cifar10", data_dir=folder, progress=False, train_size=200,
                                          batch_size=16 if quick else 32)
            data = images.load_image_data(config).to(device)
            fits.append(images.fit_method("emcmc", config, data, seed=0))
    for name, want in fits[0].samples.items():
        _on(device, [fits[1].samples[name]])
        torch.testing.assert_close(fits[1].samples[name], want, rtol=1e-3, atol=1e-4)
    return (fits[1].seconds - fits[1].compile_seconds) / fits[1].iterations


def mixed_precision_check(device, quick: bool) -> float:
    """EntropySGLD with ``autocast=torch.bfloat16`` (the potential in bf16, the state and update in fp32) against
    the same chains in fp32: means within 0.05 posterior sd; then the bf16 run's time per iteration."""
    X, y = _logistic(device)
    maker = lambda autocast: (lambda: make_kernel("entropy-sgld", logistic_regression, eta=0.05,  # noqa: E731
                                                  step_size=1e-3, autocast=autocast))
    draws = {}
    for autocast in (None, torch.bfloat16):
        pyro.set_rng_seed(0)
        mcmc = MCMC(maker(autocast)(), num_samples=100 if quick else 500, warmup_steps=50, num_chains=4,
                    disable_progbar=True)
        mcmc.run(X, y, batch_size=100)
        draws[autocast] = mcmc.get_samples()["w"].reshape(-1, X.shape[1])
        _on(device, [mcmc.kernel.initial_params["w"]])
        if mcmc.kernel.initial_params["w"].dtype != torch.float32:
            raise AssertionError("the chains' state is not fp32 under autocast")
    sd = draws[None].std(0)
    gap = float(((draws[torch.bfloat16].mean(0) - draws[None].mean(0)) / sd).abs().max())
    if gap > 0.05:
        raise AssertionError(f"bf16 autocast's means are {gap:.3f} sd from fp32's")
    return _timed_mcmc(maker(torch.bfloat16), (X, y), {"batch_size": 100}, 30 if quick else 300)


def transfer_check(device, quick: bool) -> float:
    """``pyro-flat transfer``'s reduced run on the device (a tiny ResNet pre-trained, then SGD, Laplace, SA-BMA and
    Entropy-MCMC on its adapters): every row finite. The time is the run's per fit."""
    import tempfile

    from pyro_flat.experiments.transfer.study import run_transfer_study
    from pyro_flat.experiments.transfer.config import TransferConfig

    methods = ("sgd-block", "laplace-head", "sabma-block", "emcmc-adapters")
    with tempfile.TemporaryDirectory() as folder:
        report = run_transfer_study(TransferConfig.reduced(out=f"{folder}/out", device=str(device), methods=methods,
                                                           seeds=1), log=lambda line: None)
    if report["device"] != str(device):
        raise AssertionError(f"the study ran on {report['device']}, not {device}")
    for row in report["rows"]:
        _finite([torch.tensor([row["nll"], row["accuracy"], row["ood_auroc"]])])
    return report["seconds"] / len(report["rows"])


def process_group_check(device, quick: bool) -> float:
    """``chain_method="distributed"`` in a group of one rank (nccl on CUDA tensors, gloo on the CPU)."""
    import torch.distributed as dist_

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    local_rank = str(device.index or 0) if device.type == "cuda" else "0"  # torchrun's way of naming cuda:N
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK=local_rank, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        X, y = _logistic(device)
        maker = lambda: make_kernel("sgld", logistic_regression, step_size=1e-3)  # noqa: E731
        seconds = _timed_mcmc(maker, (X, y), {"batch_size": 100}, 30 if quick else 300,
                              chain_method="distributed")
        backend = dist_.get_backend()
        expected = "nccl" if device.type == "cuda" else "gloo"
        if backend != expected:
            raise AssertionError(f"the group's backend is {backend}, not {expected}")
        return seconds
    finally:
        if dist_.is_initialized():
            dist_.destroy_process_group()
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(key, None)


# ---------------------------------------------------------------------------------------------------- helpers


def _run(kernel, args, kwargs, samples: int, warmup: int = 0, chains: int = 4, seed: int = 0, **mcmc_kwargs):
    """A seeded run of ``kernel``: the MCMC, its seconds (the device synchronised) and the warnings it gave."""
    pyro.set_rng_seed(seed)
    mcmc = MCMC(kernel, num_samples=samples, warmup_steps=warmup, num_chains=chains, disable_progbar=True,
                **mcmc_kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        mcmc.run(*args, **kwargs)
        _sync()
        seconds = time.perf_counter() - start
    return mcmc, seconds, caught


def _no_jit_warning(caught) -> None:
    """A ``jit_compile`` warning (a graph that runs eagerly or unfused, an inductor build that failed, a CUDA graph
    that failed to capture) fails the check, with its text: the point is to learn whether compiling works here."""
    for w in caught:
        if "jit_compile=" in str(w.message):
            raise AssertionError(str(w.message))


def _no_runtime_warning(caught) -> None:
    """A RuntimeWarning (a fallback: to Pyro's driver, to a loop, to NCHW memory) fails the check, with its text."""
    for w in caught:
        if issubclass(w.category, RuntimeWarning):
            raise AssertionError(str(w.message))


def _tf32(device, convolutions: bool) -> bool:
    """Whether the device's float32 products may have run in TF32 (the draws compared are in host memory, so
    ``assert_close_roundoff`` cannot tell): cuDNN's convolutions by its flag, matmuls by theirs."""
    if device.type != "cuda":
        return False
    if convolutions:
        return tf32_allowed()
    matmul = torch.backends.cuda.matmul
    return getattr(matmul, "fp32_precision", None) == "tf32" or bool(matmul.allow_tf32)


def _assert_draws_close(got: Dict[str, torch.Tensor], want: Dict[str, torch.Tensor], length: int, tf32: bool) -> None:
    """Every site's draws up to the round-off of a ``length``-term reduction (pyro_flat/roundoff.py)."""
    if set(got) != set(want):
        raise AssertionError(f"the runs drew other sites: {sorted(got)} and {sorted(want)}")
    for name, value in want.items():
        _finite([got[name]])
        assert_close_roundoff(got[name], value, length=length, tf32=tf32, msg=name)


def _assert_bf16_draws_close(got: Dict[str, torch.Tensor], want: Dict[str, torch.Tensor], iterations: int) -> None:
    """Draws ``(chain, draw, ...)`` of two bf16-autocast runs: each iteration's move (its gradient in bf16) may round
    differently, and these differences add up over the iterations: at most ``roundoff_tolerance(bf16,
    length=iterations, scale=the largest move from one draw to the next)``, absolute (not relative to the value)."""
    for name, value in want.items():
        _finite([got[name]])
        move = float(value.diff(dim=1).abs().max()) if value.shape[1] > 1 else float(value.abs().max())
        _, atol = roundoff_tolerance(torch.bfloat16, length=iterations, scale=move)
        torch.testing.assert_close(got[name], value, rtol=0.0, atol=atol,
                                   msg=lambda text, name=name, atol=atol: f"{name}: {text}\nbf16 round-off of "
                                   f"{iterations} moves of at most {move:.3g}: atol = {atol:.3g}")


def _eager_against_compiled(device, quick: bool, name: str, settings: dict, jit, gradients: int = 1,
                            autocast=None, thinning: int = 1, warmup: int = 0) -> Tuple[object, float]:
    """``name``'s 4 chains of logistic regression, eager and compiled with ``jit``: the compiled kernel (its graphs
    built without a warning) and its seconds per iteration, compiling left out; the draws agree up to round-off
    (``gradients`` gradients of 100 rows * 20 weights an iteration)."""
    X, y = _logistic(device)
    samples = 20 if quick else 100  # post-warm-up iterations (``num_samples``), every ``thinning``-th a draw
    iterations = warmup + samples
    runs = []
    for flag in (False, jit):
        kernel = make_kernel(name, logistic_regression, jit_compile=flag, autocast=autocast, **settings)
        mcmc, seconds, caught = _run(kernel, (X, y), {"batch_size": 100}, samples, warmup=warmup, thinning=thinning)
        _no_jit_warning(caught)
        _on(device, kernel.initial_params.values())
        runs.append(mcmc.get_samples(group_by_chain=True))
    if not kernel.is_compiled:
        raise AssertionError(f"{name}(jit_compile={jit!r}) ran eagerly")
    if autocast is None:
        _assert_draws_close(runs[1], runs[0], length=iterations * gradients * 100 * 20, tf32=_tf32(device, False))
    else:
        _assert_bf16_draws_close(runs[1], runs[0], iterations)
    return kernel, (seconds - kernel.compile_seconds) / iterations


# ---------------------------------------------------------------------------------------------------- compiled


def inductor_check(device, quick: bool, autocast=None) -> float:
    """EntropySGLD with ``jit_compile="inductor"`` (with ``autocast``): inductor's build holds (no warning that it
    failed and the traced graph runs without it) and the draws equal the eager ones up to round-off (bf16's, under
    autocast). The time is the compiled run's per iteration."""
    kernel, seconds = _eager_against_compiled(device, quick, "EntropySGLD", dict(eta=0.05, step_size=1e-3),
                                              "inductor", autocast=autocast)
    if kernel._steps.backend != "inductor":
        raise AssertionError(f"the graphs ran with {kernel._steps.backend!r}, not inductor")
    return seconds


def fx_check(device, quick: bool, name: str, settings: dict, gradients: int) -> float:
    """``name`` compiled with ``jit_compile="fx"`` (on a GPU replayed as a CUDA graph): its draws equal the eager
    ones up to round-off. The time is the compiled run's per iteration."""
    return _eager_against_compiled(device, quick, name, settings, "fx", gradients=gradients)[1]


def fused_check(device, quick: bool) -> float:
    """EntropySGLD with ``jit_compile="fx"`` and thinning 4: after warm-up each draw's 4 iterations run as one fused
    graph (a key of the kernel's graphs with 4 fused iterations), and the draws equal the eager ones up to
    round-off."""
    kernel, seconds = _eager_against_compiled(device, quick, "EntropySGLD", dict(eta=0.05, step_size=1e-3), "fx",
                                              thinning=4, warmup=8)
    fused = [key for key in kernel._steps.graphs if len(key) == 4 and key[-1] == 4]
    if not fused:
        raise AssertionError(f"no fused graph ran; the graphs: {list(kernel._steps.graphs)}")
    return seconds


def _exploding(params):  # curvature 50: a step of 0.05 multiplies x by -1.5 each iteration
    return 25.0 * (params["x"] ** 2).sum(-1)


def divergence_check(device, quick: bool) -> float:
    """SGLD on ``25 |x|^2`` with step 0.05 (x grows 1.5-fold an iteration), 3 chains, thinning 8, compiled with
    ``"fx"``: the divergence, inside a fused graph of 8 iterations, raises DivergenceError naming the iteration and
    chain the eager run names, with the draws made before it (equal up to round-off)."""
    errors, kernels = {}, {}
    for jit in (False, "fx"):
        kernels[jit] = kernel = SGLD(potential_fn=_exploding, step_size=0.05, jit_compile=jit)
        start = time.perf_counter()
        try:
            _run(kernel, (), {}, 2000, warmup=4, chains=3, thinning=8,
                 initial_params={"x": torch.ones(3, 2, device=device)})
        except DivergenceError as err:
            errors[jit] = err
        else:
            raise AssertionError(f"the run with jit_compile={jit!r} did not diverge")
        seconds = time.perf_counter() - start
    eager, fused = errors[False], errors["fx"]
    if not any(len(key) == 4 and key[-1] == 8 for key in kernels["fx"]._steps.graphs):
        raise AssertionError(f"no fused graph ran; the graphs: {list(kernels['fx']._steps.graphs)}")
    if (fused.iteration, fused.chain) != (eager.iteration, eager.chain):
        raise AssertionError(f"the fused run names iteration {fused.iteration}, chain {fused.chain}; the eager run "
                             f"iteration {eager.iteration}, chain {eager.chain}")
    if (fused.iteration - 4) % 8 in (0, 7):
        raise AssertionError(f"iteration {fused.iteration} is not inside a fused block of 8")
    if "iteration" not in str(fused) or "chain" not in str(fused):
        raise AssertionError(f"the error does not name its iteration and chain: {fused}")
    want, got = eager.samples["x"], fused.samples["x"]
    if got.shape != want.shape or got.shape[0] < 1:
        raise AssertionError(f"the fused run kept draws of shape {tuple(got.shape)}, the eager {tuple(want.shape)}")
    for i, draw in enumerate(want):  # x grows 1.5-fold an iteration: each draw on its own scale
        assert_close_roundoff(got[i], draw, length=fused.iteration * 2, msg=f"draw {i}")
    return (seconds - kernels["fx"].compile_seconds) / fused.iteration


# ---------------------------------------------------------------------------------------------------- checkpoint


def checkpoint_check(device, quick: bool) -> float:
    """EntropySGHMC (4 chains; ``jit_compile="fx"`` with thinning 4: fused graphs; per-chain random streams) writing
    a checkpoint, stopped by a Ctrl-C (SIGINT, as tests/test_network_execution.py does) half-way through its draws,
    then run again: it resumes from the checkpoint (part-way) and its draws equal the uninterrupted run's bit for
    bit. The time is the uninterrupted run's per iteration, compiling left out."""
    from pyro_flat.storage.checkpoint import read_checkpoint

    X, y = _logistic(device)
    warmup, samples = (0, 40) if quick else (20, 160)  # post-warm-up iterations, every 4th a draw
    draws = samples // 4
    settings = dict(num_samples=samples, warmup_steps=warmup, num_chains=4, thinning=4, disable_progbar=True,
                    random_streams="per_chain")
    make = lambda: make_kernel("EntropySGHMC", logistic_regression, eta=0.05, momentum=0.7,  # noqa: E731
                               step_size=1e-3, jit_compile="fx")

    def run(path=None, stop_at=None):
        def hook(kernel, params, stage, i):
            if stage == "Sample" and i == stop_at:
                os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C: this iteration's checkpoint, then the stop

        pyro.set_rng_seed(0)
        mcmc = MCMC(make(), checkpoint=path, checkpoint_every=3600 if path else None, hook_fn=hook, **settings)
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mcmc.run(X, y, batch_size=100)
        _no_jit_warning(caught)
        _on(device, mcmc.kernel.initial_params.values())
        return mcmc.get_samples(group_by_chain=True), time.perf_counter() - start - mcmc.kernel.compile_seconds

    reference, seconds = run()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "run.ckpt")
        try:
            run(path, stop_at=draws // 2)
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("the Ctrl-C did not stop the run")
        done = read_checkpoint(path, devices=[device] if device.type == "cuda" else [])["done"]
        if not warmup < done < warmup + draws:  # warm-up iterations and draws
            raise AssertionError(f"the checkpoint holds {done} of {warmup + draws} steps: not part-way")
        resumed, _ = run(path)
    for name, value in reference.items():
        if not torch.equal(resumed[name], value):
            raise AssertionError(f"{name}: the resumed run's draws differ from the uninterrupted run's by up to "
                                 f"{float((resumed[name] - value).abs().max()):.3g}")
    return seconds / (warmup + samples)


# ---------------------------------------------------------------------------------------------------- networks


def _small_cnn(size: int = 16, depth: int = 2) -> nn.Module:
    """A CNN with BatchNorm for 3-channel ``size`` x ``size`` images and 10 classes: 2 convolutions (``depth=1``:
    one, and no pooling)."""
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()]
    if depth == 1:
        return nn.Sequential(*layers, nn.Flatten(), nn.Linear(8 * size ** 2, 10))
    return nn.Sequential(*layers, nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(8 * (size // 2) ** 2, 10))


def _images(device, n=256, size=16):
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(n, 3, size, size, generator=g), torch.randint(0, 10, (n,), generator=g)
    return X.to(device), y.to(device)


def channels_last_check(device, quick: bool) -> float:
    """A BayesianModule CNN with BatchNorm, ``memory_format="channels_last"``, 4 vectorized chains each on its own
    minibatches, its networks one vmap-ed pass (``networks="vmap"``) and a loop (``"loop"``): no fallback warning,
    the layout kept, and the draws agree up to round-off. The time is the vmap run's per iteration."""
    X, y = _images(device)
    iterations = 10 if quick else 50
    draws, times = {}, {}
    for way in ("vmap", "loop"):
        model = BayesianModule(_small_cnn().to(device), memory_format="channels_last", networks=way)
        kernel = make_kernel("sgld", model, step_size=1e-4)
        mcmc, seconds, caught = _run(kernel, (X, y), {"batch_size": 32}, iterations)
        _no_runtime_warning(caught)
        if mcmc.chain_method != "vectorized" or model.memory_format != "channels_last":
            raise AssertionError(f"networks={way!r} ran {mcmc.chain_method} in {model.memory_format} memory")
        _on(device, kernel.initial_params.values())
        draws[way], times[way] = mcmc.get_samples(group_by_chain=True), seconds / iterations
    # each iteration: the first convolution's weight gradient over a minibatch's 32 * 16 * 16 pixels
    _assert_draws_close(draws["loop"], draws["vmap"], length=iterations * 32 * 16 * 16, tf32=_tf32(device, True))
    return times["vmap"]


class _Viewing(nn.Module):
    """A CNN whose forward flattens with .view, which NHWC activations cannot take."""

    def __init__(self):
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4 * 16 * 16, 10)

    def forward(self, x):
        h = self.conv(x)
        return self.head(h.view(h.shape[0], -1))


def nchw_fallback_check(device, quick: bool) -> float:
    """A network whose forward uses ``.view``: asked for channels_last by ``"auto"`` it runs in NCHW with a warning
    (``checked_layout``); a BayesianModule of it with ``memory_format="auto"`` runs 4 chains (on a GPU after that
    warning, ``"auto"`` choosing channels_last there), ends in NCHW, its draws finite."""
    from pyro_flat.nn import execution

    X, y = _images(device, n=128)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layout = execution.checked_layout(_Viewing().to(device), X[:2], "channels_last", "auto")
    said = [str(w.message) for w in caught if "runs in NCHW" in str(w.message)]
    if layout != "contiguous" or not said:
        raise AssertionError(f"checked_layout gave {layout!r} with the warnings {[str(w.message) for w in caught]}")
    torch.manual_seed(0)
    model = BayesianModule(_Viewing().to(device), memory_format="auto")
    iterations = 5 if quick else 30
    kernel = make_kernel("sgld", model, step_size=1e-4)
    mcmc, seconds, caught = _run(kernel, (X, y), {"batch_size": 16}, iterations)
    warned = any("runs in NCHW" in str(w.message) for w in caught)
    if warned != (device.type == "cuda") or model.memory_format != "contiguous":
        raise AssertionError(f"memory_format='auto' on {device}: {model.memory_format}, the NCHW warning "
                             f"{'given' if warned else 'not given'}")
    _on(device, kernel.initial_params.values())
    _finite(mcmc.get_samples().values())
    return seconds / iterations


def augmentation_check(device, quick: bool) -> float:
    """A BatchNorm CNN with ``transform=random_crop_flip`` (4 chains, each its own minibatches), with
    ``jit_compile="fx"`` and thinning 4 (the augmentation drawn inside single and fused graphs): no fallback, the
    draws equal the eager ones up to round-off. The time is the compiled run's per iteration."""
    from pyro_flat.nn import random_crop_flip

    X, y = _images(device, n=128, size=8)
    warmup, samples = (0, 16) if quick else (8, 80)  # post-warm-up iterations, every 4th a draw
    iterations = warmup + samples
    draws = []
    for jit in (False, "fx"):
        model = BayesianModule(_small_cnn(size=8, depth=1).to(device), transform=random_crop_flip)
        kernel = make_kernel("sgld", model, step_size=1e-3, jit_compile=jit)
        mcmc, seconds, caught = _run(kernel, (X, y), {"batch_size": 16}, samples, warmup=warmup, thinning=4)
        _no_jit_warning(caught)
        _no_runtime_warning(caught)
        if kernel.is_compiled != bool(jit) or mcmc.chain_method != "vectorized":
            raise AssertionError(f"jit_compile={jit!r}: compiled {kernel.is_compiled}, chains {mcmc.chain_method}")
        _on(device, kernel.initial_params.values())
        draws.append(mcmc.get_samples(group_by_chain=True))
    if not any(len(key) == 4 and key[-1] == 4 for key in kernel._steps.graphs):
        raise AssertionError(f"no fused graph ran; the graphs: {list(kernel._steps.graphs)}")
    # each iteration: the convolution's weight gradient over a minibatch's 16 * 8 * 8 pixels
    _assert_draws_close(draws[1], draws[0], length=iterations * 16 * 8 * 8, tf32=_tf32(device, True))
    return (seconds - kernel.compile_seconds) / iterations


def loader_check(device, quick: bool) -> float:
    """A BayesianModule CNN fed by ``Batches(DataLoader(...), device=device)`` (a shuffling loader of host tensors),
    4 chains: the batches arrive on the device, the chains' state stays there and the draws are finite."""
    from torch.utils.data import DataLoader, TensorDataset

    from pyro_flat.nn import Batches

    X, y = _images(torch.device("cpu"), n=256)
    data = Batches(DataLoader(TensorDataset(X, y), batch_size=16, shuffle=True, drop_last=True), device=device)
    model = BayesianModule(_small_cnn().to(device))
    iterations = 5 if quick else 40
    kernel = make_kernel("sgld", model, step_size=1e-4)
    mcmc, seconds, caught = _run(kernel, (data,), {}, iterations)
    _no_runtime_warning(caught)
    _on(device, kernel.initial_params.values())
    _finite(mcmc.get_samples().values())
    x, labels = data.take(torch.zeros(2, 16, dtype=torch.long, device=device))
    _on(device, [x, labels])
    return seconds / iterations


# ---------------------------------------------------------------------------------------------------- bf16


def bf16_cnn_check(device, quick: bool) -> float:
    """The BatchNorm CNN's 4 chains under ``autocast=torch.bfloat16``: vectorized, their state fp32 on the device;
    ``bma_predict(..., autocast="bf16")`` gives the fp32 prediction's probabilities up to bf16 round-off (each of
    the network's 3 weighted layers rounds its output to bf16 once). The time is the run's per iteration."""
    torch.manual_seed(0)
    X, y = torch.randn(512, 1, 28, 28, device=device), torch.randint(0, 10, (512,), device=device)
    model = BayesianModule(_cnn().to(device))
    iterations = 5 if quick else 60
    kernel = make_kernel("entropy-sgld", model, eta=0.05, step_size=1e-6, autocast="bf16")
    mcmc, seconds, caught = _run(kernel, (X, y), {"batch_size": 64}, iterations)
    _no_runtime_warning(caught)
    if mcmc.chain_method != "vectorized":
        raise AssertionError(f"the chains ran {mcmc.chain_method}, not vectorized")
    _on(device, kernel.initial_params.values())
    if any(v.dtype != torch.float32 for v in kernel.initial_params.values()):
        raise AssertionError("the chains' state is not fp32 under autocast")
    draws = {n: v[:, -1] for n, v in mcmc.get_samples(group_by_chain=True).items()}  # each chain's last draw
    want = bma_predict(model, draws, X[:64], batchnorm_data=X[:256])
    got = bma_predict(model, draws, X[:64], batchnorm_data=X[:256], autocast="bf16")
    _finite([want, got])
    if got.dtype != torch.float32:
        raise AssertionError(f"bma_predict under autocast gives {got.dtype}, not float32")
    assert_close_roundoff(got, want, length=3, dtype=torch.bfloat16)
    return seconds / iterations


def flat_loss_bf16_check(device, quick: bool) -> float:
    """``FlatLoss.under_autocast("bf16")`` of a Bayesian MLP at a draw: its loss and gradient fp32 on the device and
    within bf16 round-off of the fp32 ones (a 32-long reduction, the widest fan-in); its Hessian trace finite. The
    time is the bf16 trace's per probe."""
    torch.manual_seed(0)
    X, y = torch.randn(500, 20, device=device), torch.randint(0, 3, (500,), device=device)
    model = BayesianMLP(20, [32], 3).to(device)
    trace = pyro.poutine.trace(model).get_trace(X, y)
    draw = {n: site["value"] for n, site in trace.nodes.items() if n.startswith("layers.")}
    loss = flatness.FlatLoss.from_model(model, draw, X, y)
    here = loss.flatten(draw)
    mixed = loss.under_autocast("bf16")
    want, got = loss(here), mixed(here)
    want_grad, got_grad = torch.func.grad(loss.fn)(here), torch.func.grad(mixed.fn)(here)
    _on(device, [got, got_grad])
    if got.dtype != torch.float32 or got_grad.dtype != torch.float32:
        raise AssertionError(f"the bf16 loss gives {got.dtype} and a gradient of {got_grad.dtype}, not float32")
    assert_close_roundoff(got, want, length=32, dtype=torch.bfloat16, msg="the loss")
    assert_close_roundoff(got_grad, want_grad, length=32, dtype=torch.bfloat16, msg="the gradient")
    probes = 5 if quick else 50
    start = time.perf_counter()
    value = flatness.hessian_trace(mixed.at(here), num_probes=probes).value
    _sync()
    _finite([torch.tensor(value)])
    return (time.perf_counter() - start) / probes



def _checks() -> List[Tuple[str, Callable[[torch.device, bool], float]]]:
    """Every check, ``(name, check(device, quick) -> seconds per iteration)``, in the table's order, by theme."""
    svi = lambda loss: (lambda device, quick: svi_check(device, loss, quick))  # noqa: E731
    return [(name, partial(kernel_check, name)) for name in _kernel_names()] + [
        ("EntropySGLD, per-chain random streams", streams_check),
        # compiled iterations against eager ones
        ("EntropySGLD, jit_compile='inductor' against eager", inductor_check),
        ("EntropySGHMC, jit_compile='fx' against eager",
         partial(fx_check, name="EntropySGHMC", settings=dict(eta=0.05, momentum=0.7, step_size=1e-3), gradients=1)),
        ("SAMSGD, jit_compile='fx' against eager",
         partial(fx_check, name="SAMSGD", settings=dict(rho=0.05, step_size=1e-3), gradients=2)),
        ("LocalEntropySGLD (3 inner steps), jit_compile='fx' against eager",
         partial(fx_check, name="LocalEntropySGLD", gradients=4,
                 settings=dict(eta=0.05, step_size=1e-3, inner_step_size=1e-4, num_inner_steps=3))),
        ("EntropySGLD, fused graphs (jit_compile='fx', thinning 4) against eager", fused_check),
        ("a divergence inside a fused graph: DivergenceError names its iteration", divergence_check),
        # checkpoints
        ("EntropySGHMC (fused, per-chain streams) stopped and resumed from its checkpoint: bit for bit",
         checkpoint_check),
        # networks
        ("BayesianModule CNN, BatchNorm, 4 vectorized chains", cnn_check),
        ("BayesianModule CNN, channels_last, 4 chains' own minibatches: vmap against a loop", channels_last_check),
        ("a network with .view, memory_format='auto': NCHW with a warning", nchw_fallback_check),
        ("BayesianModule CNN, random_crop_flip, jit_compile='fx' (fused) against eager", augmentation_check),
        ("BayesianModule CNN fed by Batches(DataLoader, device=...)", loader_check),
        # bf16 autocast
        ("EntropySGLD, autocast=torch.bfloat16 against fp32", mixed_precision_check),
        ("EntropySGLD, jit_compile='inductor' under autocast=torch.bfloat16 against eager",
         partial(inductor_check, autocast=torch.bfloat16)),
        ("BayesianModule CNN, BatchNorm, bf16, 4 chains; bma_predict bf16 against fp32", bf16_cnn_check),
        ("FlatLoss.under_autocast('bf16') against fp32 (per Hessian-trace probe)", flat_loss_bf16_check),
        # flatness and SVI
        ("flatness: Hessian trace and top eigenvalue (the pair)", flatness_check),
        ("SVI: SAM_ELBO (a step)", svi(SAM_ELBO(rho=0.05))),
        ("SVI: SABMA_ELBO (a step)", svi(SABMA_ELBO(gamma=0.01))),
        # the studies
        ("images study: an Entropy-MCMC fit, cosine schedule, --jit fx", images_check),
        ("images study on generated CIFAR-10 files: --jit fx, --precision bf16, against eager", cifar_images_check),
        ("transfer study: SGD, Laplace, SA-BMA, Entropy-MCMC on adapters (per fit)", transfer_check),
        # ranks
        ("1-rank process group, chain_method='distributed'", process_group_check),
    ]


def check_names() -> List[str]:
    """The names of every check, the first column of the table's rows, in its order."""
    return [name for name, _ in _checks()]


def _device(text: str) -> torch.device:
    """``--device``: cpu, cuda or cuda:N (any torch device string); a CUDA device must be here."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError) as err:
        raise SystemExit(f"--device {text!r} is not a device ({err}): pass cpu, cuda or cuda:N") from err
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device here: run on a GPU machine, or pass --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise SystemExit(f"--device {text}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                             f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return device


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--quick", action="store_true", help="a few iterations each (the test suite's run)")
    parser.add_argument("--list", action="store_true", help="print the checks' names, one a line, and exit")
    parser.add_argument("--only", nargs="+", metavar="TEXT", default=None,
                        help="run only the checks whose name contains one of these texts (a short rerun)")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(check_names()))
        return 0
    try:
        device = _device(args.device)
    except SystemExit as err:
        print(err, file=sys.stderr)
        return 2
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        device = torch.device("cuda", index)  # results must be on this index (_on)
        torch.cuda.set_device(device)  # what the library puts on "cuda" goes to this device too
        name = f"{torch.cuda.get_device_name(device)} ({device})"
    else:
        name = f"CPU ({torch.get_num_threads()} threads)"
    checks = [(label, check) for label, check in _checks()
              if args.only is None or any(text.lower() in label.lower() for text in args.only)]
    if not checks:
        print(f"no check's name contains any of {args.only}: see --list", file=sys.stderr)
        return 2
    print(f"pyro-flat on {name}, torch {torch.__version__}, pyro {pyro.__version__}\n")
    print("| check | passed | time per iteration |")
    print("|---|---|---|")
    failed = 0
    start = time.perf_counter()
    for label, check in checks:
        try:
            seconds = check(device, args.quick)
            timed = f"{seconds * 1e3:.2f} ms" if seconds > 0 else "too short to time (--quick)"
            print(f"| {label} | yes | {timed} |", flush=True)
        except Exception as err:  # a failed check is a row of the table, not the end of the script
            failed += 1
            print(f"| {label} | NO: {type(err).__name__}: {(str(err).splitlines() or [''])[0][:150]} | |", flush=True)
            traceback.print_exc(file=sys.stderr)
    print(f"\n{len(checks) - failed} of {len(checks)} checks passed in {time.perf_counter() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
