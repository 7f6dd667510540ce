"""The sampling loop every pyro-flat run goes through: set the kernel up, then one ``sample`` after another.

:class:`pyro_flat.MCMC` stores the draws it yields; a study that needs only some states
(:func:`pyro_flat.convergence.run_ensemble`) keeps those.
"""

from __future__ import annotations

from typing import Callable, Iterator, Optional, Tuple

from ..targets import Params


def run_chains(kernel, warmup_steps: int, num_samples: int, args: tuple = (),
               kwargs: Optional[dict] = None,
               resume: Optional[Callable[[], Tuple[Params, int]]] = None) -> Iterator[Tuple[str, int, Params]]:
    """The sampling loop: set the kernel up, then yield ``(phase, i, params)`` after each draw.

    ``phase`` is ``"Initial"`` once (``i = 0``, the initial point), then ``"Warmup"`` for
    ``i < warmup_steps`` and ``"Sample"`` for the ``num_samples`` kept draws, as in Pyro's progress
    hook. The kernel is configured beforehand (:meth:`~pyro_flat.kernels.base.TargetKernel.configure`)
    and cleaned up however the loop ends. :class:`MCMC` stores the draws it yields; a study that
    needs only some states (:func:`pyro_flat.convergence.run_ensemble`) keeps those. ``resume``, called
    after the set-up, puts a checkpoint's state back and returns ``(params, steps done)``: the loop then
    yields ``"Initial"`` with those parameters and goes on from there.
    """
    try:
        kernel.setup(warmup_steps, *args, **(kwargs or {}))
        params, done = kernel.initial_params, 0
        if resume is not None:
            params, done = resume()
        yield "Initial", 0, params
        for step in range(done, warmup_steps + num_samples):
            with kernel.drawing():
                params = kernel.sample(params)
            yield ("Warmup", step, params) if step < warmup_steps else ("Sample", step - warmup_steps, params)
    finally:
        kernel.cleanup()


__all__ = ["run_chains"]
