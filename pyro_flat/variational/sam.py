r"""``SAM_ELBO``: the sharpness-aware variational posterior (SA-BBB, Nguyen et al., NeurIPS 2023).

The standard ELBO's expected negative log-likelihood :math:`\ell(\theta)` is replaced by its worst
case in a ball of radius ρ, approximated by one SAM ascent step per particle:

.. math::
    \mathcal L(q) = \mathbb E_{\theta \sim q}\Big[\ell\big(\theta + \epsilon^*(\theta)\big)\Big]
                    + \mathrm{KL}(q \,\|\, p), \qquad
    \epsilon^*(\theta) = \rho\, \frac{\nabla \ell(\theta)}{\|\nabla \ell(\theta)\|},

with ε* computed on the same minibatch and treated as a constant; the gradient reaches q's
parameters through the reparameterised θ. ℓ is every observed site (and ``pyro.factor``); the
prior and guide terms (the KL) are evaluated at θ. Latents with a constrained support are
perturbed in their unconstrained coordinates. It costs two model evaluations per particle.

>>> import torch, pyro, pyro.distributions as dist
>>> from pyro.infer import SVI
>>> from pyro.infer.autoguide import AutoNormal
>>> from pyro_flat import SAM_ELBO
>>> def model(y):
...     mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
...     with pyro.plate("data", len(y), subsample_size=50) as idx:
...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
>>> pyro.clear_param_store(); pyro.set_rng_seed(0)
>>> y = torch.randn(500) + 3.0
>>> guide = AutoNormal(model)
>>> svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), SAM_ELBO(rho=0.05))
>>> for _ in range(300):
...     loss = svi.step(y)
>>> abs(float(guide.median()["mu"]) - float(y.mean())) < 0.1
True
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
from torch.distributions import biject_to, constraints

import pyro.poutine as poutine
from pyro.infer import ELBO, Trace_ELBO
from pyro.poutine.util import prune_subsample_sites

from ..models.sam import check_sam_radius, sam_perturbation
from ..validation import check_positive_int
from .data_parallel import ShareLatents, ranks_for, sum_gradients, sum_over_ranks, traced_params
from .minibatch import SameMinibatch


def check_base(base: Optional[ELBO], owner: str) -> ELBO:
    """The base ELBO (default ``Trace_ELBO()``), refused if its particles are vectorized."""
    base = Trace_ELBO() if base is None else base
    if not isinstance(base, ELBO):
        raise TypeError(f"{owner}: base must be a pyro.infer.ELBO such as Trace_ELBO(), got {base!r}")
    if base.vectorize_particles:
        raise ValueError(f"{owner} runs its particles one after another: pass a base ELBO with "
                         "vectorize_particles=False")
    check_positive_int("base.num_particles", base.num_particles, hint="Pass e.g. Trace_ELBO(num_particles=1).")
    return base


class SAM_ELBO(ELBO):
    """The ELBO whose likelihood term is evaluated after one SAM ascent step of size ``rho``.

    :param rho: radius of the ball in θ (unconstrained coordinates of every latent together).
    :param base: the ELBO it follows for the number of particles (default ``Trace_ELBO()``); the
        guide must be reparameterisable (every autoguide of continuous latents is).
    :param data_parallel: under ``torchrun``, each rank holds a shard of the data: the ascent direction
        and the gradient are summed over the ranks (:mod:`~pyro_flat.variational.data_parallel`).
    """

    def __init__(self, rho: float, base: Optional[ELBO] = None, *, data_parallel: bool = False):
        self.rho = check_sam_radius("rho", rho, "SAM_ELBO")
        self.base = check_base(base, "SAM_ELBO")
        self.data_parallel = bool(data_parallel)
        self._ranks = None
        super().__init__(num_particles=self.base.num_particles)

    @property
    def ranks(self):
        """The ranks the gradients are summed over (``None``: one process)."""
        if self.data_parallel and self._ranks is None:
            self._ranks = ranks_for(True)
        return self._ranks

    # --------------------------------------------------------------------- one particle
    def _particle(self, model, guide, args, kwargs) -> torch.Tensor:
        same = SameMinibatch()
        if self.ranks is not None:  # each rank counts 1/R of the prior and guide terms
            share = ShareLatents(1.0 / self.ranks.world_size)
            model, guide = share(model), share(guide)
        guide_trace = poutine.trace(same(guide)).get_trace(*args, **kwargs)
        model_trace = poutine.trace(poutine.replay(same(model), trace=guide_trace)).get_trace(*args, **kwargs)
        guide_trace, model_trace = prune_subsample_sites(guide_trace), prune_subsample_sites(model_trace)
        _check_reparameterised(guide_trace)
        model_trace.compute_log_prob()
        guide_trace.compute_log_prob()
        latents = [name for name, site in model_trace.nodes.items()
                   if site["type"] == "sample" and not site["is_observed"]]
        if not latents:
            raise ValueError("SAM_ELBO: the model has no latent sample site to perturb")
        if not any(model_trace.nodes[name]["value"].requires_grad for name in latents):
            raise ValueError(f"SAM_ELBO: the guide has no parameters to optimise: its draws of {latents} depend on "
                             "no pyro.param. Use a guide with parameters, e.g. AutoNormal(model), or sample from "
                             "distributions whose arguments are pyro.param sites.")
        nll = -sum(site["log_prob_sum"] for site in model_trace.nodes.values()
                   if site["type"] == "sample" and site["is_observed"])
        if not torch.is_tensor(nll) or not nll.requires_grad:
            raise ValueError("SAM_ELBO: no observed site depends on the latents; the sharpness term "
                             "needs a likelihood (an observed pyro.sample or pyro.factor)")
        perturbed = self._perturbed_values(model_trace, latents, nll)
        replay = guide_trace.copy()
        for name, value in perturbed.items():
            replay.nodes[name] = dict(replay.nodes[name], value=value)
        sharp_trace = prune_subsample_sites(
            poutine.trace(poutine.replay(same(model), trace=replay)).get_trace(*args, **kwargs))
        sharp_trace.compute_log_prob()
        sharp_nll = -sum(site["log_prob_sum"] for site in sharp_trace.nodes.values()
                         if site["type"] == "sample" and site["is_observed"])
        kl = (sum(site["log_prob_sum"] for site in guide_trace.nodes.values() if site["type"] == "sample")
              - sum(model_trace.nodes[name]["log_prob_sum"] for name in latents))
        return sharp_nll + kl

    def _perturbed_values(self, trace, latents: List[str], nll: torch.Tensor) -> Dict[str, torch.Tensor]:
        """θ + ε* per latent, ε* = ρ ∇ℓ/‖∇ℓ‖ in unconstrained coordinates (a constant)."""
        values = [trace.nodes[name]["value"] for name in latents]
        grads = torch.autograd.grad(nll, values, retain_graph=True, allow_unused=True)
        directions, transforms = [], []
        for name, value, grad in zip(latents, values, grads):
            support = trace.nodes[name]["fn"].support
            transform = None if _is_real(support) else biject_to(support)
            grad = torch.zeros_like(value) if grad is None else grad
            if transform is not None:  # chain rule to the unconstrained coordinates: a vector-Jacobian product
                u = transform.inv(value.detach()).requires_grad_()
                grad, = torch.autograd.grad(transform(u), u, grad)
            directions.append(grad.detach())
            transforms.append(transform)
        directions = sum_over_ranks(directions, self.ranks, "summing the ascent direction across ranks")
        steps = sam_perturbation(dict(zip(latents, directions)), self.rho)
        out = {}
        for name, value, transform in zip(latents, values, transforms):
            step = steps[name]
            out[name] = value + step if transform is None else transform(transform.inv(value) + step)
        return out

    # --------------------------------------------------------------------- the ELBO interface
    def differentiable_loss(self, model, guide, *args, **kwargs) -> torch.Tensor:
        return sum(self._particle(model, guide, args, kwargs) for _ in range(self.num_particles)) / self.num_particles

    def _get_trace(self, model, guide, args, kwargs):
        # the abstract hook every subclass of Pyro's ELBO implements (Pyro's own ELBOs do): the base ELBO's
        return self.base._get_trace(model, guide, args, kwargs)

    def loss(self, model, guide, *args, **kwargs) -> float:
        with torch.enable_grad():  # even under SVI.evaluate_loss's no_grad: the ascent direction is a gradient
            return float(self.differentiable_loss(model, guide, *args, **kwargs).detach())

    def loss_and_grads(self, model, guide, *args, **kwargs) -> float:
        total, params = 0.0, {}
        for _ in range(self.num_particles):
            loss, touched = traced_params(self._particle, model, guide, args, kwargs)
            params.update(touched)
            loss = loss / self.num_particles
            if loss.requires_grad:
                loss.backward()
            total += float(loss.detach())
        return sum_gradients(params, total, self.ranks)


def _is_real(support) -> bool:
    """Whether the support is the real line (also wrapped in `independent`): no transform needed."""
    base = getattr(support, "base_constraint", support)
    return base is constraints.real


def _check_reparameterised(guide_trace) -> None:
    for name, site in guide_trace.nodes.items():
        if site["type"] == "sample" and not site["is_observed"] and not getattr(site["fn"], "has_rsample", False):
            raise ValueError(f"the guide's site {name!r} ({type(site['fn']).__name__}) is not reparameterisable: "
                             "sharpness-aware ELBOs need reparameterised guides (e.g. AutoNormal)")


__all__ = ["SAM_ELBO"]
