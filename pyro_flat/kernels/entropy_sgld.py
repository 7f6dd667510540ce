r"""Entropy-MCMC with SGLD updates (Li & Zhang, ICLR 2024, Algorithm 1)."""

from __future__ import annotations

from typing import Callable, Dict, Iterable, Optional, Union

import torch

from ..validation import check_eta
from .base import coupled_target
from .preconditioning import check_coupling_metric
from ..targets import CoupledPotential, Params
from .sgld import SGLD


class EntropySGLD(SGLD):
    r"""Entropy-MCMC: SGLD on the joint of the weights :math:`\theta` and their guiding twin :math:`\theta_a`.

    The target is :math:`\propto \exp(-U/T)` with

    .. math:: U(\theta, \theta_a) = f(\theta) + \frac{\lVert \theta - \theta_a \rVert^2}{2\eta},

    the potential of the model turned into :func:`~pyro_flat.flat_posterior` (or of a
    ``potential_fn`` turned into :func:`~pyro_flat.flat_potential`); the coupling and its gradient
    are added in closed form (:class:`~pyro_flat.targets.CoupledPotential`), so the
    twin costs a few vector operations. Each iteration updates both blocks at once:

    .. math::

        \theta &\leftarrow \theta - \alpha\Big(\widehat{\nabla f}(\theta)
                 + \frac{\theta - \theta_a}{\eta}\Big) + \sqrt{2\alpha T}\,\xi, \\
        \theta_a &\leftarrow \theta_a - \alpha\,\frac{\theta_a - \theta}{\eta}
                 + \sqrt{2\alpha T}\,\xi_a .

    Only :math:`\nabla f` is a minibatch estimate (likelihood scaled by :math:`N/B`, prior
    unscaled); the coupling gradient is exact, and the prior acts on :math:`\theta` only. The
    :math:`\theta` draws follow the original posterior, the :math:`\theta_a` draws (sites
    ``name + suffix``) the flat posterior :math:`p(\theta \mid D) * \mathcal N(0, T\eta I)`.
    :math:`\theta_a` starts at :math:`\theta` unless ``initial_params`` sets it. Constrained sites
    are coupled in their unconstrained space.

    :param eta: coupling variance :math:`\eta > 0`.
    :param sites: latent sites to couple (default: every continuous latent).
    :param suffix: name suffix of the auxiliary sites.
    :param coupling_metric: with a ``preconditioner``: ``"pulled"`` (default) or a pull strength
        :math:`\varepsilon \in [0, 1]`: the joint's exact inverse Hessian with :math:`\varepsilon K` taken
        off its cross-covariance, so :math:`\theta` moves as preconditioned SGLD on :math:`f` plus a pull
        toward :math:`\theta_a` (full in the flat directions), at the exact metric's mixing; the gap
        :math:`\theta - \theta_a` pays a larger discretisation error. ``"joint"`` (:math:`\varepsilon = 0`,
        the exact inverse Hessian: :math:`\theta` ignores :math:`\theta_a`) or ``"block"``
        (block-Jacobi: pulled, slow mixing of the flattest directions); see
        :mod:`~pyro_flat.kernels.preconditioning`.

    Other arguments as :class:`~pyro_flat.SGLD`. ``sample_stats`` gain ``coupling_distance``
    :math:`\lVert\theta - \theta_a\rVert` (over all coupled sites); at stationarity its square
    averages :math:`T\eta d`.

    Example::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro.infer import MCMC
        >>> from pyro_flat import EntropySGLD
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0., 10.))
        ...     with pyro.plate("data", len(y), subsample_size=10) as idx:
        ...         pyro.sample("y", dist.Normal(mu, 1.), obs=y[idx])
        >>> mcmc = MCMC(EntropySGLD(model, eta=0.1, step_size=1e-3), num_samples=200,
        ...             warmup_steps=100, disable_progbar=True)
        >>> mcmc.run(torch.randn(100) + 3.)
        >>> sorted(mcmc.get_samples())
        ['mu', 'mu_aux']
    """

    def __init__(
        self,
        model: Optional[Callable] = None,
        *,
        potential_fn: Optional[Callable[[Params], torch.Tensor]] = None,
        eta: float,
        step_size: Optional[float] = None,
        temperature: float = 1.0,
        schedule=None,
        sites: Optional[Iterable[str]] = None,
        suffix: str = "_aux",
        coupling_metric: Union[str, float] = "pulled",
        **kwargs,
    ):
        self.eta = check_eta(eta)
        self.sites = None if sites is None else tuple(sites)
        self.suffix = suffix
        super().__init__(
            model,
            potential_fn=potential_fn,
            step_size=step_size,
            temperature=temperature,
            schedule=schedule,
            **kwargs,
        )
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
