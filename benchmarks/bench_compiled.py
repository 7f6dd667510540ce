"""The compiled fast path (``jit_compile=True``) against eager kernels, hand-written loops, the floor and JAX.

Every number is measured in this run, on one thread unless said otherwise:

1. One chain, Bayesian logistic regression N = 12,000, d = 784 + bias, minibatch 100 (the
   ``bench_kernels.py`` problem): µs per iteration of
   - the floor: a hand-fused step with the gradient written out (no autograd): gather, two
     matvecs, the Gaussians;
   - hand-written eager torch loops with autograd (SGLD, Entropy-MCMC);
   - SGLD / EntropySGLD in ``pyro.infer.MCMC``, eager and compiled (one iteration per graph call);
   - the same in ``pyro_flat.MCMC`` with ``thinning=10``: ten iterations per fused graph call;
   - when JAX is installed (``pip install -e '.[bench]'``), the same Entropy-MCMC step in JAX and
     BlackJAX's SGLD (``jit`` over ``lax.scan``, the gather inside, the permutations drawn before
     the timer, best of several calls; ``jax_reference.py``).
   Targets: fused EntropySGLD <= 1.2x the floor loop and <= 1.3x the JAX step; fused SGLD <= 1.5x
   BlackJAX's SGLD; compiled EntropySGLD <= 1.2x the hand-written loop.
2. 128 vectorized chains (``bench_vectorized.py``'s problem: the embedded MNIST 7-vs-9 training
   images), 2 threads, chain-iterations per second of EntropySGLD and SGLD, compiled and fused
   (``thinning=10``), against JAX ``vmap`` (Entropy) and BlackJAX (SGLD) running the same algorithm:
   per-chain minibatches on both sides (pyro-flat's default), and one shared minibatch on both sides.
   Target: per-chain pyro-flat >= per-chain JAX.
3. The BNN study's network (``BayesianMLP`` 784-100-5, 2,000 images, minibatch 100), one chain, SGLD,
   20 kept draws: compiled against a hand-written loop with autograd on the same network. Target:
   <= 1.1x.
4. A cyclical cosine schedule (cSGMCMC's: 4 cycles, half of each exploration), which changes the step
   at every iteration: EntropySGLD on part 1's problem, eager, compiled (one iteration per call) and
   fused (``thinning=10``), µs per iteration (exploration iterations included), against the same
   kernel at a constant step. The step is a graph input, so one graph per phase serves every step.
   Target: compiled and fused cyclical <= 1.1x their constant-step runs.

``OMP_WAIT_POLICY=PASSIVE`` is set (unless given): on a busy machine OpenMP's spinning threads
turned a 3 ms 128-chain iteration into 11-160 ms.

Run:  python benchmarks/bench_compiled.py [--iters 1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import time

os.environ.setdefault("CI", "1")  # no progress bar: it would be timed too
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when torch starts its threads

import torch  # noqa: E402

import pyro  # noqa: E402
from pyro.infer import MCMC  # noqa: E402
from pyro_flat import MCMC as VectorizedMCMC  # noqa: E402
from pyro_flat import SGLD, EntropySGLD  # noqa: E402
from pyro_flat.datasets import load_mnist79, load_mnist_ood  # noqa: E402
from pyro_flat.models import BayesianMLP  # noqa: E402
from pyro_flat.models import logistic_regression as model  # noqa: E402
from pyro_flat.schedules import cyclical_cosine  # noqa: E402
from pyro_flat.targets import EpochBatcher  # noqa: E402

from bench_kernels import B, D, ETA, N, STEP, hand_loop, make_data  # noqa: E402


def floor_loop(X, y, iters: int, entropy: bool) -> float:
    """The step with its gradient written out: what any implementation must at least do."""
    w, b = torch.zeros(D), torch.zeros(())
    wa, ba = w.clone(), b.clone()
    noise = math.sqrt(2 * STEP)
    batches = EpochBatcher(N, B, X.device)
    start = time.perf_counter()
    for _ in range(iters):
        idx = batches()
        Xb = X.index_select(0, idx)
        r = torch.sigmoid(Xb @ w + b) - y.index_select(0, idx)   # d(-log lik)/d logits
        gw = w + (N / B) * (r @ Xb)
        gb = b + (N / B) * r.sum()
        if entropy:
            gw, gb = gw + (w - wa) / ETA, gb + (b - ba) / ETA
            wa = wa - STEP * (wa - w) / ETA + noise * torch.randn(D)
            ba = ba - STEP * (ba - b) / ETA + noise * torch.randn(())
        w = w - STEP * gw + noise * torch.randn(D)
        b = b - STEP * gb + noise * torch.randn(())
    return (time.perf_counter() - start) / iters * 1e6


def kernel_run(kernel_fn, iters: int, *args, **kwargs) -> tuple:
    """(µs per iteration, compile seconds) of one chain in Pyro's driver; setup not timed."""
    kernel = kernel_fn()
    mcmc = MCMC(kernel, num_samples=iters, warmup_steps=0, disable_progbar=True)
    pyro.set_rng_seed(0)
    start = time.perf_counter()
    mcmc.run(*args, **kwargs)
    seconds = time.perf_counter() - start - kernel.compile_seconds
    return seconds / iters * 1e6, kernel.compile_seconds


