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

The package is built in layers of folders; a module imports only from its own layer and those below
(``tests/test_layers.py`` reads every import, those inside functions too, and fails on one that
points up or closes a cycle, or on a module at the root that :data:`LAYERS` does not name). From the
ground up (:data:`LAYERS`, drawn in ``docs/layout.md``):

1. foundations: the errors that cross layers, argument checks, tracing helpers, step-size schedules,
   round-off tolerances (:mod:`pyro_flat.roundoff`), and random numbers that do not depend on the split of
   the chains over ranks (:mod:`pyro_flat.chains`);
2. targets: a model or potential as the energy a kernel samples (:mod:`pyro_flat.targets`);
3. models (the Entropy-MCMC joint, SAM's perturbation, the mixtures, the ready-made models), any
   ``nn.Module`` as a model (:mod:`pyro_flat.nn`), the data (:mod:`pyro_flat.data`), and what measures a
   result (:mod:`pyro_flat.evaluation`: predictions, metrics, ArviZ diagnostics);
4. kernels (:mod:`pyro_flat.kernels`), whose contract with the driver is
   :mod:`pyro_flat.kernels.protocol`;
5. what a run keeps on disk: its lock, streamed-draws folder and checkpoints (:mod:`pyro_flat.storage`);
   and ranks: :mod:`pyro_flat.distributed` (process groups, data-parallel targets, the across-ranks driver);
6. the driver (:mod:`pyro_flat.infer`): :class:`MCMC`, its loop, its draws in memory or in a folder, ensembles;
7. built on the driver: flatness measures, theory, convergence checks, variational inference;
8. the studies (:mod:`pyro_flat.experiments`).

Modules that moved into folders keep their old path (:data:`MOVED`): the documented short ones
(``pyro_flat.metrics``, ``pyro_flat.datasets``, ...; :data:`STABLE_PATHS`) silently, the others with a
``FutureWarning`` that names the new path.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import TYPE_CHECKING, Any, List

#: The layers of the package, from the ground up (see the module docstring): each module or subpackage
#: imports only from its own layer and those below.
LAYERS = (
    ("errors", "validation", "tracing", "schedules", "roundoff", "chains"),
    ("targets",),
    ("models", "nn", "data", "evaluation"),
    ("kernels",),
    ("storage", "distributed"),
    ("infer",),
    ("flatness", "theory", "convergence", "variational"),
    ("experiments",),
)

#: Each public name and the module that defines it: imported on first use (PEP 562), so that
#: ``import pyro_flat.experiments.cli`` and ``pyro-flat --help`` do not import torch and Pyro.
_PUBLIC = {
    "flat_posterior": "models.flat", "flat_potential": "models.flat",
    "SGD": "kernels", "SGLD": "kernels", "EntropySGLD": "kernels", "LocalEntropySGD": "kernels",
    "LocalEntropySGLD": "kernels", "SASGLD": "kernels", "FlatSGLD": "kernels", "EntropyHMC": "kernels",
    "SAMSGD": "kernels", "DivergenceError": "kernels", "SGHMC": "kernels", "EntropySGHMC": "kernels",
    "MCMC": "infer.mcmc",
    "check_convergence": "convergence", "ConvergenceResult": "convergence", "ConvergenceError": "convergence",
    "to_arviz": "evaluation.diagnostics",
    "bma_predict": "evaluation.predictive", "OnlineBMA": "evaluation.online_bma",
    "SAM_ELBO": "variational", "SABMA_ELBO": "variational", "AutoSWAG": "variational", "transfer_model": "variational",
    "fit_ensemble": "infer.ensembles",
}
#: The subpackages and modules reachable as attributes (``pyro_flat.flatness``, ...), and where each is.
_MODULES = {name: name for name in ("flatness", "models", "schedules", "theory", "variational", "kernels", "targets",
                                    "convergence", "experiments", "distributed", "nn", "data", "evaluation",
                                    "infer", "chains", "storage")}
#: The documented short paths of modules that live in a folder: ``import pyro_flat.metrics`` is
#: ``pyro_flat.evaluation.metrics``, now and later, without a warning.
STABLE_PATHS = {"datasets": "data.datasets", "metrics": "evaluation.metrics", "diagnostics": "evaluation.diagnostics",
                "predictive": "evaluation.predictive", "mixtures": "models.mixtures", "sam": "models.sam",
                "ensembles": "infer.ensembles"}
_MODULES.update(STABLE_PATHS)
#: Modules that moved into folders (``docs/layout.md``): the old path still imports, with a FutureWarning
#: that gives the new one.
MOVED = {**STABLE_PATHS,
         "chain_streams": "chains.streams", "checkpoint": "storage.checkpoint", "cifar_files": "data.cifar_files",
         "mnist_files": "data.mnist_files", "corruptions": "data.corruptions", "shift": "data.shift",
         "flat": "models.flat", "mixture_basins": "models.mixture_basins", "online_bma": "evaluation.online_bma",
         "mcmc": "infer.mcmc", "mcmc_arguments": "infer.arguments", "draws": "infer.draws",
         "progress": "infer.progress", "sampling_loop": "infer.sampling_loop", "convergence_result": "convergence.result",
         "references": "convergence.references", "ensemble_runner": "convergence.runner",
         # the studies' modules, now one folder per study (pyro_flat.experiments.images.config, ...)
         **{f"experiments.{old}": f"experiments.{new}" for old, new in (
             ("images_config", "images.config"), ("images_data", "images.data"), ("images_report", "images.report"),
             ("images_scores", "images.scores"), ("images_eta", "images.eta"), ("transfer_config", "transfer.config"),
             ("transfer_data", "transfer.data"), ("transfer_fits", "transfer.fits"),
             ("transfer_pretrain", "transfer.pretrain"), ("transfer_report", "transfer.report"),
             ("mnist79_report", "mnist79.report"), ("bnn_families", "bnn.families"), ("bnn_report", "bnn.report"),
             ("path_dynamics", "paths.dynamics"))}}


class _ModuleAliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``pyro_flat.<old>`` as the module it became (:data:`MOVED`); the same module object, so that
    its classes, and the checkpoints that pickle them, are one."""

    def __init__(self):
        self._specs = {}

    def find_spec(self, fullname, path=None, target=None):
        package, _, old = fullname.partition(".")
        if package != __name__ or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        old = spec.name.partition(".")[2]
        if old not in STABLE_PATHS:
            warnings.warn(f"pyro_flat.{old} moved to pyro_flat.{MOVED[old]}: import it from there (the old path "
                          "will be removed in a later release).", FutureWarning, stacklevel=_importer_level())
        module = importlib.import_module(f"{__name__}.{MOVED[old]}")
        self._specs[module.__name__] = module.__spec__  # the import system puts the alias's spec on it
        return module

    def exec_module(self, module):  # the module has run already: only its own spec is put back
        module.__spec__ = self._specs.pop(module.__name__)


def _importer_level() -> int:
    """``warnings.warn``'s stacklevel (from ``create_module``) of the user's import line: ``warn`` skips the frames
    of importlib's bootstrap itself; this skips ``importlib.import_module`` and this package's ``__getattr__``."""
    frame, level = sys._getframe(2), 2  # create_module's caller
    while frame is not None:
        name = frame.f_code.co_filename
        if name in (importlib.__file__, __file__):
            level += 1
        elif not ("importlib" in name and "_bootstrap" in name):
            break
        frame = frame.f_back
    return level


sys.meta_path.append(_ModuleAliases())


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    elif name in _MODULES:
        value = importlib.import_module(f".{_MODULES[name]}", __name__)
    elif name in MOVED:
        value = importlib.import_module(f".{name}", __name__)  # through the alias, with its warning
    else:
        raise AttributeError(f"module 'pyro_flat' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_PUBLIC) | set(_MODULES))


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from . import datasets, flatness, metrics, mixtures, models, schedules, theory, variational
    from .convergence.check import ConvergenceError, ConvergenceResult, check_convergence
    from .evaluation.diagnostics import to_arviz
    from .models.flat import flat_posterior, flat_potential
    from .kernels import (SGD, SGHMC, SGLD, DivergenceError, EntropyHMC, EntropySGHMC, EntropySGLD, FlatSGLD,
                          LocalEntropySGD, LocalEntropySGLD, SAMSGD, SASGLD)
    from .infer.ensembles import fit_ensemble
    from .infer.mcmc import MCMC
    from .evaluation.online_bma import OnlineBMA
    from .evaluation.predictive import bma_predict
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
