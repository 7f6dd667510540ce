"""Samplers checked against theory: :func:`check_convergence` runs many chains (:mod:`~.runner`) and compares
their law with the 2-Wasserstein bound (:mod:`pyro_flat.theory`) and a reference law (:mod:`~.references`);
:class:`ConvergenceResult` (:mod:`~.result`) is its verdict."""

from .check import (FEW_CHAINS, MIN_CHAINS, TARGET_OF, ConvergenceError, ConvergenceResult, check_convergence,
                    run_ensemble)

__all__ = ["check_convergence", "TARGET_OF", "MIN_CHAINS", "FEW_CHAINS", "ConvergenceResult", "ConvergenceError",
           "run_ensemble"]
