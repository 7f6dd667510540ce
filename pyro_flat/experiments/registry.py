"""The studies behind ``pyro-flat``, each declared once: :data:`STUDIES`.

A :class:`Study` is a config class (whose ``COMMAND`` is the subcommand's name and whose
:func:`~pyro_flat.experiments.study_config.option` fields are its options), the dotted path of
its run function, the help the command line shows, and the rule that turns the run's report into
the command's exit code. The command line (:mod:`~pyro_flat.experiments.cli`) reads nothing
else: adding a study is adding an entry here. The run function is imported only when the study
runs, so that ``pyro-flat --help`` and the option checks import neither torch nor Pyro.

>>> study = STUDIES["mnist79"]
>>> study.config.__name__, study.run
('MNIST79Config', 'pyro_flat.experiments.mnist79.study.run_mnist79')
>>> study.exit_code({"interrupted": True, "interrupted_by": "SIGTERM"}), STUDIES["bnn"].exit_code({})
(143, 0)
"""

from __future__ import annotations

import importlib
import signal
from dataclasses import dataclass
from typing import Callable, Dict, Type

from .configs import BNNConfig, MNIST79Config, PathConfig, Synthetic2DConfig
from .images.config import ImagesConfig, ImagesEtaConfig
from .study_config import StudyConfig
from .transfer.config import TransferConfig


def completed(report: dict) -> int:
    """The exit code of a study that runs to its end or raises: 0."""
    return 0


def completed_or_interrupted(report: dict) -> int:
    """The exit code of a study that writes the draws made so far when it is stopped: 0, or for a
    run stopped part-way (``report["interrupted"]``) the shell's 128 + the signal, 130 for Ctrl-C
    and 143 for SIGTERM (``report["interrupted_by"]``)."""
    if not report.get("interrupted"):
        return 0
    return 128 + (signal.SIGTERM if report.get("interrupted_by") == "SIGTERM" else signal.SIGINT)


@dataclass(frozen=True)
class Study:
    """One ``pyro-flat`` command."""

    #: its settings; ``config.COMMAND`` is the command's name
    config: Type[StudyConfig]
    #: the dotted path of ``run(config) -> report``, which writes the study's folder ``config.out``
    run: str
    #: one line in ``pyro-flat --help``
    summary: str
    #: what it does and writes, in ``pyro-flat NAME --help``
    description: str
    #: the command's exit code from the run's report
    exit_code: Callable[[dict], int] = completed

    @property
    def name(self) -> str:
        return self.config.COMMAND

    def run_function(self) -> Callable[[StudyConfig], dict]:
        """The run function, imported now (with torch and Pyro)."""
        module, _, function = self.run.rpartition(".")
        return getattr(importlib.import_module(module), function)

    def __call__(self, config: StudyConfig) -> int:
        """Run the study on ``config`` (checked first); the command's exit code."""
        config.validate()  # a bad option is one line at once, before the study imports torch
        return self.exit_code(self.run_function()(config))


#: every study, in the order ``pyro-flat --help`` lists them
STUDIES: Dict[str, Study] = {study.name: study for study in (
    Study(MNIST79Config, "pyro_flat.experiments.mnist79.study.run_mnist79",
          "Bayesian logistic regression on MNIST sevens vs nines",
          "Sample Bayesian logistic regression on MNIST 7 vs 9 and write the draws, ArviZ summary, figures, BMA "
          "metrics and report.md to --out.",
          exit_code=completed_or_interrupted),
    Study(Synthetic2DConfig, "pyro_flat.experiments.synthetic2d.study.run_synthetic2d_study",
          "which basin chains started on the ridge of a 2-D sharp/flat energy end in",
          "Start many chains of SGD, SGLD, EntropySGLD (several η), SASGLD and FlatSGLD at the saddle between a "
          "sharp and a flat mode; report the share in each basin beside the exact stationary shares; write "
          "report.md, report.json and figures."),
    Study(BNNConfig, "pyro_flat.experiments.bnn.study.run_bnn_study",
          "every BNN family (SGLD, BBB, SWAG, MC-dropout, ensembles), plain and sharpness-aware, on a Bayesian MLP "
          "over seeds: flatness, calibration, OOD detection, distribution shift",
          "Train a Bayesian MLP on some MNIST digits with each BNN family of 'Flat Seeking BNNs' and its "
          "sharpness-aware version (and EntropySGLD, FlatSGLD, SA-BMA) under one gradient budget, at several seeds; "
          "write report.md, report.json, families.png, shift.png and bma_vs_models.png."),
    Study(PathConfig, "pyro_flat.experiments.paths.study.run_path_study",
          "the minimum-energy path between two minima of a Bayesian MLP, and the curvature along it",
          "Two SGLD draws of the BNN study's MLP descend to minima of the training NLL; the straight line and the "
          "minimum-energy path (NEB) join them; write the loss, top Hessian eigenvalue and trace along both "
          "(paths.png), where each sampler's draws sit (draws.png) and SGD started on the path (dynamics.png), "
          "with report.md and report.json."),
    Study(ImagesConfig, "pyro_flat.experiments.images.study.run_images_study",
          "Entropy-MCMC against SGD, an SGD ensemble and SGLD (Entropy-SGD, SAM, Entropy-SGLD on request) on a "
          "ResNet, in the paper's per-step coupling: digits here, CIFAR from --data-dir",
          "Train a residual network with BatchNorm with each method of the Entropy-MCMC paper (and an SGD ensemble) "
          "for the same epochs at several seeds, checking that each fit converged; score "
          "the model averages on clean, corrupted and out-of-distribution images and their flatness; count the "
          "paper's claims by paired t-tests; write report.md, report.json, corruption.png and interpolation.png."),
    Study(ImagesEtaConfig, "pyro_flat.experiments.images.study.run_images_study",
          "the image study's Entropy-MCMC against η, around the paper's per-step coupling, with SGD beside it",
          "Fit Entropy-MCMC at several multiples of the regime's η (and SGD once) at several seeds, with the image "
          "study's protocol; write report.md, report.json and eta_sweep.png (accuracy, NLL and θa's top Hessian "
          "eigenvalue against η)."),
    Study(TransferConfig, "pyro_flat.experiments.transfer.study.run_transfer_study",
          "few-shot Bayesian transfer from a pre-trained ResNet: flat and non-flat posteriors over its last block, its "
          "low-rank adapters or its head (SA-BMA's claims counted)",
          "Pre-train a ResNet on some classes (cached in --out as pretrained.pt), transfer it to the others with k shots "
          "per class by SGD, SWAG, last-layer Laplace, VI, SA-BMA, SGLD and Entropy-MCMC on its last block or its "
          "low-rank adapters at several seeds; score accuracy, NLL, ECE, corrupted images, OOD AUROC and cost; count "
          "SA-BMA's claims by paired t-tests; write report.md, report.json and transfer.png."),
)}
