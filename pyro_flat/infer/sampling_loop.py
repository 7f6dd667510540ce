"""The sampling loop every pyro-flat run goes through: set the kernel up, then one ``sample`` after another.

:class:`pyro_flat.MCMC` stores the draws it yields; a study that needs only some states
(:func:`pyro_flat.convergence.run_ensemble`) keeps those.
"""

from __future__ import annotations

from typing import Iterator, Optional, Protocol, Tuple

from ..targets import Params


class Resumption(Protocol):
    """A stopped run's state, put back in two steps (:class:`~pyro_flat.storage.checkpoint.Checkpointer`)."""

    def prepare(self, kernel) -> None:
        """Before the set-up: what the set-up must already see (a model's choices made by measurement)."""

    def restore(self, kernel) -> Tuple[Params, int]:
        """After the set-up: the kernel's state and the random streams; returns ``(params, steps done)``."""


def run_chains(kernel, warmup_steps: int, num_samples: int, args: tuple = (),
               kwargs: Optional[dict] = None,
               resume: Optional[Resumption] = None) -> Iterator[Tuple[str, int, Params]]:
    """The sampling loop: set the kernel up, then yield ``(phase, i, params)`` after each draw.

    ``phase`` is ``"Initial"`` once (``i = 0``, the initial point), then ``"Warmup"`` for
    ``i < warmup_steps`` and ``"Sample"`` for the ``num_samples`` kept draws, as in Pyro's progress
    hook. The kernel is configured beforehand (:meth:`~pyro_flat.kernels.base.TargetKernel.configure`)
    and cleaned up however the loop ends. :class:`MCMC` stores the draws it yields; a study that
    needs only some states (:func:`pyro_flat.convergence.run_ensemble`) keeps those. ``resume`` puts a
    checkpoint's state back, part before the set-up (a graph traced there sees the run's choices) and the rest
    after it, and gives ``(params, steps done)``: the loop then yields ``"Initial"`` with those parameters and
    goes on from there.
    """
    try:
        if resume is not None:
            resume.prepare(kernel)
        kernel.setup(warmup_steps, *args, **(kwargs or {}))
        params, done = kernel.initial_params, 0
        if resume is not None:
            params, done = resume.restore(kernel)
        yield "Initial", 0, params
        for step in range(done, warmup_steps + num_samples):
            with kernel.drawing():
                params = kernel.sample(params)
            yield ("Warmup", step, params) if step < warmup_steps else ("Sample", step - warmup_steps, params)
    finally:
        kernel.cleanup()


__all__ = ["run_chains"]
