"""Time of a 16-image minimum-energy path on the BNN study's MLP against a straight-line profile.

The MLP 784-100-5 (79,005 weights) on the path study's 1,000 MNIST images of digits 0-4, between two
minima of the loss per image (training NLL plus weight decay; two SGLD draws, each descended by
Adam): the nudged elastic band (16 images, climbing image, FIRE, 2 AutoNEB insertion rounds) and the
straight line of the same resolution, each with its curvature profile (Lanczos top eigenvalue and a
10-probe trace per image). The study's dynamics are cut to one step (they are not timed here).
Target: the path in at most 5 minutes on 2 cores.

Run:  python benchmarks/bench_paths.py
"""

from __future__ import annotations

import os

os.environ.setdefault("CI", "1")

from dataclasses import replace

import torch

from pyro_flat.experiments.paths.study import PathConfig, run_path_study

TARGET_SECONDS = 300.0


def main() -> None:
    torch.set_num_threads(2)
    config = replace(PathConfig(progress=False), samplers=("sgld",), dynamics_steps=1)
    report = run_path_study(config, write=False, log=lambda line: None)
    s = report["seconds"]
    line = s["straight_line"] + s["curvature, straight line"]
    path = s["path"] + s["curvature, minimum-energy path"]
    print(f"16 images ({report['path']['images']} after AutoNEB), MLP 784-100-5 ({report['n_train']} images), 2 threads; "
          f"path {'converged' if report['path']['converged'] else 'NOT converged'} in {report['path']['iterations']} "
          "FIRE steps")
    print(f"  straight line: losses {s['straight_line']:.2f} s + curvature {s['curvature, straight line']:.1f} s = {line:.1f} s")
    print(f"  minimum-energy path: NEB {s['path']:.1f} s + curvature {s['curvature, minimum-energy path']:.1f} s = "
          f"{path:.1f} s ({path / line:.1f}x the straight line)")
    verdict = "met" if s["path"] <= TARGET_SECONDS else "MISSED"
    print(f"  target: the path in <= {TARGET_SECONDS:.0f} s: {verdict} ({s['path']:.1f} s)")


if __name__ == "__main__":
    main()
