r"""Entropy-MCMC with SGLD updates (Li & Zhang, ICLR 2024, Algorithm 1)."""

from __future__ import annotations

from .coupling import EntropyCoupling
from .sgld import SGLD


class EntropySGLD(EntropyCoupling, SGLD):
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
