r"""Entropy-MCMC with momentum: SGHMC on the joint of :math:`\theta` and its guiding twin :math:`\theta_a`."""

from __future__ import annotations

from .coupling import EntropyCoupling
from .sghmc import SGHMC


class EntropySGHMC(EntropyCoupling, SGHMC):
    r"""Entropy-MCMC with SGHMC updates: BAOAB with momenta for both :math:`\theta` and :math:`\theta_a`.

    The target is :math:`\propto \exp(-U/T)`,
    :math:`U(\theta, \theta_a) = f(\theta) + \lVert\theta - \theta_a\rVert^2/(2\eta)`, as for
    :class:`~pyro_flat.EntropySGLD`; each iteration is :class:`~pyro_flat.SGHMC`'s on the joint,
    with momenta :math:`(p, p_a)` and the joint gradient

    .. math::

        \nabla_\theta U = \widehat{\nabla f}(\theta) + \frac{\theta - \theta_a}{\eta}, \qquad
        \nabla_{\theta_a} U = \frac{\theta_a - \theta}{\eta},

    only :math:`\nabla f` a minibatch estimate. On a Gaussian :math:`f` with exact gradients the draws
    follow the joint exactly at every stable step: :math:`\theta` the posterior, :math:`\theta_a` the flat
    posterior :math:`p(\theta \mid D) * \mathcal N(0, T\eta I)`. The stiffest direction is the gap
    :math:`\theta - \theta_a` (curvature about :math:`2/\eta` plus :math:`f`'s): without a preconditioner
    the step needs :math:`\alpha(\lambda_{\max}(\nabla^2 f) + 2/\eta) < 2(1 + \mu)`.

    Arguments: ``eta``, ``sites``, ``suffix`` and ``coupling_metric`` as :class:`~pyro_flat.EntropySGLD`;
    ``step_size``, ``momentum`` or ``friction`` and the rest as :class:`~pyro_flat.SGHMC`.
    ``sample_stats`` gain ``coupling_distance``.

    Example::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro.infer import MCMC
        >>> from pyro_flat import EntropySGHMC
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0., 10.))
        ...     with pyro.plate("data", len(y), subsample_size=10) as idx:
        ...         pyro.sample("y", dist.Normal(mu, 1.), obs=y[idx])
        >>> mcmc = MCMC(EntropySGHMC(model, eta=0.1, step_size=1e-4), num_samples=200,
        ...             warmup_steps=100, disable_progbar=True)
        >>> mcmc.run(torch.randn(100) + 3.)
        >>> sorted(mcmc.get_samples())
        ['mu', 'mu_aux']
    """
