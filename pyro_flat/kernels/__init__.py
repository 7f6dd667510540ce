"""Pyro ``MCMCKernel``s for flat posteriors: one small module per algorithm."""

from .base import StochasticGradientKernel, TargetKernel
from .entropy_hmc import EntropyHMC
from .entropy_sgld import EntropySGLD
from .errors import DivergenceError
from .flat_sgld import FlatSGLD
from .local_entropy import LocalEntropySGD, LocalEntropySGLD
from .sasgld import SASGLD
from .sgd import SGD
from .sgld import SGLD

__all__ = [
    "TargetKernel",
    "StochasticGradientKernel",
    "SGLD",
    "SGD",
    "EntropySGLD",
    "EntropyHMC",
    "LocalEntropySGD",
    "LocalEntropySGLD",
    "SASGLD",
    "FlatSGLD",
    "DivergenceError",
]
