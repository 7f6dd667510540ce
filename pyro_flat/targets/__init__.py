r"""Targets: what the samplers, ``flatness``, ``theory`` and the SVI code differentiate.

A *target* turns a Pyro model (or a user's ``potential_fn``) into named unconstrained tensors
:math:`z`, a batched potential :math:`U(z)` with its gradient, fresh minibatches from Pyro's
subsampled plates and the support transforms. What a kernel may ask of one is written down in
:class:`Target` (:mod:`~pyro_flat.targets.protocol`). Nothing here imports a kernel.

- :class:`Target`, :class:`Evaluation`: the kernel-target contract (:mod:`~pyro_flat.targets.protocol`);
- :class:`ModelPotential`, :class:`CallablePotential`: a model's or a function's potential
  (:mod:`~pyro_flat.targets.potential`), the model's log joint in one pass
  (:mod:`~pyro_flat.targets.log_joint`);
- :class:`CoupledPotential`, :class:`Coupling` and :func:`coupling`: the Entropy-MCMC joint and its
  coupling term, written once (:mod:`~pyro_flat.targets.coupling`);
- :func:`merge_overrides`, :func:`model_start`: where chains start, the user's values or the model's own
  ``initial_params`` (:mod:`~pyro_flat.targets.starts`);
- :class:`EpochBatcher`, :class:`Minibatches`: minibatch indices (:mod:`~pyro_flat.targets.batching`);
- :class:`SiteInfo`, :func:`support_transform`, :func:`is_subsample_site`: sites
  (:mod:`~pyro_flat.targets.sites`); :class:`SiteLayout`: sites <-> one flat vector
  (:mod:`~pyro_flat.targets.layout`);
- :func:`compile_target`, :class:`CompiledTarget`: the energy and gradient as one traced graph,
  the kernels' ``jit_compile=True`` (:mod:`~pyro_flat.targets.compiled`, on :mod:`pyro_flat.tracing`).
"""

from .batching import EpochBatcher, Minibatches
from .compiled import CompiledTarget, compile_target
from .coupling import CoupledPotential, Coupling, CouplingTerms, coupling
from .layout import ChainLayout, Params, SiteLayout
from .log_joint import ChangedSitesError, NotBroadcasting
from .potential import (
    CallablePotential,
    MINIBATCH_SCHEMES,
    ModelPotential,
    check_finite_inputs,
    check_minibatches,
    potential_and_grad,
)
from .protocol import CoupledTarget, Evaluation, FullDataTarget, Target
from .sites import SiteInfo, is_subsample_site, support_transform
from .starts import InitialShapeError, merge_overrides, model_start

__all__ = [
    "Target",
    "CoupledTarget",
    "FullDataTarget",
    "Evaluation",
    "ModelPotential",
    "CompiledTarget",
    "compile_target",
    "CallablePotential",
    "CoupledPotential",
    "Coupling",
    "coupling",
    "CouplingTerms",
    "SiteInfo",
    "SiteLayout",
    "ChainLayout",
    "Params",
    "EpochBatcher",
    "Minibatches",
    "NotBroadcasting",
    "ChangedSitesError",
    "InitialShapeError",
    "support_transform",
    "is_subsample_site",
    "check_finite_inputs",
    "check_minibatches",
    "MINIBATCH_SCHEMES",
    "merge_overrides",
    "model_start",
    "potential_and_grad",
]
