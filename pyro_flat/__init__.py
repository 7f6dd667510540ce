"""pyro-flat: flatness-seeking Bayesian inference for Pyro.

- :func:`flat_posterior` turns any Pyro model into the Entropy-MCMC joint over weights θ and their
  guiding twins θa (sites ``name + "_aux"``);
- :class:`SGLD` and :class:`EntropySGLD` are ``pyro.infer.MCMC`` kernels with Pyro-native minibatches,
  :class:`EntropyHMC` the exact (Metropolis-corrected) sampler of the same joint, :class:`SGHMC` and
  :class:`EntropySGHMC` their momentum (underdamped Langevin) versions;
- :class:`MCMC` is Pyro's driver plus vectorized chains (all chains as one batched tensor), also split
  over the ranks of ``torchrun`` or data-parallel across them (:mod:`pyro_flat.distributed`);
- :class:`SGD`, :class:`LocalEntropySGD` and :class:`LocalEntropySGLD` are the paper's baselines,
  :class:`SASGLD` and :class:`FlatSGLD` the flat-seeking relatives; :mod:`pyro_flat.flatness`
  measures flatness (Hessian spectra and traces, loss curves, local entropy);
  :func:`check_convergence` and :mod:`pyro_flat.theory` test samplers against their
  2-Wasserstein bounds;
- :class:`SAM_ELBO` and :class:`SABMA_ELBO` are flat-seeking ELBOs for ``pyro.infer.SVI``
  (:mod:`pyro_flat.variational`, with :func:`transfer_model` for Bayesian transfer learning);
- :func:`to_arviz` gives ArviZ diagnostics; :func:`bma_predict` and :mod:`pyro_flat.metrics` give
  Bayesian-model-averaged predictions and their calibration, :class:`OnlineBMA` the average as the
  draws come;
- :mod:`pyro_flat.datasets` (MNIST 7-vs-9), :mod:`pyro_flat.mixtures` (sharp/flat mixtures and
  their basins, exactly), :mod:`pyro_flat.models`, and the studies behind the ``pyro-flat``
  command (:mod:`pyro_flat.experiments`).

The package is built in layers; a module imports only from its own layer and those below
(``tests/test_layers.py`` reads every import, those inside functions too, and fails on one that
points up or closes a cycle). From the ground up (:data:`LAYERS`):

1. foundations: the errors that cross layers, argument checks, tracing helpers, random numbers that do
   not depend on the split of the chains over ranks (:mod:`pyro_flat.chains`, :mod:`pyro_flat.chain_streams`),
   step-size schedules;
2. targets: a model or potential as the energy a kernel samples (:mod:`pyro_flat.targets`);
3. models and measures: the Entropy-MCMC joint, SAM's perturbation, the models, the datasets,
   predictions and their metrics, the exact mixtures;
4. kernels (:mod:`pyro_flat.kernels`), whose contract with the driver is
   :mod:`pyro_flat.kernels.protocol`;
5. what a run keeps on disk: its lock and streamed-draws folder (:mod:`pyro_flat.storage`), checkpoints
   (:mod:`pyro_flat.checkpoint`); and ranks: :mod:`pyro_flat.distributed` (process groups,
   data-parallel targets, the across-ranks driver);
6. the driver: :class:`MCMC`, its draws in memory or in a folder, and ArviZ diagnostics;
7. built on the driver: flatness measures, theory and convergence checks, ensembles, variational inference;
8. the studies (:mod:`pyro_flat.experiments`).
"""

import importlib
from typing import TYPE_CHECKING, Any, List

#: The layers of the package, from the ground up (see the module docstring): each module or subpackage
#: imports only from its own layer and those below.
LAYERS = (
    ("errors", "validation", "tracing", "chain_streams", "chains", "schedules"),
    ("targets",),
    ("flat", "sam", "models", "nn", "mnist_files", "cifar_files", "datasets", "predictive", "metrics", "online_bma",
     "corruptions", "shift", "mixture_basins", "mixtures"),
    ("kernels",),
    ("storage", "checkpoint", "distributed"),
    ("mcmc_arguments", "draws", "progress", "sampling_loop", "diagnostics", "mcmc"),
    ("flatness", "theory", "references", "ensemble_runner", "convergence_result", "convergence", "ensembles",
     "variational"),
    ("experiments",),
)

#: Each public name and the module that defines it: imported on first use (PEP 562), so that
#: ``import pyro_flat.experiments.cli`` and ``pyro-flat --help`` do not import torch and Pyro.
_PUBLIC = {
    "flat_posterior": "flat", "flat_potential": "flat",
    "SGD": "kernels", "SGLD": "kernels", "EntropySGLD": "kernels", "LocalEntropySGD": "kernels",
    "LocalEntropySGLD": "kernels", "SASGLD": "kernels", "FlatSGLD": "kernels", "EntropyHMC": "kernels",
    "SAMSGD": "kernels", "DivergenceError": "kernels", "SGHMC": "kernels", "EntropySGHMC": "kernels",
    "MCMC": "mcmc",
    "check_convergence": "convergence", "ConvergenceResult": "convergence", "ConvergenceError": "convergence",
    "to_arviz": "diagnostics",
    "bma_predict": "predictive", "OnlineBMA": "online_bma",
    "SAM_ELBO": "variational", "SABMA_ELBO": "variational", "AutoSWAG": "variational", "transfer_model": "variational",
    "fit_ensemble": "ensembles",
}
#: The subpackages and modules reachable as attributes (``pyro_flat.flatness``, ...).
_MODULES = ("datasets", "diagnostics", "flatness", "metrics", "mixtures", "models", "schedules", "theory",
            "variational", "kernels", "targets", "predictive", "convergence", "experiments", "distributed",
            "ensembles", "sam", "nn")


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    elif name in _MODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'pyro_flat' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_PUBLIC) | set(_MODULES))


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from . import datasets, flatness, metrics, mixtures, models, schedules, theory, variational
    from .convergence import ConvergenceError, ConvergenceResult, check_convergence
    from .diagnostics import to_arviz
    from .flat import flat_posterior, flat_potential
    from .kernels import (SGD, SGHMC, SGLD, DivergenceError, EntropyHMC, EntropySGHMC, EntropySGLD, FlatSGLD,
                          LocalEntropySGD, LocalEntropySGLD, SAMSGD, SASGLD)
    from .ensembles import fit_ensemble
    from .mcmc import MCMC
    from .online_bma import OnlineBMA
    from .predictive import bma_predict
    from .variational import SABMA_ELBO, SAM_ELBO, AutoSWAG, transfer_model

__version__ = "0.1.0"

__all__ = [
    "flat_posterior",
    "flat_potential",
    "SGLD",
    "SGD",
    "EntropySGLD",
    "SGHMC",
    "EntropySGHMC",
    "LocalEntropySGD",
    "LocalEntropySGLD",
    "SASGLD",
    "SAMSGD",
    "FlatSGLD",
    "EntropyHMC",
    "MCMC",
    "check_convergence",
    "ConvergenceResult",
    "ConvergenceError",
    "theory",
    "flatness",
    "DivergenceError",
    "to_arviz",
    "bma_predict",
    "OnlineBMA",
    "metrics",
    "datasets",
    "mixtures",
    "variational",
    "SAM_ELBO",
    "SABMA_ELBO",
    "AutoSWAG",
    "fit_ensemble",
    "transfer_model",
    "models",
    "schedules",
]
