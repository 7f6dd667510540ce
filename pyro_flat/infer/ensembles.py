r"""Deep ensembles (Lakshminarayanan et al. 2017) and sharpness-aware ensembles, vectorized over members.

:func:`fit_ensemble` runs M MAP fits from M initial points drawn by ``init_strategy`` (by default the
model's own initialisation if it has one, as a ``BayesianModule`` does, else the prior) as M chains of
:class:`~pyro_flat.SGD` (or, with ``rho``, of :class:`~pyro_flat.kernels.SAMSGD`) through
:class:`~pyro_flat.MCMC`: one batched network where the model broadcasts over a leading chain
dimension (as :class:`~pyro_flat.models.BayesianMLP` does), each member with its own seed and minibatches. The members are the chains' last iterates, so
Bayesian model averaging over the ensemble is :func:`~pyro_flat.bma_predict` over ``members``.

.. math:: \theta^{(m)}_{k+1} = \theta^{(m)}_k - \alpha_k \widehat{\nabla U}\big(\theta^{(m)}_k
          [+\ \varepsilon^*]\big), \qquad m = 1, \dots, M,

with :math:`\varepsilon^* = \rho g/\lVert g\rVert` per member for the sharpness-aware ensemble.

>>> import torch, pyro, pyro.distributions as dist
>>> def model(y):
...     mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
...     with pyro.plate("data", len(y)):
...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y)
>>> pyro.set_rng_seed(0)
>>> y = torch.randn(100) + 3.0
>>> ensemble = fit_ensemble(model, y, size=4, num_steps=400, step_size=1e-3)
>>> ensemble.members["mu"].shape
torch.Size([4])
>>> bool((ensemble.members["mu"] - y.mean()).abs().max() < 0.01)
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch

from ..validation import check_positive_int


@dataclass
class Ensemble:
    """The result of :func:`fit_ensemble`.

    :ivar members: ``{site: (size, ...)}``, the members' final weights (constrained space).
    :ivar potential: ``(size, records)``, the minibatch potential U at evenly spaced iterations of
        the second half of the run (its trend says whether the fits had settled).
    :ivar num_steps: iterations per member; ``grad_evals`` gradient evaluations per member.
    """

    members: Dict[str, torch.Tensor]
    potential: torch.Tensor
    num_steps: int
    grad_evals: int

    @property
    def size(self) -> int:
        return int(self.potential.shape[0])

    def loss_trend(self) -> Tuple[float, float]:
        """The members' mean potential over the last fifth of the records and over the fifth before."""
        records = self.potential.shape[1]
        fifth = max(1, records // 5)
        last = self.potential[:, -fifth:].mean()
        before = self.potential[:, -2 * fifth:-fifth].mean() if records >= 2 * fifth else last
        return float(last), float(before)


def fit_ensemble(model: Callable, *args, size: int, num_steps: int, step_size: float, rho: Optional[float] = None,
                 schedule=None, init_strategy: Optional[Callable] = None, minibatches: str = "per_chain",
                 progress: bool = False, **kwargs) -> Ensemble:
    """Train ``size`` MAP members of ``model`` by SGD (``rho=None``) or SAM (``rho > 0``), vectorized.

    :param model: a Pyro model whose latents are the weights; ``args``/``kwargs`` are its own
        (e.g. ``X, y, batch_size=100`` for a minibatched model).
    :param size: the number of members M >= 1.
    :param num_steps: iterations per member (SAM's cost 2 gradient evaluations each).
    :param step_size: the SGD step size α (or a ``schedule``).
    :param rho: SAM's radius: a sharpness-aware ensemble.
    :param init_strategy: where each member starts (a fresh draw per member). Default: the model's own
        start if it has one (a :class:`~pyro_flat.nn.BayesianModule`: PyTorch's initialisation of the
        network, run again per member), else a prior draw.
    :param minibatches: ``"per_chain"`` (each member its own minibatches) or ``"shared"``.
    """
    from ..evaluation.diagnostics import mcmc_sample_stats
    from ..kernels import SAMSGD, SGD
    from .mcmc import MCMC

    size = check_positive_int("size", size, hint="It is the number of ensemble members, e.g. size=5.")
    num_steps = check_positive_int("num_steps", num_steps, hint="Train each member for e.g. num_steps=2000.")
    if num_steps < 8:
        raise ValueError(f"num_steps={num_steps}: an ensemble needs at least 8 iterations per member "
                         "(the second half is recorded to show the loss trend)")
    settings = dict(step_size=step_size, schedule=schedule, init_strategy=init_strategy)
    kernel = SGD(model, **settings) if rho is None else SAMSGD(model, rho=rho, **settings)
    records = min(20, num_steps // 2)
    thinning = (num_steps // 2) // records
    mcmc = MCMC(kernel, num_samples=records * thinning, warmup_steps=num_steps - records * thinning,
                num_chains=size, thinning=thinning, minibatches=minibatches, disable_progbar=not progress)
    mcmc.run(*args, **kwargs)
    draws = mcmc.get_samples(group_by_chain=True)
    potential = mcmc_sample_stats(mcmc)["potential_energy"]
    return Ensemble(members={name: value[:, -1] for name, value in draws.items()}, potential=potential,
                    num_steps=num_steps, grad_evals=int(kernel.num_grad_evals))


__all__ = ["fit_ensemble", "Ensemble"]
