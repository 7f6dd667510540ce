"""The settings of ``pyro-flat images``: the Entropy-MCMC image experiments, scaled to this machine or as
published (``--preset emcmc-cifar``). Imports neither torch nor Pyro.

The protocol's settings (network, epochs, cycles, learning rate, weight decay, temperature, η, batch size,
augmentation) come from the preset; an option given on the command line replaces the preset's value,
except under ``--preset emcmc-cifar``, which is the published protocol unchanged and refuses them.

>>> config = ImagesConfig()
>>> config.protocol()["network"], config.protocol()["epochs"]
('small-resnet', 12)
>>> ImagesConfig(preset="emcmc-cifar", dataset="cifar10").protocol()["epochs"]
200
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Dict, Optional, Tuple

from .output import StudyError
from .study_config import StudyConfig, option, out_option

#: the methods of the image study; ``emcmc`` reports θ, θa and both
IMAGE_METHODS = ("sgd", "entropy-sgd", "sam", "sgld", "entropy-sgld", "emcmc")
#: the methods that optimise (one network, the last iterate), against those that sample (draws per cycle)
OPTIMISERS = ("sgd", "entropy-sgd", "sam")
DATASETS = ("digits", "cifar10", "cifar100")
NETWORKS = ("tiny-resnet", "small-resnet", "resnet18")
#: the protocol each preset fixes (the paper's values in its own scale: learning rate on the mean loss,
#: weight decay, temperature and η as published; the study maps them to pyro-flat's, see images.py)
PRESETS: Dict[str, Dict[str, object]] = {
    # the paper's protocol on 2 CPU cores: a small ResNet, 12 epochs in 2 cycles, draws from the last epoch of each
    "digits": dict(network="small-resnet", epochs=12, cycles=2, draw_epochs=1, lr=0.5, weight_decay=5e-4,
                   temperature=1e-4, eta=4e-4, batch_size=128, augment=False),
    # Entropy-MCMC's CIFAR protocol unchanged (ResNet-18, 200 epochs, 4 cosine cycles, the last 2 epochs of each)
    "emcmc-cifar": dict(network="resnet18", epochs=200, cycles=4, draw_epochs=2, lr=0.5, weight_decay=5e-4,
                        temperature=1e-4, eta=4e-4, batch_size=128, augment=True),
}
#: what ``--device`` takes
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
PROTOCOL_OPTIONS = ("network", "epochs", "cycles", "draw_epochs", "lr", "weight_decay", "temperature", "eta",
                    "batch_size")


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
                                        "‖θ − θa‖²/(2η) on the log posterior's scale)", type=float,
                                  default_text="the preset's")
    batch_size: Optional[int] = option(None, "minibatch size", type=int, default_text="the preset's")
    methods: Tuple[str, ...] = option(IMAGE_METHODS, f"methods, any of {', '.join(IMAGE_METHODS)}",
                                      choices=IMAGE_METHODS, metavar="METHOD")
    seeds: int = option(3, "seeds: every method runs from --seed, --seed + 1, ...; claims are paired t-tests over them")
    draws_per_cycle: int = option(2, "draws a sampler keeps in each cycle")
    inner_steps: int = option(5, "Entropy-SGD's and Entropy-SGLD's inner steps (their outer steps are epochs x "
                                 "iterations / inner steps: the same gradient budget)")
    rho: float = option(0.05, "SAM's radius")
    ood_digits: Tuple[int, ...] = option((8, 9), "digits held out of training as the out-of-distribution set "
                                                 "(--dataset digits)")
    train_size: Optional[int] = option(None, "training images used (the first of each class in turn)", type=int,
                                       default_text="all")
    test_size: Optional[int] = option(800, "test images scored (and out-of-distribution images)")
    corrupted_size: Optional[int] = option(200, "test images of each corrupted set (5 kinds x 5 severities)")
    flatness_images: int = option(256, "training images of the Hessian's top eigenvalue and trace (and of each "
                                       "draw's BatchNorm statistics)")
    trace_probes: int = option(4, "Hutchinson probes of the Hessian trace")
    out: str = out_option("pyro-flat-out/images")
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

    COMMAND: ClassVar[str] = "images"
    #: a tiny ResNet, a few hundred images, 2 seeds, 2 short epochs (lr 0.05: with N = 320 the step lr / N must stay
    #: below η)
    REDUCED: ClassVar[Dict[str, object]] = dict(
        network="tiny-resnet", epochs=2, cycles=1, seeds=2, train_size=320, test_size=96, corrupted_size=40, flatness_images=64,
        trace_probes=2, inner_steps=2, batch_size=32, draws_per_cycle=2, lr=0.05)

    def protocol(self) -> Dict[str, object]:
        """The preset's settings with this config's own values put in (``None``: the preset's)."""
        chosen = dict(PRESETS[self.preset])
        chosen.update({name: getattr(self, name) for name in PROTOCOL_OPTIONS if getattr(self, name) is not None})
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
        for name in ("lr", "weight_decay", "temperature", "eta"):
            value = protocol[name]
            if not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise StudyError(f"--{name.replace('_', '-')} must be a positive number, got {value!r}")
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
        for name in ("train_size", "test_size", "corrupted_size"):
            if getattr(self, name) is not None:
                self.require_int(2, name)
