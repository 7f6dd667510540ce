r"""Potential energies that kernels differentiate: a Pyro model, or a user's ``potential_fn``.

A kernel sees a *target*: named unconstrained tensors :math:`z`, a potential
:math:`U(z) = -\log p(t(z), D) - \log\lvert\det J_t(z)\rvert` and Pyro's ``transforms``.
:class:`ModelPotential` evaluates a Pyro model in one pass under a single light effect handler
(:class:`_LogJoint`) instead of ``poutine.trace`` + ``log_prob_sum``: that is what keeps a
kernel step within a small factor of a hand-written torch loop. Minibatches come from Pyro's own
``pyro.plate(..., subsample_size=B)``: every evaluation substitutes fresh indices for the plate's
subsample site (epoch-wise shuffling, so each minibatch is a uniformly random subset) and the
plate scales the likelihood by :math:`N/B`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch
from pyro import poutine
from pyro.distributions.transforms import biject_to
from pyro.distributions.util import scale_and_mask
from pyro.infer.autoguide.initialization import InitMessenger, init_to_sample
from pyro.poutine.messenger import Messenger

from ..flat import AUX_INFER_KEY, _is_subsample

Params = Dict[str, torch.Tensor]


@dataclass(frozen=True)
class SiteInfo:
    """A latent site as a kernel sees it: unconstrained shape and the map back to its support."""

    name: str
    shape: torch.Size
    transform: torch.distributions.Transform  # unconstrained -> constrained
    aux_of: Optional[str] = None  # for a flat-posterior twin: the site it guides

    @property
    def is_identity(self) -> bool:
        return _is_identity(self.transform)


def _is_identity(transform: torch.distributions.Transform) -> bool:
    if isinstance(transform, torch.distributions.transforms.IndependentTransform):
        return _is_identity(transform.base_transform)
    return isinstance(transform, torch.distributions.transforms.ComposeTransform) and not transform.parts


class EpochBatcher:
    """Minibatch indices without replacement within an epoch, reshuffled every epoch.

    Each batch is a uniformly random subset of ``range(size)``, so ``N/B`` times its log-likelihood
    is an unbiased estimate of the full one. One ``randperm`` per epoch instead of per step.
    """

    def __init__(self, size: int, batch_size: int, device: torch.device):
        self.size, self.batch_size, self.device = size, batch_size, device
        self._perm = torch.empty(0, dtype=torch.long, device=device)
        self._pos = 0

    def __call__(self) -> torch.Tensor:
        if self._pos + self.batch_size > self._perm.numel():
            self._perm = torch.randperm(self.size, device=self.device)
            self._pos = 0
        batch = self._perm[self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        return batch


class _LogJoint(Messenger):
    """Substitute unconstrained values and minibatch indices; accumulate the log joint."""

    def __init__(self, sites: Dict[str, SiteInfo], params: Params, indices: Dict[str, torch.Tensor]):
        super().__init__()
        self.sites, self.params, self.indices = sites, params, indices
        self.log_joint = 0.0

    def _pyro_sample(self, msg) -> None:
        name = msg["name"]
        if _is_subsample(msg):
            if name in self.indices:
                msg["value"] = self.indices[name]
                msg["done"] = True
            return
        fn = msg["fn"]
        if msg["is_observed"]:
            value = msg["value"]
        else:
            site = self.sites.get(name)
            if site is None:
                raise KeyError(
                    f"the model sampled latent site {name!r}, which it did not sample during "
                    "setup; models must have a fixed set of latent sites."
                )
            unconstrained = self.params[name]
            value = unconstrained if site.is_identity else site.transform(unconstrained)
            msg["value"] = value
            msg["done"] = True
            if not site.is_identity:
                log_det = site.transform.log_abs_det_jacobian(unconstrained, value)
                self.log_joint = self.log_joint + log_det.sum()
        log_prob = scale_and_mask(fn.log_prob(value), msg["scale"], msg["mask"])
        self.log_joint = self.log_joint + log_prob.sum()


def _check_finite_inputs(args: tuple, kwargs: dict) -> None:
    named = [(f"argument {i}", a) for i, a in enumerate(args)] + [
        (f"argument {k!r}", v) for k, v in kwargs.items()
    ]
    for label, value in named:
        if torch.is_tensor(value) and value.is_floating_point():
            if not bool(torch.isfinite(value).all()):
                bad = int((~torch.isfinite(value)).sum())
                raise ValueError(
                    f"model {label} holds {bad} NaN/inf value(s); clean or impute the data "
                    "before sampling (e.g. drop rows with torch.isfinite(X).all(-1))."
                )


class ModelPotential:
    r"""The potential :math:`U(z)` of a Pyro model in unconstrained coordinates.

    :param model: a Pyro model; plates with ``subsample_size`` make :meth:`__call__` stochastic.
    :param model_args, model_kwargs: the data, as passed to ``mcmc.run``.
    :param init_strategy: a Pyro init strategy (``pyro.infer.autoguide.initialization``).
    """

    def __init__(
        self,
        model: Callable,
        model_args: tuple = (),
        model_kwargs: Optional[dict] = None,
        init_strategy: Callable = init_to_sample,
    ):
        self.model = model
        self.model_args = tuple(model_args)
        self.model_kwargs = dict(model_kwargs or {})
        self.init_strategy = init_strategy
        _check_finite_inputs(self.model_args, self.model_kwargs)
        trace = self._init_trace()
        self.sites: Dict[str, SiteInfo] = {}
        self.batchers: Dict[str, EpochBatcher] = {}
        self.full_indices: Dict[str, torch.Tensor] = {}
        subsampled = {}
        for name, site in trace.nodes.items():
            if site["type"] != "sample":
                continue
            if _is_subsample(site):
                fn = site["fn"]
                batch = site["value"].numel()
                if batch < fn.size:
                    subsampled[name] = (fn.size, batch)
                    self.batchers[name] = EpochBatcher(fn.size, batch, site["value"].device)
                else:
                    self.full_indices[name] = site["value"]
                continue
            if site["is_observed"]:
                value = site["value"]
                if torch.is_tensor(value) and value.is_floating_point():
                    if not bool(torch.isfinite(value).all()):
                        raise ValueError(
                            f"observed site {name!r} holds NaN/inf values; clean or mask the data "
                            "(poutine.mask / obs_mask) before sampling."
                        )
                continue
            if site["fn"].support.is_discrete:
                raise ValueError(
                    f"latent site {name!r} is discrete ({type(site['fn']).__name__}); pyro-flat's "
                    "gradient-based kernels need continuous latents: marginalise it out "
                    "(e.g. with a mixture distribution) or observe it."
                )
            local = [f.name for f in site["cond_indep_stack"] if f.name in subsampled]
            if local:
                raise ValueError(
                    f"latent site {name!r} lies inside the subsampled plate {local[0]!r}; local "
                    "latents cannot be updated from minibatches. Move the site out of the plate "
                    "or drop subsample_size."
                )
            transform = biject_to(site["fn"].support)
            unconstrained = transform.inv(site["value"]).detach()
            self.sites[name] = SiteInfo(
                name, unconstrained.shape, transform, site["infer"].get(AUX_INFER_KEY)
            )
        if not self.sites:
            raise ValueError(
                "the model has no continuous latent site (pyro.sample without obs=); there is "
                "nothing to sample. Check that the data are passed as obs= and that at least one "
                "parameter is a pyro.sample / PyroSample site."
            )
        self._initial_trace = trace
        self.subsampled_plates: Dict[str, Tuple[int, int]] = subsampled

    def _init_trace(self) -> poutine.Trace:
        with torch.no_grad():
            return poutine.trace(InitMessenger(self.init_strategy)(self.model)).get_trace(
                *self.model_args, **self.model_kwargs
            )

    @property
    def transforms(self) -> Dict[str, torch.distributions.Transform]:
        """Pyro's convention: ``transforms[name]`` maps the support to the unconstrained space."""
        return {name: site.transform.inv for name, site in self.sites.items()}

    def initial_params(self) -> Params:
        """Unconstrained values drawn by the init strategy (the setup trace, then fresh ones)."""
        trace, self._initial_trace = self._initial_trace, None
        if trace is None:
            trace = self._init_trace()
        return {
            name: site.transform.inv(trace.nodes[name]["value"]).detach().clone()
            for name, site in self.sites.items()
        }

    def __call__(self, params: Params) -> torch.Tensor:
        indices = {name: batcher() for name, batcher in self.batchers.items()}
        indices.update(self.full_indices)
        with _LogJoint(self.sites, params, indices) as log_joint:
            self.model(*self.model_args, **self.model_kwargs)
        return -log_joint.log_joint


