r"""The fits of ``pyro-flat transfer``: each method fine-tunes (or puts a posterior on) part of the same pre-trained
network, on the same shots, for the same ``iterations`` steps in ``cycles`` cosine cycles (:func:`fit_method`).

======================  =================================================================  =====================
method                  what it does                                                       the Bayesian part
======================  =================================================================  =====================
``sgd-block``           SGD (pyro-flat's ``SGD`` kernel), the last iterate                 last stage + head
``sgd-adapters``        the same on low-rank adapters (:func:`~pyro_flat.nn.low_rank_adapters`) adapters + head
``swag-block``          :class:`~pyro_flat.variational.AutoSWAG` by SGD                    last stage + head
``laplace-head``        :class:`~pyro_flat.variational.LastLayerLaplace` on ``sgd-block``  head
``vi-block``            mean-field VI (``AutoNormal``, ``Trace_ELBO``) via ``transfer_model``  last stage + head
``sabma-block``         the same guide and steps with ``SABMA_ELBO`` (SA-BMA)              last stage + head
``sgld-block``          SGLD                                                               last stage + head
``emcmc-block``         Entropy-MCMC (``EntropySGLD``)                                     last stage + head
``sgld-adapters``       SGLD                                                               adapters + head
``emcmc-adapters``      Entropy-MCMC                                                       adapters + head
======================  =================================================================  =====================

Every posterior is the same: a Normal prior of precision :math:`N w` centred on the pre-trained weights (and the new
head at 0), the shots' likelihood, at the Entropy-MCMC paper's temperature :math:`T` (the variational fits maximise
:math:`\mathbb{E}_q[\log p(D, \theta)]/T + H(q)`, the ELBO of the same tempered posterior). The step size is
:math:`\ell/N`; Entropy-MCMC's :math:`\eta = \ell/(N c)` at the per-step coupling :math:`c` (0.025, the paper's);
θa has no prior of its own (the joint is exact). The last-layer Laplace approximation is laplace-torch's standard
post-hoc one (temperature 1, its prior precision by the marginal likelihood), written here because laplace-torch
needs torchvision, which has no build for this machine's torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch

import pyro
import pyro.poutine as poutine

from ... import schedules
from ...infer.mcmc import MCMC
from ...kernels import make_kernel
from ...nn import BayesianModule, low_rank_adapters
from .config import POINT_METHODS, SAMPLERS, TransferConfig
from .pretrain import head_features, last_stage, load_weights

LABELS = {"sgd-block": "SGD (last block)", "sgd-adapters": "SGD (adapters)", "swag-block": "SWAG (last block)",
          "laplace-head": "Laplace (last layer)", "vi-block": "VI (last block)", "sabma-block": "SA-BMA (last block)",
          "sgld-block": "SGLD (last block)", "emcmc-block": "Entropy-MCMC (last block)",
          "sgld-adapters": "SGLD (adapters)", "emcmc-adapters": "Entropy-MCMC (adapters)"}


@dataclass
class TransferFit:
    """One method at one seed and one number of shots: the draws of its model average ``{site: (draws, ...)}``
    (SGD: its last iterate), its point at the end of each cycle ``{site: (cycles, ...)}``, the model they are
    sites of, and what it cost."""

    method: str
    model: BayesianModule
    samples: Dict[str, torch.Tensor]
    #: ``None`` for ``laplace-head``, whose convergence is that of the SGD fit it starts from
    cycle_ends: Optional[Dict[str, torch.Tensor]]
    grad_evals: int
    seconds: float
    extra: Dict[str, float] = field(default_factory=dict)
    #: the model average's probabilities for images, where it is not ``bma_predict`` over ``samples`` (Laplace:
    #: its Monte Carlo average over the head on the features, which the fixed network computes once)
    predict: Optional[Callable[[torch.Tensor], torch.Tensor]] = None

    @property
    def uses(self) -> List[str]:
        return ["theta", "aux"] if any(k.endswith("_aux") for k in self.samples) else ["theta"]


@dataclass
class Task:
    """A transfer task at one seed: the shots, the network with its new head, and the scaled protocol."""

    X: torch.Tensor
    y: torch.Tensor
    net: torch.nn.Module
    num_classes: int
    seed: int
    step_size: float
    prior_sd: float
    eta: float
    batch_size: int


def make_task(config: TransferConfig, X: torch.Tensor, y: torch.Tensor, net: torch.nn.Module, num_classes: int,
              seed: int) -> Task:
    p, n = config.protocol(), len(X)
    step = float(p["lr"]) / n
    return Task(X, y, net, num_classes, seed, step, 1.0 / (n * config.weight_decay) ** 0.5, step / config.coupling,
                min(int(p["batch_size"]), n))


def bayesian_part(method: str, task: Task, config: TransferConfig) -> BayesianModule:
    """The model whose sites are ``method``'s Bayesian part (the rest of the network fixed at its weights)."""
    stage = last_stage(task.net)
    if method.endswith("adapters"):
        torch.manual_seed(task.seed)  # the adapters' A factors: PyTorch's initialisation, seeded
        net = low_rank_adapters(task.net, rank=config.rank, targets=[f"{stage}.*"])
        sampled = ["*.lora_A", "*.lora_B", "linear.*"]
    else:
        net, sampled = task.net, [f"{stage}.*", "linear.*"]
    return BayesianModule(net, prior=task.prior_sd, sampled=sampled, prior_mean="module")


