"""What a long run keeps on disk besides its checkpoint: the one-run-at-a-time lock that ``checkpoint=`` and
``draws_dir=`` hold (:mod:`~pyro_flat.storage.locks`), and the folder of a run's streamed draws
(:mod:`~pyro_flat.storage.draws_folder`: its checks, names, manifest and owners)."""