class CallablePotential:
    """A user's ``potential_fn(params) -> scalar`` over real-valued tensors."""

    def __init__(
        self,
        potential_fn: Callable[[Params], torch.Tensor],
        initial_params: Params,
        aux_pairs: Optional[Dict[str, str]] = None,
    ):
        self.potential_fn = potential_fn
        aux_pairs = aux_pairs or {}
        self.sites = {
            name: SiteInfo(
                name,
                value.shape,
                torch.distributions.transforms.identity_transform,
                aux_pairs.get(name),
            )
            for name, value in initial_params.items()
        }
        self._initial = {k: v.detach().clone() for k, v in initial_params.items()}
        self.subsampled_plates: Dict[str, Tuple[int, int]] = {}

    @property
    def transforms(self) -> Dict[str, torch.distributions.Transform]:
        return {}

    def initial_params(self) -> Params:
        return {k: v.clone() for k, v in self._initial.items()}

    def __call__(self, params: Params) -> torch.Tensor:
        return self.potential_fn(params)


def potential_and_grad(potential: Callable[[Params], torch.Tensor], params: Params) -> Tuple[torch.Tensor, Params]:
    """Evaluate ``potential(params)`` and its gradient with one reverse pass."""
    leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    energy = potential(leaves)
    if not (torch.is_tensor(energy) and energy.numel() == 1):
        raise ValueError(
            f"the potential must return a scalar tensor, got {type(energy).__name__} "
            f"with shape {getattr(energy, 'shape', None)}"
        )
    grads = torch.autograd.grad(energy, list(leaves.values()), allow_unused=True)
    return energy.detach(), {
        k: (torch.zeros_like(v) if g is None else g) for (k, v), g in zip(leaves.items(), grads)
    }


def is_finite(x: torch.Tensor) -> bool:
    return bool(torch.isfinite(x).all())

