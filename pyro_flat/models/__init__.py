"""Models: the Entropy-MCMC joint of any Pyro model (:mod:`~.flat`), SAM's perturbation (:mod:`~.sam`), the
sharp/flat mixtures solved exactly (:mod:`~.mixtures`, :mod:`~.mixture_basins`), and the ready-made models
of the studies (:mod:`~.zoo`, whose names this package exports: ``pyro_flat.models.BayesianMLP``)."""

from .zoo import (BayesianClassifier, BayesianCNN, BayesianMLP, LogisticRegressionPotential, logistic_probs,
                  logistic_regression, take_rows)

__all__ = ["logistic_regression", "take_rows", "logistic_probs", "LogisticRegressionPotential", "BayesianClassifier",
           "BayesianMLP", "BayesianCNN"]
