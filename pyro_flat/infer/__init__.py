"""The driver: :class:`~pyro_flat.MCMC` (:mod:`~.mcmc`), its arguments checked (:mod:`~.arguments`), the one
sampling loop (:mod:`~.sampling_loop`), the draws in memory or streamed to a folder (:mod:`~.draws`), the
progress bar (:mod:`~.progress`), and ensembles run as vectorized chains (:mod:`~.ensembles`)."""
