"""Experiments built on the library: the studies behind the ``pyro-flat`` command.

Nothing in the library imports this package. Each study is a config dataclass (with a
``reduced()`` constructor for tests) and a function that writes one consistent output folder,
declared once in :data:`~pyro_flat.experiments.registry.STUDIES`, which the command line reads:

One folder per study, each with its ``study`` module (the run function) beside its parts:

- :mod:`~pyro_flat.experiments.mnist79`: Bayesian logistic regression on MNIST 7 vs 9 (``study``, ``report``);
- :mod:`~pyro_flat.experiments.synthetic2d`: θ and θa trajectories on a 2-D sharp/flat energy;
- :mod:`~pyro_flat.experiments.bnn`: every BNN family, plain and sharpness-aware, on a Bayesian MLP over seeds
  (``study``, ``families``, ``report``);
- :mod:`~pyro_flat.experiments.paths`: minimum-energy paths between two minima of that MLP (``study``, ``dynamics``);
- :mod:`~pyro_flat.experiments.images`: Entropy-MCMC against its baselines on a small ResNet, and the η sweep
  (``study``, ``config``, ``data``, ``scores``, ``report``, ``eta``);
- :mod:`~pyro_flat.experiments.transfer`: few-shot transfer from a pre-trained network (``study``, ``config``,
  ``data``, ``pretrain``, ``fits``, ``report``).

What they share stays here: :mod:`~pyro_flat.experiments.cli` (the command line),
:mod:`~pyro_flat.experiments.registry` (the studies), :mod:`~pyro_flat.experiments.configs` and
:mod:`~pyro_flat.experiments.study_config` (the configs and their frame), :mod:`~pyro_flat.experiments.output`
(option checks, the output folder, the rank-0 / other-ranks split), :mod:`~pyro_flat.experiments.resume`
(checkpoints, the lock), :mod:`~pyro_flat.experiments.compare` (claims over seeds) and
:mod:`~pyro_flat.experiments.plots` (figures). The modules' old flat paths (``images_config``, ...) still import,
with a FutureWarning (``pyro_flat.MOVED``).
"""
