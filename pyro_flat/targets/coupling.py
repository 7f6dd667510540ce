r"""The Entropy-MCMC coupling :math:`\lVert\theta - \theta_a\rVert^2/(2\eta)`, written once, and the
coupled target :class:`CoupledPotential` that adds it to a base target.

Everything that adds the coupling calls :func:`coupling`: :class:`~pyro_flat.targets.CoupledPotential`
(the kernels' joint, per site), :func:`~pyro_flat.flat_potential` (a user's potential) and
:class:`~pyro_flat.EntropyHMC` (on its flat ``(chains, D)`` vectors). Its gradient is closed form:
:math:`\nabla_\theta = (\theta - \theta_a)/\eta = -\nabla_{\theta_a}`, so the twins need no autograd.
With ``batch_dims`` leading batch (chain) dimensions, every chain gets its own term: the squares
are summed over each site's own dimensions only (docs/theory.md, section 1).

>>> import torch
>>> terms = coupling([torch.tensor([[1.0, 1.0], [0.0, 2.0]])], eta=2.0, batch_dims=1)
>>> terms.energy, terms.distance, terms.grad_theta[0][1]
(tensor([0.5000, 1.0000]), tensor([1.4142, 2.0000]), tensor([0., 1.]))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence

import torch

from .batching import Minibatches
from .layout import Params
from .potential import merge_overrides
from .protocol import Evaluation, TargetBase
from .sites import SiteInfo


class CouplingTerms(NamedTuple):
    """The coupling's value, its gradient in θ per site (that in θa is its negative), and
    :math:`\\lVert\\theta - \\theta_a\\rVert` (one per chain)."""

    energy: torch.Tensor
    grad_theta: List[torch.Tensor]
    distance: torch.Tensor


def coupling(diffs: Sequence[torch.Tensor], eta: float, batch_dims: int = 0) -> CouplingTerms:
    r""":math:`\lVert\theta - \theta_a\rVert^2/(2\eta)` and :math:`(\theta - \theta_a)/\eta` from
    ``diffs`` :math:`= \theta - \theta_a`, one tensor per site, each with ``batch_dims`` leading
    batch dimensions that are kept (the energy has shape ``diffs[0].shape[:batch_dims]``)."""
    diffs = list(diffs)
    if batch_dims == 0:  # every site's norm in one multi-tensor operation
        norms = torch._foreach_norm(diffs)
    else:
        norms = [torch.linalg.vector_norm(d.reshape(d.shape[:batch_dims] + (-1,)), dim=-1) for d in diffs]
    distance = norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms), dim=0)
    return CouplingTerms(distance.square() * (0.5 / eta), torch._foreach_div(diffs, eta), distance)


@dataclass(frozen=True)
class Coupling:
    """What makes a target an Entropy-MCMC joint: :math:`\\eta` and ``pairs`` ``{twin: site}``
    (a target's :attr:`~pyro_flat.targets.Target.coupling`; ``None`` on a target without twins)."""

    eta: float
    pairs: Dict[str, str]

    @property
    def sites(self) -> List[str]:
        """The coupled sites θ, in the twins' order."""
        return list(self.pairs.values())

    @property
    def twins(self) -> List[str]:
        """The auxiliary sites θa."""
        return list(self.pairs)


class CoupledPotential(TargetBase):
    r"""The Entropy-MCMC joint of a base target: :math:`U(z, z_a) = U_0(z) + \lVert z - z_a\rVert^2 / (2\eta)`.

    The coupling is added in closed form, gradient included
    (:math:`\nabla_z \mathrel{+}= (z - z_a)/\eta`, :math:`\nabla_{z_a} = (z_a - z)/\eta`), so the
    auxiliary block costs a few vector operations and no autograd. For a Pyro model this equals
    the potential of :func:`~pyro_flat.flat_posterior` up to the Gaussian normalising constant
    (the tests check it), for a ``potential_fn`` it is :func:`~pyro_flat.flat_potential`.
    Twins start at their site (:math:`z_a = z`) unless ``initial_params`` names them.

    ``aux_prior_sd`` :math:`s` adds :math:`\lVert z_a\rVert^2/(2s^2)` (a Normal prior on the twins, the weight
    decay that the official Entropy-MCMC code applies to :math:`\theta_a` as well): the joint is then no
    longer exact, its :math:`z`-marginal is the posterior times the smoothed prior factor.
    """

    def __init__(self, base, eta: float, sites: Optional[Iterable[str]] = None, suffix: str = "_aux",
                 aux_prior_sd: Optional[float] = None):
        self.base, self.suffix = base, suffix
        self.aux_precision = None if aux_prior_sd is None else 1.0 / float(aux_prior_sd) ** 2
        names = tuple(base.sites) if sites is None else tuple(sites)
        missing = [n for n in names if n not in base.sites]
        if missing:
            raise ValueError(
                f"sites names {missing}, which are not latent sites of the model; its continuous "
                f"latent sites are {sorted(base.sites)}."
            )
        if not names:
            raise ValueError("sites=[] couples nothing; name at least one latent site.")
        self.coupling = Coupling(float(eta), {n + suffix: n for n in names})
        self._names, self._auxes = list(names), list(self.pairs)
        self.sites = dict(base.sites)
        for aux, name in self.pairs.items():
            if aux in self.sites:
                raise ValueError(f"the model already has a site named {aux!r}; pick another suffix.")
            self.sites[aux] = SiteInfo(
                aux, base.sites[name].shape, torch.distributions.transforms.identity_transform
            )
        self.subsampled_plates = base.subsampled_plates
        self.num_chains = base.num_chains

    @property
    def eta(self) -> float:
        return self.coupling.eta

    @property
    def pairs(self) -> Dict[str, str]:
        """``{twin: site}``."""
        return self.coupling.pairs

    @property
    def is_compiled(self) -> bool:
        return self.base.is_compiled

    @property
    def batches(self) -> Minibatches:
        return self.base.batches

    @property
    def transforms(self) -> Dict[str, torch.distributions.Transform]:
        return self.base.transforms  # twins are unconstrained: identity, omitted as Pyro does

    def initial_params(self, overrides: Optional[Params] = None) -> Params:
        """The base target's initial point; each twin starts at its site unless overridden."""
        overrides = overrides or {}
        params = self.base.initial_params({k: v for k, v in overrides.items() if k not in self.pairs})
        for aux, name in self.pairs.items():
            params[aux] = params[name].clone()
        return merge_overrides(params, {k: v for k, v in overrides.items() if k in self.pairs})

    def __call__(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None) -> torch.Tensor:
        """The joint energy alone (differentiable)."""
        base_params = {k: v for k, v in params.items() if k not in self.pairs}
        diffs = [params[n] - params[a] for n, a in zip(self._names, self._auxes)]
        terms = coupling(diffs, self.eta, batch_dims=0 if self.num_chains is None else 1)
        energy = self.base(base_params, indices) + terms.energy
        return energy if self.aux_precision is None else energy + self._aux_prior_energy(params)

    def _aux_prior_energy(self, params: Params) -> torch.Tensor:
        r""":math:`\lVert z_a\rVert^2/(2s^2)` per chain (``aux_prior_sd`` given)."""
        batch = 0 if self.num_chains is None else 1
        squares = [params[a].reshape(params[a].shape[:batch] + (-1,)).square().sum(-1) for a in self._auxes]
        return torch.stack(squares).sum(0) * (0.5 * self.aux_precision)

    def evaluate(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None) -> Evaluation:
        """The base's energy and gradient on the minibatch ``indices`` (a fresh one when ``None``),
        plus the coupling; the statistic ``coupling_distance`` is :math:`\\lVert\\theta - \\theta_a\\rVert`."""
        base_params = {k: v for k, v in params.items() if k not in self.pairs}
        energy, grads, stats = self.base.evaluate(base_params, indices)
        names, auxes = self._names, self._auxes
        diffs = torch._foreach_sub([params[n] for n in names], [params[a] for a in auxes])
        terms = coupling(diffs, self.eta, batch_dims=0 if self.num_chains is None else 1)
        grads.update(zip(names, torch._foreach_add([grads[n] for n in names], terms.grad_theta)))
        aux_grads = torch._foreach_neg(terms.grad_theta)
        if self.aux_precision is not None:  # the twins' own prior
            torch._foreach_add_(aux_grads, [params[a] for a in auxes], alpha=self.aux_precision)
            energy = energy + self._aux_prior_energy(params)
        grads.update(zip(auxes, aux_grads))
        return Evaluation(energy + terms.energy, grads, {**stats, "coupling_distance": terms.distance})


__all__ = ["coupling", "CouplingTerms", "Coupling", "CoupledPotential"]
