"""The settings of ``pyro-flat transfer``: Bayesian transfer learning from a pre-trained ResNet, few-shot, with
flat and non-flat posteriors over its last block, its low-rank adapters or its head. Imports neither torch nor Pyro.

>>> config = TransferConfig()
>>> config.protocol()["network"], config.shots, config.protocol()["pretrain_classes"]
('small-resnet', (10, 50), (0, 1, 2, 3, 4))
>>> TransferConfig(preset="cifar100").protocol()["network"]
'resnet18'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, Optional, Tuple

from ..images.config import DEVICE_PATTERN, PAPER_COUPLING, require_coupling
from ..output import StudyError
from ..study_config import StudyConfig, option, out_option, threads_option

#: the methods, each from the same pre-trained network; the part it makes Bayesian (or trains) is in its name
TRANSFER_METHODS = ("sgd-block", "sgd-adapters", "swag-block", "laplace-head", "vi-block", "sabma-block",
                    "sgld-block", "emcmc-block", "sgld-adapters", "emcmc-adapters")
#: the methods that keep one network (their last iterate)
POINT_METHODS = ("sgd-block", "sgd-adapters")
#: the variational fits (``pyro.infer.SVI``)
SVI_METHODS = ("swag-block", "vi-block", "sabma-block")
#: the samplers (``pyro_flat.MCMC``), their kernel and their non-flat counterpart
SAMPLERS = {"sgld-block": "sgld", "emcmc-block": "entropy-sgld", "sgld-adapters": "sgld",
            "emcmc-adapters": "entropy-sgld", "sgd-block": "sgd", "sgd-adapters": "sgd"}
#: the preset's protocol: the network, the classes it is pre-trained on (the others are the transfer task), the
#: pre-training, and the fine-tuning's cosine schedule in the Entropy-MCMC image study's dimensionless regime
PRESETS: Dict[str, Dict[str, object]] = {
    # 2 CPU cores: the small ResNet pre-trained on digits 0-4 (every image the project has), 14x14 pixels
    "digits": dict(network="small-resnet", pretrain_classes=(0, 1, 2, 3, 4), image_size=14, pretrain_epochs=8,
                   pretrain_lr=0.05, iterations=800, batch_size=25, lr=0.5),
    # a GPU: ResNet-18 pre-trained on CIFAR-100's first 50 classes, transferred to the other 50
    "cifar100": dict(network="resnet18", pretrain_classes=tuple(range(50)), image_size=None, pretrain_epochs=30,
                     pretrain_lr=0.05, iterations=2000, batch_size=64, lr=0.5),
}
PROTOCOL_OPTIONS = ("network", "pretrain_epochs", "iterations", "batch_size", "lr")


@dataclass
class TransferConfig(StudyConfig):
    """Settings of the transfer study. ``None`` in a protocol field means the preset's value (:meth:`protocol`)."""

    COMMAND: ClassVar[str] = "transfer"
    REDUCED: ClassVar[Dict[str, object]] = dict(network="tiny-resnet", shots=(5,), seeds=2, iterations=24,
                                                pretrain_epochs=1, batch_size=10, test_size=60, corrupted_size=10,
                                                swag_rank=3, draws_per_cycle=2, pretrain_size=600)

    preset: str = option("digits", "the protocol: digits (a small ResNet on digits 0-4, then 5-9; 2 CPU cores) or "
                                   "cifar100 (ResNet-18 on CIFAR-100's classes 0-49, then 50-99, from --data-dir; a GPU)",
                         choices=tuple(PRESETS))
    data_dir: Optional[str] = option(None, "digits: a folder of MNIST IDX files whose images join the embedded "
                                           "subset's; cifar100: the official python-version folder",
                                     default_text="../shared/data/mnist where it exists")
    network: Optional[str] = option(None, "the pre-trained network: tiny-resnet, small-resnet or resnet18",
                                    choices=("tiny-resnet", "small-resnet", "resnet18"), default_text="the preset's")
    pretrain_epochs: Optional[int] = option(None, "epochs of the pre-training (SGD with momentum, cosine)", type=int,
                                            default_text="the preset's")
    pretrain_size: Optional[int] = option(None, "pre-training images used (all by default)", type=int,
                                          default_text="all")
    shots: Tuple[int, ...] = option((10, 50), "training images per new class: one transfer task per value")
    seeds: int = option(4, "seeds: each draws its own shots and runs every method; claims are paired t-tests over them")
    methods: Tuple[str, ...] = option(TRANSFER_METHODS, f"methods, any of {', '.join(TRANSFER_METHODS)}",
                                      choices=TRANSFER_METHODS, metavar="METHOD")
    iterations: Optional[int] = option(None, "steps of each fine-tuning (every method the same)", type=int,
                                       default_text="the preset's")
    batch_size: Optional[int] = option(None, "minibatch size (at most the shots' images)", type=int,
                                       default_text="the preset's")
    lr: Optional[float] = option(None, "learning rate on the mean loss (the samplers' step size is lr / N)", type=float,
                                 default_text="the preset's")
    weight_decay: float = option(5e-4, "weight decay: a Gaussian prior of precision N x weight decay, centred on the "
                                       "pre-trained weights")
    temperature: float = option(1e-4, "the posterior's temperature, of the samplers and the variational fits (the "
                                      "Entropy-MCMC paper's cold posterior; Laplace keeps 1)")
    coupling: float = option(PAPER_COUPLING, "Entropy-MCMC's per-step coupling lr / (N η), the fraction of the gap "
                                             "θ − θa that θa closes per step: between 0 and 1 (the paper's: 0.025)")
    cycles: int = option(2, "cosine cycles of every fine-tuning (the convergence rule compares their ends)")
    draws_per_cycle: int = option(4, "draws a sampler keeps from the last quarter of each cycle")
    rank: int = option(4, "the low-rank adapters' rank")
    swag_rank: int = option(10, "SWAG's number of deviation columns")
    svi_lr: float = option(0.01, "first Adam step of the variational fits (it falls tenfold over the run)")
    sabma_gamma: float = option(0.01, "SA-BMA's KL-ball size")
    draws: int = option(8, "draws of each variational fit in its model average")
    laplace_draws: int = option(200, "draws of the last-layer Laplace posterior in its model average (on features "
                                     "computed once)")
    converged_within: float = option(0.05, "a fit has converged when its training NLL per image at the end of its "
                                           "last cycle is within this of the cycle before's")
    test_size: int = option(500, "test images of the new classes scored (and out-of-distribution images)")
    corrupted_size: int = option(50, "test images of each corrupted set (5 kinds x 5 severities)")
    out: str = out_option("pyro-flat-out/transfer")
    threads: Optional[int] = threads_option(1)
    device: str = option("auto", "where the networks train: auto (a GPU where torch sees one, else the CPU), cpu, "
                                 "cuda or cuda:N")
    resume: bool = option(False, "continue the run into --out that was stopped: the fits it finished (kept beside "
                                 "--out, in .NAME.checkpoints/, with the pre-trained network) are read, the others run, "
                                 "with the results of a run never stopped", action="store_true", default_text="")

    def protocol(self) -> Dict[str, object]:
        """The preset's protocol with the options given on the command line in place of its values."""
        p = dict(PRESETS[self.preset])
        for name in PROTOCOL_OPTIONS:
            if getattr(self, name) is not None:
                p[name] = getattr(self, name)
        return p

    def validate(self) -> None:
        super().validate()
        p = self.protocol()
        self.require_int(1, "seeds", "cycles", "draws_per_cycle", "rank", "swag_rank", "draws", "laplace_draws", "test_size",
                         "corrupted_size")
        for name in ("pretrain_epochs", "iterations", "pretrain_size"):
            if getattr(self, name) is not None:
                self.require_int(1, name)
        if self.batch_size is not None:
            self.require_int(2, "batch_size")  # BatchNorm normalises a minibatch by its own statistics
        self.require_positive("weight_decay", "temperature", "svi_lr", "sabma_gamma", "converged_within")
        require_coupling(self.coupling)  # images' rule: θa closes a fraction below 1 of the gap θ − θa per step
        if self.lr is not None:
            self.require_positive("lr")
        if not self.shots or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.shots):
            raise StudyError(f"--shots {' '.join(map(str, self.shots))}: give one or more positive integers, e.g. "
                             "--shots 10 50")
        if not self.methods:
            raise StudyError("--methods: give at least one method")
        if "laplace-head" in self.methods and "sgd-block" not in self.methods:
            raise StudyError("--methods: laplace-head is the Laplace posterior of sgd-block's fine-tuned head; add "
                             "sgd-block")
        if self.preset == "cifar100" and not self.data_dir:
            raise StudyError("--preset cifar100 reads CIFAR-100's official python-version folder: pass --data-dir")
        if not DEVICE_PATTERN.fullmatch(self.device):
            raise StudyError(f"--device {self.device!r}: pass auto, cpu, cuda or cuda:N")
        steps = int(p["iterations"]) // self.cycles
        if steps < 4 * self.draws_per_cycle:
            raise StudyError(f"--iterations {p['iterations']} in {self.cycles} cycles leaves {steps} steps a cycle: "
                             f"the last quarter must hold --draws-per-cycle {self.draws_per_cycle}; raise --iterations")


__all__ = ["TransferConfig", "TRANSFER_METHODS", "PRESETS", "SAMPLERS", "SVI_METHODS", "POINT_METHODS"]
