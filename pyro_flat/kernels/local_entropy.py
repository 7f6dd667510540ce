r"""Local-entropy baselines (Chaudhari et al., ICLR 2017): Entropy-SGD and Entropy-SGLD.

Li & Zhang (2024) call them "Entropy-SGD" and "Entropy-SGLD"; pyro-flat names them
:class:`LocalEntropySGD` and :class:`LocalEntropySGLD` so that they are not confused with
:class:`~pyro_flat.EntropySGLD` (Entropy-MCMC).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..validation import check_eta, check_number, check_positive, check_positive_int
from .integrators import StepSize, Transition, langevin_step
from .stochastic_gradient import StochasticGradientKernel
from ..targets import Params


class LocalEntropySGLD(StochasticGradientKernel):
    r"""Langevin dynamics on the local entropy, its gradient estimated by a nested SGLD chain.

    The local-entropy potential of :math:`U` at scope :math:`\eta` and temperature :math:`T` is

    .. math:: F(\theta) = -T \log \int \exp\!\Big(-\frac{U(\theta') +
              \lVert\theta' - \theta\rVert^2/(2\eta)}{T}\Big)\, d\theta',
              \qquad \nabla F(\theta) = \frac{\theta - \mathbb E[\theta' \mid \theta]}{\eta}.

    Each iteration runs an *inner* SGLD chain of ``num_inner_steps`` :math:`L` steps of size
    :math:`\alpha'` on :math:`U(\theta') + \lVert\theta' - \theta\rVert^2/(2\eta)`, started at
    :math:`\theta' = \theta`, and keeps an exponential running mean :math:`\mu` of its iterates:

    .. math::

        \theta' &\leftarrow \theta' - \alpha'\Big(\widehat{\nabla U}(\theta')
                   + \frac{\theta' - \theta}{\eta}\Big) + \sqrt{2\alpha' T}\,\xi', \qquad
        \mu \leftarrow (1 - a)\,\mu + a\,\theta' \quad (\mu = \theta \text{ at first}), \\
        \theta &\leftarrow \theta - \alpha\,\frac{\theta - \mu}{\eta} + \sqrt{2\alpha T}\,\xi .

    With ``outer_noise=False`` (:class:`LocalEntropySGD`, Chaudhari et al.'s Entropy-SGD) the last
    line has no noise and :math:`\theta` descends :math:`F`. With noise (Entropy-SGLD), the draws
    target :math:`\propto \exp(-F/T)`: **the flat posterior**, the :math:`\theta_a`-marginal of the
    Entropy-MCMC joint, the same law as :class:`~pyro_flat.EntropySGLD`'s twins, under the model's
    own site names. :math:`\mu` is a biased estimate of :math:`\mathbb E[\theta' \mid \theta]`
    (finite :math:`L`, a start at :math:`\theta`, an average of correlated iterates); that bias is
    the extra term of these methods' convergence bounds (:mod:`pyro_flat.theory`).

    Each iteration costs :math:`L` gradient evaluations of :math:`U` (the first, at
    :math:`\theta' = \theta`, also gives the ``potential_energy`` statistic); ``grad_evals`` in
    ``sample_stats`` counts them.

    :param eta: scope :math:`\eta > 0` (Chaudhari et al.'s :math:`1/\gamma`).
    :param step_size: outer step :math:`\alpha`.
    :param num_inner_steps: :math:`L \ge 1` (Chaudhari et al. use 20).
    :param inner_step_size: :math:`\alpha'` (default: ``step_size``).
    :param mean_weight: :math:`a \in (0, 1]`, the weight of the newest inner iterate in
        :math:`\mu` (default 0.25; ``1`` keeps only the last iterate).
    :param outer_noise: Langevin noise on the outer step (Entropy-SGLD) or not (Entropy-SGD).

    ``temperature``, ``schedule`` (of the outer step), ``model``/``potential_fn`` and the rest as
    :class:`~pyro_flat.SGLD`.

    Example::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro_flat import MCMC, LocalEntropySGLD
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0., 10.))
        ...     with pyro.plate("data", len(y), subsample_size=10) as idx:
        ...         pyro.sample("y", dist.Normal(mu, 1.), obs=y[idx])
        >>> kernel = LocalEntropySGLD(model, eta=0.1, step_size=1e-2, inner_step_size=1e-3,
        ...                           num_inner_steps=5)
        >>> mcmc = MCMC(kernel, num_samples=100, warmup_steps=50, disable_progbar=True)
        >>> mcmc.run(torch.randn(100) + 3.)
        >>> mcmc.get_samples()["mu"].shape, kernel.num_grad_evals
        (torch.Size([100]), 750)
    """

    outer_noise_default = True

    def __init__(
        self,
        model: Optional[Callable] = None,
        *,
        potential_fn: Optional[Callable[[Params], torch.Tensor]] = None,
        eta: float,
        step_size: float,
        num_inner_steps: int = 20,
        inner_step_size: Optional[float] = None,
        mean_weight: float = 0.25,
        outer_noise: Optional[bool] = None,
        temperature: float = 1.0,
        schedule=None,
        **kwargs,
    ):
        if kwargs.get("preconditioner") is not None:
            raise ValueError(f"{type(self).__name__} takes no preconditioner: its inner chain samples "
                             "a different conditional law at every step. Use EntropySGLD(..., "
                             "preconditioner='dense') for a preconditioned flat posterior.")
        super().__init__(model, potential_fn=potential_fn, step_size=step_size,
                         temperature=temperature, schedule=schedule, **kwargs)
        self.eta = check_eta(eta)
        self.num_inner_steps = check_positive_int("num_inner_steps", num_inner_steps,
                                                  hint="It is the length of the inner SGLD chain (Chaudhari et al. use 20).")
        self.inner_step_size = (self.step_size if inner_step_size is None else
                                check_positive("inner_step_size", inner_step_size,
                                               hint="It must keep the inner chain stable: "
                                               "inner_step_size * (curvature + 1/eta) < 1."))
        a = check_number("mean_weight", mean_weight, "0.25")
        if not 0.0 < a <= 1.0:
            raise ValueError(f"mean_weight must lie in (0, 1], got mean_weight={mean_weight!r}.")
        self.mean_weight = a
        self.outer_noise = self.outer_noise_default if outer_noise is None else bool(outer_noise)

    @property
    def grads_per_iteration(self) -> int:
        return self.num_inner_steps

    def transition(self, params: Params, step_size: StepSize, temperature: float) -> Transition:
        names = list(params)
        theta = [params[n] for n in names]
        inner, mean = params, theta
        energy = grads = stats = None
        for step in range(self.num_inner_steps):
            inner_energy, g, inner_stats = self.target.evaluate(inner)
            if step == 0:  # theta' = theta: the potential at the draw, for free
                energy, grads, stats = inner_energy, g, inner_stats
            # the inner chain is SGLD on U(theta') + |theta' - theta|^2 / (2 eta)
            pull = torch._foreach_sub([inner[n] for n in names], theta)
            torch._foreach_div_(pull, self.eta)
            torch._foreach_add_(pull, [g[n] for n in names])
            inner = langevin_step(inner, dict(zip(names, pull)), self.inner_step_size, self.temperature)
            mean = torch._foreach_lerp(mean, [inner[n] for n in names], self.mean_weight)
        # the outer step follows the local-entropy gradient estimate (theta - mu) / eta
        local_grad = torch._foreach_sub(theta, mean)
        torch._foreach_div_(local_grad, self.eta)
        # a divergence in the inner chain reaches the new point through the mean
        new = langevin_step(params, dict(zip(names, local_grad)), step_size,
                            temperature if self.outer_noise else 0.0)
        return Transition(new, energy, grads, stats)


class LocalEntropySGD(LocalEntropySGLD):
    r"""Entropy-SGD (Chaudhari et al., 2017): gradient descent on the local entropy.

    :class:`LocalEntropySGLD` with ``outer_noise=False``: the outer step is
    :math:`\theta \leftarrow \theta - \alpha(\theta - \mu)/\eta`, the inner chain keeps its
    Langevin noise at temperature :math:`T` (Chaudhari et al.'s "thermal noise"). An optimiser,
    not a sampler: each chain settles near a minimum of the local entropy :math:`F`.

    Example::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro_flat import MCMC, LocalEntropySGD
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0., 10.))
        ...     with pyro.plate("data", len(y)):
        ...         pyro.sample("y", dist.Normal(mu, 1.), obs=y)
        >>> kernel = LocalEntropySGD(model, eta=0.1, step_size=1e-2, inner_step_size=1e-3,
        ...                          num_inner_steps=5)
        >>> mcmc = MCMC(kernel, num_samples=10, warmup_steps=100, disable_progbar=True)
        >>> mcmc.run(torch.randn(100) + 3.)
        >>> mcmc.get_samples()["mu"].shape
        torch.Size([10])
    """

    outer_noise_default = False
