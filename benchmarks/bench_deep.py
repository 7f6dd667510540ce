"""A CNN as a flat posterior: EntropySGLD on a ``BayesianModule`` against hand-written steps on the same
network, and 4 vectorized chains against one, in one run (one thread).

The network: two 3x3 convolutions (16 and 32 channels) with BatchNorm, ReLU and 2x2 max-pooling, then a
1568-32-10 head (about 55k weights); 28x28 inputs, minibatch 128, 2,000 training images. Each time is
the seconds per iteration between two run lengths (the set-up cancels); each run keeps one draw
(``thinning``), as a long run keeps few (storing every draw of a large network times the copies,
not the iterations). Baselines:

- a plain ``torch.optim.SGD`` training step (forward, backward, update);
- a hand-written Entropy-MCMC step on the same network: that step plus the coupling
  :math:`(\\theta - \\theta_a)/\\eta`, θa's update and the Gaussian noise of both.

Targets: one chain of EntropySGLD <= 1.15x the hand-written step and <= 1.3x the SGD step; 4 vectorized
chains give >= 0.95x the chain-iterations per second of one chain alone (vectorizing costs nothing). The 4 chains run both
ways a ``BayesianModule`` offers (``networks="loop"``, the default on a CPU, and ``"vmap"``).

``--network resnet18`` times the CIFAR ResNet-18 of the Entropy-MCMC experiments instead
(:func:`pyro_flat.nn.resnet.resnet18`, 11.2 million weights, 3x32x32 inputs, Entropy-MCMC's eta = 4e-4),
where the paper's claim is "minimal overhead": one Entropy-MCMC iteration <= 1.15x one SGD training
iteration. ``--device cuda`` runs on a GPU (synchronised before each clock reading) and prints images
per second. On the CPU, ResNet-18 takes about 2.5 s an iteration: use ``--iterations 6 --chains 1``.

``--precision bf16`` runs every step in mixed precision, PyTorch's way: the forward and backward under
``torch.autocast(dtype=torch.bfloat16)``, the weights and the update fp32 (``torch.optim.SGD`` and the hand-written
step inside autocast, EntropySGLD with ``autocast=torch.bfloat16``), so that the sampler is compared with the SGD
step of the same precision.

``--channels-last`` runs every network, baselines included, on images in NHWC memory (a ``BayesianModule`` with
``memory_format="channels_last"``, the layout cuDNN's tensor-core convolutions take; on a GPU that is the
``BayesianModule``'s default, ``auto``). ``--momentum`` adds EntropySGHMC (the momentum sampler, ``momentum=0.9``).
``--fastest`` adds the fastest ResNet training step plain PyTorch offers here: ``torch.compile(mode="max-autotune")``
of the network (on a CPU without autotuning) under the same precision and layout (inductor's fused kernels and, on a
GPU, its CUDA graphs), compiled once before the timed runs.

``--chains`` times C vectorized chains of the sampler for each C > 1, with the networks run as one ``vmap``-ed pass,
one after another (``loop``) and as ``networks="measure"`` chooses by timing both (``auto`` on a GPU), against C
separate runs of one chain (chain-iterations per second).

``--jit inductor|fx`` adds EntropySGLD with ``jit_compile`` (the whole iteration as one traced graph; with
inductor, its elementwise work fused), timed inside one run so that the graph is built once: the median
seconds per iteration over draws of ``--iterations`` iterations each, after the draws that built it,
beside the eager kernel timed the same way; on a GPU (where the compiled iteration replays as a CUDA
graph) also against the SGD step captured as a CUDA graph, the like-for-like baseline.

Run:  python benchmarks/bench_deep.py [--iterations 30] [--network cnn|resnet18] [--device cpu|cuda]
                                      [--threads 1] [--chains 1 4] [--jit inductor|fx] [--precision fp32|bf16]
                                      [--channels-last] [--momentum] [--fastest]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time

import torch
from torch import nn

import pyro
from pyro_flat import MCMC, EntropySGHMC, EntropySGLD
from pyro_flat.nn import BayesianModule
from pyro_flat.nn.resnet import resnet18

N, BATCH, STEP = 2000, 128, 1e-6
ETA = {"cnn": 0.1, "resnet18": 4e-4}


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 7 * 7, 32), nn.ReLU(), nn.Linear(32, 10))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def per_iteration(run, short: int, long: int) -> float:
    """Seconds per iteration: (time of ``long`` - time of ``short``) / (long - short), after one untimed run."""
    run(short)
    times = []
    for iterations in (short, long):
        _sync()
        start = time.perf_counter()
        run(iterations)
        _sync()
        times.append(time.perf_counter() - start)
    return (times[1] - times[0]) / (long - short)


def in_one_run(make, X, y, eta: float, jit, thinning: int, draws: int = 6, *, autocast=None,
               memory_format: str = "contiguous") -> float:
    """Seconds per iteration of one chain of EntropySGLD within one run: the median over draws 3.. of the
    time between draws ``thinning`` iterations apart (a compiled graph is built in the first ones; no
    fused multi-iteration graph, so it is built once). The kernel keeps no draws (``record_draws=False``):
    copying a draw to host memory is timed on its own (:func:`draw_copy`), as a long run keeps one every
    few hundred iterations."""
    stamps = []

    def clock(kernel, samples, stage, i) -> None:
        _sync()
        stamps.append(time.perf_counter())

    pyro.set_rng_seed(0)
    model = BayesianModule(make().to(X.device), prior=1.0, memory_format=memory_format)
    kernel = EntropySGLD(model, eta=eta, step_size=STEP, jit_compile=jit, record_draws=False, autocast=autocast)
    kernel.fused_steps = 1
    MCMC(kernel, num_samples=draws * thinning, warmup_steps=2, thinning=thinning, hook_fn=clock,
         disable_progbar=True).run(X, y, batch_size=BATCH)
    if jit and not kernel.is_compiled:
        raise RuntimeError(f"jit_compile={jit!r} fell back to the eager iteration: see the warning above")
    gaps = sorted(b - a for a, b in zip(stamps[3:], stamps[4:]))
    return gaps[len(gaps) // 2] / thinning


def draw_copy(make, device: torch.device, repeats: int = 5) -> float:
    """Seconds to copy one draw of the network's θ and θa to host memory, as a kept draw is (median)."""
    tensors = [p.detach() for p in make().to(device).parameters()] * 2
    times = []
    for _ in range(repeats):
        _sync()
        start = time.perf_counter()
        [t.cpu() for t in tensors]
        _sync()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=30, help="iterations of the longer run of each")
    parser.add_argument("--network", choices=("cnn", "resnet18"), default="cnn")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (default 1)")
    parser.add_argument("--chains", type=int, nargs="+", default=[1, 4],
                        help="chain counts to time (default 1 4; 1 alone skips the vectorized chains)")
    parser.add_argument("--jit", choices=("inductor", "fx"), default=None,
                        help="also time EntropySGLD(jit_compile=...) against the eager kernel, within one run each")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="bf16: every step's forward and backward under torch.autocast, weights and update fp32")
    parser.add_argument("--channels-last", action="store_true", help="every network on NHWC images")
    parser.add_argument("--momentum", action="store_true", help="also time EntropySGHMC (momentum=0.9)")
    parser.add_argument("--fastest", action="store_true",
                        help="also time the SGD step of torch.compile(mode='max-autotune') (compiles for minutes)")
    args = parser.parse_args()
    long = args.iterations
    short = max(long // 3, 2)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    make = cnn if args.network == "cnn" else resnet18
    eta = ETA[args.network]
    shape = (1, 28, 28) if args.network == "cnn" else (3, 32, 32)
    layout = "channels_last" if args.channels_last else "contiguous"
    memory = torch.channels_last if args.channels_last else torch.contiguous_format
    X, y = torch.randn(N, *shape, device=device), torch.randint(0, 10, (N,), device=device)
    weights = sum(p.numel() for p in make().parameters())
    autocast = torch.bfloat16 if args.precision == "bf16" else None

    def network() -> nn.Module:
        return make().to(device, memory_format=memory).train()

    def images(idx: torch.Tensor) -> torch.Tensor:
        return X[idx].contiguous(memory_format=memory)

    def precision():
        return contextlib.nullcontext() if autocast is None else torch.autocast(device.type, dtype=autocast)

    built = {}  # the compiled network, built once (its compile time is in the untimed first run)

    def sgd(iterations: int, compiled: bool = False) -> None:
        if compiled and not built:
            net = network()
            mode = "max-autotune" if device.type == "cuda" else None  # on a CPU autotuning adds nothing but time
            built.update(net=net, forward=torch.compile(net, mode=mode))
        net = built["net"] if compiled else network()
        forward = built["forward"] if compiled else net
        optimiser = torch.optim.SGD(net.parameters(), lr=1e-3, weight_decay=1e-4)
        for _ in range(iterations):
            idx = torch.randint(0, N, (BATCH,), device=device)
            optimiser.zero_grad()
            with precision():
                loss = nn.functional.cross_entropy(forward(images(idx)), y[idx])
            loss.backward()
            optimiser.step()

    def sgd_graphed(iterations: int) -> None:
        """The SGD step captured as one CUDA graph (PyTorch's whole-network capture): its launch-free time."""
        net = network()
        optimiser = torch.optim.SGD(net.parameters(), lr=1e-3, weight_decay=1e-4)

        def step() -> None:
            idx = torch.randint(0, N, (BATCH,), device=device)
            with precision():
                loss = nn.functional.cross_entropy(net(images(idx)), y[idx])
            loss.backward()
            optimiser.step()

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                optimiser.zero_grad(set_to_none=True)
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        optimiser.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            step()
        for _ in range(iterations):
            graph.replay()

    def by_hand(iterations: int) -> None:
        net = network()
        params = list(net.parameters())
        aux = [p.detach().clone() for p in params]
        noise = math.sqrt(2 * STEP)
        for _ in range(iterations):
            idx = torch.randint(0, N, (BATCH,), device=device)
            with precision():
                loss = N * nn.functional.cross_entropy(net(images(idx)), y[idx]) + 0.5 * sum(p.square().sum() for p in params)
                grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, a, g in zip(params, aux, grads):
                    pull = (p - a) / eta
                    p.add_(-STEP * (g + pull) + noise * torch.randn_like(p))
                    a.add_(STEP * pull + noise * torch.randn_like(a))

    chosen = {}  # networks="measure": the way measured for each chain count

    def sampler(chains: int, networks: str = "auto", momentum: bool = False):
        def run(iterations: int) -> None:
            pyro.set_rng_seed(0)
            model = BayesianModule(make().to(device), prior=1.0, networks=networks, memory_format=layout)
            kernel = (EntropySGHMC(model, eta=eta, step_size=STEP, momentum=0.9, autocast=autocast) if momentum
                      else EntropySGLD(model, eta=eta, step_size=STEP, autocast=autocast))
            mcmc = MCMC(kernel, num_samples=iterations, warmup_steps=0, num_chains=chains, thinning=iterations,
                        disable_progbar=True)
            mcmc.run(X, y, batch_size=BATCH)
            assert chains == 1 or mcmc.chain_method == "vectorized"
            for kind, choice in model.network_choices["sampling"].items():
                if kind.networks == chains and kind.backward:  # a step's pass (not the chains' check, no gradient)
                    chosen[chains] = choice
        return run

    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{args.threads} CPU thread(s)"
    print(f"{args.network} of {weights:,} weights, minibatch {BATCH}, {where}, {args.precision}, {layout}; seconds per "
          f"iteration ({short} and {long} iterations):")
    t_sgd = per_iteration(sgd, short, long)
    t_hand = per_iteration(by_hand, short, long)
    t_one = per_iteration(sampler(1), short, long)
    print(f"  torch.optim.SGD step              {t_sgd * 1e3:8.1f} ms   {BATCH / t_sgd:8.0f} images/s")
    print(f"  hand-written Entropy-MCMC step    {t_hand * 1e3:8.1f} ms   {BATCH / t_hand:8.0f} images/s")
    print(f"  EntropySGLD, 1 chain              {t_one * 1e3:8.1f} ms   {BATCH / t_one:8.0f} images/s   "
          f"{t_one / t_hand:.2f}x the hand-written step (target <= 1.15x), {t_one / t_sgd:.2f}x the SGD step "
          "(target <= 1.3x; the paper's minimal overhead: <= 1.15x)")
    if args.momentum:
        t_momentum = per_iteration(sampler(1, momentum=True), short, long)
        print(f"  EntropySGHMC, 1 chain             {t_momentum * 1e3:8.1f} ms   {BATCH / t_momentum:8.0f} images/s   "
              f"{t_momentum / t_sgd:.2f}x the SGD step")
    if args.fastest:
        t_fastest = per_iteration(lambda n: sgd(n, compiled=True), short, long)
        label = "torch.compile max-autotune" if device.type == "cuda" else "torch.compile (inductor)  "
        print(f"  SGD step, {label} {t_fastest * 1e3:5.1f} ms   {BATCH / t_fastest:8.0f} images/s   "
              f"(the eager SGD step is {t_sgd / t_fastest:.2f}x it; target <= 1.5x)")
    if args.jit and device.type == "cuda":
        t_graphed = per_iteration(sgd_graphed, short, long)
        print(f"  torch.optim.SGD step, CUDA graph  {t_graphed * 1e3:8.1f} ms   {BATCH / t_graphed:8.0f} images/s")
    if args.jit:
        settings = dict(autocast=autocast, memory_format=layout)
        eager = in_one_run(make, X, y, eta, False, long, **settings)
        compiled = in_one_run(make, X, y, eta, args.jit, long, **settings)
        print(f"  within one run (median of draws {long} iterations apart, after the first two):")
        print(f"  EntropySGLD, eager                {eager * 1e3:8.1f} ms   {BATCH / eager:8.0f} images/s   "
              f"{eager / t_sgd:.2f}x the SGD step")
        against = f", {compiled / t_graphed:.2f}x the SGD step's CUDA graph" if device.type == "cuda" else ""
        print(f"  EntropySGLD, jit_compile={args.jit:9s}{compiled * 1e3:8.1f} ms   {BATCH / compiled:8.0f} images/s   "
              f"{compiled / t_sgd:.2f}x the SGD step{against} (the paper's minimal overhead: <= 1.15x)")
        if device.type == "cuda":  # on the CPU a kept draw stays where it is
            copy = draw_copy(make, device)
            print(f"  (no draws kept in these two runs; keeping one, θ and θa copied to host memory, costs "
                  f"{copy * 1e3:.1f} ms once: {copy / 391 * 1e3:.3f} ms an iteration at the paper's one draw in 391)")
    for chains in (c for c in args.chains if c > 1):
        for label in ("loop", "vmap", "measure"):
            t = per_iteration(sampler(chains, label), short, long)
            way = f" (chose {chosen[chains].way})" if label == "measure" and chains in chosen else ""
            print(f"  EntropySGLD, {chains} vectorized chains, networks={label:7s} {t * 1e3:8.1f} ms   chain-iterations "
                  f"per second {chains / t:.1f} against {chains} separate runs' {1 / t_one:.1f}: "
                  f"{(chains / t) / (1 / t_one):.2f}x{way} (targets: >= 0.95x; 4 chains on a GPU >= 3x)")


if __name__ == "__main__":
    main()
