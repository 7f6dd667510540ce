"""What measures a result: Bayesian model averages (:mod:`~.predictive`, and as the draws come,
:mod:`~.online_bma`), their accuracy and calibration (:mod:`~.metrics`), and ArviZ diagnostics
(:mod:`~.diagnostics`). Each is documented at its short path: ``pyro_flat.metrics``, ..."""