def _cycle_plan(config: TransferConfig, method: str) -> Dict[str, int]:
    iterations = int(config.protocol()["iterations"])
    cycle = iterations // config.cycles
    if method in POINT_METHODS:
        return dict(cycle=cycle, sampled=1, thinning=1)
    sampled = cycle // 4 - (cycle // 4) % config.draws_per_cycle
    return dict(cycle=cycle, sampled=sampled, thinning=sampled // config.draws_per_cycle)


def _fit_chain(method: str, task: Task, config: TransferConfig) -> TransferFit:
    model = bayesian_part(method, task, config)
    plan = _cycle_plan(config, method)
    settings = {"step_size": task.step_size}
    if method not in POINT_METHODS:
        settings["temperature"] = config.temperature
    if SAMPLERS[method] == "entropy-sgld":
        settings["eta"] = task.eta
    schedule = schedules.cyclical_cosine(num_steps=plan["cycle"] * config.cycles, num_cycles=config.cycles,
                                         exploration=1 - plan["sampled"] / plan["cycle"],
                                         exploration_noise=method not in POINT_METHODS)
    kernel = make_kernel(SAMPLERS[method], model, schedule=schedule, **settings)
    pyro.set_rng_seed(task.seed)
    mcmc = MCMC(kernel, num_samples=plan["sampled"] * config.cycles, warmup_steps=0, thinning=plan["thinning"],
                initial_params=model.initial_params(), disable_progbar=True)
    start = time.perf_counter()
    mcmc.run(task.X, task.y, batch_size=task.batch_size)
    seconds = time.perf_counter() - start
    samples = {k: v.detach() for k, v in mcmc.get_samples().items()}
    per_cycle = len(next(iter(samples.values()))) // config.cycles
    ends = {k: v[per_cycle - 1::per_cycle] for k, v in samples.items()}
    if method in POINT_METHODS:
        samples = {k: v[-1:] for k, v in samples.items()}
    steps = plan["cycle"] * config.cycles
    return TransferFit(method, model, samples, ends, steps * kernel.grads_per_iteration, seconds)


def _svi_run(model, guide, loss, task: Task, config: TransferConfig, optimiser) -> Dict[str, torch.Tensor]:
    """``iterations`` SVI steps in ``cycles`` stretches; the guide's median at the end of each stretch."""
    from pyro.infer import SVI

    iterations = int(config.protocol()["iterations"])
    svi = SVI(model, guide, optimiser, loss)
    per = iterations // config.cycles
    ends = []
    for _ in range(config.cycles):
        for _ in range(per):
            svi.step(task.X, task.y, batch_size=task.batch_size)
        with torch.no_grad():
            ends.append({k: v.detach().clone() for k, v in guide.median(task.X, task.y).items()})
    return {k: torch.stack([e[k] for e in ends]) for k in ends[0]}


def _guide_draws(guide, task: Task, num: int) -> Dict[str, torch.Tensor]:
    with torch.no_grad():
        draws = [guide(task.X, task.y, batch_size=task.batch_size) for _ in range(num)]
    return {k: torch.stack([d[k] for d in draws]).detach() for k in draws[0]}


def _fit_variational(method: str, task: Task, config: TransferConfig) -> TransferFit:
    from pyro.infer import Trace_ELBO
    from pyro.infer.autoguide import AutoNormal
    from pyro.infer.autoguide.initialization import init_to_value

    from ...variational import SABMA_ELBO, transfer_model

    part = bayesian_part(method, task, config)  # the sites the draws are of (the last stage and the head)
    stage = last_stage(task.net)
    everything = BayesianModule(task.net, prior=task.prior_sd, prior_mean="module")
    model = poutine.scale(transfer_model(everything, task.net, variational=[stage, "linear"]),
                          scale=1.0 / config.temperature)
    start_values = {k: v.detach().clone() for k, v in task.net.named_parameters() if k in part.shapes}
    guide = AutoNormal(model, init_loc_fn=init_to_value(values=start_values), init_scale=1e-3)
    iterations = int(config.protocol()["iterations"])
    optimiser = pyro.optim.ClippedAdam({"lr": config.svi_lr, "lrd": 0.1 ** (1.0 / iterations)})
    loss = SABMA_ELBO(config.sabma_gamma) if method == "sabma-block" else Trace_ELBO()
    pyro.clear_param_store()
    pyro.set_rng_seed(task.seed)
    start = time.perf_counter()
    ends = _svi_run(model, guide, loss, task, config, optimiser)
    seconds = time.perf_counter() - start
    samples = _guide_draws(guide, task, config.draws)
    return TransferFit(method, part, samples, ends, iterations * (2 if method == "sabma-block" else 1), seconds)


def _fit_swag(method: str, task: Task, config: TransferConfig) -> TransferFit:
    from pyro.infer import Trace_ELBO
    from pyro.infer.autoguide.initialization import init_to_value

    from ...variational import AutoSWAG

    model = bayesian_part(method, task, config)
    iterations = int(config.protocol()["iterations"])
    window = iterations - iterations // 2  # the second half is collected, at least once an epoch
    epoch = -(-len(task.X) // task.batch_size)
    rank = min(config.swag_rank, max(2, window // 2))
    every = max(1, min(epoch, window // (2 * rank)))
    start_values = {k: v.detach().clone() for k, v in task.net.named_parameters() if k in model.shapes}
    guide = AutoSWAG(model, rank=rank, collect_start=iterations // 2, collect_every=every,
                     init_loc_fn=init_to_value(values=start_values))
    pyro.clear_param_store()
    pyro.set_rng_seed(task.seed)
    start = time.perf_counter()
    ends = _svi_run(model, guide, Trace_ELBO(), task, config, pyro.optim.SGD({"lr": task.step_size}))
    seconds = time.perf_counter() - start
    guide.eval()
    samples = _guide_draws(guide, task, config.draws)
    return TransferFit(method, model, samples, ends, iterations, seconds, {"swag_rank": rank})


def fit_laplace(sgd: TransferFit, task: Task, config: TransferConfig) -> TransferFit:
    """The last-layer Laplace posterior of ``sgd``'s (``sgd-block``'s) fine-tuned network: features at its weights
    (BatchNorm statistics of the shots), the head's GGN, the prior precision by the marginal likelihood. Its model
    average is ``laplace_draws`` draws of the head on the features (the rest of the network is fixed: its features
    are computed once)."""
    from ...variational import LastLayerLaplace

    start = time.perf_counter()
    tuned = load_weights(task.net, {k: v[-1] for k, v in sgd.samples.items()})
    features_of = head_features(tuned, task.X)  # the fixed network's features, its statistics over the shots
    features = features_of(task.X)
    laplace = LastLayerLaplace(features, task.y, tuned.linear.weight.detach(), tuned.linear.bias.detach())
    seconds = sgd.seconds + time.perf_counter() - start
    generator = torch.Generator(device=features.device).manual_seed(task.seed)
    draws = laplace.sample(config.laplace_draws, generator=generator)
    samples = {"linear.weight": draws["weight"], "linear.bias": draws["bias"]}
    model = BayesianModule(tuned, prior=1.0, sampled=["linear.*"])

    def predict(images: torch.Tensor) -> torch.Tensor:
        logits = features_of(images) @ samples["linear.weight"].transpose(1, 2) \
            + samples["linear.bias"][:, None]
        return logits.softmax(-1).mean(0)

    return TransferFit("laplace-head", model, samples, None, sgd.grad_evals, seconds,
                       {"prior_precision": float(laplace.prior_precision)}, predict)


def fit_method(method: str, task: Task, config: TransferConfig, sgd: Optional[TransferFit] = None) -> TransferFit:
    """``method``'s fit of ``task`` (``laplace-head`` from ``sgd``, the ``sgd-block`` fit of the same task)."""
    if method == "laplace-head":
        return fit_laplace(sgd, task, config)
    fitter: Callable = (_fit_swag if method == "swag-block" else _fit_variational if method in ("vi-block", "sabma-block")
                        else _fit_chain)
    return fitter(method, task, config)


__all__ = ["TransferFit", "Task", "make_task", "fit_method", "bayesian_part", "LABELS"]
