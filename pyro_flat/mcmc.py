r"""``pyro_flat.MCMC``: Pyro's MCMC driver, plus chains vectorized in one process.

Pyro runs ``num_chains`` chains one after the other, or in worker processes (about 1 ms of
traffic per draw). pyro-flat's kernels can instead advance all chains together as one batched
tensor (a leading chain dimension on every parameter), which is what many-chain studies need:
hundreds of chains at the cost of a few. :class:`MCMC` is ``pyro.infer.MCMC`` with two more
arguments, ``chain_method`` and ``thinning``. ``chain_method`` is one of:

- ``"vectorized"``: one kernel, one process, all chains batched; an error says why if the model
  does not broadcast;
- ``"auto"`` (default): vectorized when the kernel supports it and the model broadcasts over a
  leading chain dimension (checked by evaluating the first chains both ways), else Pyro's
  behaviour, with a warning that says why;
- ``"sequential"``/``"parallel"``: Pyro's behaviour (``"parallel"`` uses Pyro's worker processes
  when there are enough CPUs).

Whatever ran is in ``mcmc.chain_method``. Samples, ``summary()``, ``diagnostics()`` and
:func:`pyro_flat.to_arviz` look exactly as after Pyro's own run: ``(chain, draw, ...)``.
With ``pyro.set_rng_seed(s)`` before ``run`` a vectorized run is reproducible bit for bit.

``thinning=k`` (NumPyro's meaning) keeps every ``k``-th of the ``num_samples`` post-warm-up
iterations, ``num_samples // k`` draws per chain. The kernel makes the ``k`` iterations of a draw
inside one ``sample`` call, so the skipped states are never stored, by either driver: a Bayesian
neural network's chain of thousands of iterations holds only the draws it keeps. The progress bar
counts kept draws.

Example::

    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_flat import MCMC, EntropySGLD
    >>> def model():
    ...     pyro.sample("x", dist.Normal(torch.zeros(2), 1.).to_event(1))
    >>> mcmc = MCMC(EntropySGLD(model, eta=0.5, step_size=0.05), num_samples=100,
    ...             warmup_steps=50, num_chains=8, disable_progbar=True)
    >>> mcmc.run()
    >>> mcmc.chain_method, mcmc.get_samples(group_by_chain=True)["x_aux"].shape
    ('vectorized', torch.Size([8, 100, 2]))
"""

from __future__ import annotations

import logging
import warnings
from typing import Dict, Optional

import torch

import pyro
import pyro.infer
from pyro import poutine
from pyro.infer.mcmc.api import _add_logging_hook
from pyro.infer.mcmc.logger import ProgressBar, initialize_logger
from pyro.util import optional

CHAIN_METHODS = ("auto", "vectorized", "sequential", "parallel")


