r"""Flatness-aware SGLD (fSGLD; Bruno, Hwang, An, Sabanis & Lim, arXiv 2510.02174)."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..chains.shard import chain_randn_like_each
from ..validation import check_positive
from ..targets import Params
from .integrators import StepSize, Transition
from .sgld import SGLD


class FlatSGLD(SGLD):
    r"""fSGLD: the Langevin step takes the gradient at a randomly perturbed point.

    .. math::

        \varepsilon \sim \mathcal N(0, \sigma^2 I), \qquad
        z \leftarrow z - \alpha\, \widehat{\nabla U}(z + \varepsilon) + \sqrt{2\alpha T}\,\xi .

    Since :math:`\mathbb E_\varepsilon \nabla U(z + \varepsilon) = \nabla \bar U_\sigma(z)`, the
    chain is SGLD on the **randomly smoothed energy** (random weight perturbation) and targets

    .. math:: \propto \exp\big(-\bar U_\sigma(z)/T\big), \qquad
              \bar U_\sigma(z) = \mathbb E_{\varepsilon\sim\mathcal N(0,\sigma^2 I)}\, U(z + \varepsilon)
              = U(z) + \tfrac{\sigma^2}{2}\operatorname{tr}\nabla^2 U(z) + O(\sigma^4),

    a Hessian-trace-regularised posterior, up to the :math:`O(\alpha)` bias of the extra gradient
    noise :math:`\nabla U(z+\varepsilon) - \nabla\bar U_\sigma(z)`. Note the difference from the
    Entropy-MCMC flat posterior, which smooths the *density* (:math:`p * \mathcal N(0, \eta I)`):
    fSGLD smooths the *energy*, so for a Gaussian posterior (constant trace) its target is the
    posterior itself. Bruno et al. couple :math:`\sigma` to the temperature; here both are free.
    One gradient evaluation per iteration, plus one gradient-free evaluation of the potential at
    :math:`z` on the same minibatch for the ``potential_energy`` statistic and the divergence check.

    :param sigma: perturbation scale :math:`\sigma > 0` (in the unconstrained space).

    Other arguments as :class:`~pyro_flat.SGLD`.

    Example::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro_flat import MCMC, FlatSGLD
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0., 10.))
        ...     with pyro.plate("data", len(y), subsample_size=10) as idx:
        ...         pyro.sample("y", dist.Normal(mu, 1.), obs=y[idx])
        >>> mcmc = MCMC(FlatSGLD(model, sigma=0.05, step_size=1e-3), num_samples=100,
        ...             warmup_steps=50, disable_progbar=True)
        >>> mcmc.run(torch.randn(100) + 3.)
        >>> mcmc.get_samples()["mu"].shape
        torch.Size([100])
    """

    def __init__(self, model: Optional[Callable] = None, *, sigma: float, **kwargs):
        super().__init__(model, **kwargs)
        self.sigma = check_positive("sigma", sigma, hint="It is the sd of the weight perturbation.")

    def transition(self, params: Params, step_size: StepSize, temperature: float) -> Transition:
        indices = self.target.draw_indices()
        noise = chain_randn_like_each(params.values())
        perturbed = {n: z + self.sigma * e for (n, z), e in zip(params.items(), noise)}
        _, grads = self.target.potential_and_grad(perturbed, indices)
        with torch.no_grad():
            energy = self.target(params, indices).detach()
        return Transition(self.update(params, grads, step_size, temperature), energy, grads, {})
