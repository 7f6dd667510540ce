"""Run an ensemble of chains and keep only its checkpoints: many vectorized chains of a
stochastic-gradient kernel from one start, their states stored at chosen iterations and nowhere
else. The ensemble at iteration ``k`` is a sample of the chain's law after ``k`` steps, which
:func:`pyro_flat.convergence.check_convergence` and the studies measure.

>>> import torch
>>> from pyro_flat import SGLD
>>> kernel = SGLD(potential_fn=lambda p: 0.5 * (p["theta"] ** 2).sum(-1), step_size=0.1)
>>> states = run_ensemble(kernel, torch.zeros(2), 500, [0, 50], progress_bar=False)
>>> sorted(states), tuple(states[50]["theta"].shape)
([0, 50], (500, 2))
"""

from __future__ import annotations

from typing import Dict

import torch
from tqdm.auto import tqdm

from ..kernels.stochastic_gradient import StochasticGradientKernel
from ..infer.sampling_loop import run_chains
from ..theory.problems import SITE


def run_ensemble(kernel: StochasticGradientKernel, initial_point: torch.Tensor, num_chains: int,
                 checkpoints, *, progress_bar: bool = True) -> Dict[int, Dict[str, torch.Tensor]]:
    """Run ``num_chains`` vectorized chains of ``kernel`` (built with ``potential_fn=``) from
    ``initial_point`` (twins too) and return ``{k: params}`` at each checkpoint iteration ``k``
    (0 is the start). Nothing else is stored: the run's memory does not grow with its length.

    ``initial_point`` is one point ``(dim,)`` for every chain, or one per chain ``(num_chains, dim)``.
    """
    marks = {int(k) for k in checkpoints}
    last = max(marks)
    if initial_point.dim() == 2 and initial_point.shape[0] != num_chains:
        raise ValueError(f"initial_point has {initial_point.shape[0]} rows for {num_chains} chains: give "
                         "one point (dim,) or one per chain (num_chains, dim)")
    kernel.configure(num_chains=num_chains)
    kernel.initial_params = {SITE: initial_point.detach().expand(num_chains, -1).clone()}
    out: Dict[int, Dict[str, torch.Tensor]] = {}
    with tqdm(total=last, disable=not progress_bar, desc=type(kernel).__name__) as bar:
        # every iteration counts as warm-up: the kernel keeps no draws or statistics
        for phase, i, params in run_chains(kernel, last, 0):
            k = 0 if phase == "Initial" else i + 1
            if k in marks:
                out[k] = {name: v.detach().clone() for name, v in params.items()}
            bar.update(k > 0)
    return out
