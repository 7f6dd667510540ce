r"""BatchNorm for sampled networks: each draw's statistics from a pass over training data.

While sampling, a network's BatchNorm layers normalise with the minibatch's statistics (see
:class:`~pyro_flat.nn.module.BayesianModule`). A prediction needs the statistics of the network it
is made with: for each draw, :class:`BatchNormStatistics` resets the running mean and variance and
averages them over every batch of the training inputs, with the draw's weights (SWA's ``bn_update``,
the cumulative average of ``momentum=None``), in training mode and without gradients.
:func:`update_batchnorm` gives them for a dict of draws.

>>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
>>> batchnorm_layers(net)
['1']
"""

from __future__ import annotations

import copy
import math
from typing import Dict, List, Optional, Tuple

import torch
from torch.func import functional_call
from torch.nn.modules.batchnorm import _BatchNorm

#: training rows per batch of the statistics pass
STATISTICS_BATCH = 512


def batchnorm_layers(module: torch.nn.Module, every: bool = False) -> List[str]:
    """The names of ``module``'s BatchNorm layers that keep running statistics (``every``: all of them)."""
    return [name for name, m in module.named_modules() if isinstance(m, _BatchNorm) and (every or m.track_running_stats)]


class BatchNormStatistics:
    """Each network's BatchNorm statistics over training inputs, for ``module``'s architecture (a copy in
    training mode, its BatchNorm layers averaging over the whole pass)."""

    def __init__(self, module: torch.nn.Module):
        self.module = copy.deepcopy(module).train()
        self.layers = batchnorm_layers(self.module)
        for name in self.layers:
            self.module.get_submodule(name).momentum = None

    def __call__(self, params: Dict[str, torch.Tensor], inputs: torch.Tensor, batch_dims: Tuple[int, ...] = (),
                 shared: Optional[Dict[str, torch.Tensor]] = None,
                 batch_size: int = STATISTICS_BATCH) -> Dict[str, torch.Tensor]:
        """``{"layer.running_mean" / "layer.running_var": (*batch_dims, features)}`` over ``inputs``, for
        ``params`` whose leading ``batch_dims`` index networks; ``shared``: the same for all (frozen weights)."""
        count = math.prod(batch_dims)
        flat = {k: v.reshape(count, *v.shape[len(batch_dims):]) for k, v in params.items()}
        names = [(f"{layer}.running_mean", f"{layer}.running_var", f"{layer}.num_batches_tracked")
                 for layer in self.layers]
        results = {name: [] for mean, var, _ in names for name in (mean, var)}
        bounds = list(range(0, inputs.shape[0], batch_size)) + [inputs.shape[0]]
        if len(bounds) > 2 and bounds[-1] - bounds[-2] == 1:  # no batch of one row: BatchNorm has no statistics of it
            bounds[-2] -= 1
        with torch.no_grad():
            for i in range(count):
                buffers = {}
                for (mean, var, tracked), layer in zip(names, self.layers):
                    m = self.module.get_submodule(layer)
                    buffers[mean], buffers[var] = torch.zeros_like(m.running_mean), torch.ones_like(m.running_var)
                    buffers[tracked] = torch.zeros_like(m.num_batches_tracked)
                state = {**{k: v[i] for k, v in flat.items()}, **(shared or {}), **buffers}
                for start, stop in zip(bounds, bounds[1:]):  # updates the buffers in place
                    functional_call(self.module, state, (inputs[start: stop],))
                for name in results:
                    results[name].append(buffers[name])
        return {k: torch.stack(v).reshape(*batch_dims, *v[0].shape) for k, v in results.items()}


def check_batch_rows(rows: int, layers: List[str], what: str) -> None:
    """A ``ValueError`` saying ``what`` (e.g. ``"batch_size=1"``) is too few rows when BatchNorm ``layers``
    normalise a minibatch of ``rows`` rows with its own statistics (one row has no variance)."""
    if layers and rows < 2:
        raise ValueError(f"{what} gives minibatches of {rows} row, but the BatchNorm layers {layers} normalise each "
                         "minibatch with its own mean and variance, which one row does not have: pass at least 2 rows "
                         "per minibatch (e.g. batch_size=32).")


def check_batchnorm_inputs(name: str, inputs, device: torch.device, dtype: torch.dtype, probe) -> None:
    """``inputs`` for the statistics pass: a tensor on ``device`` of ``dtype``, at least 2 rows, finite, rows the
    network takes (``probe(name, inputs)``); else an error naming ``name``."""
    if not torch.is_tensor(inputs) or inputs.device != device:
        raise ValueError(f"{name} must be a tensor of training inputs on the module's device {device}, got "
                         f"{type(inputs).__name__}{'' if not torch.is_tensor(inputs) else ' on ' + str(inputs.device)}.")
    if inputs.is_floating_point() and inputs.dtype != dtype:
        raise ValueError(f"{name} is {inputs.dtype} and the module's weights {dtype}: pass {name}.to({dtype}).")
    rows = inputs.shape[0] if inputs.dim() else 0
    if rows < 2:
        raise ValueError(f"{name} has {rows} row{'s' * (rows != 1)} (shape {tuple(inputs.shape)}): each "
                         "draw's BatchNorm statistics are a mean and a variance over training inputs, which need at "
                         f"least 2 rows; pass the training inputs, e.g. {name}=X_train.")
    if inputs.is_floating_point() and not bool(torch.isfinite(inputs).all()):
        raise ValueError(f"{name} holds {int((~torch.isfinite(inputs)).sum())} NaN/inf value(s); clean or impute the "
                         "data before predicting (e.g. drop rows with torch.isfinite(X).all(-1)).")
    probe(name, inputs)


def update_batchnorm(model, draws: Dict[str, torch.Tensor], inputs: torch.Tensor, *,
                     batch_size: int = STATISTICS_BATCH) -> Dict[str, torch.Tensor]:
    """Each draw's BatchNorm statistics over the training ``inputs``: ``{buffer: (num_draws, ...)}``, named
    as ``module.load_state_dict`` takes them. ``model`` is a :class:`~pyro_flat.nn.BayesianModule` and
    ``draws`` its sites ``{name: (num_draws, *shape)}`` (from ``mcmc.get_samples()``, θ or θa)."""
    return model.batchnorm_statistics(draws, inputs, batch_size=batch_size)


__all__ = ["BatchNormStatistics", "batchnorm_layers", "check_batch_rows", "check_batchnorm_inputs",
           "update_batchnorm", "STATISTICS_BATCH"]
