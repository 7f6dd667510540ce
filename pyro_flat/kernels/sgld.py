r"""Stochastic-gradient Langevin dynamics (Welling & Teh, 2011) as a Pyro ``MCMCKernel``."""

from __future__ import annotations

from .integrators import StepSize
from .stochastic_gradient import StochasticGradientKernel
from ..targets import Params


class SGLD(StochasticGradientKernel):
    r"""Stochastic-gradient Langevin dynamics.

    .. math::

        z_{k+1} = z_k - \alpha_k \widehat{\nabla U}(z_k) + \sqrt{2\alpha_k T}\,\xi_k,
        \qquad \xi_k \sim \mathcal N(0, I),

    where :math:`z` are the model's latents in unconstrained space and
    :math:`\widehat{\nabla U}` is the gradient of the potential with the likelihood of a fresh
    minibatch scaled by :math:`N/B` (Pyro's ``pyro.plate(..., subsample_size=B)``; full batch
    without it). The chain targets :math:`\propto \exp(-U/T)` up to an :math:`O(\alpha)` bias.

    See :class:`~pyro_flat.kernels.stochastic_gradient.StochasticGradientKernel` for the arguments:
    ``preconditioner=`` makes it :math:`z - \alpha M^{-1}\widehat{\nabla U} + \sqrt{2\alpha T} L\xi`
    (:mod:`~pyro_flat.kernels.preconditioning`); a cyclical ``schedule`` (cSGMCMC) turns each
    cycle's exploration phase into noise-free steps that make no draw.

    Example::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro.infer import MCMC
        >>> from pyro_flat import SGLD
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0., 10.))
        ...     with pyro.plate("data", len(y), subsample_size=10) as idx:
        ...         pyro.sample("y", dist.Normal(mu, 1.), obs=y[idx])
        >>> y = torch.randn(100) + 3.
        >>> mcmc = MCMC(SGLD(model, step_size=1e-3), num_samples=200, warmup_steps=100,
        ...             disable_progbar=True)
        >>> mcmc.run(y)
        >>> mcmc.get_samples()["mu"].shape
        torch.Size([200])
    """

    def update(self, params: Params, grads: Params, step_size: StepSize, temperature: float) -> Params:
        return self.langevin(params, grads, step_size, temperature)
