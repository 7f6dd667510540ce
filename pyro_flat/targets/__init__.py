r"""Targets: what the samplers, ``flatness``, ``theory`` and the coming SVI code differentiate.

A *target* turns a Pyro model (or a user's ``potential_fn``) into named unconstrained tensors
:math:`z`, a batched potential :math:`U(z)` with its gradient, fresh minibatches from Pyro's
subsampled plates and the support transforms. Nothing here imports a kernel.

- :class:`ModelPotential`, :class:`CallablePotential`: a model's or a function's potential
  (:mod:`~pyro_flat.targets.potential`);
- :class:`CoupledPotential` and :func:`coupling`: the Entropy-MCMC joint and its coupling term,
  written once (:mod:`~pyro_flat.targets.coupling`);
- :class:`SiteInfo`, :func:`support_transform`, :func:`is_subsample_site`: sites
  (:mod:`~pyro_flat.targets.sites`); :class:`SiteLayout`: sites <-> one flat vector
  (:mod:`~pyro_flat.targets.layout`); :class:`EpochBatcher`: minibatch indices;
- :func:`compile_target`, :class:`CompiledTarget`: the energy and gradient as one traced graph,
  the kernels' ``jit_compile=True`` (:mod:`~pyro_flat.targets.compiled`).
"""

from .coupling import CouplingTerms, coupling
from .layout import ChainLayout, Params, SiteLayout
from .potential import (
    CallablePotential,
    CoupledPotential,
    EpochBatcher,
    ModelPotential,
    NotBroadcasting,
    check_finite_inputs,
    merge_overrides,
    potential_and_grad,
)
from .sites import SiteInfo, is_subsample_site, support_transform
from .compiled import CompiledTarget, compile_target

__all__ = [
    "ModelPotential",
    "CompiledTarget",
    "compile_target",
    "CallablePotential",
    "CoupledPotential",
    "coupling",
    "CouplingTerms",
    "SiteInfo",
    "SiteLayout",
    "ChainLayout",
    "Params",
    "EpochBatcher",
    "NotBroadcasting",
    "support_transform",
    "is_subsample_site",
    "check_finite_inputs",
    "merge_overrides",
    "potential_and_grad",
]
