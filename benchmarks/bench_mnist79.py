"""Wall time of the default ``pyro-flat mnist79`` study against a hand-written loop in the same run.

The study runs EntropySGLD and the SGLD baseline (4 chains x 6,000 iterations each) and then
evaluates, summarises and plots. The baseline is the hand-written EntropySGLD torch loop of
``bench_kernels.py`` timed here for the same total number of iterations: the cost of the sampling
alone with no Pyro, no evaluation and no files. Target: the study under 300 s on 2 CPU cores.

Run:  python benchmarks/bench_mnist79.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("CI", "1")
sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402

from bench_kernels import hand_loop, make_data  # noqa: E402
from pyro_flat.experiments.mnist79 import MNIST79Config, run_mnist79  # noqa: E402

BUDGET_S = 300.0


def main():
    config = MNIST79Config(out=tempfile.mkdtemp(prefix="bench-mnist79-"), progress=False)
    iterations = 2 * config.chains * (config.warmup + config.num_samples)  # sampler + baseline
    start = time.perf_counter()
    report = run_mnist79(config, log=lambda line: None)
    study_s = time.perf_counter() - start
    sampling_s = sum(report["seconds"].values())

    torch.set_num_threads(1)
    X, y = make_data()
    hand_us = min(hand_loop(X, y, 2000, entropy=True) for _ in range(3))
    hand_s = hand_us * 1e-6 * iterations

    print(f"default pyro-flat mnist79: {iterations} iterations in all ({config.chains} chains x "
          f"{config.warmup + config.num_samples}, EntropySGLD + SGLD)")
    print(f"  study, wall                        {study_s:7.1f} s")
    print(f"  of which sampling (Pyro MCMC)      {sampling_s:7.1f} s   " + ", ".join(
        f"{k} {v:.1f} s" for k, v in report["seconds"].items()))
    print(f"  hand-written EntropySGLD loop      {hand_s:7.1f} s   ({hand_us:.0f} us/iteration)")
    print()
    print(f"  sampling / hand loop               {sampling_s / hand_s:7.2f}")
    print(f"  study / hand loop                  {study_s / hand_s:7.2f}")
    verdict = "ok" if study_s <= BUDGET_S else "MISSED"
    print(f"  study / {BUDGET_S:.0f} s budget                {study_s / BUDGET_S:7.2f}  {verdict}")


if __name__ == "__main__":
    main()
