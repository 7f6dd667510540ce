r"""The kernel-target contract: what a kernel may ask of the potential it samples.

A *target* is any object with the attributes and methods of :class:`Target`; pyro-flat's kernels
use nothing else. :class:`~pyro_flat.targets.ModelPotential` (a Pyro model),
:class:`~pyro_flat.targets.CallablePotential` (a ``potential_fn``),
:class:`~pyro_flat.targets.CoupledPotential` (the Entropy-MCMC joint of either) and
:class:`~pyro_flat.targets.CompiledTarget` (any of them with a traced gradient) all are.

One evaluation returns everything it produced, :class:`Evaluation` ``(energy, grads, stats)``:
the energy :math:`U(z)` on a minibatch, its gradient, and the target's own per-draw statistics
(the coupled target's :math:`\lVert\theta - \theta_a\rVert`), which a kernel records with the
draw. Nothing is left on the target between calls, as in BlackJAX and posteriors, whose steps
return their new state.

A coupled target says so through :attr:`Target.coupling` (a
:class:`~pyro_flat.targets.Coupling`: :math:`\eta` and the twin names), never through its class;
it is then a :class:`CoupledTarget`, whose ``base`` is the target of :math:`\theta` alone. A target
that can evaluate its potential on all its data at once (a model's, summed over ranks or not) is a
:class:`FullDataTarget`; the curvature estimates of the preconditioners and of
:mod:`pyro_flat.flatness` use it when they can, a minibatch otherwise.
"""

from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Protocol, Tuple, runtime_checkable

import torch

from .batching import Minibatches
from .layout import Params
from .sites import SiteInfo


class Evaluation(NamedTuple):
    """One evaluation of a target: the energy (``()`` or ``(C,)`` for vectorized chains), the
    gradient per site, and the target's statistics at that point (``{}`` for most targets)."""

    energy: torch.Tensor
    grads: Params
    stats: Dict[str, torch.Tensor]


@runtime_checkable
class Target(Protocol):
    """What a kernel may call.

    - ``sites``: ``{name: SiteInfo}`` of the latent sites, in unconstrained coordinates;
    - ``transforms``: Pyro's convention, support -> unconstrained (identity sites omitted);
    - ``num_chains``: ``C`` vectorized chains (a leading ``(C,)`` dim everywhere) or ``None``;
    - ``subsampled_plates``: ``{plate: (size, batch_size)}``;
    - ``batches``: the :class:`~pyro_flat.targets.Minibatches` its minibatches come from;
    - ``coupling``: ``None``, or the :class:`~pyro_flat.targets.Coupling` of an Entropy-MCMC joint;
    - ``is_compiled``: whether :meth:`evaluate` replays a traced graph (``jit_compile``).
    """

    sites: Dict[str, SiteInfo]
    num_chains: Optional[int]
    subsampled_plates: Dict[str, Tuple[int, int]]
    batches: Minibatches
    coupling: Optional[object]
    is_compiled: bool

    @property
    def transforms(self) -> Dict[str, torch.distributions.Transform]: ...

    def initial_params(self, overrides: Optional[Params] = None) -> Params:
        """The starting point (unconstrained), with the user's ``overrides`` put in."""

    def __call__(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None) -> torch.Tensor:
        """The energy alone, differentiable (no gradient taken, no statistics)."""

    def evaluate(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None) -> Evaluation:
        """Energy, gradient and statistics at ``params``; ``indices`` fixes the minibatch (a fresh
        one from :attr:`batches` when ``None``)."""

    def potential_and_grad(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None
                           ) -> Tuple[torch.Tensor, Params]:
        """:meth:`evaluate` without the statistics."""

    def draw_indices(self) -> Dict[str, torch.Tensor]:
        """A fresh minibatch (to evaluate twice on the same data)."""

    def fixed_batch(self) -> Dict[str, torch.Tensor]:
        """The first minibatch of every subsampled plate (for deterministic comparisons)."""


@runtime_checkable
class CoupledTarget(Target, Protocol):
    """A target whose ``coupling`` is not ``None`` (the Entropy-MCMC joint): ``base`` is the target of
    :math:`\theta` alone, whose sites the joint's are plus the twins."""

    base: Target


@runtime_checkable
class FullDataTarget(Target, Protocol):
    """A target that also evaluates its potential on all its data (every subsampled plate whole)."""

    def full_data(self, params: Params, *, likelihood_only: bool = False) -> torch.Tensor:
        """The potential on all the data, differentiable; ``likelihood_only``: the negative
        log-likelihood alone (no prior, no Jacobian)."""


class TargetBase:
    """What every target derives from :meth:`evaluate` and :attr:`batches` alone:
    :meth:`potential_and_grad`, :meth:`draw_indices` and :meth:`fixed_batch`."""

    batches: Minibatches

    def evaluate(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None) -> Evaluation:
        raise NotImplementedError

    def potential_and_grad(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None
                           ) -> Tuple[torch.Tensor, Params]:
        """:meth:`evaluate`'s energy and gradient."""
        energy, grads, _ = self.evaluate(params, indices)
        return energy, grads

    def draw_indices(self) -> Dict[str, torch.Tensor]:
        """A fresh minibatch, to evaluate the potential twice on the same data."""
        return self.batches.draw()

    def fixed_batch(self) -> Dict[str, torch.Tensor]:
        """The first minibatch of every subsampled plate (for deterministic comparisons)."""
        return self.batches.fixed()


__all__ = ["Target", "CoupledTarget", "FullDataTarget", "TargetBase", "Evaluation"]
