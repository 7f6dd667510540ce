r"""Can a target run ``C`` chains at once? The probe behind ``chain_method="auto"``.

:class:`pyro_flat.MCMC` vectorizes chains only when the model broadcasts over a leading chain
dimension. :func:`vectorization_error` decides it from two targets it is given, one chain's and
``C`` chains', built by the kernel: the batched energies of the first chains (on fixed
minibatches) must equal the energies of the same points evaluated one by one. With per-chain
minibatches every chain's fixed minibatch is a different one, and each chain alone is evaluated
on its own: a model that gives every chain the same data fails.

The points are the batched start, each chain moved by its own random offset, so that chains
differ and every twin differs from its site even where the run starts with equal chains and
:math:`\theta_a = \theta` (a term that mixes chains, or the coupling, is zero there and would go
unseen). The offsets come from a private generator: the probe leaves the global random stream alone.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..targets import Params, Target

#: chains compared one by one (the others only have to come out in the right shape)
CHAINS_COMPARED = 2


def vectorization_error(single: Target, batched: Target, start: Params) -> Optional[str]:
    """``None`` if ``batched`` (``C`` chains) gives each chain the energy ``single`` gives it alone,
    else why not; ``start`` is ``batched``'s initial point ``{site: (C, ...)}``."""
    num_chains = batched.num_chains
    generator = torch.Generator().manual_seed(0)  # leaves the global random stream alone
    moved = {k: v + 0.1 * (1 + v.abs()) * torch.randn(v.shape, generator=generator).to(v)
             for k, v in start.items()}
    fixed = batched.fixed_batch()

    def alone(points: Params, c: int) -> float:
        return float(single({k: v[c] for k, v in points.items()}, batched.batches.for_chain(fixed, c)))

    batched_energies = {}  # each set of points evaluated once for all chains (its cost grows with C)
    with torch.no_grad():
        for c in range(min(num_chains, CHAINS_COMPARED)):
            # the moved point, unless it leaves the potential's domain (then the start)
            energy, points, which = alone(moved, c), moved, "moved"
            if not math.isfinite(energy):
                energy, points, which = alone(start, c), start, "start"
            if which not in batched_energies:
                batched_energies[which] = batched(points, fixed)
            energies = batched_energies[which]
            if energies.shape != (num_chains,):
                return f"the potential returned shape {tuple(energies.shape)}, not ({num_chains},)"
            together = float(energies[c])
            if not math.isclose(together, energy, rel_tol=1e-4, abs_tol=1e-4):
                return f"chain {c}'s energy is {together:.6g} evaluated with the others but {energy:.6g} alone"
    return None


__all__ = ["vectorization_error"]
