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

import math
from typing import Callable, Dict, Iterable, Optional, Tuple

import torch
from pyro import poutine
from pyro.distributions.util import scale_and_mask
from pyro.infer.autoguide.initialization import InitMessenger, init_to_sample
from pyro.poutine.messenger import Messenger

from .coupling import coupling
from .layout import Params
from .sites import SiteInfo, is_subsample_site, support_transform


class EpochBatcher:
    """Minibatch indices without replacement within an epoch, reshuffled every epoch.

    Each batch is a uniformly random subset of ``range(size)``, so ``N/B`` times its log-likelihood
    is an unbiased estimate of the full one. One permutation per epoch instead of per step. With
    ``num_chains=C`` every call gives ``(C, B)`` indices, each chain its own permutation (chains
    that share no minibatch are independent draws of one chain's law); else ``(B,)``.

    >>> batches = EpochBatcher(6, 3, torch.device("cpu"), num_chains=2)
    >>> first, second = batches(), batches()
    >>> torch.cat([first, second], 1).sort(1).values.tolist()
    [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]]
    """

    def __init__(self, size: int, batch_size: int, device: torch.device, num_chains: Optional[int] = None):
        self.size, self.batch_size, self.device = size, batch_size, device
        self.num_chains = num_chains
        self._perm = torch.empty(0 if num_chains is None else (num_chains, 0), dtype=torch.long, device=device)
        self._pos = 0

    def _shuffle(self) -> torch.Tensor:
        if self.num_chains is None:
            return torch.randperm(self.size, device=self.device)
        return torch.rand(self.num_chains, self.size, device=self.device).argsort(-1)

    def __call__(self) -> torch.Tensor:
        if self._pos + self.batch_size > self._perm.shape[-1]:
            self._perm = self._shuffle()
            self._pos = 0
        batch = self._perm[..., self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        return batch


class NotBroadcasting(ValueError):
    """The model does not broadcast over a leading chain dimension (see :class:`ModelPotential`)."""


class _LogJoint(Messenger):
    """Substitute unconstrained values and minibatch indices; accumulate the log joint.

    With ``chains=(C, max_plate_nesting)`` the values carry a leading dimension of ``C`` chains at
    ``dim=-(max_plate_nesting + 1)`` of the batch shape (the layout of Pyro's
    ``vectorize_particles``) and the log joint is a ``(C,)`` vector. No plate is added for the
    chains: the distributions stay unexpanded and broadcast, which saves a pass over every
    ``(C, ...)`` parameter; a term without the chain dimension is the same for every chain.

    With ``block=(plate, keep, first)`` it evaluates one block of a full-data pass (see
    :meth:`ModelPotential.full_data`): terms inside ``plate`` lose the plate's ``N/B`` scale and
    keep only the indices marked in ``keep``; terms outside it count in the ``first`` block only.
    With ``observed_only=True`` only the observed sites count: the log-likelihood.
    """

    def __init__(self, sites: Dict[str, SiteInfo], params: Params, indices: Dict[str, torch.Tensor],
                 chains: Optional[Tuple[int, int]] = None,
                 block: Optional[Tuple[str, torch.Tensor, bool]] = None, observed_only: bool = False):
        super().__init__()
        self.sites, self.params, self.indices, self.chains = sites, params, indices, chains
        self.block, self.observed_only = block, observed_only
        self.terms: list = []

    def _reduce(self, name: str, term: torch.Tensor) -> torch.Tensor:
        """Sum a log-density term over everything but the chain dimension."""
        if self.chains is None:
            return term.sum()
        num_chains, nesting = self.chains
        if term.dim() <= nesting:  # does not depend on the chain's parameters
            return term.sum().expand(num_chains)
        if term.dim() != nesting + 1 or term.shape[0] != num_chains:
            raise NotBroadcasting(
                f"site {name!r} has log-density shape {tuple(term.shape)} with {num_chains} "
                f"vectorized chains; expected ({num_chains}, ...) with {nesting + 1} dims"
            )
        return term.reshape(num_chains, -1).sum(-1)

    def _value(self, site: SiteInfo) -> torch.Tensor:
        z = self.params[site.name]
        if self.chains is None:
            return z
        num_chains, nesting = self.chains  # pad with the plate dims the site is not in
        return z.reshape((num_chains,) + (1,) * (nesting - site.batch_rank) + tuple(site.shape))

    @property
    def log_joint(self) -> torch.Tensor:
        return sum(self.terms[1:], self.terms[0])

    def _pyro_sample(self, msg) -> None:
        name, fn = msg["name"], msg["fn"]
        if is_subsample_site(msg):
            if name in self.indices:
                msg["value"] = self.indices[name]
                msg["done"] = True
            return
        if msg["is_observed"]:
            value = msg["value"]
        else:
            site = self.sites.get(name)
            if site is None:
                raise KeyError(
                    f"the model sampled latent site {name!r}, which it did not sample during "
                    "setup; models must have a fixed set of latent sites."
                )
            unconstrained = self._value(site)
            value = unconstrained if site.is_identity else site.transform(unconstrained)
            msg["value"] = value
            msg["done"] = True
            if self.observed_only:
                return
            if not site.is_identity and (self.block is None or self.block[2]):
                jacobian = site.transform.log_abs_det_jacobian(unconstrained, value)
                self.terms.append(
                    jacobian.sum() if self.chains is None else jacobian.reshape(self.chains[0], -1).sum(-1)
                )
        scale, mask = msg["scale"], msg["mask"]
        if self.block is not None:
            plate, keep, first = self.block
            frame = next((f for f in msg["cond_indep_stack"] if f.name == plate), None)
            if frame is None:
                if not first:
                    return
            else:  # undo the plate's N/B and drop the indices an earlier block has counted
                scale = scale * frame.size / frame.full_size
                keep = keep.reshape((-1,) + (1,) * (-frame.dim - 1))
                mask = keep if mask is None else mask & keep
        if mask is None:  # scale the sum, not every term
            log_prob = self._reduce(name, fn.log_prob(value))
            unscaled = not torch.is_tensor(scale) and scale == 1.0  # no value read: traceable
            self.terms.append(log_prob if unscaled else log_prob * scale)
        else:
            self.terms.append(self._reduce(name, scale_and_mask(fn.log_prob(value), scale, mask)))


def check_finite_inputs(args: tuple, kwargs: dict) -> None:
    named = [(f"argument {i}", a) for i, a in enumerate(args)] + [
        (f"argument {k!r}", v) for k, v in kwargs.items()
    ]
    for label, value in named:
        if torch.is_tensor(value) and value.numel() == 0:
            raise ValueError(f"model {label} is empty (shape {tuple(value.shape)}); pass at least one "
                             "data point.")
        if torch.is_tensor(value) and value.is_floating_point():
            if not bool(torch.isfinite(value).all()):
                bad = int((~torch.isfinite(value)).sum())
                raise ValueError(
                    f"model {label} holds {bad} NaN/inf value(s); clean or impute the data "
                    "before sampling (e.g. drop rows with torch.isfinite(X).all(-1))."
                )


def potential_and_grad(
    potential: Callable[[Params], torch.Tensor], params: Params, num_chains: Optional[int] = None
) -> Tuple[torch.Tensor, Params]:
    """Evaluate ``potential(params)`` and its gradient with one reverse pass.

    With ``num_chains=C`` the potential returns one energy per chain, shape ``(C,)``; chains are
    independent, so the gradient of the sum is every chain's own gradient.
    """
    leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    energy = potential(leaves)
    expected = () if num_chains is None else (num_chains,)
    if not (torch.is_tensor(energy) and energy.numel() == max(1, math.prod(expected))):
        raise ValueError(
            f"the potential must return a tensor of shape {expected or 'scalar'}, got "
            f"{type(energy).__name__} with shape {tuple(getattr(energy, 'shape', ()))}"
        )
    grads = torch.autograd.grad(energy.sum(), list(leaves.values()), allow_unused=True)
    return energy.detach().reshape(expected), {
        k: (torch.zeros_like(v) if g is None else g) for (k, v), g in zip(leaves.items(), grads)
    }


class InitialShapeError(ValueError):
    """An ``initial_params`` value of the wrong shape (``given`` against ``expected``, one chain's)."""

    def __init__(self, name: str, given: tuple, expected: tuple):
        super().__init__(
            f"initial_params[{name!r}] has shape {given}, but the site's unconstrained value has shape "
            f"{expected} (a leading chain dimension included when chains are vectorized); pass a tensor "
            "of that shape.")
        self.name, self.given, self.expected = name, given, expected


def merge_overrides(params: Params, overrides: Optional[Params]) -> Params:
    """``params`` with the user's values put in, cast to each site's dtype and device."""
    unknown = set(overrides or {}) - set(params)
    if unknown:
        raise ValueError(f"initial_params names {sorted(unknown)}, which are not latent sites of the "
                         f"target; its sites are {sorted(params)}.")
    for name, value in (overrides or {}).items():
        value = torch.as_tensor(value)
        if value.shape != params[name].shape:
            raise InitialShapeError(name, tuple(value.shape), tuple(params[name].shape))
        params[name] = value.to(params[name]).clone()
    return params


class _Autograd:
    """Targets whose gradient comes from one reverse pass through ``__call__``."""

    last_stats: Dict[str, torch.Tensor] = {}  # statistics of the last evaluation (none here)
    num_chains: Optional[int] = None  # vectorized chains: a leading (C,) dim on every tensor

    def potential_and_grad(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None
                           ) -> Tuple[torch.Tensor, Params]:
        """Energy and gradient; ``indices`` (from :meth:`draw_indices`) fixes the minibatch."""
        fn = self if indices is None else (lambda p: self(p, indices))
        return potential_and_grad(fn, params, self.num_chains)

    def draw_indices(self) -> Dict[str, torch.Tensor]:
        """A fresh minibatch, to evaluate the potential twice on the same data (none here)."""
        return {}


class ModelPotential(_Autograd):
    r"""The potential :math:`U(z)` of a Pyro model in unconstrained coordinates.

    :param model: a Pyro model; plates with ``subsample_size`` make :meth:`__call__` stochastic.
    :param model_args, model_kwargs: the data, as passed to ``mcmc.run``.
    :param init_strategy: a Pyro init strategy (``pyro.infer.autoguide.initialization``).
    :param num_chains: ``C`` vectorized chains: every parameter gets a leading ``(C,)`` dim and
        :meth:`__call__` returns ``(C,)`` energies. The chain dimension sits left of the model's
        own plates, each site's value padded with a singleton for every plate it is not in
        (Pyro's ``vectorize_particles`` layout): a global weight vector of
        shape ``(d,)`` arrives as ``(C, 1, d)`` in a model with one data plate, or as ``(C, d)``
        if it is declared in a ``pyro.plate`` of its own (see :func:`pyro_flat.models.logistic_regression`).
        All chains see the same minibatch at a step.
    """

    def __init__(
        self,
        model: Callable,
        model_args: tuple = (),
        model_kwargs: Optional[dict] = None,
        init_strategy: Callable = init_to_sample,
        num_chains: Optional[int] = None,
    ):
        self.model = model
        self.num_chains = num_chains
        self.model_args = tuple(model_args)
        self.model_kwargs = dict(model_kwargs or {})
        self.init_strategy = init_strategy
        check_finite_inputs(self.model_args, self.model_kwargs)
        trace = self._init_trace()
        self.sites: Dict[str, SiteInfo] = {}
        self.batchers: Dict[str, EpochBatcher] = {}
        self.full_indices: Dict[str, torch.Tensor] = {}
        subsampled = {}
        nesting = 0
        for name, site in trace.nodes.items():
            if site["type"] != "sample":
                continue
            if is_subsample_site(site):
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
            transform = support_transform(name, site["fn"].support)
            unconstrained = transform.inv(site["value"]).detach()
            self.sites[name] = SiteInfo(name, unconstrained.shape, transform, len(site["fn"].batch_shape))
        for site in trace.nodes.values():
            if site["type"] == "sample":
                frames = [-f.dim for f in site["cond_indep_stack"] if f.vectorized]
                nesting = max([nesting, len(getattr(site["fn"], "batch_shape", ())), *frames])
        if not self.sites:
            raise ValueError(
                "the model has no continuous latent site (pyro.sample without obs=); there is "
                "nothing to sample. Check that the data are passed as obs= and that at least one "
                "parameter is a pyro.sample / PyroSample site."
            )
        self._initial_trace = trace
        self.subsampled_plates: Dict[str, Tuple[int, int]] = subsampled
        self.max_plate_nesting = nesting

    def _init_trace(self) -> poutine.Trace:
        try:
            with torch.no_grad():
                return poutine.trace(InitMessenger(self.init_strategy)(self.model)).get_trace(
                    *self.model_args, **self.model_kwargs
                )
        except ZeroDivisionError as err:  # pyro.plate(size=0)
            raise ValueError("the model has a pyro.plate of size 0: its data are empty; pass at "
                             "least one data point.") from err
        except ValueError as err:
            if "subsample_size does not match len(subsample)" not in str(err):
                raise
            asked, size = str(err).split(",")[1].split(".")[0].split(" vs ")
            raise ValueError(
                f"a pyro.plate has subsample_size={asked.strip()} but only {size.strip()} data "
                f"points; pass subsample_size <= {size.strip()} (or None for the full batch)."
            ) from None

    @property
    def transforms(self) -> Dict[str, torch.distributions.Transform]:
        """Pyro's convention: ``transforms[name]`` maps the support to the unconstrained space."""
        return {name: site.transform.inv for name, site in self.sites.items()}

    def initial_params(self, overrides: Optional[Params] = None) -> Params:
        """Unconstrained values drawn by the init strategy (the setup trace, then fresh ones),
        with the user's ``overrides`` put in."""
        draws = []
        for _ in range(self.num_chains or 1):  # vectorized chains: one init-strategy draw each
            trace, self._initial_trace = self._initial_trace, None
            if trace is None:
                trace = self._init_trace()
            draws.append({
                name: site.transform.inv(trace.nodes[name]["value"]).detach().clone()
                for name, site in self.sites.items()
            })
        if self.num_chains is None:
            params = draws[0]
        else:
            params = {name: torch.stack([d[name] for d in draws]) for name in self.sites}
        return merge_overrides(params, overrides)

    def __call__(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None) -> torch.Tensor:
        if indices is None:
            indices = self.draw_indices()
        indices = {**indices, **self.full_indices}
        chains = None if self.num_chains is None else (self.num_chains, self.max_plate_nesting)
        with _LogJoint(self.sites, params, indices, chains) as log_joint:
            self.model(*self.model_args, **self.model_kwargs)
        return -log_joint.log_joint

    def full_data(self, params: Params, *, likelihood_only: bool = False) -> torch.Tensor:
        """The potential on **all** the data, differentiable, also for a subsampled model
        (``likelihood_only=True``: the negative log-likelihood alone, without prior and Jacobians).

        A subsampled plate keeps its ``subsample_size`` ``B``, so the data are visited in blocks of
        ``B`` indices (the last block overlaps the one before and counts only its new indices);
        each block's likelihood enters unscaled and the terms outside the plate enter once. The
        sum is the exact full-data potential. One subsampled plate at most.
        """
        chains = None if self.num_chains is None else (self.num_chains, self.max_plate_nesting)
        if not self.batchers:
            with _LogJoint(self.sites, params, dict(self.full_indices), chains,
                           observed_only=likelihood_only) as lj:
                self.model(*self.model_args, **self.model_kwargs)
            return -lj.log_joint
        if len(self.batchers) > 1:
            raise ValueError(
                f"full-data evaluation supports one subsampled plate, the model has "
                f"{sorted(self.batchers)}; call the model without subsample_size instead."
            )
        (plate, batcher), = self.batchers.items()
        total = None
        for start in range(0, batcher.size, batcher.batch_size):
            stop = min(start + batcher.batch_size, batcher.size)
            idx = torch.arange(stop - batcher.batch_size, stop, device=batcher.device)
            block = (plate, idx >= start, start == 0)
            with _LogJoint(self.sites, params, {plate: idx, **self.full_indices}, chains, block,
                           likelihood_only) as lj:
                self.model(*self.model_args, **self.model_kwargs)
            total = -lj.log_joint if total is None else total - lj.log_joint
        return total

    def draw_indices(self) -> Dict[str, torch.Tensor]:
        return {name: batcher() for name, batcher in self.batchers.items()}

    def fixed_batch(self) -> Dict[str, torch.Tensor]:
        """The first minibatch of every subsampled plate (for deterministic comparisons)."""
        return {name: torch.arange(b.batch_size, device=b.device) for name, b in self.batchers.items()}


class CallablePotential(_Autograd):
    """A user's ``potential_fn(params) -> scalar`` over real-valued tensors.

    With ``num_chains=C`` the initial values carry a leading ``(C,)`` dim and ``potential_fn``
    must map such a batch to ``(C,)`` energies.
    """

    def __init__(
        self,
        potential_fn: Callable[[Params], torch.Tensor],
        initial_params: Params,
        num_chains: Optional[int] = None,
    ):
        self.potential_fn = potential_fn
        self.num_chains = num_chains
        lead = 0 if num_chains is None else 1
        self.sites = {
            name: SiteInfo(name, value.shape[lead:], torch.distributions.transforms.identity_transform)
            for name, value in initial_params.items()
        }
        self._initial = {k: v.detach().clone() for k, v in initial_params.items()}
        self.subsampled_plates: Dict[str, Tuple[int, int]] = {}

    @property
    def transforms(self) -> Dict[str, torch.distributions.Transform]:
        return {}

    def initial_params(self, overrides: Optional[Params] = None) -> Params:
        return merge_overrides({k: v.clone() for k, v in self._initial.items()}, overrides)

    def __call__(self, params: Params, indices=None) -> torch.Tensor:
        return self.potential_fn(params)

    def fixed_batch(self) -> Dict[str, torch.Tensor]:
        return {}


class CoupledPotential:
    r"""The Entropy-MCMC joint of a base target: :math:`U(z, z_a) = U_0(z) + \lVert z - z_a\rVert^2 / (2\eta)`.

    The coupling is added in closed form, gradient included
    (:math:`\nabla_z \mathrel{+}= (z - z_a)/\eta`, :math:`\nabla_{z_a} = (z_a - z)/\eta`), so the
    auxiliary block costs a few vector operations and no autograd. For a Pyro model this equals
    the potential of :func:`~pyro_flat.flat_posterior` up to the Gaussian normalising constant
    (the tests check it), for a ``potential_fn`` it is :func:`~pyro_flat.flat_potential`.
    Twins start at their site (:math:`z_a = z`) unless ``initial_params`` names them.
    """

    def __init__(self, base, eta: float, sites: Optional[Iterable[str]] = None, suffix: str = "_aux"):
        self.base, self.eta, self.suffix = base, float(eta), suffix
        names = tuple(base.sites) if sites is None else tuple(sites)
        missing = [n for n in names if n not in base.sites]
        if missing:
            raise ValueError(
                f"sites names {missing}, which are not latent sites of the model; its continuous "
                f"latent sites are {sorted(base.sites)}."
            )
        if not names:
            raise ValueError("sites=[] couples nothing; name at least one latent site.")
        self.pairs = {n + suffix: n for n in names}
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
    def transforms(self) -> Dict[str, torch.distributions.Transform]:
        return self.base.transforms  # twins are unconstrained: identity, omitted as Pyro does

    def initial_params(self, overrides: Optional[Params] = None) -> Params:
        """The base target's initial point; each twin starts at its site unless overridden."""
        overrides = overrides or {}
        params = self.base.initial_params({k: v for k, v in overrides.items() if k not in self.pairs})
        for aux, name in self.pairs.items():
            params[aux] = params[name].clone()
        return merge_overrides(params, {k: v for k, v in overrides.items() if k in self.pairs})

    def potential_and_grad(self, params: Params) -> Tuple[torch.Tensor, Params]:
        base_params = {k: v for k, v in params.items() if k not in self.pairs}
        energy, grads = self.base.potential_and_grad(base_params)
        names, auxes = self._names, self._auxes
        diffs = torch._foreach_sub([params[n] for n in names], [params[a] for a in auxes])
        terms = coupling(diffs, self.eta, batch_dims=0 if self.num_chains is None else 1)
        grads.update(zip(names, torch._foreach_add([grads[n] for n in names], terms.grad_theta)))
        grads.update(zip(auxes, torch._foreach_neg(terms.grad_theta)))
        self.last_stats = {"coupling_distance": terms.distance}  # ||θ - θa||
        return energy + terms.energy, grads

