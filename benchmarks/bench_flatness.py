"""Flatness measures of a 100k-parameter MLP on 1,000 MNIST images, against plain baselines.

The MLP 784-128-10 (101,770 parameters) is first trained for a few Adam epochs (so that the
spectrum has its usual outliers), then timed on the mean cross-entropy of 1,000 embedded MNIST
training images:

- **target**: top-5 Hessian eigenvalues by Lanczos (``top_eigenvalues(k=5)``) plus a 100-probe
  Hutchinson trace with vectorized Hessian-vector products (``hessian_trace``), under 60 s;
- **baseline, same run**: top-5 by power iteration with deflation (PyHessian's method, same
  relative tolerance), and the 100 probes one Hessian-vector product at a time.

It prints the times, their ratios, the eigenvalues from both methods and the trace ± stderr.

Run:  python benchmarks/bench_flatness.py [--tol 1e-3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from pyro_flat.datasets import load_mnist_digits
from pyro_flat.flatness import FlatLoss, hessian_trace, power_iteration, top_eigenvalues


def trained_mlp(X, y, epochs: int = 30, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.Tanh(), torch.nn.Linear(128, 10))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(epochs):
        for idx in torch.randperm(len(X)).split(100):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(X[idx]), y[idx]).backward()
            opt.step()
    return net


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tol", type=float, default=1e-3, help="relative tolerance of both eigen-solvers")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--images", type=int, default=1000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    images, labels = load_mnist_digits(None, split="train")
    X = torch.as_tensor(images[: args.images].reshape(-1, 784) / 255.0, dtype=torch.float32)
    y = torch.as_tensor(labels[: args.images])
    net = trained_mlp(X, y)
    loss = FlatLoss.from_module(net, lambda m: torch.nn.functional.cross_entropy(m(X), y))
    print(f"MLP with {loss.dim:,} parameters, {len(X)} images, {args.threads} threads")
    hessian_trace(loss, num_probes=2)  # first-call overheads (torch.func tracing) out of the timings

    eig, t_lanczos = timed(lambda: top_eigenvalues(loss, k=5, tol=args.tol))
    trace, t_trace = timed(lambda: hessian_trace(loss, num_probes=100, seed=1))
    eig_power, t_power = timed(lambda: power_iteration(loss, k=5, tol=args.tol))
    trace_loop, t_trace_loop = timed(lambda: hessian_trace(loss, num_probes=100, seed=1, chunk_size=1))

    total, baseline = t_lanczos + t_trace, t_power + t_trace_loop
    result = {
        "params": loss.dim, "images": len(X),
        "lanczos_s": t_lanczos, "trace_s": t_trace, "total_s": total,
        "power_iteration_s": t_power, "trace_loop_s": t_trace_loop, "baseline_total_s": baseline,
        "top5_lanczos": eig, "top5_power": eig_power,
        "trace": trace.value, "trace_stderr": trace.stderr, "trace_loop": trace_loop.value,
    }
    print(f"top-5 eigenvalues, Lanczos:          {[round(v, 4) for v in eig]}  {t_lanczos:6.1f} s")
    print(f"top-5 eigenvalues, power iteration:  {[round(v, 4) for v in eig_power]}  {t_power:6.1f} s"
          f"  ({t_power / t_lanczos:.1f}x Lanczos)")
    print(f"trace, 100 probes vectorized:        {trace.value:.2f} ± {trace.stderr:.2f}  {t_trace:6.1f} s")
    print(f"trace, 100 probes one at a time:     {trace_loop.value:.2f}  {t_trace_loop:6.1f} s"
          f"  ({t_trace_loop / t_trace:.1f}x vectorized)")
    print(f"target (top-5 + 100-probe trace):    {total:.1f} s, {total / 60:.2f} of the 60 s budget; "
          f"baseline {baseline:.1f} s ({baseline / total:.1f}x)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