def fused_run(kernel_fn, iters: int, *args, thinning: int = 10, **kwargs) -> tuple:
    """(µs per iteration, compile seconds) of one chain in ``pyro_flat.MCMC`` with ``thinning``:
    ``thinning`` iterations per fused graph call."""
    kernel = kernel_fn()
    mcmc = VectorizedMCMC(kernel, num_samples=iters, warmup_steps=0, thinning=thinning, disable_progbar=True)
    pyro.set_rng_seed(0)
    start = time.perf_counter()
    mcmc.run(*args, **kwargs)
    seconds = time.perf_counter() - start - kernel.compile_seconds
    return seconds / iters * 1e6, kernel.compile_seconds


def cyclical_run(jit, iters: int, X, y, thinning: int = 1) -> float:
    """µs per iteration (exploration iterations included) of one EntropySGLD chain under a 4-cycle cosine
    schedule with ``iters`` sampling-phase iterations, in ``pyro_flat.MCMC``; compile time excluded."""
    schedule = cyclical_cosine(num_steps=2 * iters + 10, num_cycles=4, exploration=0.5)
    kernel = EntropySGLD(model, eta=ETA, step_size=STEP, schedule=schedule, jit_compile=jit)
    mcmc = VectorizedMCMC(kernel, num_samples=iters, warmup_steps=0, thinning=thinning,  # iters // thinning kept
                          disable_progbar=True)
    pyro.set_rng_seed(0)
    start = time.perf_counter()
    mcmc.run(X, y)
    return (time.perf_counter() - start - kernel.compile_seconds) / kernel.iteration * 1e6


def vectorized_rate(kind: str, jit: bool, X, y, chains: int, iters: int, minibatches: str = "per_chain",
                    thinning: int = 1) -> float:
    """Chain-iterations per second of ``chains`` vectorized chains (compile time excluded)."""
    if kind == "Entropy":
        kernel = EntropySGLD(model, eta=0.01, step_size=5e-4, record_draws=False, jit_compile=jit)
    else:
        kernel = SGLD(model, step_size=5e-4, record_draws=False, jit_compile=jit)
    mcmc = VectorizedMCMC(kernel, iters, 0, num_chains=chains, thinning=thinning, minibatches=minibatches,
                          disable_progbar=True)
    pyro.set_rng_seed(0)
    start = time.perf_counter()
    mcmc.run(X, y, batch_size=100, prior_scale=0.5)
    return chains * iters / (time.perf_counter() - start - kernel.compile_seconds)


