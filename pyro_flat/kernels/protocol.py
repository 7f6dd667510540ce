r"""The driver-kernel contract: what :class:`pyro_flat.MCMC` may ask of a kernel, and what it gets back.

The kernel-target contract (:mod:`pyro_flat.targets.protocol`) says what a kernel asks of its
potential; this module says what the driver asks of the kernel. Any object with the methods of
:class:`ChainKernel` runs under :class:`pyro_flat.MCMC` with all its chains as one batched tensor
(``chain_method="vectorized"``, ``"distributed"``, ``"data_parallel"``); an object with Pyro's
``setup`` and ``sample`` alone (``pyro.infer.NUTS``) runs under Pyro's own driver, one chain at a
time. Every pyro-flat kernel (:class:`~pyro_flat.kernels.base.TargetKernel`) is a
:class:`ChainKernel`.

One run, as the driver makes it (:func:`pyro_flat.infer.sampling_loop.run_chains`)::

    kernel.vectorization_error(C, args, kwargs, ...)   # None: C chains can be batched
    kernel.configure(num_chains=C, steps_per_draw=k, minibatches=..., data_parallel=..., random_streams=...)
    kernel.initial_params = {name: (C, ...) tensor}    # optional: the user's starting point
    kernel.setup(warmup_steps, *args, **kwargs)        # the target and the initial point
    params = kernel.initial_params                     # unconstrained, (C, ...) per site
    for each iteration:                                # k iterations per kept draw after warm-up
        with kernel.drawing(): params = kernel.sample(params)
    kernel.diagnostics(); kernel.cleanup()             # per-chain statistics; release the run

What a kernel returns is its state, explicit (as in BlackJAX and posteriors): ``sample`` takes the
unconstrained parameters and returns the next ones; the statistics of each draw (step size,
acceptance, the coupling distance) are kept by the kernel and handed over by ``diagnostics``.
``partial_samples`` gives back the draws made before an error or a Ctrl-C.

The state a kernel carries from one iteration to the next, beyond ``params``, is what a checkpoint
must hold to continue a run exactly: the iteration count and phase (warm-up or sampling), the
adapted step sizes, the frozen preconditioner or mass matrix, the schedule's position, the
minibatch streams' generators, the per-draw records, the momenta of the momentum samplers (the
stochastic-gradient kernels' ``carried`` state), and (for Entropy-MCMC) :math:`\theta_a` as part of
``params``. :meth:`~pyro_flat.kernels.base.TargetKernel.state_dict` gives exactly that (each class lists its
part in ``run_state``), and :mod:`pyro_flat.storage.checkpoint` writes it with the parameters and the random streams.
A model that makes choices by measurement during a run (a :class:`RunChoices`: a
:class:`~pyro_flat.nn.BayesianModule` timing ``vmap`` against a loop) has them kept in that state too.

>>> import torch
>>> from pyro_flat.kernels import SGLD
>>> isinstance(SGLD(potential_fn=lambda p: (p["x"] ** 2).sum(-1), step_size=0.1), ChainKernel)
True
"""

from __future__ import annotations

from typing import Callable, ContextManager, Dict, List, Optional, Protocol, runtime_checkable

import torch

from ..targets import Params, Target


@runtime_checkable
class RunChoices(Protocol):
    """A model that chooses how to run by measuring during a run (timings differ between runs, the ways' numbers
    only up to round-off): the kernel's :meth:`~pyro_flat.kernels.base.TargetKernel.state_dict` keeps the
    choices, and a resumed run is handed them back before its first iteration, so it goes on the same way."""

    def run_choices(self) -> dict:
        """What was chosen so far (plain data)."""

    def load_run_choices(self, choices: dict) -> None:
        """Make the same choices as the run that gave ``choices``."""


@runtime_checkable
class DataParallelism(Protocol):
    """How a kernel's target spans the ranks of a data-parallel run (implemented by
    :class:`pyro_flat.distributed.DataParallelShards`): the kernel hands over how to build its target
    for a shard, and gets back the target of all shards."""

    def assemble(self, build: Callable[[int], Target], who: str) -> Target:
        """The target of all shards, from this rank's ``build(R)`` (``R`` ranks: the latent terms
        weighted ``1/R``); ``who`` names the kernel in errors."""

    def check_start(self, who: str, num_chains: Optional[int]) -> None:
        """Called on every rank when the summed energy at the initial point is not finite: raise an
        error that names the rank whose data shard gave it."""


@runtime_checkable
class ChainKernel(Protocol):
    """What :class:`pyro_flat.MCMC` calls (see the module docstring for the order).

    - ``supports_thinning``: whether ``configure(steps_per_draw=k)`` may ask for ``k > 1``;
    - ``initial_params``: set before ``setup`` to start from the user's point; read after it;
    - ``transforms``: Pyro's convention, support -> unconstrained, for the driver to constrain the draws;
    - ``partial_samples``: each chain's draws so far (constrained), for an error or a Ctrl-C.
    """

    supports_thinning: bool
    initial_params: Optional[Params]

    @property
    def transforms(self) -> Dict[str, torch.distributions.Transform]: ...

    @property
    def partial_samples(self) -> List[Dict[str, torch.Tensor]]: ...

    def vectorization_error(self, num_chains: int, args: tuple, kwargs: dict,
                            initial_params: Optional[Params] = None, minibatches: str = "per_chain", *,
                            num_draws: int = 0) -> Optional[str]:
        """``None`` if ``num_chains`` chains run correctly as one batched tensor, else why not."""

    def configure(self, *, num_chains: Optional[int] = None, steps_per_draw: int = 1,
                  minibatches: str = "per_chain", data_parallel: Optional[DataParallelism] = None,
                  random_streams: str = "shared") -> None:
        """The driver's settings for the next run; forgets every earlier run."""

    def setup(self, warmup_steps: int, *args, **kwargs) -> None:
        """Build the target from the model's arguments and draw (or take) the initial point."""

    def drawing(self) -> ContextManager:
        """The context :meth:`sample` runs in: where the chains' random numbers come from
        (:func:`pyro_flat.chains.streams.drawing_from`)."""

    def sample(self, params: Params) -> Params:
        """One kept iteration (``steps_per_draw`` of them after warm-up): the next parameters."""

    def diagnostics(self) -> dict:
        """The run's statistics, each with a leading chain dimension where it is per chain."""

    def logging(self) -> Dict[str, str]:
        """What the progress bar shows."""

    def cleanup(self) -> None:
        """Release what the run holds (called however the run ends)."""


__all__ = ["ChainKernel", "DataParallelism", "RunChoices"]
