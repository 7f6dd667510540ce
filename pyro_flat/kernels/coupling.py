r"""Entropy-MCMC's joint for any stochastic-gradient kernel: the guiding twin :math:`\theta_a`.

:class:`EntropyCoupling` turns a kernel of :math:`\exp(-f/T)` into one of the joint
:math:`\exp(-U/T)`, :math:`U(\theta, \theta_a) = f(\theta) + \lVert\theta - \theta_a\rVert^2/(2\eta)`
(:class:`~pyro_flat.targets.CoupledPotential`): the twins are more sites of the target, so the kernel's
own update (Langevin for :class:`~pyro_flat.EntropySGLD`, BAOAB for :class:`~pyro_flat.EntropySGHMC`)
moves both blocks, with the coupling's gradient exact and :math:`\nabla f` from minibatches.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, Optional, Union

from ..targets import CoupledPotential, Params
from ..validation import check_eta, check_positive
from .base import coupled_target
from .preconditioning import check_coupling_metric


class EntropyCoupling:
    """Mixin, placed before a :class:`~pyro_flat.kernels.StochasticGradientKernel` subclass: its target
    becomes Entropy-MCMC's joint.

    :param eta: coupling variance :math:`\\eta > 0`.
    :param sites: latent sites to couple (default: every continuous latent).
    :param suffix: name suffix of the auxiliary sites.
    :param coupling_metric: with a ``preconditioner``, the joint's metric: ``"pulled"`` (default), a pull
        strength in [0, 1], ``"joint"`` or ``"block"`` (see :mod:`~pyro_flat.kernels.preconditioning`).
    :param aux_prior_sd: a Normal prior of this sd on :math:`\theta_a` too (``None``, the default: none, the
        exact joint). The official Entropy-MCMC code's weight decay acts on :math:`\theta_a` as well, which is
        this prior at the weights' own prior sd; it moves the :math:`\theta`-marginal off the posterior.
    """

    def __init__(self, model: Optional[Callable] = None, *, eta: Optional[float] = None,
                 sites: Optional[Iterable[str]] = None, suffix: str = "_aux", coupling_metric: Union[str, float] = "pulled",
                 aux_prior_sd: Optional[float] = None, **kwargs):
        if eta is None:
            raise TypeError(f"{type(self).__name__} needs eta=, the coupling variance η > 0 of θ and its guiding twin θa "
                            "(e.g. 1e-2: small η keeps θa close to θ).")
        self.eta = check_eta(eta)
        self.sites = None if sites is None else tuple(sites)
        self.suffix = suffix
        self.aux_prior_sd = None if aux_prior_sd is None else check_positive(
            "aux_prior_sd", aux_prior_sd, hint="It is the sd of a Normal prior on θa; leave it None for the exact joint.")
        super().__init__(model, **kwargs)
        self.coupling_metric = check_coupling_metric(coupling_metric)
        if self.preconditioner is not None:
            self.preconditioner.coupling_metric = self.coupling_metric

    def build_target(self, args: tuple, kwargs: dict, *, num_chains: Optional[int] = None,
                     initial_params: Optional[Params] = None) -> CoupledPotential:
        return coupled_target(self, args, kwargs, num_chains=num_chains, initial_params=initial_params)

    def logging(self) -> Dict[str, str]:
        out = super().logging()
        dist = self._last_stats.get("coupling_distance")
        if dist is not None:
            out["|θ-θa|"] = f"{float(dist.mean()):.3g}"  # mean over vectorized chains
        return out


__all__ = ["EntropyCoupling"]
