"""The progress bar and the user's ``hook_fn`` of :class:`pyro_flat.MCMC`'s vectorized loop."""

from __future__ import annotations

import json
import time

from pyro.infer.mcmc.logger import DIAGNOSTIC_MSG


class ProgressHook:
    """After every draw: the user's ``hook_fn``; at most every :attr:`interval` seconds (and when the
    phase changes or the run ends, :meth:`flush`) the kernel's ``logging()`` to Pyro's MCMC logger,
    which feeds the progress bar's postfix, and the bar advanced by the iterations the kernel made since
    (its ``iteration``). The bar counts iterations, not draws: with thinning inside the kernel, or a
    cyclical schedule whose exploration iterations make no draw, its rate and time left stay true (its
    total is the kernel's ``iterations_for`` the run). Logging every draw cost a ``json.dumps``, a log
    record and a ``json.loads`` per iteration, a third of a compiled iteration's time."""

    interval = 0.1

    def __init__(self, logger, progress_bar, user_hook=None):
        self.logger, self.progress_bar, self.user_hook = logger, progress_bar, user_hook
        self.counted = 0  # the kernel's iterations the bar has counted (a resumed run: those before the stop)
        self.pending, self.stage, self.last = 0, None, time.perf_counter()

    def resumed(self, iterations: int) -> None:
        """A resumed run: the bar starts at the ``iterations`` the kernel made before the stop."""
        self.progress_bar.update(iterations)
        self.counted = iterations

    def __call__(self, kernel, params, stage, i):
        if stage != self.stage:
            self.flush(kernel)
            self.stage = stage
        self.pending, self.counted = self.pending + kernel.iteration - self.counted, kernel.iteration
        if time.perf_counter() - self.last >= self.interval:
            self.flush(kernel)
        if self.user_hook is not None:
            self.user_hook(kernel, params, stage, i)

    def flush(self, kernel) -> None:
        if self.pending:
            self.logger.info(json.dumps(kernel.logging()), extra={"msg_type": DIAGNOSTIC_MSG})  # the bar: +1
            if self.pending > 1:
                self.progress_bar.update(self.pending - 1)
            self.progress_bar.set_description(f"{type(kernel).__name__} {self.stage}", refresh=False)
        self.pending, self.last = 0, time.perf_counter()


__all__ = ["ProgressHook"]
