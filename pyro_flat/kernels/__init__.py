"""Pyro ``MCMCKernel``s for flat posteriors: one small module per algorithm."""

from .base import StochasticGradientKernel
from .entropy_sgld import EntropySGLD
from .errors import DivergenceError
from .sgld import SGLD

__all__ = ["StochasticGradientKernel", "SGLD", "EntropySGLD", "DivergenceError"]
