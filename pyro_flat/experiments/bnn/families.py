r"""The fits of ``pyro-flat bnn``: each BNN family of "Flat Seeking BNNs", plain and sharpness-aware.

One function, :func:`fit_method`, trains the study's network (:func:`bnn_network`: the
:class:`~pyro_flat.models.BayesianMLP` or, with ``--network cnn``, the
:class:`~pyro_flat.models.BayesianCNN`; every method takes either, as the same kind of Pyro model)
with one method and returns a :class:`Fit`: the draws of its posterior for the Bayesian model
average, the points where flatness is measured, and the objective along the second half of the run (is it still
falling?). Every trajectory — a chain, an ensemble member, a variational fit — makes
``config.grad_evals`` gradient evaluations on minibatches; a SAM step costs two, so the
sharpness-aware versions make half as many steps.

==============  =======================  ==========================================  ============
family          plain                    sharpness-aware (the one SAM step,          runs as
                                         :func:`pyro_flat.sam.sam_perturbation`)
==============  =======================  ==========================================  ============
SGLD            ``sgld``                 ``sasgld`` (ρ)                              C chains
BBB             ``bbb`` (Trace_ELBO)     ``sa-bbb`` (SAM_ELBO, ``sam_rho`` in        SVI, Adam
                                         weight space at each draw θ ~ q)
SWAG            ``swag`` (AutoSWAG, SGD) ``sa-swag`` (SAM iterates, ρ)               SVI, SGD
MC-dropout      ``dropout`` (AutoDelta)  ``sa-dropout`` (ρ)                          SVI, SGD
ensemble        ``ensemble`` (C members) ``sa-ensemble`` (ρ)                         C chains
==============  =======================  ==========================================  ============

and, against a baseline, ``entropy-sgld`` and ``flat-sgld`` (SGLD's) and ``sabma`` (SA-BMA,
BBB's). The SGD-based methods share ``step_size`` and ρ, so the sharpness-aware versions differ from
their baselines in the SAM step (and so make half as many steps).

``sabma`` is the SA-BMA paper's pipeline within the same budget (:func:`sabma_split`): half of the
gradient evaluations go to a SWAG fit (``AutoSWAG`` by SGD, the ``swag`` row's settings on its
shorter run), and the other half to :class:`~pyro_flat.SABMA_ELBO` from
``AutoSWAG.low_rank_guide()`` (Adam, as the BBB rows), two evaluations a step.

>>> from pyro_flat.experiments.configs import BNNConfig, BNN_FAMILIES
>>> [pair for pair in BNN_FAMILIES.values()][:2]
[('sgld', 'sasgld'), ('bbb', 'sa-bbb')]
>>> METHOD_LABELS["sa-dropout"], steps_for("sa-dropout", BNNConfig(grad_evals=1000))
('SA-MC-dropout', 500)
>>> sabma_split(BNNConfig(grad_evals=1000)), steps_for("sabma", BNNConfig(grad_evals=1000))  # 500 + 2 x 250
((500, 250), 750)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch

import pyro

from ...evaluation.diagnostics import mcmc_sample_stats
from ...kernels import kernel_class, make_kernel
from ...infer.mcmc import MCMC
from ...models.zoo import BayesianClassifier, BayesianCNN, BayesianMLP
from ..configs import BNN_METHODS, BNN_OWN_SETTING, BNNConfig
from ..output import StudyError

#: the rows' names of the methods
METHOD_LABELS = {"sgld": "SGLD", "sasgld": "SASGLD", "entropy-sgld": "EntropySGLD", "flat-sgld": "FlatSGLD",
                 "bbb": "BBB", "sa-bbb": "SA-BBB", "sabma": "SA-BMA", "swag": "SWAG", "sa-swag": "SA-SWAG",
                 "dropout": "MC-dropout", "sa-dropout": "SA-MC-dropout", "ensemble": "ensemble",
                 "sa-ensemble": "SA-ensemble"}
#: the methods that take SAM's two gradient evaluations per step (``sabma`` takes one per step of its
#: SWAG phase and two per step of its SA-BMA phase: :func:`sabma_split`)
TWO_GRADIENT_METHODS = ("sasgld", "sa-bbb", "sa-swag", "sa-dropout", "sa-ensemble")


@dataclass
class Fit:
    """One method's fit at one seed.

    :ivar samples: ``{site: (S, ...)}``, the draws averaged by the BMA (EntropySGLD's with their
        ``_aux`` twins).
    :ivar flat_points: ``{site: (P, ...)}``, where the Hessian is measured (the draws, or the one MAP
        point of MC-dropout, measured without dropout).
    :ivar uses: the variables evaluated: ``("theta",)``, or ``("theta", "aux")`` for EntropySGLD.
    :ivar records: ``(trajectories, R)``, the objective per training image (the minibatch potential,
        or the negative ELBO) at R evenly spaced steps of the second half of each trajectory (SA-BMA's:
        of its SA-BMA phase).
    :ivar guide: the SVI fits' guide (``AutoNormal``, ``AutoSWAG``, ``AutoDelta``, or SA-BMA's
        ``AutoLowRankMultivariateNormal``); ``None`` for the samplers and ensembles.
    :ivar swag: SA-BMA's SWAG fit, the ``AutoSWAG`` its guide started from; ``None`` otherwise.
    """

    method: str
    model: BayesianClassifier
    samples: Dict[str, torch.Tensor]
    flat_points: Dict[str, torch.Tensor]
    uses: Tuple[str, ...]
    steps: int
    grad_evals: int
    seconds: float
    records: torch.Tensor
    guide: Optional[object] = None
    swag: Optional[object] = None

    @property
    def label(self) -> str:
        return METHOD_LABELS[self.method]


def loss_trend(records) -> Tuple[float, float]:
    """How much the objective fell from the second-to-last fifth of the records to the last:
    ``(drop, standard error)``. Several trajectories: the mean of their drops ± its standard error
    (they are independent); one: the difference of the two fifths' means ± the error of each
    (minibatch noise between steps, taken as independent).

    With one trajectory of fewer than 10 records (a fifth of one record) the error is unknown: nan.

    >>> loss_trend(torch.tensor([[5.0, 5.0, 4.0, 4.0, 3.0, 3.0, 2.0, 2.0, 1.0, 1.0]]))
    (1.0, 0.0)
    """
    records = torch.as_tensor(records, dtype=torch.float64)
    fifth = max(1, records.shape[1] // 5)
    before, last = records[:, -2 * fifth:-fifth], records[:, -fifth:]
    if before.shape[1] == 0:
        return 0.0, float("nan")
    drops = before.mean(1) - last.mean(1)
    if len(drops) > 1:
        return float(drops.mean()), float(drops.std() / np.sqrt(len(drops)))
    if fifth < 2:
        return float(drops[0]), float("nan")
    se = torch.sqrt(before.var(1, unbiased=True) / before.shape[1] + last.var(1, unbiased=True) / last.shape[1])
    return float(drops[0]), float(se[0])


#: the share of SA-BMA's gradient evaluations that goes to its SWAG phase
SABMA_SWAG_SHARE = 0.5


def sabma_split(config: BNNConfig) -> Tuple[int, int]:
    """SA-BMA's ``(SWAG steps, SA-BMA steps)`` within ``config.grad_evals``: ``SABMA_SWAG_SHARE`` of the
    evaluations (rounded so that the rest is even) to SWAG's SGD steps at one evaluation each, the rest
    to SABMA_ELBO's steps at two each, so ``swag + 2 * sabma == grad_evals`` exactly (the study
    requires ``grad_evals >= 16``: at least 4 SA-BMA steps and 8 SWAG steps)."""
    sabma = int(config.grad_evals * (1 - SABMA_SWAG_SHARE)) // 2
    return config.grad_evals - 2 * sabma, sabma


def steps_for(method: str, config: BNNConfig) -> int:
    """Steps per trajectory within the budget of ``config.grad_evals`` gradient evaluations (SA-BMA's:
    those of its two phases together)."""
    if method == "sabma":
        return sum(sabma_split(config))
    return config.grad_evals // (2 if method in TWO_GRADIENT_METHODS else 1)


def _spent(method: str, config: BNNConfig) -> int:
    """The gradient evaluations an SVI fit of ``method`` makes: its steps times their cost."""
    if method == "sabma":
        swag, sabma = sabma_split(config)
        return swag + 2 * sabma
    return steps_for(method, config) * (2 if method in TWO_GRADIENT_METHODS else 1)


def make_bnn_kernel(name: str, config: BNNConfig, model_or_potential, toy: bool = False):
    """The sampler ``name`` with the study's settings, on the network or (``toy``) the 2-D energy: the step
    size, the temperature, its own setting (:data:`~pyro_flat.experiments.configs.BNN_OWN_SETTING`) and on
    the network the preconditioner."""
    target = {"potential_fn": model_or_potential} if toy else {"model": model_or_potential}
    settings = dict(step_size=config.step(toy), temperature=config.temperature)
    own = BNN_OWN_SETTING[name]
    if own is not None:
        settings[own] = getattr(config, f"toy_{own}" if toy else own)
    if not toy:
        settings["preconditioner"] = None if config.preconditioner == "none" else config.preconditioner
    return make_kernel(name, **target, **settings)


def bnn_network(config: BNNConfig, data, dropout: float = 0.0) -> BayesianClassifier:
    """The study's network for ``data`` (flat images, ``len(data.in_digits)`` classes): ``config.network``'s
    ``BayesianMLP`` (``hidden``) or ``BayesianCNN`` (``channels``), prior sd ``prior_scale``, MC-dropout's
    ``dropout``. Every method fits the network it gets, so this is the one place that chooses it."""
    kind, width = {"mlp": (BayesianMLP, config.hidden), "cnn": (BayesianCNN, config.channels)}[config.network]
    return kind(data.X_train.shape[1], width, len(data.in_digits), prior_scale=config.prior_scale, dropout=dropout)


def network_text(config: dict, num_weights: Optional[int] = None) -> str:
    """The network of a run's config (``asdict(BNNConfig)``; a report without ``network`` ran the MLP)."""
    weights = "" if num_weights is None else f", {num_weights:,} weights"
    if config.get("network", "mlp") == "cnn":
        return (f"CNN: 3x3 convolutions of stride 2 (padding 1) with {', '.join(map(str, config['channels']))} "
                f"channels, each followed by ReLU, then a linear head (no BatchNorm{weights})")
    return f"MLP hidden {tuple(config['hidden'])} (tanh{weights})"


