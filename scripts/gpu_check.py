"""Everything pyro-flat runs, on one device, as one table: ``python scripts/gpu_check.py`` (under 5 minutes on a GPU).

Every kernel (4 vectorized chains of Bayesian logistic regression, minibatch 100), EntropyHMC on the
full data, the flatness measures (Hessian trace and top eigenvalue of a Bayesian MLP), the SVI
objectives (SAM_ELBO, SABMA_ELBO), a ``BayesianModule`` CNN with BatchNorm (4 vectorized chains, then
``bma_predict`` with each draw's BatchNorm statistics), the image study's Entropy-MCMC fit compiled
(``--jit fx``) against eager, per-chain random streams (a split of the chains
draws their rows of the whole draw), and a 1-rank process group (nccl on a GPU, gloo on a CPU) running
``chain_method="distributed"``. A check passes when it runs, its results are
finite, and the chains' state stays on the device (the draws of vectorized chains go to host memory as
they are made, by design: device memory does not grow with the draws). The table gives the time per iteration (per
step, per measure) after the first. ``--device cpu`` runs the same checks on the CPU (the test suite
does, with ``--quick``). Exit status 1 if any check failed.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import traceback
from typing import Callable, List, Tuple

import torch
from torch import nn

import pyro
from pyro.infer import SVI
from pyro.infer.autoguide import AutoNormal
from pyro_flat import MCMC, SABMA_ELBO, SAM_ELBO, EntropyHMC, bma_predict, flatness
from pyro_flat.kernels import KERNELS, kernel_class, kernel_settings, make_kernel
from pyro_flat.models import BayesianMLP, logistic_regression
from pyro_flat.nn import BayesianModule

SETTINGS = dict(step_size=1e-3, eta=0.05, rho=0.05, sigma=0.01)


def _on(device: torch.device, values) -> None:
    for value in values:
        if value.device.type != device.type:
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


def kernel_checks(device, quick: bool) -> List[Tuple[str, Callable[[], float]]]:
    X, y = _logistic(device)
    iterations = 30 if quick else 300
    checks = []
    for name in sorted(set(kernel_class(k).__name__ for k in KERNELS)):
        if name == "EntropyHMC":
            maker = lambda: EntropyHMC(logistic_regression, eta=0.05, num_steps=5)  # noqa: E731
            checks.append((name, lambda m=maker: _timed_mcmc(m, (X, y), {"batch_size": None}, iterations // 3)))
            continue
        own = {k: v for k, v in SETTINGS.items() if k in kernel_settings(name)}
        maker = lambda name=name, own=own: make_kernel(name, logistic_regression, **own)  # noqa: E731
        checks.append((name, lambda m=maker: _timed_mcmc(m, (X, y), {"batch_size": 100}, iterations)))
    return checks


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
    from pyro_flat.experiments import images
    from pyro_flat.experiments.images_config import ImagesConfig

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
    from pyro_flat.experiments import images
    from pyro_flat.experiments.images_config import ImagesConfig

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

    from pyro_flat.experiments.transfer import run_transfer_study
    from pyro_flat.experiments.transfer_config import TransferConfig

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
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--quick", action="store_true", help="a few iterations each (the test suite's run)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: run on a GPU machine, or pass --device cpu", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    checks = kernel_checks(device, args.quick) + [
        ("EntropySGLD, per-chain random streams", lambda: streams_check(device, args.quick)),
        ("flatness: Hessian trace and top eigenvalue (the pair)", lambda: flatness_check(device, args.quick)),
        ("SVI: SAM_ELBO (a step)", lambda: svi_check(device, SAM_ELBO(rho=0.05), args.quick)),
        ("SVI: SABMA_ELBO (a step)", lambda: svi_check(device, SABMA_ELBO(gamma=0.01), args.quick)),
        ("BayesianModule CNN, BatchNorm, 4 vectorized chains", lambda: cnn_check(device, args.quick)),
        ("images study: an Entropy-MCMC fit, cosine schedule, --jit fx", lambda: images_check(device, args.quick)),
        ("EntropySGLD, autocast=torch.bfloat16 against fp32", lambda: mixed_precision_check(device, args.quick)),
        ("images study on generated CIFAR-10 files: --jit fx, --precision bf16, against eager",
         lambda: cifar_images_check(device, args.quick)),
        ("transfer study: SGD, Laplace, SA-BMA, Entropy-MCMC on adapters (per fit)",
         lambda: transfer_check(device, args.quick)),
        ("1-rank process group, chain_method='distributed'", lambda: process_group_check(device, args.quick)),
    ]
    print(f"pyro-flat on {name}, torch {torch.__version__}, pyro {pyro.__version__}\n")
    print("| check | passed | time per iteration |")
    print("|---|---|---|")
    failed = 0
    start = time.perf_counter()
    for label, check in checks:
        try:
            seconds = check()
            print(f"| {label} | yes | {seconds * 1e3:.2f} ms |", flush=True)
        except Exception as err:  # a failed check is a row of the table, not the end of the script
            failed += 1
            print(f"| {label} | NO: {type(err).__name__}: {str(err).splitlines()[0][:150]} | |", flush=True)
            traceback.print_exc(file=sys.stderr)
    print(f"\n{len(checks) - failed} of {len(checks)} checks passed in {time.perf_counter() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
