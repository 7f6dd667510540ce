r"""Sharpness-aware SGLD (Nguyen et al., NeurIPS 2023, "Flat Seeking Bayesian Neural Networks")."""

from __future__ import annotations

from typing import Callable, Optional

from ..targets import Params
from ..models.sam import check_sam_radius, sam_perturbation
from .integrators import StepSize, Transition
from .sgld import SGLD


class SASGLD(SGLD):
    r"""Sharpness-aware SGLD: the Langevin step takes the gradient at the SAM-perturbed point.

    .. math::

        g = \widehat{\nabla U}(z), \qquad
        z \leftarrow z - \alpha\, \widehat{\nabla U}\Big(z + \rho\,\frac{g}{\lVert g\rVert}\Big)
            + \sqrt{2\alpha T}\,\xi,

    both gradients on the same minibatch (the norm runs over all sites, per chain). To first order
    in :math:`\rho`, :math:`\nabla U(z + \rho g/\lVert g\rVert) \approx \nabla\big(U(z) + \rho
    \lVert\nabla U(z)\rVert\big)`, so the chain targets the **sharpness-aware posterior**

    .. math:: \propto \exp\big(-U_\rho(z)/T\big), \qquad
              U_\rho(z) = \max_{\lVert\varepsilon\rVert \le \rho} U(z + \varepsilon)
              = U(z) + \rho\lVert\nabla U(z)\rVert + O(\rho^2),

    the flat posterior of Nguyen et al., up to :math:`O(\rho^2)` and the :math:`O(\alpha)`
    discretisation bias. In one dimension, for a :math:`U` symmetric about its minimum
    :math:`m`, it is exact: :math:`U_\rho(z) = U(|z - m| + \rho)` and the drift is
    :math:`-U_\rho'`. It costs **two** gradient evaluations per iteration (``grad_evals`` counts
    them); with minibatches :math:`\lVert g\rVert` is the minibatch gradient's norm, as in SAM.

    :param rho: perturbation radius :math:`\rho > 0` (in the unconstrained space).

    Other arguments as :class:`~pyro_flat.SGLD`.

    Example::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro_flat import MCMC, SASGLD
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0., 10.))
        ...     with pyro.plate("data", len(y), subsample_size=10) as idx:
        ...         pyro.sample("y", dist.Normal(mu, 1.), obs=y[idx])
        >>> kernel = SASGLD(model, rho=0.05, step_size=1e-3)
        >>> mcmc = MCMC(kernel, num_samples=100, warmup_steps=50, disable_progbar=True)
        >>> mcmc.run(torch.randn(100) + 3.)
        >>> mcmc.get_samples()["mu"].shape, kernel.num_grad_evals
        (torch.Size([100]), 300)
    """

    grads_per_iteration = 2

    def __init__(self, model: Optional[Callable] = None, *, rho: float, **kwargs):
        super().__init__(model, **kwargs)
        self.rho = check_sam_radius("rho", rho, type(self).__name__)

    def transition(self, params: Params, step_size: StepSize, temperature: float) -> Transition:
        indices = self.target.draw_indices()  # one minibatch for both gradients
        energy, grads, stats = self.target.evaluate(params, indices)
        ascent = {n: params[n] + e for n, e in sam_perturbation(grads, self.rho, self.num_chains).items()}
        _, sharp_grads = self.target.potential_and_grad(ascent, indices)
        return Transition(self.update(params, sharp_grads, step_size, temperature), energy, grads, stats)