def sampler_label(name: str) -> str:
    """The class name of a registered sampler (``"entropy-sgld"`` -> ``"EntropySGLD"``)."""
    return kernel_class(name).__name__


def _run_chains(key: str, config: BNNConfig, model: BayesianClassifier, data):
    kernel = make_bnn_kernel(key, config, model)
    iterations = config.iterations(kernel.grads_per_iteration)
    warmup = int(config.warmup_fraction * iterations)
    mcmc = MCMC(kernel, num_samples=iterations - warmup, warmup_steps=warmup, num_chains=config.num_chains,
                thinning=config.thinning(kernel.grads_per_iteration), disable_progbar=not config.progress)
    start = time.perf_counter()
    mcmc.run(data.X_train, data.y_train, batch_size=config.batch_size)
    return mcmc, kernel, iterations, time.perf_counter() - start


def sample_chains(key: str, name: str, config: BNNConfig, model: BayesianClassifier, data, log) -> Tuple[dict, float, int]:
    """``num_chains`` vectorized chains of sampler ``key`` from ``config.seed``; draws
    ``{site: (chain, draw, ...)}``, the seconds taken and the gradient evaluations per chain."""
    pyro.set_rng_seed(config.seed)
    mcmc, kernel, iterations, seconds = _run_chains(key, config, model, data)
    log(f"{name}: {config.num_chains} chains ({mcmc.chain_method}, minibatches {mcmc.minibatches}) x {iterations} "
        f"iterations ({kernel.num_grad_evals} gradient evaluations each) in {seconds:.1f} s")
    return mcmc.get_samples(group_by_chain=True), seconds, kernel.num_grad_evals


