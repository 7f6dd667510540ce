r"""Stochastic gradient descent (the MAP baseline) as a Pyro ``MCMCKernel``."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..targets import Params
from .sgld import SGLD


class SGD(SGLD):
    r"""Stochastic gradient descent on the potential: SGLD without noise.

    .. math:: z_{k+1} = z_k - \alpha_k \widehat{\nabla U}(z_k).

    Not a sampler: each chain converges to (a neighbourhood of, with minibatches) the MAP
    estimate, so its "draws" are a point mass per chain. It runs through the same driver as the
    samplers so that they can be compared per iteration and per gradient evaluation.
    Arguments as :class:`~pyro_flat.SGLD`, without ``temperature``.

    Example::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro_flat import MCMC, SGD
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0., 10.))
        ...     with pyro.plate("data", len(y)):
        ...         pyro.sample("y", dist.Normal(mu, 1.), obs=y)
        >>> y = torch.randn(100) + 3.
        >>> mcmc = MCMC(SGD(model, step_size=1e-3), num_samples=10, warmup_steps=200,
        ...             disable_progbar=True)
        >>> mcmc.run(y)
        >>> bool((mcmc.get_samples()["mu"] - y.sum() / (len(y) + 0.01)).abs().max() < 1e-3)
        True
    """

    allow_zero_temperature = True
    #: settings the class fixes itself (``kernel_settings`` leaves them out; ``make_kernel`` refuses them)
    fixed_settings = ("temperature",)

    def __init__(self, model: Optional[Callable] = None, *,
                 potential_fn: Optional[Callable[[Params], torch.Tensor]] = None,
                 step_size: Optional[float] = None, schedule=None, **kwargs):
        if "temperature" in kwargs:
            raise ValueError("SGD has no temperature (it is SGLD at temperature 0); use SGLD for "
                             "a sampler at temperature T.")
        super().__init__(model, potential_fn=potential_fn, step_size=step_size, temperature=0.0,
                         schedule=schedule, **kwargs)