class MCMC(pyro.infer.MCMC):
    """``pyro.infer.MCMC`` with vectorized chains (see the module docstring).

    :param chain_method: ``"auto"``, ``"vectorized"``, ``"sequential"`` or ``"parallel"``.
    :param thinning: keep every ``thinning``-th post-warm-up iteration (a pyro-flat
        stochastic-gradient kernel is needed for ``thinning > 1``).

    The other arguments are ``pyro.infer.MCMC``'s. ``initial_params`` for ``num_chains > 1`` have
    a leading chain dimension, as in Pyro.
    """

    def __init__(self, kernel, num_samples: int, warmup_steps: Optional[int] = None,
                 initial_params: Optional[Dict[str, torch.Tensor]] = None, num_chains: int = 1,
                 chain_method: str = "auto", thinning: int = 1, **kwargs):
        num_samples = _thinned(kernel, num_samples, thinning)
        if chain_method not in CHAIN_METHODS:
            raise ValueError(f"chain_method must be one of {CHAIN_METHODS}, got {chain_method!r}.")
        if not isinstance(num_chains, int) or num_chains < 1:
            raise ValueError(f"num_chains must be a positive int, got num_chains={num_chains!r}.")
        can_vectorize = hasattr(kernel, "vectorization_error")
        if chain_method == "vectorized" and not can_vectorize:
            raise ValueError(
                f"chain_method='vectorized' needs a pyro-flat kernel; {type(kernel).__name__} "
                "cannot batch chains. Use chain_method='sequential'."
            )
        self._requested = (num_chains, chain_method, initial_params, num_samples, warmup_steps, kwargs)
        self.kernel = kernel
        self.chain_method = chain_method
        vectorize = num_chains > 1 and can_vectorize and chain_method in ("auto", "vectorized")
        if vectorize:  # decided for good in run(), when the model's arguments are known
            super().__init__(kernel, num_samples, warmup_steps, num_chains=1, **kwargs)
        else:
            self._init_pyro(num_chains, initial_params)

    def _init_pyro(self, num_chains: int, initial_params) -> None:
        _, _, _, num_samples, warmup_steps, kwargs = self._requested
        with warnings.catch_warnings():
            if self.chain_method == "sequential":  # asked for: Pyro need not warn about it
                warnings.filterwarnings("ignore", message="num_chains=.*Chains will be drawn sequentially")
            super().__init__(self.kernel, num_samples, warmup_steps, initial_params=initial_params,
                             num_chains=num_chains, **kwargs)
        if num_chains > 1 and self.chain_method != "sequential":
            parallel = type(self.sampler).__name__ == "_MultiSampler"
            self.chain_method = "parallel" if parallel else "sequential"
        elif num_chains == 1:
            self.chain_method = "sequential"

    def run(self, *args, **kwargs) -> None:
        num_chains, method, initial_params, *_ = self._requested
        if self.num_chains == 1 and num_chains > 1:  # vectorization requested: can it be done?
            reason = self.kernel.vectorization_error(num_chains, args, kwargs, initial_params)
            if reason is None:
                return self._run_vectorized(num_chains, initial_params, args, kwargs)
            if method == "vectorized":
                raise ValueError(
                    f"chain_method='vectorized': the model does not broadcast over a leading chain "
                    f"dimension ({reason}). Write it so that every latent may carry a leading "
                    "batch dim (as Predictive(parallel=True) needs), pass a batched potential_fn, "
                    "or use chain_method='sequential'."
                )
            warnings.warn(
                f"{type(self.kernel).__name__}: running {num_chains} chains with Pyro's driver, "
                f"not vectorized, because the model does not broadcast over a leading chain "
                f"dimension ({reason}).",
                stacklevel=2,
            )
            self.chain_method = "sequential"
            self._init_pyro(num_chains, initial_params)
        return super().run(*args, **kwargs)

    def _run_vectorized(self, num_chains: int, initial_params, args, kwargs) -> None:
        """Pyro's sampling loop for one kernel that holds every chain; draws go straight into
        preallocated ``(chain, draw, ...)`` buffers."""
        kernel, warmup, num_samples = self.kernel, self.warmup_steps, self.num_samples
        kernel.num_chains = num_chains
        if initial_params is not None:
            kernel.initial_params = initial_params
        self._args, self._kwargs = args, kwargs
        args = [a.detach() if torch.is_tensor(a) else a for a in args]
        progress_bar = ProgressBar(warmup, num_samples, disable=self.sampler.disable_progbar)
        logger = initialize_logger(logging.getLogger("pyro.infer.mcmc"), "", progress_bar)
        hook = _add_logging_hook(logger, progress_bar, self.sampler.hook)
        try:
            with poutine.block(), optional(pyro.validation_enabled(not self.disable_validation),
                                           self.disable_validation is not None):
                kernel.setup(warmup, *args, **kwargs)
                params = kernel.initial_params
                names = getattr(kernel, "save_params", None) or sorted(params)
                draws = {n: params[n].new_empty((num_samples,) + params[n].shape)  # (draw, chain, ...)
                         for n in names}
                for i in range(warmup):
                    params = kernel.sample(params)
                    hook(kernel, params, "Warmup", i)
                for i in range(num_samples):
                    params = kernel.sample(params)
                    for n in names:
                        draws[n][i] = params[n]
                    hook(kernel, params, "Sample", i)
                diagnostics = kernel.diagnostics()
                kernel.cleanup()
            if self.transforms is None:
                self.transforms = kernel.transforms
            draws = {n: v.transpose(0, 1) for n, v in draws.items()}  # (chain, draw, ...) views
            self._samples = {n: self.transforms[n].inv(v) if n in self.transforms else v
                             for n, v in draws.items()}
        finally:
            progress_bar.close()
            kernel.num_chains = None
        self.chain_method = "vectorized"
        self.num_chains = num_chains
        self._diagnostics = _split_diagnostics(diagnostics, num_chains)


def _thinned(kernel, num_samples: int, thinning: int) -> int:
    """The number of kept draws; tells the kernel how many iterations make one draw."""
    if isinstance(thinning, bool) or not isinstance(thinning, int) or thinning < 1:
        raise ValueError(f"thinning must be a positive int, got thinning={thinning!r}.")
    if hasattr(kernel, "steps_per_draw"):
        kernel.steps_per_draw = 1  # a kernel may be reused by a run without thinning
    if thinning == 1:
        return num_samples
    if not hasattr(kernel, "steps_per_draw"):
        raise ValueError(
            f"thinning={thinning} needs a pyro-flat stochastic-gradient kernel (SGLD, EntropySGLD, "
            f"...); {type(kernel).__name__} makes one iteration per draw. Use thinning=1 and "
            "slice the draws afterwards: mcmc.get_samples(group_by_chain=True)[name][:, ::k].")
    if num_samples < thinning:
        raise ValueError(f"num_samples={num_samples} keeps no draw with thinning={thinning}; "
                         "pass num_samples >= thinning.")
    kernel.steps_per_draw = thinning
    return num_samples // thinning


def _split_diagnostics(diagnostics: dict, num_chains: int) -> list:
    """A vectorized kernel's diagnostics as Pyro's list of one dict per chain."""
    per_chain = []
    for c in range(num_chains):
        chain = {}
        for key, value in diagnostics.items():
            if key == "divergences":
                chain[key] = list(value[c])
            elif key == "sample_stats":
                chain[key] = {name: stat[:, c] for name, stat in value.items()}
            elif torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == num_chains:
                chain[key] = value[c]
            else:
                chain[key] = value
        per_chain.append(chain)
    return per_chain