def mlp_kernel_run(net, jit, X, y, iters: int) -> float:
    """µs per iteration of one chain as the BNN study runs it: 20 kept draws (thinning)."""
    kernel = SGLD(net, step_size=5e-5, jit_compile=jit)
    mcmc = VectorizedMCMC(kernel, num_samples=20 * (iters // 20), warmup_steps=0, thinning=iters // 20,
                          disable_progbar=True)
    pyro.set_rng_seed(0)
    start = time.perf_counter()
    mcmc.run(X, y, batch_size=100)
    return (time.perf_counter() - start - kernel.compile_seconds) / (20 * (iters // 20)) * 1e6


def mlp_hand_loop(net: BayesianMLP, X, y, iters: int, step: float) -> float:
    """SGLD on the MLP's potential written directly: prior, N/B-scaled minibatch likelihood; keeps
    20 draws, as the kernels do."""
    sizes = [(layer.out_features, layer.in_features) for layer in net.layers]
    params = [t for o, i in sizes for t in (0.1 * torch.randn(o, i), torch.zeros(o))]
    n, noise = len(X), math.sqrt(2 * step)
    batches, kept = EpochBatcher(n, B, X.device), []
    start = time.perf_counter()
    for k in range(iters):
        idx = batches()
        leaves = [p.requires_grad_(True) for p in params]
        logits = net.logits(X.index_select(0, idx), list(zip(leaves[::2], leaves[1::2])))
        nll = torch.nn.functional.cross_entropy(logits, y.index_select(0, idx), reduction="sum")
        U = (n / B) * nll + sum(0.5 * (p / 0.1).pow(2).sum() for p in leaves)
        grads = torch.autograd.grad(U, leaves)
        with torch.no_grad():
            params = [p - step * g + noise * torch.randn_like(p) for p, g in zip(leaves, grads)]
        if (k + 1) % (iters // 20) == 0:
            kept.append([p.clone() for p in params])
    return (time.perf_counter() - start) / iters * 1e6


def jax_available() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("jax", "blackjax"))


def best(fn, repeats: int) -> float:
    return min(fn() for _ in range(repeats))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    parser.add_argument("--chains", type=int, default=128)
    args = parser.parse_args()
    iters, repeats = args.iters, args.repeats

    torch.set_num_threads(1)
    X, y = make_data()
    rows = {}
    for _ in range(repeats):  # interleaved, best of each: the load on a shared machine drifts
        for name, fn in {
            "floor SGLD": lambda: floor_loop(X, y, iters, False),
            "floor Entropy": lambda: floor_loop(X, y, iters, True),
            "hand SGLD (autograd)": lambda: hand_loop(X, y, iters, False),
            "hand Entropy (autograd)": lambda: hand_loop(X, y, iters, True),
            "SGLD eager": lambda: kernel_run(lambda: SGLD(model, step_size=STEP), iters, X, y)[0],
            "SGLD compiled": lambda: kernel_run(lambda: SGLD(model, step_size=STEP, jit_compile=True), iters, X, y),
            "EntropySGLD eager": lambda: kernel_run(lambda: EntropySGLD(model, eta=ETA, step_size=STEP), iters, X, y)[0],
            "EntropySGLD compiled": lambda: kernel_run(
                lambda: EntropySGLD(model, eta=ETA, step_size=STEP, jit_compile=True), iters, X, y),
            "SGLD fused": lambda: fused_run(lambda: SGLD(model, step_size=STEP, jit_compile=True), iters, X, y),
            "EntropySGLD fused": lambda: fused_run(
                lambda: EntropySGLD(model, eta=ETA, step_size=STEP, jit_compile=True), iters, X, y),
        }.items():
            value = fn()
            us, compile_s = value if isinstance(value, tuple) else (value, None)
            if name not in rows:
                rows[name] = (us, compile_s)  # the first compile of this process: the cold one
            rows[name] = (min(us, rows[name][0]), rows[name][1])
    print(f"1. One chain: logistic regression N={N} d={D}+1 B={B}, 1 thread, {iters} iterations, best of {repeats}")
    for name, (us, compile_s) in rows.items():
        extra = "" if compile_s is None else f"   (compile {compile_s:.2f} s, first run)"
        print(f"  {name:<26s} {us:8.0f} us/iteration{extra}")
    for kind in ("SGLD", "EntropySGLD"):
        eager, (fast, compile_s) = rows[f"{kind} eager"][0], rows[f"{kind} compiled"]
        pays = compile_s / max(1e-12, (eager - fast) * 1e-6)
        print(f"  {kind}: compiled is {eager / fast:.2f}x faster than eager; compiling ({compile_s:.2f} s) "
              f"pays after {pays:,.0f} iterations")
    ratios = [
        ("EntropySGLD compiled / hand Entropy", rows["EntropySGLD compiled"][0] / rows["hand Entropy (autograd)"][0], 1.2),
        ("SGLD compiled / hand SGLD", rows["SGLD compiled"][0] / rows["hand SGLD (autograd)"][0], 1.2),
        ("EntropySGLD compiled / floor Entropy", rows["EntropySGLD compiled"][0] / rows["floor Entropy"][0], None),
        ("SGLD compiled / floor SGLD", rows["SGLD compiled"][0] / rows["floor SGLD"][0], None),
        ("EntropySGLD fused / floor Entropy", rows["EntropySGLD fused"][0] / rows["floor Entropy"][0], 1.2),
        ("SGLD fused / floor SGLD", rows["SGLD fused"][0] / rows["floor SGLD"][0], None),
    ]
    for name, ratio, target in ratios:
        verdict = "" if target is None else ("  ok" if ratio <= target else "  MISSED") + f" (target <= {target})"
        print(f"  {name:<40s} {ratio:5.2f}{verdict}")

    X79, y79 = load_mnist79(None, split="train")
    have_jax = jax_available()
    if not have_jax:
        print("  JAX / BlackJAX: not installed (pip install -e '.[bench]'); no JAX figures in this run")
    else:
        import jax_reference as jr

        Xj, yj = (jr.jnp.asarray(t.numpy()) for t in make_data())
        jax_us = {
            "JAX Entropy step": jr.seconds_per_call(jr.entropy_chain(Xj, yj, B, STEP, ETA, 1.0), iters, B, N, None,
                                                    False, repeats) / iters * 1e6,
            "BlackJAX SGLD": jr.seconds_per_call(jr.blackjax_sgld_chain(Xj, yj, B, STEP, 1.0), iters, B, N, None,
                                                 False, repeats) / iters * 1e6,
        }
        for name, us in jax_us.items():
            print(f"  {name:<26s} {us:8.0f} us/iteration   (jit, lax.scan)")
        for name, ratio, target in [
            ("EntropySGLD fused / JAX Entropy step", rows["EntropySGLD fused"][0] / jax_us["JAX Entropy step"], 1.3),
            ("EntropySGLD compiled / JAX Entropy step", rows["EntropySGLD compiled"][0] / jax_us["JAX Entropy step"],
             None),
            ("SGLD fused / BlackJAX SGLD", rows["SGLD fused"][0] / jax_us["BlackJAX SGLD"], 1.5),
        ]:
            verdict = "" if target is None else ("  ok" if ratio <= target else "  MISSED") + f" (target <= {target})"
            print(f"  {name:<40s} {ratio:5.2f}{verdict}")

    torch.set_num_threads(2)
    chains, vector_iters = args.chains, 200
    print(f"\n2. {chains} vectorized chains: logistic regression d=785, N={len(X79)}, minibatch 100, 2 threads, "
          f"{vector_iters} iterations; chain-iterations/s, best of {repeats}")
    if have_jax:
        Xj, yj = jr.jnp.asarray(X79.numpy()), jr.jnp.asarray(y79.numpy())
        jax_chains = {"Entropy": jr.entropy_chain(Xj, yj, B, 5e-4, 0.01, 0.25),
                      "SGLD": jr.blackjax_sgld_chain(Xj, yj, B, 5e-4, 0.25)}
    for scheme in ("per_chain", "shared"):
        for kind in ("Entropy", "SGLD"):
            rate = {label: max(vectorized_rate(kind, True, X79, y79, chains, vector_iters, scheme, thinning)
                               for _ in range(repeats))
                    for label, thinning in (("compiled", 1), ("fused", 10))}
            line = (f"  {kind + 'SGLD' if kind == 'Entropy' else kind:<12s} {scheme:<9s} compiled {rate['compiled']:8.0f}, "
                    f"fused (thinning 10) {rate['fused']:8.0f}")
            if have_jax:
                seconds = jr.seconds_per_call(jax_chains[kind], vector_iters, B, len(X79), chains, scheme == "shared",
                                              repeats)
                jax_rate = chains * vector_iters / seconds
                label = "JAX vmap" if kind == "Entropy" else "BlackJAX vmap"
                ratio = max(rate.values()) / jax_rate
                target = "" if scheme != "per_chain" or kind != "Entropy" else \
                    ("  ok" if ratio >= 1 else "  MISSED") + " (target >= 1)"
                line += f"; {label} {jax_rate:8.0f}; pyro-flat / JAX {ratio:5.2f}{target}"
            print(line)

    torch.set_num_threads(1)
    data = load_mnist_ood(None)
    net = BayesianMLP(data.X_train.shape[1], [100], len(data.in_digits))
    mlp_iters = max(100, iters // 2)
    mlp = {
        "hand SGLD (autograd)": best(lambda: mlp_hand_loop(net, data.X_train, data.y_train, mlp_iters, 5e-5), repeats),
        "SGLD eager": best(lambda: mlp_kernel_run(net, False, data.X_train, data.y_train, mlp_iters), repeats),
        "SGLD compiled": best(lambda: mlp_kernel_run(net, True, data.X_train, data.y_train, mlp_iters), repeats),
    }
    print(f"\n3. One chain: BayesianMLP 784-100-5 (79,005 weights), N={len(data.X_train)}, minibatch 100, 1 thread, "
          f"{mlp_iters} iterations, 20 kept draws (as the BNN study)")
    for name, us in mlp.items():
        print(f"  {name:<26s} {us:8.0f} us/iteration")
    ratio = mlp["SGLD compiled"] / mlp["hand SGLD (autograd)"]
    print(f"  SGLD compiled / hand SGLD {ratio:5.2f}  {'ok' if ratio <= 1.1 else 'MISSED'} (target <= 1.1)")

    cyclical = {}
    for _ in range(repeats):  # interleaved, best of each
        for name, fn in {
            "eager": lambda: cyclical_run(False, iters, X, y),
            "compiled": lambda: cyclical_run(True, iters, X, y),
            "fused": lambda: cyclical_run(True, iters, X, y, thinning=10),
            "constant compiled": lambda: fused_run(
                lambda: EntropySGLD(model, eta=ETA, step_size=STEP, jit_compile=True), iters, X, y, thinning=1)[0],
            "constant fused": lambda: fused_run(
                lambda: EntropySGLD(model, eta=ETA, step_size=STEP, jit_compile=True), iters, X, y)[0],
        }.items():
            cyclical[name] = min(fn(), cyclical.get(name, math.inf))
    print(f"\n4. One chain of EntropySGLD under a 4-cycle cosine schedule (exploration 0.5), part 1's problem, "
          f"{iters} sampling iterations, 1 thread, best of {repeats}")
    for name in ("eager", "compiled", "fused"):
        print(f"  cyclical {name:<18s} {cyclical[name]:8.0f} us/iteration")
    for name in ("compiled", "fused"):
        print(f"  constant step {name:<13s} {cyclical['constant ' + name]:8.0f} us/iteration")
    print(f"  cyclical: compiled is {cyclical['eager'] / cyclical['compiled']:.2f}x faster than eager, fused "
          f"{cyclical['eager'] / cyclical['fused']:.2f}x")
    for name in ("compiled", "fused"):
        ratio = cyclical[name] / cyclical["constant " + name]
        print(f"  cyclical {name} / constant step {name} {ratio:5.2f}  {'ok' if ratio <= 1.1 else 'MISSED'} "
              "(target <= 1.1)")


if __name__ == "__main__":
    main()
