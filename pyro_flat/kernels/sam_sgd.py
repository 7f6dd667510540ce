r"""SAM (Foret et al., ICLR 2021) as a Pyro ``MCMCKernel``: the members of a sharpness-aware ensemble."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..targets import Params
from .sasgld import SASGLD


class SAMSGD(SASGLD):
    r"""Sharpness-aware minimisation: gradient descent with the gradient taken at SAM's ascent point.

    .. math:: g = \widehat{\nabla U}(z), \qquad
              z_{k+1} = z_k - \alpha_k\, \widehat{\nabla U}\Big(z_k + \rho\,\frac{g}{\lVert g\rVert}\Big),

    both gradients on the same minibatch (:func:`~pyro_flat.sam.sam_perturbation`, the norm per
    chain). It is :class:`~pyro_flat.SASGLD` at temperature 0, as :class:`~pyro_flat.SGD` is SGLD at
    temperature 0: not a sampler, each chain settles at (a neighbourhood of) a minimum of the
    sharpness-aware potential :math:`\max_{\lVert\varepsilon\rVert\le\rho} U(z+\varepsilon)`.
    Vectorized chains from different initial points are the members of a sharpness-aware deep
    ensemble (:func:`~pyro_flat.ensembles.fit_ensemble`). Two gradient evaluations per iteration.

    :param rho: the SAM radius :math:`\rho > 0` (unconstrained coordinates).

    Other arguments as :class:`~pyro_flat.SGD`.

    Example::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro_flat import MCMC
        >>> from pyro_flat.kernels import SAMSGD
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0., 10.))
        ...     with pyro.plate("data", len(y)):
        ...         pyro.sample("y", dist.Normal(mu, 1.), obs=y)
        >>> y = torch.randn(100) + 3.
        >>> mcmc = MCMC(SAMSGD(model, rho=0.01, step_size=1e-3), num_samples=1, warmup_steps=300,
        ...             disable_progbar=True)
        >>> mcmc.run(y)
        >>> bool((mcmc.get_samples()["mu"] - y.mean()).abs().max() < 0.05)
        True
    """

    allow_zero_temperature = True
    #: settings the class fixes itself (``kernel_settings`` leaves them out; ``make_kernel`` refuses them)
    fixed_settings = ("temperature",)

    def __init__(self, model: Optional[Callable] = None, *, rho: float,
                 potential_fn: Optional[Callable[[Params], torch.Tensor]] = None, **kwargs):
        if "temperature" in kwargs:
            raise ValueError("SAMSGD has no temperature (it is SASGLD at temperature 0); use SASGLD for "
                             "a sampler at temperature T.")
        super().__init__(model, rho=rho, potential_fn=potential_fn, temperature=0.0, **kwargs)
