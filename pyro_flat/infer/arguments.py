"""The arguments of :class:`pyro_flat.MCMC`, checked before any work: a kernel instance (not a
sampler's name or class) and ``initial_params`` as floating-point tensors with a chain dimension;
the chains' starts for Pyro's driver when none is given (:func:`pyro_driver_starts`); and the run's CUDA devices
(:func:`run_cuda_devices`).

>>> check_initial_params({"x": [[0, 1], [2, 3]]}, num_chains=2)["x"].dtype
torch.float32
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from ..nn.batches import Batches
from ..targets.starts import start_hook
from ..validation import check_real_tensor


def check_kernel(kernel) -> None:
    """A ``TypeError`` naming ``kernel`` unless it is a kernel instance (Pyro's contract: ``setup``
    and ``sample``), not a sampler's name or class."""
    if isinstance(kernel, (type, str)):
        from ..kernels import KERNELS, kernel_class  # here: the kernels sit above the driver's checks

        by_name = ""
        if isinstance(kernel, type):
            name, given = kernel.__name__, f"the class {kernel.__name__}"
        else:
            given = f"the string {kernel!r}"
            try:
                name = kernel_class(kernel).__name__
                by_name = f" (pyro_flat.kernels.make_kernel({kernel!r}, model, step_size=1e-3) builds one by name)"
            except ValueError:  # no kernel of that name
                name, by_name = "SGLD", f" (the kernels by name: {', '.join(KERNELS)})"
        raise TypeError(f"kernel must be a kernel instance, got {given}; pass one built with its model, e.g. "
                        f"MCMC({name}(model, step_size=1e-3), num_samples=...){by_name}.")
    if not (callable(getattr(kernel, "setup", None)) and callable(getattr(kernel, "sample", None))):
        raise TypeError(f"kernel must be an MCMC kernel such as pyro_flat.SGLD(model, step_size=1e-3) or "
                        f"pyro.infer.NUTS(model), got {type(kernel).__name__} {kernel!r:.80}.")


def check_initial_params(initial_params, num_chains: int) -> Dict[str, torch.Tensor]:
    """``initial_params`` as a dict of floating-point tensors (integers converted), with a leading
    chain dim for several chains; else an error naming the value. With one chain a value may have a
    leading chain dim of 1 or none (the target tells them apart by the site's shape)."""
    if not isinstance(initial_params, dict):
        raise ValueError(f"initial_params must be a dict {{site name: tensor}}, got "
                         f"{type(initial_params).__name__}.")
    initial_params = {name: check_real_tensor(f"initial_params[{name!r}]", value)
                      for name, value in initial_params.items()}
    for name, value in initial_params.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            bad = ~torch.isfinite(value.reshape(len(value), -1)).all(-1) if num_chains > 1 and value.dim() else None
            where = "" if bad is None else f" (chain {int(bad.nonzero()[0, 0])})"
            raise ValueError(f"initial_params[{name!r}] holds NaN or inf{where}; pass finite starting values.")
    if num_chains > 1:
        for name, value in initial_params.items():
            shape = tuple(torch.as_tensor(value).shape)
            if not shape or shape[0] != num_chains:
                raise ValueError(
                    f"initial_params[{name!r}] has shape {shape}; with num_chains={num_chains} each "
                    f"value needs a leading chain dimension of {num_chains} (one row per chain).")
    return initial_params


def pyro_driver_starts(kernel, num_chains: int, args: tuple, kwargs: dict) -> Optional[Dict[str, torch.Tensor]]:
    """Every chain's start ``{site: (C, ...)}`` (unconstrained) from the model's own ``initial_params``
    (:mod:`pyro_flat.targets.starts`), for Pyro's driver, which sets up one chain at a time and would
    otherwise start each from the model's one-chain start; ``None`` for one chain, for a kernel given an
    ``init_strategy`` and for a model without that method (each chain then draws its own start)."""
    model = getattr(kernel, "model", None)
    if num_chains == 1 or model is None or not hasattr(kernel, "build_target") \
            or start_hook(model, getattr(kernel, "init_strategy", None)) is None:
        return None
    return kernel.build_target(args, kwargs, num_chains=num_chains).initial_params()


def run_cuda_devices(args: tuple, kwargs: dict, initial_params: Optional[Dict[str, torch.Tensor]] = None,
                     kernel=None) -> list:
    """The CUDA devices of the run: of the model's tensor arguments, of the batches a
    :class:`~pyro_flat.nn.Batches` argument puts on its ``device``, of ``initial_params`` (a ``potential_fn``'s
    state) and of the weights of a ``kernel`` whose model is an ``nn.Module``: those whose random streams a run
    draws from, which decide a run across ranks' backend and where a checkpoint's CUDA tensors go."""
    values = list(args) + list(kwargs.values()) + list((initial_params or {}).values())
    devices = {v.device for v in values if torch.is_tensor(v)}
    devices |= {torch.device(v.device) for v in values if isinstance(v, Batches) and v.device is not None}
    model = getattr(kernel, "model", None)
    if isinstance(model, torch.nn.Module):
        devices |= {t.device for t in (*model.parameters(), *model.buffers())}
    # indexed devices first, by index (cuda:2 before cuda:10)
    return sorted({d for d in devices if d.type == "cuda"}, key=lambda d: (d.index is None, d.index or 0))


__all__ = ["run_cuda_devices", "check_kernel", "check_initial_params", "pyro_driver_starts"]
