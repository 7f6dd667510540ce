r"""Can a target run ``C`` chains at once? The probe behind ``chain_method="auto"``.

:class:`pyro_flat.MCMC` vectorizes chains only when the model broadcasts over a leading chain
dimension. :func:`probe_chains` builds two targets with the kernel, one chain's and ``C`` chains'
(after checking one chain alone and the memory ``C`` chains need), and :func:`vectorization_error`
decides from them: the batched energies of the first chains (on fixed
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

from ..targets import ChangedSitesError, InitialShapeError, Params, Target, merge_overrides
from ..validation import check_chain_memory

#: chains compared one by one (the others only have to come out in the right shape)
CHAINS_COMPARED = 2


def probe_chains(kernel, num_chains: int, args: tuple, kwargs: dict, initial_params: Optional[Params],
                 num_draws: int = 0) -> Optional[str]:
    """``None`` if ``kernel``'s target (built by its ``build_target``) runs ``num_chains`` chains at once
    correctly, else why not. One chain's errors (bad data, a wrong initial value, a model that fails alone)
    are raised, not a reason to fall back; so is a ``num_chains`` whose draws cannot fit in memory."""
    first = None if initial_params is None else {k: v[0] for k, v in initial_params.items()}
    # one chain's target first, outside the `try`: its errors (bad data, a discrete latent, a
    # subsampled plate for HMC, ...) are the user's to see, not a reason to fall back
    single = kernel.build_target(args, kwargs, initial_params=first)
    try:
        one = single.initial_params(first)  # a wrong initial value is the user's error too
    except InitialShapeError as err:  # say it in the shapes the user passed: chains first
        raise InitialShapeError(err.name, (num_chains, *err.given), (num_chains, *err.expected)) from None
    # a chain's state, and with its own minibatches a permutation of each subsampled plate per epoch
    per_chain = kernel.minibatches == "per_chain"
    permutations = sum(size for size, _ in single.subsampled_plates.values()) if per_chain else 0
    check_chain_memory(num_chains, num_draws, sum(v.numel() * v.element_size() for v in one.values()),
                       bytes_per_chain=16 * permutations)
    # one chain's energy and gradient, outside the `try` too: a model that fails for one chain (a dtype
    # error, labels of the wrong kind) fails for the user, not as a reason to fall back to Pyro's driver
    single.potential_and_grad(one, single.fixed_batch())
    try:
        batched = kernel.build_target(args, kwargs, num_chains=num_chains, initial_params=initial_params)
        # chain 0's point for every chain (the probe moves each chain its own way), the user's values
        # put in: the batched target need not draw an initial point per chain
        start = merge_overrides({k: v.expand(num_chains, *v.shape).clone() for k, v in one.items()},
                                {k: v for k, v in (initial_params or {}).items() if k in batched.sites},
                                one_chain=num_chains == 1)
        return vectorization_error(single, batched, start)
    except ChangedSitesError:  # the model's own error, whether or not chains are batched
        raise
    except Exception as err:  # any other failure of the batched run means: not broadcastable
        return f"{type(err).__name__}: {err}".split("\n")[0]


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


__all__ = ["probe_chains", "vectorization_error"]
