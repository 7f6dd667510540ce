r"""Potential energies that kernels differentiate: a Pyro model, or a user's ``potential_fn``.

A kernel sees a *target* (:class:`~pyro_flat.targets.Target`): named unconstrained tensors :math:`z`, a
potential :math:`U(z) = -\log p(t(z), D) - \log\lvert\det J_t(z)\rvert` and Pyro's ``transforms``.
:class:`ModelPotential` evaluates a Pyro model in one pass under a single light effect handler
(:class:`~pyro_flat.targets.log_joint.LogJoint`). Minibatches come from Pyro's own
``pyro.plate(..., subsample_size=B)``: every evaluation substitutes fresh indices for the plate's
subsample site (epoch-wise shuffling, so each minibatch is a uniformly random subset) and the
plate scales the likelihood by :math:`N/B`.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Tuple

import pyro
import torch
from pyro import poutine
from pyro.infer.autoguide.initialization import InitMessenger

from ..chains.shard import chain_indices, owns, shard_of
from .batching import EpochBatcher, Minibatches
from .layout import Params
from .log_joint import ChangedSitesError, LogJoint
from .protocol import Evaluation, TargetBase
from .sites import SiteInfo, check_finite_priors, is_subsample_site, support_transform
from .starts import merge_overrides, model_start, setup_strategy, start_hook


#: Up to this many vectorized chains, each chain's initial point comes from a trace of the model of
#: its own, as Pyro's driver draws them (so the seeded runs of a few chains keep their draws); beyond,
#: one trace draws them all (a Python loop of one trace per chain took minutes for 10**6 chains).
TRACED_CHAINS_MAX = 256


def check_finite_inputs(args: tuple, kwargs: dict, *, before: str = "sampling", who: str = "") -> None:
    """A ``ValueError`` naming the model's tensor argument that is empty (when ``before="sampling"``) or holds
    NaN/inf; ``who`` prefixes the message (``"bma_predict: "``)."""
    named = [(f"argument {i}", a) for i, a in enumerate(args)] + [
        (f"argument {k!r}", v) for k, v in kwargs.items()
    ]
    for label, value in named:
        if torch.is_tensor(value) and value.numel() == 0 and before == "sampling":
            raise ValueError(f"model {label} is empty (shape {tuple(value.shape)}); pass at least one "
                             "data point.")
        if torch.is_tensor(value) and value.is_floating_point():
            if not bool(torch.isfinite(value).all()):
                bad = int((~torch.isfinite(value)).sum())
                raise ValueError(
                    f"{who}model {label} holds {bad} NaN/inf value(s); clean or impute the data "
                    f"before {before} (e.g. drop rows with torch.isfinite(X).all(-1))."
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


MINIBATCH_SCHEMES = ("per_chain", "shared")


def check_minibatches(minibatches: str) -> str:
    """``minibatches`` must name a scheme of :data:`MINIBATCH_SCHEMES`."""
    if minibatches not in MINIBATCH_SCHEMES:
        raise ValueError(f"minibatches must be 'per_chain' (each vectorized chain its own minibatch: independent "
                         f"chains) or 'shared' (one minibatch for all chains: correlated), got {minibatches!r}.")
    return minibatches


class AutogradTarget(TargetBase):
    """Targets whose gradient comes from one reverse pass through ``__call__(params, indices)``."""

    num_chains: Optional[int] = None  # vectorized chains: a leading (C,) dim on every tensor
    coupling = None  # not an Entropy-MCMC joint (see CoupledPotential)
    is_compiled = False  # the gradient comes from autograd (see CompiledTarget)

    def evaluate(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None) -> Evaluation:
        """Energy and gradient (no statistics); ``indices`` (from :meth:`draw_indices`) fixes the minibatch."""
        fn = self if indices is None else (lambda p: self(p, indices))
        energy, grads = potential_and_grad(fn, params, self.num_chains)
        return Evaluation(energy, grads, {})


class ModelPotential(AutogradTarget):
    r"""The potential :math:`U(z)` of a Pyro model in unconstrained coordinates.

    :param model: a Pyro model; plates with ``subsample_size`` make :meth:`__call__` stochastic.
    :param model_args, model_kwargs: the data, as passed to ``mcmc.run``.
    :param init_strategy: a Pyro init strategy (``pyro.infer.autoguide.initialization``), or ``None``
        (default): the model's own start if it has one (an ``initial_params(num_chains=...)`` method, see
        :mod:`~pyro_flat.targets.starts`; a :class:`~pyro_flat.nn.BayesianModule`'s), else a prior draw.
    :param num_chains: ``C`` vectorized chains: every parameter gets a leading ``(C,)`` dim and
        :meth:`__call__` returns ``(C,)`` energies. The chain dimension sits left of the model's
        own plates, each site's value padded with a singleton for every plate it is not in
        (Pyro's ``vectorize_particles`` layout): a global weight vector of
        shape ``(d,)`` arrives as ``(C, 1, d)`` in a model with one data plate, or as ``(C, d)``
        if it is declared in a ``pyro.plate`` of its own (see :func:`pyro_flat.models.logistic_regression`).
    :param minibatches: with ``num_chains``, ``"per_chain"`` (default): each chain draws its own
        minibatches, so the chains are independent; the plate's indices are ``(C, B)`` and a model
        that gathers its data as ``X[idx]`` gets ``(C, B, ...)`` data. ``"shared"``: all chains see
        the same ``(B,)`` minibatch at a step and share its gradient noise, which correlates them
        (R-hat and ESS then overstate convergence).
    :param latent_weight: weight of the latent sites' terms (prior densities and Jacobians): ``1/R``
        for one of ``R`` data-parallel shards, so that the shards' potentials sum to the whole one.
    """

    def __init__(
        self,
        model: Callable,
        model_args: tuple = (),
        model_kwargs: Optional[dict] = None,
        init_strategy: Optional[Callable] = None,
        num_chains: Optional[int] = None,
        minibatches: str = "per_chain",
        latent_weight: float = 1.0,
    ):
        self.model = model
        self.latent_weight = latent_weight
        self.num_chains = num_chains
        self.minibatches = check_minibatches(minibatches)
        per_chain = num_chains if minibatches == "per_chain" else None
        self.model_args = tuple(model_args)
        self.model_kwargs = dict(model_kwargs or {})
        self.init_strategy = init_strategy
        self._start_hook = start_hook(model, init_strategy)  # the model's own start (no init_strategy given)
        check_finite_inputs(self.model_args, self.model_kwargs)
        trace = self._init_trace()
        check_finite_priors(trace)  # once, at set-up: a step never reads its priors' parameters back
        self.sites: Dict[str, SiteInfo] = {}
        batchers: Dict[str, EpochBatcher] = {}
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
                    batchers[name] = EpochBatcher(fn.size, batch, site["value"].device, per_chain)
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
        #: where the model draws its latents (draws kept in host memory go back there to be evaluated)
        self.device = trace.nodes[next(iter(self.sites))]["value"].device
        self.batches = Minibatches(batchers)
        self.subsampled_plates: Dict[str, Tuple[int, int]] = subsampled
        self.max_plate_nesting = nesting

    def _traced(self) -> poutine.Trace:
        """The model traced once at its starting values, without a gradient."""
        with torch.no_grad():
            strategy = setup_strategy(self._start_hook, self.init_strategy)
            return poutine.trace(InitMessenger(strategy)(self.model)).get_trace(*self.model_args, **self.model_kwargs)

    def _init_trace(self) -> poutine.Trace:
        try:
            return self._traced()
        except ZeroDivisionError as err:  # pyro.plate(size=0)
            raise ValueError("the model has a pyro.plate of size 0: its data are empty; pass at "
                             "least one data point.") from err
        except ValueError as err:
            if str(err).startswith("Expected parameter"):  # torch's check of a distribution's parameters
                self._name_nonfinite_prior(err)
            if "subsample_size does not match len(subsample)" not in str(err):
                raise
            asked, size = str(err).split(",")[1].split(".")[0].split(" vs ")
            raise ValueError(
                f"a pyro.plate has subsample_size={asked.strip()} but only {size.strip()} data "
                f"points; pass subsample_size <= {size.strip()} (or None for the full batch)."
            ) from None

    def _name_nonfinite_prior(self, err: ValueError) -> None:
        """torch refused a distribution's parameters while the model was traced (Pyro's validation on), without
        naming the site: the model traced again without the check finds it, and the error names it when a latent
        site's prior is not finite (else the caller raises torch's own)."""
        try:
            with pyro.validation_enabled(False):
                trace = self._traced()
        except Exception:  # noqa: BLE001 - torch's error, not this one, is the one to show
            return
        check_finite_priors(trace, cause=err)

    @property
    def transforms(self) -> Dict[str, torch.distributions.Transform]:
        """Pyro's convention: ``transforms[name]`` maps the support to the unconstrained space."""
        return {name: site.transform.inv for name, site in self.sites.items()}

    def initial_params(self, overrides: Optional[Params] = None) -> Params:
        """Unconstrained values drawn by the init strategy (the setup trace, then fresh ones), or the
        model's own start (:func:`~pyro_flat.targets.starts.model_start`), with the user's ``overrides`` put
        in. Up to :data:`TRACED_CHAINS_MAX` vectorized chains each chain's values come from a trace of its
        own; beyond, from one trace of all the chains (:meth:`_chain_plate_draws`), so that set-up does not
        grow with the number of chains."""
        count, one_chain = self.num_chains or 1, self.num_chains in (None, 1)
        if self._start_hook is not None:
            self._initial_trace = None
            start = model_start(self._start_hook, self.sites, self.num_chains, self.device)
            return merge_overrides(start, overrides, one_chain=one_chain)
        if self.num_chains is not None and len(chain_indices(count)) > TRACED_CHAINS_MAX:
            params = self._chain_plate_draws(count)
            if params is not None:
                return merge_overrides(params, overrides, one_chain=one_chain)
        draws = []
        for chain in chain_indices(count):  # vectorized chains: one init-strategy draw each (all of a shard's)
            trace, self._initial_trace = self._initial_trace, None
            if trace is None:
                trace = self._init_trace()
            if not owns(chain, count):
                continue
            missing = [name for name in self.sites if name not in trace.nodes]
            if missing:
                raise ChangedSitesError(
                    f"the model did not sample latent site {missing[0]!r} when it drew chain {chain}'s initial "
                    "point, though it did in its first run: a model must sample the same latent sites on every "
                    "call (keep no state between calls that changes which sites it samples).")
            draws.append({
                name: site.transform.inv(trace.nodes[name]["value"]).detach().clone()
                for name, site in self.sites.items()
            })
        if self.num_chains is None:
            params = draws[0]
        else:
            params = {name: torch.stack([d[name] for d in draws]) for name in self.sites}
        return merge_overrides(params, overrides, one_chain=one_chain)

    def _chain_plate_draws(self, count: int) -> Optional[Params]:
        """Every chain's initial values from one trace of the model inside a plate of chains, left of
        its own plates (the layout of :meth:`__call__`): the init strategy draws them all at once.
        Under a chain shard all the chains are drawn and this shard's rows kept, so that a chain's start
        does not depend on the split. ``None`` if the model or the init strategy does not broadcast so
        (the caller then traces one chain at a time)."""
        self._initial_trace = None  # one chain's draw: the plate draws them all
        shard = shard_of(count)
        total = count if shard is None else shard.total

        def chains(*args, **kwargs):
            with pyro.plate("_pyro_flat_chains", total, dim=-(self.max_plate_nesting + 1)):
                return self.model(*args, **kwargs)

        try:
            with torch.no_grad():
                trace = poutine.trace(InitMessenger(setup_strategy(None, self.init_strategy))(chains)).get_trace(
                    *self.model_args, **self.model_kwargs)
            params = {}
            for name, site in self.sites.items():
                value = site.transform.inv(trace.nodes[name]["value"]).detach()
                size = math.prod(site.shape)
                if value.numel() == total * size:  # (C, 1, ..., *shape): one value per chain
                    value = value.reshape(total, *site.shape)
                elif value.numel() == size:  # a value for every chain (e.g. init_to_value)
                    value = value.reshape(site.shape).expand(total, *site.shape)
                else:
                    return None
                params[name] = (value if shard is None else shard.rows(value)).clone()
            return params
        except Exception:  # noqa: BLE001 - a model that does not broadcast: one trace per chain
            return None

    def __call__(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None) -> torch.Tensor:
        if indices is None:
            indices = self.draw_indices()
        indices = {**indices, **self.full_indices}
        chains = None if self.num_chains is None else (self.num_chains, self.max_plate_nesting)
        with LogJoint(self.sites, params, indices, chains, latent_weight=self.latent_weight) as log_joint:
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
        batchers = self.batches.batchers
        if not batchers:
            with LogJoint(self.sites, params, dict(self.full_indices), chains,
                          observed_only=likelihood_only, latent_weight=self.latent_weight) as lj:
                self.model(*self.model_args, **self.model_kwargs)
            return -lj.log_joint
        if len(batchers) > 1:
            raise ValueError(
                f"full-data evaluation supports one subsampled plate, the model has "
                f"{sorted(batchers)}; call the model without subsample_size instead."
            )
        (plate, batcher), = batchers.items()
        total = None
        for start in range(0, batcher.size, batcher.batch_size):
            stop = min(start + batcher.batch_size, batcher.size)
            idx = torch.arange(stop - batcher.batch_size, stop, device=batcher.device)
            block = (plate, idx >= start, start == 0)
            with LogJoint(self.sites, params, {plate: idx, **self.full_indices}, chains, block,
                          likelihood_only, self.latent_weight) as lj:
                self.model(*self.model_args, **self.model_kwargs)
            total = -lj.log_joint if total is None else total - lj.log_joint
        return total


class CallablePotential(AutogradTarget):
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
        self.batches = Minibatches()
        self.subsampled_plates: Dict[str, Tuple[int, int]] = {}

    @property
    def transforms(self) -> Dict[str, torch.distributions.Transform]:
        return {}

    def initial_params(self, overrides: Optional[Params] = None) -> Params:
        return merge_overrides({k: v.clone() for k, v in self._initial.items()}, overrides)

    def __call__(self, params: Params, indices=None) -> torch.Tensor:
        return self.potential_fn(params)
