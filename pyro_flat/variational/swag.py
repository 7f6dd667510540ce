r"""``AutoSWAG``: SWA-Gaussian (Maddox et al., NeurIPS 2019) as a Pyro autoguide.

While ``pyro.infer.SVI`` runs, the guide is a point mass at its parameter :math:`\theta` (MAP, as
Pyro's ``AutoLaplaceApproximation``), and it records the optimiser's iterates
:math:`\theta_1, \dots, \theta_n` (every ``collect_every``-th after ``collect_start``):

.. math::
    \bar\theta = \frac1n\sum_i \theta_i, \qquad
    \Sigma_{\mathrm{diag}} = \frac1n\sum_i \theta_i^2 - \bar\theta^2, \qquad
    D = [\theta_i - \bar\theta_{(i)}]_{\text{last } K},

:math:`\bar\theta_{(i)}` the running mean after :math:`\theta_i`. The SWAG posterior is then

.. math:: q(\theta) = \mathcal N\Big(\bar\theta,\ \tfrac12\Sigma_{\mathrm{diag}}
          + \tfrac{1}{2(K-1)} D D^\top\Big),

a ``LowRankMultivariateNormal`` in the unconstrained latent space. ``guide.eval()`` switches the
guide to it (for ``Predictive`` and :func:`~pyro_flat.bma_predict`); :meth:`AutoSWAG.low_rank_guide`
returns an ``AutoLowRankMultivariateNormal`` with the same distribution and trainable parameters,
the starting point of :class:`~pyro_flat.SABMA_ELBO` (the pipeline of SA-BMA: a pre-trained
network, SWAG, then SA-BMA). With ``SAM_ELBO(rho)`` as the loss, the iterates are SAM's: SA-SWAG.

An iterate is recorded when the guide is called with parameters that differ from the last ones it
saw, so the guide's several calls within one step (SAM's two evaluations, several particles)
record it once, and calls after training record nothing.

>>> import torch, pyro, pyro.distributions as dist
>>> from pyro.infer import SVI, Trace_ELBO, Predictive
>>> def model(y):
...     mu = pyro.sample("mu", dist.Normal(0.0, 10.0).expand([3]).to_event(1))
...     with pyro.plate("data", len(y), subsample_size=20) as idx:
...         pyro.sample("y", dist.Normal(mu, 1.0).to_event(1), obs=y[idx])
>>> pyro.clear_param_store(); pyro.set_rng_seed(0)
>>> y = torch.randn(200, 3) + 3.0
>>> guide = AutoSWAG(model, rank=2, collect_start=100)
>>> svi = SVI(model, guide, pyro.optim.SGD({"lr": 1e-3}), Trace_ELBO())
>>> for _ in range(300):
...     loss = svi.step(y)
>>> guide.num_collected
200
>>> draws = Predictive(model, guide=guide.eval(), num_samples=10, return_sites=["mu"])(y)["mu"]
>>> draws.shape
torch.Size([10, 1, 3])
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

import pyro.distributions as dist
from pyro import poutine
from pyro.infer.autoguide import AutoContinuous, AutoLowRankMultivariateNormal
from pyro.infer.autoguide.initialization import init_to_median
from pyro.nn import PyroParam

from ..validation import check_nonnegative_int, check_positive, check_positive_int


class AutoSWAG(AutoContinuous):
    """SWAG: the moments of the optimiser's iterates, as a low-rank-plus-diagonal Gaussian guide.

    :param model: the Pyro model.
    :param rank: K, the number of deviation columns kept (the low-rank part's rank).
    :param collect_start: iterates before this one (counted from 0) are not recorded (burn-in).
    :param collect_every: record every this many iterates (SWAG records once per epoch).
    :param min_variance: the smallest diagonal variance of the SWAG posterior (a coordinate the
        iterates never moved has variance 0; SWAG's reference code clamps it the same way).
    :param init_loc_fn: per-site initialisation (``init_to_value`` to start from a pre-trained network).

    ``num_collected``, ``mean``, ``sq_mean`` and ``deviations`` (``(rank, latent_dim)``, oldest first)
    hold the moments; :meth:`posterior` the SWAG distribution; ``state_dict()`` saves them with the
    counters. ``median()`` and ``quantiles()`` follow the mode: in training mode the current iterate
    (a point mass), after ``guide.eval()`` the SWAG posterior's.
    """

    def __init__(self, model: Callable, *, rank: int, collect_start: int = 0, collect_every: int = 1,
                 min_variance: float = 1e-30, init_loc_fn: Callable = init_to_median):
        self.rank = check_positive_int("rank", rank, hint="It is SWAG's number of deviation columns, e.g. rank=20.")
        self.collect_start = check_nonnegative_int("collect_start", collect_start,
                                                   hint="It is the first iterate recorded (a burn-in).")
        self.collect_every = check_positive_int("collect_every", collect_every,
                                                hint="Record every k-th iterate, e.g. one per epoch.")
        self.min_variance = check_positive("min_variance", min_variance, hint="SWAG's reference code uses 1e-30.")
        self.iterations_seen = 0
        self.num_collected = 0
        super().__init__(model, init_loc_fn=init_loc_fn)

    def _setup_prototype(self, *args, **kwargs):
        super()._setup_prototype(*args, **kwargs)
        if self.rank > self.latent_dim:
            raise ValueError(f"AutoSWAG: rank={self.rank} exceeds the model's {self.latent_dim} latent "
                             f"coordinates; pass rank <= {self.latent_dim}.")
        self.loc = nn.Parameter(self._init_loc())
        zeros = self.loc.detach().new_zeros
        # the first two moments in float64: their difference, the diagonal variance, is often 1e-8 of
        # the second moment, below float32's resolution (the posterior's covariance was then singular)
        self.register_buffer("mean", zeros(self.latent_dim, dtype=torch.float64))
        self.register_buffer("sq_mean", zeros(self.latent_dim, dtype=torch.float64))
        self.register_buffer("_deviation_ring", zeros(self.rank, self.latent_dim))  # row n % rank: the n-th
        self.register_buffer("_last_seen", self.loc.detach().clone().fill_(float("nan")))

    # ------------------------------------------------------------------ collecting the moments
    def _observe(self) -> None:
        """Record ``loc`` if it is a new iterate (it differs from the last one seen)."""
        theta = self.loc.detach()
        if torch.equal(theta, self._last_seen):
            return
        self._last_seen.copy_(theta)
        k = self.iterations_seen
        self.iterations_seen += 1
        if k < self.collect_start or (k - self.collect_start) % self.collect_every:
            return
        n = self.num_collected
        wide = theta.to(self.mean.dtype)
        self.mean.lerp_(wide, 1.0 / (n + 1))  # in place: no copy of the weights but the ring's row
        self.sq_mean.mul_(n / (n + 1)).addcmul_(wide, wide, value=1.0 / (n + 1))
        self._deviation_ring[n % self.rank].copy_(wide - self.mean)
        self.num_collected = n + 1

    @property
    def deviations(self) -> torch.Tensor:
        """The last ``min(num_collected, rank)`` deviations θ_i - mean after θ_i, oldest first."""
        n, ring = self.num_collected, self._deviation_ring
        if n <= self.rank:
            return ring[:n]
        return torch.cat([ring[n % self.rank:], ring[:n % self.rank]])

    def _check_collected(self) -> None:
        if self.num_collected == 0:
            raise ValueError(
                "AutoSWAG has collected no iterate yet: run pyro.infer.SVI with this guide in training mode "
                f"(guide.train()) past collect_start={self.collect_start} steps before asking for its posterior "
                f"(it has seen {self.iterations_seen} iterates).")

    def posterior(self) -> dist.LowRankMultivariateNormal:
        r"""The SWAG distribution :math:`\mathcal N(\bar\theta, \frac12\Sigma_{diag} + \frac{DD^\top}{2(K-1)})`
        of the unconstrained latent vector (K the columns collected, at least 2 for the low-rank part)."""
        self._check_collected()
        dtype = self.loc.dtype
        variance = (self.sq_mean - self.mean.square()).clamp_min(0.0).to(dtype)
        deviations = self.deviations
        columns = deviations.shape[0]
        if columns < 2:  # the first deviation is 0 by construction: no low-rank part yet
            factor = torch.zeros_like(deviations.T)
        else:
            factor = deviations.T / math.sqrt(2.0 * (columns - 1))
        return dist.LowRankMultivariateNormal(self.mean.to(dtype), factor,
                                              (0.5 * variance).clamp_min(self.min_variance))

    def get_extra_state(self) -> dict:
        """The counters, saved with the moments by ``state_dict()`` (restored by ``load_state_dict``)."""
        return {"num_collected": self.num_collected, "iterations_seen": self.iterations_seen}

    def set_extra_state(self, state: dict) -> None:
        self.num_collected = int(state["num_collected"])
        self.iterations_seen = int(state["iterations_seen"])

    # ------------------------------------------------------------------ the AutoContinuous interface
    def get_posterior(self, *args, **kwargs):
        """In training mode a point mass at ``loc`` (recording the iterate); in eval mode the SWAG posterior."""
        if not self.training:
            return self.posterior()
        self._observe()
        return dist.Delta(self.loc).to_event(1)

    def _loc_scale(self, *args, **kwargs):
        if self.training:
            return self.loc, torch.zeros_like(self.loc)
        q = self.posterior()
        return q.loc, q.variance.sqrt()

    def low_rank_guide(self, *args, **kwargs) -> AutoLowRankMultivariateNormal:
        """An ``AutoLowRankMultivariateNormal`` whose distribution is the SWAG posterior, with trainable
        ``loc``, ``scale`` and ``cov_factor`` (``scale²`` the diagonal, ``cov_factor · scale`` the low-rank
        factor): the starting point of SA-BMA. ``args`` are the model's, as for the first SVI step."""
        q = self.posterior()
        guide = AutoLowRankMultivariateNormal(self.model, rank=self.rank)
        try:
            with torch.random.fork_rng(), poutine.block():  # one run sets it up; it draws no number of the user's
                guide(*args, **kwargs)
        except TypeError as err:
            raise TypeError(f"AutoSWAG.low_rank_guide(*args, **kwargs) runs the model once to set the new guide up: "
                            f"pass the model's arguments, those of an SVI step (e.g. low_rank_guide(X, y)); {err}") from err
        scale = q.cov_diag.sqrt()
        factor = torch.zeros(self.latent_dim, self.rank, dtype=scale.dtype, device=scale.device)
        factor[:, :q.cov_factor.shape[1]] = q.cov_factor / scale.unsqueeze(-1)
        guide.loc = nn.Parameter(q.loc.clone())
        guide.scale = PyroParam(scale, constraint=guide.scale_constraint)
        guide.cov_factor = nn.Parameter(factor)
        return guide


__all__ = ["AutoSWAG"]
