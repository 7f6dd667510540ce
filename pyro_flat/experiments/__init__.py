"""Experiments built on the library: the studies behind the ``pyro-flat`` command.

Nothing in the library imports this package. Each study is a config dataclass (with a
``reduced()`` constructor for tests) and a function that writes one consistent output folder,
declared once in :data:`~pyro_flat.experiments.registry.STUDIES`, which the command line reads:

- :mod:`~pyro_flat.experiments.mnist79`: Bayesian logistic regression on MNIST 7 vs 9;
- :mod:`~pyro_flat.experiments.synthetic2d`: θ and θa trajectories on a 2-D sharp/flat energy;
- :mod:`~pyro_flat.experiments.bnn`: every BNN family, plain and sharpness-aware, on a Bayesian MLP
  over seeds (its fits in :mod:`~pyro_flat.experiments.bnn_families`, its report in
  :mod:`~pyro_flat.experiments.bnn_report`);
- :mod:`~pyro_flat.experiments.paths`: minimum-energy paths between two minima of that MLP;
- :mod:`~pyro_flat.experiments.plots`: their figures; :mod:`~pyro_flat.experiments.output`: option
  checks, the output folder and the rank-0 / other-ranks split (``across_ranks``);
  :mod:`~pyro_flat.experiments.study_config`: the frame of the configs (a field that is also an
  option); :mod:`~pyro_flat.experiments.cli`: the command line.
"""