def _chain_records(mcmc, n_train: int) -> torch.Tensor:
    return mcmc_sample_stats(mcmc)["potential_energy"] / n_train


def _fit_sampler(method: str, config: BNNConfig, net: BayesianClassifier, data) -> Fit:
    mcmc, kernel, iterations, seconds = _run_chains(method, config, net, data)
    # draw-major (draw 1 of every chain, then draw 2, ...): the first m draws span the chains
    samples = {k: v.transpose(0, 1).flatten(0, 1) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    uses = ("theta", "aux") if any(k.endswith("_aux") for k in samples) else ("theta",)
    return Fit(method, net, samples, samples, uses, iterations, kernel.num_grad_evals, seconds,
               _chain_records(mcmc, len(data.X_train)))


def _fit_ensemble(method: str, config: BNNConfig, net: BayesianClassifier, data) -> Fit:
    from ...infer.ensembles import fit_ensemble

    steps = steps_for(method, config)
    start = time.perf_counter()
    ensemble = fit_ensemble(net, data.X_train, data.y_train, size=config.num_chains, num_steps=steps,
                            step_size=config.step_size, rho=config.rho if method == "sa-ensemble" else None,
                            progress=config.progress, batch_size=config.batch_size)
    seconds = time.perf_counter() - start
    return Fit(method, net, ensemble.members, ensemble.members, ("theta",), steps, ensemble.grad_evals, seconds,
               ensemble.potential / len(data.X_train))


def _svi(method: str, config: BNNConfig, model, guide, optim, loss, data,
         steps: Optional[int] = None, desc: Optional[str] = None) -> Tuple[torch.Tensor, float]:
    """Run SVI for ``steps`` (the method's by default); the loss per training image at up to 100 evenly
    spaced steps of the second half (each the mean over its stretch of steps) and the seconds taken."""
    from pyro.infer import SVI
    from tqdm.auto import tqdm

    steps = steps_for(method, config) if steps is None else steps
    svi = SVI(model, guide, optim, loss)
    start = time.perf_counter()
    losses = [svi.step(data.X_train, data.y_train, batch_size=config.batch_size)
              for _ in tqdm(range(steps), desc=desc or METHOD_LABELS[method], disable=not config.progress)]
    seconds = time.perf_counter() - start
    half = np.asarray(losses[steps // 2:], dtype=float) / len(data.X_train)
    stretches = np.array_split(half, min(100, len(half)))
    return torch.tensor([[s.mean() for s in stretches]]), seconds


def _guide_draws(guide, num: int, data, config: BNNConfig) -> Dict[str, torch.Tensor]:
    with torch.no_grad():
        draws = [guide(data.X_train, data.y_train, batch_size=config.batch_size) for _ in range(num)]
    return {name: torch.stack([d[name] for d in draws]) for name in draws[0]}


def _sam_or_plain(method: str, rho: float):
    from pyro.infer import Trace_ELBO

    from ...variational import SAM_ELBO

    return SAM_ELBO(rho) if method.startswith("sa-") else Trace_ELBO()


def _adam(config: BNNConfig, steps: int):
    """The BBB-type fits' optimiser: Adam from ``svi_lr``, its step falling tenfold over ``steps``."""
    return pyro.optim.ClippedAdam({"lr": config.svi_lr, "lrd": 0.1 ** (1.0 / steps)})


def _fit_bbb(method: str, config: BNNConfig, net: BayesianClassifier, data) -> Fit:
    from pyro.infer.autoguide import AutoNormal
    from pyro.infer.autoguide.initialization import init_to_sample

    guide = AutoNormal(net, init_loc_fn=init_to_sample, init_scale=config.svi_init_scale)
    steps = steps_for(method, config)
    records, seconds = _svi(method, config, net, guide, _adam(config, steps), _sam_or_plain(method, config.sam_rho),
                            data)
    samples = _guide_draws(guide, config.num_chains * config.num_draws, data, config)
    return Fit(method, net, samples, samples, ("theta",), steps, _spent(method, config), seconds, records, guide)


def _swag_run(method: str, config: BNNConfig, net, data, steps: int, desc: Optional[str] = None):
    """AutoSWAG trained by SGD at ``step_size`` for ``steps`` (SAM iterates for ``sa-swag``): the
    iterates of the second half are collected, at least once an epoch. ``(guide, records, seconds)``."""
    from pyro.infer.autoguide.initialization import init_to_sample

    from ...variational import AutoSWAG

    window = steps - steps // 2  # the second half is collected, at least once an epoch
    epoch = -(-len(data.X_train) // config.batch_size)
    rank = min(config.swag_rank, max(2, window // 2))
    every = max(1, min(epoch, window // (2 * rank)))
    guide = AutoSWAG(net, rank=rank, collect_start=steps // 2, collect_every=every, init_loc_fn=init_to_sample)
    records, seconds = _svi(method, config, net, guide, pyro.optim.SGD({"lr": config.step_size}),
                            _sam_or_plain(method, config.rho), data, steps=steps, desc=desc)
    return guide, records, seconds


def _fit_swag(method: str, config: BNNConfig, net: BayesianClassifier, data) -> Fit:
    steps = steps_for(method, config)
    guide, records, seconds = _swag_run(method, config, net, data, steps)
    guide.eval()
    samples = _guide_draws(guide, config.num_chains * config.num_draws, data, config)
    return Fit(method, net, samples, samples, ("theta",), steps, _spent(method, config), seconds, records, guide)


def _fit_sabma(method: str, config: BNNConfig, net: BayesianClassifier, data) -> Fit:
    """SA-BMA as its paper runs it: a SWAG fit, its posterior as the starting guide, then SABMA_ELBO.

    The trajectory's ``config.grad_evals`` gradient evaluations are split by :func:`sabma_split`: half
    (``S1 = grad_evals - 2 * S2`` evaluations) to a SWAG fit of ``S1`` SGD steps with the ``swag`` row's
    settings (``step_size``, ``swag_rank``, the second half collected, at least once an epoch; plain
    SGD iterates, not SAM's), and the rest to ``S2 = grad_evals // 4`` steps of
    ``SABMA_ELBO(sabma_gamma)`` at two evaluations each, from ``AutoSWAG.low_rank_guide()`` (an
    ``AutoLowRankMultivariateNormal`` whose law is the SWAG posterior, SWAG's rank), by Adam from
    ``svi_lr`` falling tenfold over the ``S2`` steps (the BBB rows' optimiser): ``S1 + 2 S2 = grad_evals``
    exactly. ``steps`` is ``S1 + S2``; the records (the "still falling" check) are the SA-BMA phase's
    negative ELBO, at the perturbed parameters φ + δ.

    The paper also takes its prior from the SWAG fit; pyro-flat keeps the model's own prior (the
    network's ``Normal(0, prior_scale)``), so that SA-BMA's posterior is the same posterior the
    other rows approximate. Only the starting guide comes from SWAG.
    """
    from ...variational import SABMA_ELBO

    swag_steps, sabma_steps = sabma_split(config)
    swag, _, swag_seconds = _swag_run(method, config, net, data, swag_steps, desc="SA-BMA's SWAG")
    start = time.perf_counter()
    guide = swag.low_rank_guide(data.X_train, data.y_train, batch_size=config.batch_size)
    seconds = swag_seconds + time.perf_counter() - start
    records, sabma_seconds = _svi(method, config, net, guide, _adam(config, sabma_steps),
                                  SABMA_ELBO(config.sabma_gamma), data, steps=sabma_steps)
    samples = _guide_draws(guide, config.num_chains * config.num_draws, data, config)
    return Fit(method, net, samples, samples, ("theta",), swag_steps + sabma_steps, _spent(method, config),
               seconds + sabma_seconds, records, guide, swag)


def _fit_dropout(method: str, config: BNNConfig, net: BayesianClassifier, data) -> Fit:
    from pyro.infer.autoguide import AutoDelta
    from pyro.infer.autoguide.initialization import init_to_sample

    dropout_net = bnn_network(config, data, dropout=config.dropout)
    guide = AutoDelta(dropout_net, init_loc_fn=init_to_sample)
    records, seconds = _svi(method, config, dropout_net, guide, pyro.optim.SGD({"lr": config.step_size}),
                            _sam_or_plain(method, config.rho), data)
    point = _guide_draws(guide, 1, data, config)
    samples = {k: v.expand(config.num_chains * config.num_draws, *v.shape[1:]) for k, v in point.items()}
    return Fit(method, dropout_net, samples, point, ("theta",), steps_for(method, config), _spent(method, config),
               seconds, records, guide)


_FITTERS: Dict[str, Callable[..., Fit]] = {
    "sgld": _fit_sampler, "sasgld": _fit_sampler, "entropy-sgld": _fit_sampler, "flat-sgld": _fit_sampler,
    "bbb": _fit_bbb, "sa-bbb": _fit_bbb, "sabma": _fit_sabma, "swag": _fit_swag, "sa-swag": _fit_swag,
    "dropout": _fit_dropout, "sa-dropout": _fit_dropout, "ensemble": _fit_ensemble, "sa-ensemble": _fit_ensemble}


def fit_method(method: str, config: BNNConfig, net: BayesianClassifier, data, seed: Optional[int] = None) -> Fit:
    """Train ``net`` on ``data`` with ``method`` (a key of :data:`METHOD_LABELS`) from ``seed``
    (``config.seed`` by default): the same seed gives every method the same random stream, so a plain
    method and its sharpness-aware version start from the same weights."""
    if method not in _FITTERS:
        raise StudyError(f"--methods: unknown method {method!r}; choose from {', '.join(BNN_METHODS)}")
    pyro.clear_param_store()
    pyro.set_rng_seed(config.seed if seed is None else seed)
    return _FITTERS[method](method, config, net, data)


__all__ = ["Fit", "fit_method", "bnn_network", "network_text", "loss_trend", "steps_for", "sabma_split",
           "make_bnn_kernel", "sample_chains", "sampler_label", "METHOD_LABELS"]
