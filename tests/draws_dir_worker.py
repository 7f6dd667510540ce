"""A run that ``tests/test_draws_dir.py`` starts in a process of its own, to share a ``draws_dir`` with another.

``python tests/draws_dir_worker.py DRAWS_DIR CHECKPOINT|none GO OUT OVERWRITE(0|1) SEED [BLOCK_BYTES]``: 3 chains of
SGLD on a 2-D standard normal, 60 draws, seeded with ``SEED``, streamed to ``DRAWS_DIR`` (checkpoints every 20 ms to
``CHECKPOINT`` unless ``none``; blocks of ``BLOCK_BYTES``, a row being 24 bytes, if given). Each draw takes 5 ms,
and from draw 40 on the run waits for the file ``GO`` to exist (60 s at most): the test decides when it ends. Its
draws are saved to ``OUT``.
"""

import os
import sys
import time

import torch

import pyro
from pyro_flat import MCMC, SGLD


def run(draws_dir, checkpoint=None, go=None, seed: int = 1, overwrite: bool = False, **kwargs):
    def hook(kernel, params, phase, i):
        if phase != "Sample" or go is None:
            return
        time.sleep(0.005)
        deadline = time.monotonic() + 60
        while i >= 40 and not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.01)

    pyro.set_rng_seed(seed)
    mcmc = MCMC(SGLD(potential_fn=lambda p: 0.5 * (p["x"] ** 2).sum(-1), step_size=0.1), num_samples=60,
                warmup_steps=5, initial_params={"x": torch.zeros(3, 2)}, num_chains=3, draws_dir=draws_dir,
                checkpoint=checkpoint, checkpoint_every=0.02, overwrite_draws=overwrite,
                hook_fn=kwargs.pop("hook_fn", hook), disable_progbar=True, **kwargs)
    mcmc.run()
    return {k: v.clone() for k, v in mcmc.get_samples(group_by_chain=True).items()}


if __name__ == "__main__":
    folder, checkpoint, go, out, overwrite, seed = sys.argv[1:7]
    if len(sys.argv) > 7:
        from pyro_flat.infer import draws as streamed

        streamed.BLOCK_BYTES = int(sys.argv[7])
    draws = run(folder, None if checkpoint == "none" else checkpoint, go, int(seed), overwrite == "1")
    torch.save(draws, out)
