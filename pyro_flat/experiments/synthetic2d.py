"""The study behind ``pyro-flat synthetic2d``: θ and θa trajectories on a 2-D sharp/flat energy.

:func:`run_synthetic2d` returns the trajectories; :func:`run_synthetic2d_study` (the command)
also writes their figure.

>>> paths = run_synthetic2d(num_steps=50)
>>> sorted(paths), paths["EntropySGLD θa"].shape
(['EntropySGLD θ', 'EntropySGLD θa', 'SGLD θ'], (50, 2))
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict

import numpy as np
import torch

import pyro

from ..datasets import sharp_flat_2d
from ..kernels import SGLD, EntropySGLD
from .output import require_int, require_positive, staged_output


def run_synthetic2d(*, eta: float = 1.0, step_size: float = 2e-3, num_steps: int = 3000,
                    temperature: float = 1.0, start=(-1.5, -0.8), seed: int = 0) -> Dict[str, np.ndarray]:
    """Trajectories of SGLD's θ and EntropySGLD's θ and θa on :func:`sharp_flat_2d`, one common start.

    Returns ``{"SGLD θ": (num_steps, 2), "EntropySGLD θ": ..., "EntropySGLD θa": ...}``.
    """
    from pyro.infer import MCMC

    mixture = sharp_flat_2d()
    paths = {}
    init = {"theta": torch.tensor(start), "theta_aux": torch.tensor(start)}
    for label, kernel in (("SGLD", SGLD(mixture.model, step_size=step_size, temperature=temperature)),
                          ("EntropySGLD", EntropySGLD(mixture.model, eta=eta, step_size=step_size,
                                                      temperature=temperature))):
        pyro.set_rng_seed(seed)
        params = {k: v for k, v in init.items() if label == "EntropySGLD" or k == "theta"}
        mcmc = MCMC(kernel, num_samples=num_steps, warmup_steps=0, initial_params=params, disable_progbar=True)
        mcmc.run()
        s = mcmc.get_samples()
        paths[f"{label} θ"] = s["theta"].numpy()
        if "theta_aux" in s:
            paths[f"{label} θa"] = s["theta_aux"].numpy()
    return paths


def run_synthetic2d_study(*, eta: float = 1.0, step_size: float = 2e-3, num_steps: int = 3000,
                          seed: int = 0, out: str = "pyro-flat-out/synthetic2d", overwrite: bool = False,
                          log: Callable[[str], None] = print) -> Dict[str, float]:
    """Run :func:`run_synthetic2d`, print each trajectory's share of steps in the flat mode and write
    ``synthetic2d.png`` to ``out``; returns the shares."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plots import plot_trajectories_2d

    require_positive("--eta", eta)
    require_positive("--step-size", step_size)
    require_int("--num-steps", num_steps, 1)
    mixture = sharp_flat_2d()
    paths = run_synthetic2d(eta=eta, step_size=step_size, num_steps=num_steps, seed=seed)
    shares = {}
    for label, path in paths.items():
        shares[label] = float(mixture.in_flat_mode(torch.as_tensor(path)).double().mean())
        log(f"{label}: {100 * shares[label]:.0f}% of the steps in the flat mode")
    with staged_output(out, "synthetic2d", overwrite) as staging:
        fig = plot_trajectories_2d(mixture, paths, eta=eta,
                                   title=f"sharp vs flat mode: SGLD and Entropy-MCMC (η = {eta:g})")
        fig.savefig(staging / "synthetic2d.png", dpi=110)
        plt.close(fig)
    log(f"wrote {Path(out).expanduser() / 'synthetic2d.png'}")
    return shares
