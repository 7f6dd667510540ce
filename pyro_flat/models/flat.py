r"""The flat posterior as an ordinary Pyro model.

Entropy-MCMC (Li & Zhang, ICLR 2024) samples the joint

.. math::

    p(\theta, \theta_a \mid D) \propto
        \exp\Big(-f(\theta) - \frac{\lVert\theta - \theta_a\rVert^2}{2\eta}\Big),
    \qquad f(\theta) = -\log p(D \mid \theta) - \log p(\theta).

Because :math:`\theta_a \mid \theta, D \sim \mathcal N(\theta, \eta I)` exactly, the joint is the
generative model :math:`\theta \sim p(\theta),\ \theta_a \sim \mathcal N(\theta, \eta I),\
y \sim p(y \mid \theta)` conditioned on :math:`D`: the auxiliary (guiding) variable is an ordinary
latent child of :math:`\theta`. Its marginal is the Gaussian-smoothed, *flat* posterior
:math:`p(\theta \mid D) * \mathcal N(0, \eta I)`, while the :math:`\theta` marginal is unchanged.

:func:`flat_posterior` adds that child to any Pyro model; :func:`flat_potential` does the same for a
plain potential function. Every sampler that works on a Pyro model (the kernels of this package,
Pyro's ``NUTS``, ``Predictive``) therefore works on the flat posterior unchanged.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Dict, Iterable, Optional

import torch
from pyro.distributions import Normal
from pyro.poutine.messenger import Messenger

import pyro

from ..targets.coupling import coupling
from ..targets.sites import is_subsample_site, support_transform
from ..validation import check_eta

AUX_INFER_KEY = "flat_aux_of"
"""Key of ``site["infer"]`` that marks an auxiliary site and names the site it guides."""


class FlatPosteriorMessenger(Messenger):
    r"""Effect handler that adds an auxiliary latent ``name + suffix`` after each selected latent.

    For a latent site with support :math:`S` and bijection :math:`t = \mathrm{biject\_to}(S)` from
    the unconstrained space, the added site is

    .. math:: \theta_a \sim \mathcal N\big(t^{-1}(\theta), \sqrt{\eta}\big)

    with the event dimension of :math:`t`'s domain: the coupling lives in the *unconstrained* space,
    which for real-valued weights is the identity. A site is coupled if it is latent where the
    model samples it: ``obs=`` data and a ``poutine.condition`` applied *inside*
    ``flat_posterior`` make it data, never coupled; a ``condition`` applied *outside* (as Pyro's
    HMC/NUTS potential does to every latent) only fixes its value, and its twin stays.
    """

    def __init__(self, eta: float, sites: Optional[Iterable[str]] = None, suffix: str = "_aux"):
        super().__init__()
        self.eta = check_eta(eta)
        if not isinstance(suffix, str) or not suffix:
            raise ValueError(f"suffix must be a non-empty string, got suffix={suffix!r}")
        self.sites = None if sites is None else frozenset(sites)
        self.suffix = suffix
        self._coupled: set = set()

    def __enter__(self):
        self._coupled = set()
        self._latent: set = set()  # sites still latent when they reach this handler
        return super().__enter__()

    def _pyro_sample(self, msg) -> None:
        # handlers outside this one (e.g. Pyro's potential conditioning every latent) have not
        # run yet: what is observed here is the model's data
        if not msg["is_observed"]:
            self._latent.add(msg["name"])

    def __exit__(self, *exc):
        result = super().__exit__(*exc)
        if exc[0] is None and self.sites is not None:
            missing = self.sites - self._coupled
            if missing:
                raise ValueError(
                    f"flat_posterior(sites=...) names {sorted(missing)}, which the model did not "
                    "sample as latent sites; pass names of latent pyro.sample / PyroSample sites "
                    "(or sites=None to couple every continuous latent)."
                )
        return result

    def _postprocess_message(self, msg) -> None:
        if (
            msg["type"] != "sample"
            or msg["name"] not in self._latent
            or is_subsample_site(msg)
            or msg["infer"].get(AUX_INFER_KEY) is not None
            or msg["infer"].get("_deterministic")
        ):
            return
        name = msg["name"]
        if self.sites is not None and name not in self.sites:
            return
        support = msg["fn"].support
        if support.is_discrete:
            if self.sites is not None:
                raise ValueError(
                    f"flat_posterior(sites=...) names the discrete site {name!r}; only continuous "
                    "latents can be coupled to an auxiliary variable."
                )
            return
        transform = support_transform(name, support)
        unconstrained = transform.inv(msg["value"])
        aux_fn = Normal(unconstrained, math.sqrt(self.eta)).to_event(transform.domain.event_dim)
        self._coupled.add(name)
        pyro.sample(name + self.suffix, aux_fn, infer={AUX_INFER_KEY: name})


def flat_posterior(
    model: Callable,
    eta: float,
    *,
    sites: Optional[Iterable[str]] = None,
    suffix: str = "_aux",
) -> Callable:
    r"""Return the flat-posterior version of ``model``: each latent gains a guiding twin.

    Every continuous latent site ``name`` (or only those in ``sites``) is followed by an auxiliary
    latent site ``name + suffix`` distributed as ``Normal(value, sqrt(eta))`` with matching event
    shape, so that

    .. math::

        \log p(\theta, \theta_a, D) = \log p(\theta, D)
            - \frac{\lVert\theta - \theta_a\rVert^2}{2\eta} + \text{const}.

    Constrained sites (``Gamma``, ``Dirichlet``, ...) are coupled in the unconstrained space of
    ``biject_to(support)``: the auxiliary variable is real valued and
    :math:`\theta_a \mid \theta \sim \mathcal N(t^{-1}(\theta), \eta I)`. Plain ``pyro.sample``
    sites and ``PyroModule``/``PyroSample`` weights are handled alike; observed, deterministic and
    discrete sites are left alone.

    :param model: a Pyro model (any callable that calls ``pyro.sample``).
    :param eta: coupling variance :math:`\eta > 0`.
    :param sites: names of the latent sites to couple; ``None`` couples every continuous latent.
    :param suffix: appended to a site name to name its auxiliary site.
    :returns: a model with the same signature and return value.

    Example::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro_flat import flat_posterior
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0., 10.))
        ...     with pyro.plate("data", len(y)):
        ...         pyro.sample("y", dist.Normal(mu, 1.), obs=y)
        >>> flat = flat_posterior(model, eta=0.5)
        >>> tr = pyro.poutine.trace(flat).get_trace(torch.zeros(3))
        >>> [n for n, site in tr.nodes.items() if site["type"] == "sample"]
        ['mu', 'mu_aux', 'data', 'y']
    """
    handler = FlatPosteriorMessenger(eta, sites=sites, suffix=suffix)

    @functools.wraps(model)
    def flat_model(*args, **kwargs):
        with FlatPosteriorMessenger(handler.eta, sites=handler.sites, suffix=handler.suffix):
            return model(*args, **kwargs)

    flat_model.flat_eta = handler.eta
    flat_model.flat_suffix = handler.suffix
    flat_model.base_model = model
    return flat_model


def flat_potential(
    potential_fn: Callable[[Dict[str, torch.Tensor]], torch.Tensor],
    eta: float,
    *,
    sites: Iterable[str],
    suffix: str = "_aux",
) -> Callable[[Dict[str, torch.Tensor]], torch.Tensor]:
    r"""Couple a potential function :math:`f` over named tensors to guiding twins.

    Returns :math:`U(\theta, \theta_a) = f(\theta) + \sum_k \lVert\theta_k - \theta_{a,k}\rVert^2/(2\eta)`
    as a function of a dict holding both ``name`` and ``name + suffix`` for each name in ``sites``.
    This is :func:`flat_posterior` for users who write the potential themselves. A batched
    ``potential_fn`` (``(C, ...)`` tensors to ``(C,)`` energies, for vectorized chains) gets one
    coupling term per chain: the squares are summed over each site's own dimensions only.

    Example::

        >>> import torch
        >>> from pyro_flat import flat_potential
        >>> U = flat_potential(lambda p: 0.5 * (p["x"] ** 2).sum(), eta=2.0, sites=["x"])
        >>> float(U({"x": torch.tensor([1.0]), "x_aux": torch.tensor([3.0])}))
        1.5
    """
    eta = check_eta(eta)
    names = tuple(sites)
    if not names:
        raise ValueError("flat_potential needs at least one site name to couple (sites=[...]).")

    def coupled_potential(params: Dict[str, torch.Tensor]) -> torch.Tensor:
        base = {k: v for k, v in params.items() if k not in aux_names}
        energy = torch.as_tensor(potential_fn(base))
        # A batched potential maps (C, ...) tensors to (C,) energies: the coupling is summed over
        # each site's own dimensions only, one term per chain (energy.shape leads every tensor).
        diffs = [params[name] - params[name + suffix] for name in names]
        return energy + coupling(diffs, eta, batch_dims=energy.dim()).energy

    aux_names = frozenset(n + suffix for n in names)
    coupled_potential.flat_eta = eta
    coupled_potential.flat_suffix = suffix
    return coupled_potential
