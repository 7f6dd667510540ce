"""The settings of ``pyro-flat images``: the Entropy-MCMC image experiments, scaled to this machine or as
published (``--preset emcmc-cifar``). Imports neither torch nor Pyro.

The protocol's settings (network, epochs, cycles, learning rate, weight decay, temperature, η, batch size,
augmentation) come from the preset; an option given on the command line replaces the preset's value,
except under ``--preset emcmc-cifar``, which is the published protocol unchanged and refuses them.

>>> config = ImagesConfig()
>>> config.protocol()["network"], config.protocol()["epochs"], config.protocol()["coupling"]
('small-resnet', 64, 0.025)
>>> ImagesConfig(preset="emcmc-cifar", dataset="cifar10").protocol()["epochs"]
200
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Dict, Optional, Tuple

from ..output import StudyError
from ..study_config import StudyConfig, option, out_option, threads_option

#: the methods of the image study; ``emcmc`` reports θ, θa and both; ``sgd-ensemble``: SGD networks trained at the
#: compute of one sampler chain (a reviewer's first baseline; not one of the paper's)
IMAGE_METHODS = ("sgd", "sgd-ensemble", "entropy-sgd", "sam", "sgld", "entropy-sgld", "emcmc")
#: what the default run compares (the others on request: ``--methods``)
DEFAULT_METHODS = ("sgd", "sgd-ensemble", "sgld", "emcmc")
#: the methods that optimise (one network, the last iterate), against those that sample (draws per cycle)
OPTIMISERS = ("sgd", "sgd-ensemble", "entropy-sgd", "sam")
DATASETS = ("digits", "cifar10", "cifar100")
NETWORKS = ("tiny-resnet", "small-resnet", "resnet18")
#: the paper's per-step coupling lr / (N η) on CIFAR-10: 0.5 / (50,000 x 4e-4)
PAPER_COUPLING = 0.025


def require_coupling(value: float) -> None:
    """A ``StudyError`` naming ``--coupling`` unless ``value`` lies strictly between 0 and 1: Entropy-MCMC's per-step
    coupling lr / (N·η) is the fraction of the gap θ − θa that θa closes per step, and at 1 or more θa overshoots θ
    (the fit ends at chance, or diverges). Every study with ``--coupling`` (``images``, ``images-eta``, ``transfer``)
    checks it here, before any fit.

    >>> require_coupling(2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    pyro_flat.experiments.output.StudyError: --coupling 2 is ... lr / (N·η), ...: it must lie strictly between 0 and 1 ...
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        shown = f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(value)
        raise StudyError(f"--coupling {shown} is Entropy-MCMC's per-step coupling lr / (N·η), the fraction of the gap "
                         "θ − θa that θa closes per step: it must lie strictly between 0 and 1 (at 1 or more θa "
                         f"overshoots θ); the paper's is {PAPER_COUPLING:g}")


#: the protocol each preset fixes (the paper's values in its own scale: learning rate on the mean loss,
#: weight decay, temperature and η as published; the study maps them to pyro-flat's, see images.py). ``eta``
#: ``None``: η follows from ``coupling``, the fraction lr / (N η) of the gap θ − θa that θa closes per step.
PRESETS: Dict[str, Dict[str, object]] = {
    # the paper's dimensionless regime on 2 CPU cores: its per-step coupling, temperature, noise, θa prior, 4 cycles
    # with 2 draws from the last 2 epochs of each, every method the same epochs; 1,000 digits (a small-data regime,
    # where averaging matters) and 80 epochs, enough for every method's last two cycles to end at the same
    # training NLL (docs/studies/images.md)
    "digits": dict(network="small-resnet", train_size=1000, image_size=14, epochs=64, cycles=4, draw_epochs=2,
                   lr=0.5, weight_decay=5e-4, temperature=1e-4, eta=None, coupling=PAPER_COUPLING, batch_size=32,
                   augment=False, exploration_noise=True, aux_prior=True, budget="epochs"),
    # Entropy-MCMC's CIFAR protocol unchanged (ResNet-18, 200 epochs, 4 cosine cycles, the last 2 epochs of each)
    "emcmc-cifar": dict(network="resnet18", train_size=None, image_size=None, epochs=200, cycles=4, draw_epochs=2, lr=0.5,
                        weight_decay=5e-4, temperature=1e-4, eta=4e-4, coupling=None, batch_size=128, augment=True,
                        exploration_noise=True, aux_prior=True, budget="epochs"),
}
#: the paper's CIFAR-10 protocol, which the report sets beside each number of the run's that departs from it
PAPER_PROTOCOL = dict(PRESETS["emcmc-cifar"], train_size=50_000, coupling=PAPER_COUPLING)
#: float32's smallest normal and largest values (torch.finfo; torch is not imported here)
FLOAT32_TINY, FLOAT32_MAX = 1.1754943508222875e-38, 3.4028234663852886e38
#: what ``--device`` takes
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
PROTOCOL_OPTIONS = ("network", "train_size", "image_size", "epochs", "cycles", "draw_epochs", "lr", "weight_decay", "temperature",
                    "eta", "coupling", "batch_size", "exploration_noise", "aux_prior", "budget")


@dataclass
class ImagesConfig(StudyConfig):
    """Settings of the image study. ``None`` in a protocol field means the preset's value (:meth:`protocol`)."""

    dataset: str = option("digits", "digits (MNIST, embedded or --data-dir), cifar10 or cifar100 (from --data-dir)",
                          choices=DATASETS)
    data_dir: Optional[str] = option(None, "folder of the data files: MNIST's IDX files or mnist.npz; for CIFAR the "
                                           "official python-version folders, and where present SVHN's test_32x32.mat "
                                           "and CIFAR-10-C/", default_text="the embedded MNIST subset")
    preset: str = option("digits", "the protocol: digits (the paper's, scaled to 2 CPU cores) or emcmc-cifar (the "
                                   "paper's CIFAR protocol unchanged)", choices=tuple(PRESETS))
    network: Optional[str] = option(None, "network: tiny-resnet, small-resnet or resnet18", choices=NETWORKS,
                                    default_text="the preset's")
    epochs: Optional[int] = option(None, "epochs of each method (the optimisers and samplers alike)", type=int,
                                   default_text="the preset's")
    cycles: Optional[int] = option(None, "cosine cycles of the samplers' step size", type=int,
                                   default_text="the preset's")
    draw_epochs: Optional[int] = option(None, "epochs at the end of each cycle whose iterations are sampled", type=int,
                                        default_text="the preset's")
    lr: Optional[float] = option(None, "learning rate on the mean loss (the step size is lr / N)", type=float,
                                 default_text="the preset's")
    weight_decay: Optional[float] = option(None, "weight decay (a Gaussian prior of precision N x weight decay)",
                                           type=float, default_text="the preset's")
    temperature: Optional[float] = option(None, "the samplers' temperature", type=float, default_text="the preset's")
    eta: Optional[float] = option(None, "Entropy-MCMC's and the local-entropy methods' η (the coupling "
                                        "‖θ − θa‖²/(2η) on the log posterior's scale); replaces --coupling",
                                  type=float, default_text="the preset's, or from --coupling")
    coupling: Optional[float] = option(None, "the per-step coupling lr / (N η), the fraction of the gap θ − θa that "
                                             "θa closes per step, between 0 and 1 (the paper's: 0.025); sets η for "
                                             "the data's N",
                                       type=float, default_text="the preset's")
    exploration_noise: Optional[bool] = option(None, "the samplers' cosine cycles run noise-free in their exploration "
                                                     "phase (cSGMCMC's rule; the paper keeps the noise at every step)",
                                               flag="--no-exploration-noise", action="store_const", const=False,
                                               default_text="")
    aux_prior: Optional[bool] = option(None, "θa without a prior of its own, the exact joint (the paper's weight "
                                             "decay acts on θa too)", flag="--no-aux-prior", action="store_const",
                                       const=False, default_text="")
    budget: Optional[str] = option(None, "what every method gets the same of: epochs (the paper's rule) or gradient "
                                         "evaluations (Entropy-SGD and Entropy-SGLD then make a fifth of the steps, SAM "
                                         "half)", choices=("epochs", "gradients"), default_text="the preset's")
    ensemble_size: Optional[int] = option(None, "networks of sgd-ensemble, trained together at the compute of one "
                                                "sampler chain (each for epochs / size, in two cycles)", type=int,
                                          default_text="half the cycles: each network's cycles as long as every "
                                                       "other method's")
    converged_within: float = option(0.01, "a fit has converged when its training NLL per image at the end of its "
                                           "last cycle is within this of the cycle before's")
    batch_size: Optional[int] = option(None, "minibatch size", type=int, default_text="the preset's")
    methods: Tuple[str, ...] = option(DEFAULT_METHODS, f"methods, any of {', '.join(IMAGE_METHODS)}",
                                      choices=IMAGE_METHODS, metavar="METHOD")
    seeds: int = option(6, "seeds: every method runs from --seed, --seed + 1, ...; claims are paired t-tests over them")
    draws_per_cycle: int = option(2, "draws a sampler keeps in each cycle")
    inner_steps: int = option(5, "Entropy-SGD's and Entropy-SGLD's inner steps, each a gradient evaluation (one outer "
                                 "step per minibatch; with --budget gradients, that many times fewer)")
    rho: float = option(0.05, "SAM's radius")
    ood_digits: Tuple[int, ...] = option((8, 9), "digits held out of training as the out-of-distribution set "
                                                 "(--dataset digits)")
    train_size: Optional[int] = option(None, "training images used (the first of each class in turn)", type=int,
                                       default_text="the preset's (digits: 1000; emcmc-cifar: all)")
    image_size: Optional[int] = option(None, "the images' side after averaging blocks of pixels (the corrupted and "
                                             "out-of-distribution images too)", type=int,
                                       default_text="the preset's (digits: 14, from 28; emcmc-cifar: 32, as stored)")
    test_size: Optional[int] = option(800, "test images scored (and out-of-distribution images)")
    corrupted_size: Optional[int] = option(100, "test images of each corrupted set (5 kinds x 5 severities)")
    flatness_images: int = option(256, "training images of the Hessian's top eigenvalue and trace (and of each "
                                       "draw's BatchNorm statistics)")
    trace_probes: int = option(4, "Hutchinson probes of the Hessian trace")
    out: str = out_option("pyro-flat-out/images")
    # a digits fit's iteration is many small operations: 13.9 ms on one thread, about twice that on two (2 idle cores)
    threads: Optional[int] = threads_option(1)
    resume: bool = option(False, "continue the run into --out that was killed: the fits it finished are kept, the "
                                 "one it was in continues from its last checkpoint (beside --out, in "
                                 ".NAME.checkpoints/), with the results of a run never stopped", action="store_true",
                          default_text="")
    checkpoint_every: float = option(60.0, "seconds between a fit's checkpoints (--resume continues from the last)")
    device: str = option("auto", "where the networks train and are scored: auto (this process's GPU where torch "
                                 "sees one, cuda:LOCAL_RANK under torchrun; else the CPU), cpu, cuda or cuda:N")
    jit: str = option("off", "compile each fit's iteration into one graph (the kernels' jit_compile): fx (traced; "
                             "replayed as one CUDA graph on a GPU, where it pays) or inductor; the same fits up to "
                             "round-off", choices=("off", "fx", "inductor"))
    precision: str = option("fp32", "bf16: each fit's forward and backward under torch.autocast (the kernels' autocast; "
                                    "the weights and the update fp32; predictions and losses scored the same way, curvature in fp32)",
                            choices=("fp32", "bf16"))

    COMMAND: ClassVar[str] = "images"
    #: a tiny ResNet, a few hundred images, 2 seeds, 2 short epochs (lr 0.05: with N = 320 the step lr / N must stay
    #: below η)
    REDUCED: ClassVar[Dict[str, object]] = dict(
        network="tiny-resnet", epochs=4, cycles=2, draw_epochs=1, seeds=2, train_size=320, test_size=96, corrupted_size=40, flatness_images=64,
        trace_probes=2, inner_steps=2, batch_size=32, draws_per_cycle=2, lr=0.05)

    def protocol(self) -> Dict[str, object]:
        """The preset's settings with this config's own values put in (``None``: the preset's)."""
        chosen = dict(PRESETS[self.preset])
        chosen.update({name: getattr(self, name) for name in PROTOCOL_OPTIONS if getattr(self, name) is not None})
        if self.dataset != "digits" and self.image_size is None:  # the digits preset's 14 pixels are the digits'
            chosen["image_size"] = None
        if self.eta is not None:  # η given: the coupling follows from it (and N)
            chosen["coupling"] = None
        elif self.coupling is not None:
            chosen["eta"] = None
        return chosen

    def validate(self) -> None:
        super().validate()
        if self.preset == "emcmc-cifar":
            given = [f"--{name.replace('_', '-')}" for name in PROTOCOL_OPTIONS if getattr(self, name) is not None]
            if given:
                raise StudyError(f"--preset emcmc-cifar is the paper's protocol unchanged; it fixes {', '.join(given)}: "
                                 "leave them out, or use --preset digits and set them")
            if self.dataset == "digits":
                raise StudyError("--preset emcmc-cifar is the CIFAR protocol: pass --dataset cifar10 or cifar100 "
                                 "with --data-dir")
        if self.dataset != "digits" and self.data_dir is None:
            raise StudyError(f"--dataset {self.dataset} reads the official files from --data-dir (nothing is "
                             "downloaded); pass --data-dir DIR holding "
                             + ("cifar-10-batches-py/" if self.dataset == "cifar10" else "cifar-100-python/"))
        if not isinstance(self.device, str) or not DEVICE_PATTERN.fullmatch(self.device):
            raise StudyError(f"--device takes auto, cpu, cuda or cuda:N, got {self.device!r}")
        unknown = [m for m in self.methods if m not in IMAGE_METHODS]
        if unknown or not self.methods:
            raise StudyError(f"--methods takes one or more of {', '.join(IMAGE_METHODS)}; got "
                             f"{', '.join(map(str, self.methods)) or 'none'}")
        protocol = self.protocol()
        self.require_int(1, "seeds", "draws_per_cycle", "inner_steps", "flatness_images")
        self.require_int(2, "trace_probes")
        for name in ("epochs", "cycles", "draw_epochs", "batch_size"):
            if not isinstance(protocol[name], int) or isinstance(protocol[name], bool) or protocol[name] < 1:
                raise StudyError(f"--{name.replace('_', '-')} must be an integer >= 1, got {protocol[name]!r}")
        if self.eta is not None and self.coupling is not None:
            raise StudyError(f"--eta {self.eta:g} and --coupling {self.coupling:g} both set η (the coupling is lr / (N η)): "
                             "give one of them")
        for name in ("lr", "weight_decay", "temperature", "eta", "coupling"):
            value = protocol[name]
            if value is None and name in ("eta", "coupling"):
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < float("inf"):
                raise StudyError(f"--{name.replace('_', '-')} must be a positive number, got {value!r}"
                                 + (" (a temperature T > 0 scales the noise √(2 α T); 1e-4 is the paper's)"
                                    if name == "temperature" else ""))
        if protocol["coupling"] is not None:
            require_coupling(protocol["coupling"])
        self._check_scale(protocol)
        if protocol["train_size"] is not None:
            self.check_batch_size(protocol["train_size"])
        if self.ensemble_size is not None:
            self.require_int(1, "ensemble_size")
        self.require_positive("converged_within")
        self.require_positive("rho", "checkpoint_every")
        if protocol["epochs"] % protocol["cycles"]:
            raise StudyError(f"--epochs {protocol['epochs']} must be a multiple of --cycles {protocol['cycles']} "
                             "(every cycle has the same number of epochs)")
        if protocol["draw_epochs"] > protocol["epochs"] // protocol["cycles"]:
            raise StudyError(f"--draw-epochs {protocol['draw_epochs']} is more than a cycle's "
                             f"{protocol['epochs'] // protocol['cycles']} epochs")
        if self.dataset == "digits" and (not self.ood_digits or any(d not in range(10) for d in self.ood_digits)
                                         or len(set(self.ood_digits)) > 8):
            raise StudyError(f"--ood-digits must be one to eight distinct digits 0-9, got {self.ood_digits}")
        if self.image_size is not None:
            self.require_int(4, "image_size")
        for name in ("train_size", "test_size", "corrupted_size"):
            if getattr(self, name) is not None:
                self.require_int(2, name)

    def check_batch_size(self, num_train: int) -> None:
        """A :class:`StudyError` when the batch size exceeds the ``num_train`` training images."""
        batch, preset = self.protocol()["batch_size"], PRESETS[self.preset]["batch_size"]
        if batch > num_train:
            raise StudyError(f"--batch-size {batch} exceeds the training set size, {num_train:,} images: pass --batch-size "
                             f"{num_train:,} or less (or a larger --train-size; the preset's batch size is {preset})")

    def _check_scale(self, protocol: Dict[str, object]) -> None:
        """A :class:`StudyError` naming the option whose value takes the sampler's step size, noise, prior precision
        or η out of float32's range, where the networks train (a traceback otherwise, at the first step)."""
        n = protocol["train_size"] or 50_000  # CIFAR's training set: every image
        step = protocol["lr"] / n
        eta = protocol["eta"] if protocol["eta"] is not None else step / protocol["coupling"]
        scaled = {"lr": ("the step size lr / N", step), "temperature": ("the noise variance 2 (lr / N) T",
                                                                        2 * step * protocol["temperature"]),
                  "weight_decay": ("the prior precision N x weight decay", n * protocol["weight_decay"]),
                  "eta" if protocol["eta"] is not None else "coupling": ("η", eta)}
        for name, (what, value) in scaled.items():
            if not FLOAT32_TINY <= value <= FLOAT32_MAX:
                raise StudyError(f"--{name.replace('_', '-')} {protocol[name]:g} makes {what} {value:.3g} (N = {n:,}), "
                                 f"outside float32's range ({FLOAT32_TINY:.3g} to {FLOAT32_MAX:.3g}), in which the "
                                 f"networks train: pass a value near the paper's ({PAPER_PROTOCOL[name]:g})")

    @property
    def members(self) -> int:
        """Networks of ``sgd-ensemble`` (``--ensemble-size``; by default half the cycles, so that each network's two
        cycles are as long as every other method's)."""
        return self.ensemble_size or max(1, int(self.protocol()["cycles"]) // 2)


@dataclass
class ImagesEtaConfig(ImagesConfig):
    """Settings of ``pyro-flat images-eta``: the image study's Entropy-MCMC at several η around the regime's, with
    SGD as the reference (the paper tunes η on a grid)."""

    eta_factors: Tuple[float, ...] = option((0.25, 0.5, 1.0, 2.0, 4.0), "multiples of the regime's η (the one --eta "
                                            "or --coupling sets) to fit Entropy-MCMC at: at least two distinct, positive",
                                            type=float, metavar="FACTOR")
    seeds: int = option(3, "seeds: every η (and SGD) runs from --seed, --seed + 1, ...")
    out: str = out_option("pyro-flat-out/images-eta")

    COMMAND: ClassVar[str] = "images-eta"
    REDUCED: ClassVar[Dict[str, object]] = dict(ImagesConfig.REDUCED, eta_factors=(0.5, 2.0))

    def validate(self) -> None:
        super().validate()
        factors = self.eta_factors
        if not isinstance(factors, tuple) or any(isinstance(f, bool) or not isinstance(f, (int, float))
                                                 or not 0 < f < float("inf") for f in factors):
            raise StudyError(f"--eta-factors takes positive numbers (multiples of the regime's η), got {factors!r}")
        if len(set(factors)) < 2:
            raise StudyError(f"--eta-factors {' '.join(map(str, factors))} is a sweep of one value: give at least two "
                             "distinct multiples of η, e.g. 0.25 0.5 1 2 4")
        coupling = self.protocol()["coupling"]
        if coupling is not None and coupling / min(factors) >= 1:
            raise StudyError(f"--eta-factors {min(factors):g} makes the per-step coupling {coupling / min(factors):.3g}, "
                             "at or above 1 (θa would overshoot θ): keep every factor above "
                             f"{coupling:.3g}")
