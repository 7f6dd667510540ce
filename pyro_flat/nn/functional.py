r"""A network run with weights it does not own, for one draw or a batch of them: ``torch.func`` underneath.

:class:`BatchedNetwork` holds a stateless copy of the user's ``nn.Module`` and evaluates it at given
parameters (and buffers) with :func:`torch.func.functional_call`. Parameters with leading batch
dimensions (vectorized chains, blocks of draws) are flattened into one and mapped with
:func:`torch.func.vmap`, each network on its own inputs (per-chain minibatches) or on shared ones. A module that ``vmap`` cannot
map runs its networks one after another, after one warning that names the layer where it failed.
``networks="loop"`` runs them one after another from the start: on a CPU, where a convolution keeps
the cores busy, ``vmap``'s grouped convolutions and batched BatchNorm cost more than a loop
(``benchmarks/bench_deep.py``); ``"measure"`` times both at the first pass of each number of networks and keeps
the faster, and ``memory_format="channels_last"`` hands images to the network in NHWC layout
(:mod:`~pyro_flat.nn.execution`).
The copy runs in evaluation mode: dropout is off, so the likelihood is a function of the weights.

>>> net = BatchedNetwork(torch.nn.Linear(3, 2))
>>> weights = {"weight": torch.zeros(4, 2, 3), "bias": torch.ones(4, 2)}   # 4 networks
>>> net(weights, torch.randn(5, 3), batch_dims=(4,), per_network_inputs=False).shape
torch.Size([4, 5, 2])
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch.func import functional_call, vmap

from .execution import Choice, Pass, choose, current_pass, in_layout


class BatchedNetwork:
    """``module``'s computation at given weights, in evaluation mode (dropout off: the likelihood is a
    function of the weights). ``batchnorm="batch"`` normalises every BatchNorm layer with its input's
    own statistics (the copy keeps no running statistics: nothing is shared between networks);
    ``"running"`` uses the running statistics passed as buffers (prediction)."""

    def __init__(self, module: torch.nn.Module, batchnorm: str = "batch", networks: str = "vmap",
                 memory_format: str = "contiguous"):
        self.module = copy.deepcopy(module).eval()
        if batchnorm == "batch":
            torch.func.replace_all_batch_norm_modules_(self.module)
        self.networks, self.memory_format = networks, memory_format  # resolved (pyro_flat.nn.execution)
        self.use_vmap = networks != "loop"  # False once vmap has failed
        # vmap's layout: memory_format, or NCHW where a layer cannot ask a channels_last input its layout in vmap
        self.vmap_memory_format = memory_format
        self.choices: Dict[Pass, Choice] = {}  # networks="measure": the way chosen for each kind of pass

    def __call__(self, params: Dict[str, torch.Tensor], x: torch.Tensor, *, batch_dims: Tuple[int, ...] = (),
                 per_network_inputs: bool = False, shared: Optional[Dict[str, torch.Tensor]] = None) -> torch.Tensor:
        """The output for ``params`` (parameters and buffers) whose leading ``batch_dims`` index networks;
        ``x`` carries the same leading dims when ``per_network_inputs``; ``shared`` (not batched) is the
        same for every network (frozen parameters)."""
        shared = shared or {}
        x = in_layout(x, self.memory_format)
        if not batch_dims:
            return functional_call(self.module, {**params, **shared}, (x,))
        count = math.prod(batch_dims)
        flat = {k: v.reshape(count, *v.shape[len(batch_dims):]) for k, v in params.items()}
        inputs = x.reshape(count, *x.shape[len(batch_dims):]) if per_network_inputs else x
        if per_network_inputs:
            inputs = in_layout(inputs, self.memory_format, per_network=True)
        out = self._mapped(flat, shared, inputs, per_network_inputs, count)
        return out.reshape(*batch_dims, *out.shape[1:])

    def _mapped(self, state, shared, x, per_network_inputs: bool, count: int) -> torch.Tensor:
        def one(weights, inputs):
            return functional_call(self.module, {**weights, **shared}, (inputs,))

        mapped = vmap(one, in_dims=(0, 0 if per_network_inputs else None), randomness="different")

        def looped() -> torch.Tensor:
            return torch.stack([one({k: v[i] for k, v in state.items()},
                                    in_layout(x[i], self.memory_format) if per_network_inputs else x)
                                for i in range(count)])

        measuring = self.networks == "measure" and count > 1
        kind = current_pass(count, x) if measuring else None  # the other ways check nothing per pass
        if measuring and kind not in self.choices and kind._replace(inputs=()) in self.choices:
            self.choices[kind] = self.choices[kind._replace(inputs=())]  # a checkpoint's choice from before the shape
        if self.use_vmap and measuring and kind not in self.choices:
            try:
                chosen = choose({"vmap": lambda: self._vmapped(mapped, state, x), "loop": looped}, (*state.values(), x))
            except Exception as err:  # vmap (or its backward) fails: the loop, as where vmap cannot map a layer
                if isinstance(err, torch.OutOfMemoryError):
                    raise
                chosen = Choice("loop", {})
                warnings.warn(f"BayesianModule: timing torch.func.vmap against a loop failed ({type(err).__name__}: "
                              f"{str(err).splitlines()[0]}); its {count} networks run one after another.",
                              RuntimeWarning, stacklevel=4)
            if chosen is not None:  # None inside a trace: vmap, nothing recorded
                self.choices[kind] = chosen
        if self.use_vmap and self.choices.get(kind, Choice("vmap", {})).way == "vmap":
            try:
                return self._vmapped(mapped, state, x)
            except Exception as err:  # a layer vmap cannot map: run the networks one by one from now on
                if isinstance(err, torch.OutOfMemoryError):
                    raise
                self.use_vmap = False
                warnings.warn(f"BayesianModule: torch.func.vmap cannot map layer {self._failing_layer(mapped, state, x)} "
                              f"({type(err).__name__}: {str(err).splitlines()[0]}); its {count} networks run one "
                              "after another, which is slower.", RuntimeWarning, stacklevel=4)
        return looped()

    def _vmapped(self, mapped, state, x: torch.Tensor) -> torch.Tensor:
        """The ``vmap``-ed pass, in :attr:`vmap_memory_format`. Under channels_last, a layer that asks its input's
        layout inside ``vmap`` fails there (BatchNorm on cuDNN: "querying is_contiguous inside of vmap"): the pass
        is tried again in NCHW and, where that runs, ``vmap`` runs in NCHW from then on (the loop keeps NHWC)."""
        if self.vmap_memory_format == "contiguous":
            return mapped(state, x.contiguous())
        try:
            return mapped(state, x)
        except RuntimeError as err:
            if isinstance(err, torch.OutOfMemoryError) or "inside of vmap" not in str(err):
                raise
            out = mapped(state, x.contiguous())  # raises where vmap cannot map the layer in NCHW either
            self.vmap_memory_format = "contiguous"
            return out

    def _failing_layer(self, mapped, state, x) -> str:
        """The leaf layer the failed ``vmap`` call was in: the call again, with each leaf saying when it starts."""
        entered = []
        hooks = [m.register_forward_pre_hook(lambda m, _, name=name: entered.append(name))
                 for name, m in self.module.named_modules() if name and not list(m.children())]
        try:
            mapped(state, x.contiguous() if self.vmap_memory_format == "contiguous" else x)
        except Exception:
            pass
        finally:
            for hook in hooks:
                hook.remove()
        if not entered:
            return type(self.module).__name__
        return f"{entered[-1]} ({type(self.module.get_submodule(entered[-1])).__name__})"


def probe_inputs(module: torch.nn.Module, name: str, x: torch.Tensor, lead: int = 1) -> None:
    """Run ``module`` (a copy, its own weights) on the first two rows of ``x`` (``lead`` leading dims before a
    row). If it fails where its first layer cannot take the rows (their shape, or a dtype that is no float), a
    ``ValueError`` naming ``name`` says what that layer takes; any other error is the module's own, raised as it
    is. A ``TypeError`` if it returns no tensor. No gradient, no sample site, the random stream kept."""
    import pyro

    rows = x.reshape(-1, *x.shape[lead:])[:2]
    if not len(rows):
        return
    try:
        devices = [x.device] if x.device.type == "cuda" else []
        with torch.no_grad(), pyro.poutine.block(), torch.random.fork_rng(devices=devices):
            out = module(rows)
    except (RuntimeError, ValueError, TypeError, IndexError) as err:
        why = _input_fault(module, name, rows)
        if why is None or isinstance(err, torch.OutOfMemoryError):
            raise
        raise ValueError(f"{name} has rows of shape {tuple(rows.shape[1:])} ({x.dtype}), which the module "
                         f"{type(module).__name__} cannot take ({type(err).__name__}: {str(err).splitlines()[0]}). "
                         f"{why}") from err
    if not torch.is_tensor(out):
        raise TypeError(f"the module's forward returned a {type(out).__name__}, not a tensor: BayesianModule needs one "
                        "tensor of logits (the likelihood's input). Wrap the module so that its forward returns it, "
                        "e.g. a torch.nn.Module whose forward is `return net(x)[0]`.")


def _input_fault(module: torch.nn.Module, name: str, rows: torch.Tensor) -> Optional[str]:
    """What is wrong with ``rows`` for the first layer with weights (a linear layer or a convolution): their
    dtype (integers where it takes floats) or their shape; ``None`` where that layer would take them."""
    n, m = next(((n, m) for n, m in module.named_modules() if not list(m.children())
                 and list(m.parameters(recurse=False))), (None, None))
    if isinstance(m, torch.nn.Linear):
        takes, fits = (m.in_features,), rows.shape[-1] == m.in_features
    elif isinstance(m, torch.nn.modules.conv._ConvNd):
        takes = (m.in_channels, *("D", "H", "W")[3 - len(m.kernel_size):])
        fits = rows.dim() == len(takes) + 1 and rows.shape[1] == m.in_channels
    else:
        return None
    if not rows.is_floating_point():
        return f"{name} is {rows.dtype}: convert it, {name}.float() (pixels of 0..255: {name}.float() / 255)."
    shape = ", ".join(map(str, takes))
    return None if fits else (f"Its first layer {n!r} ({type(m).__name__}) takes rows of shape ({shape}"
                              f"{',' * (len(takes) == 1)}): pass {name} of shape (N, {shape}).")


def split_batch_dims(value: torch.Tensor, shape: Sequence[int], name: str) -> Tuple[int, ...]:
    """The leading dims of a sampled weight ``value`` beyond its parameter's ``shape``, less the data
    plate's slot when it is there: ``(C,)`` for ``(C, 1, *shape)`` (Pyro's ``vectorize_particles``
    layout, the one :class:`pyro_flat.MCMC` uses) and for ``(C, *shape)`` (a guide's draws in
    ``Predictive(parallel=True)``), ``()`` for one network."""
    if tuple(value.shape[value.dim() - len(shape):]) != tuple(shape):
        raise ValueError(f"the value of site {name!r} has shape {tuple(value.shape)}; its parameter's shape is "
                         f"{tuple(shape)} (with leading batch dims, as (chains, 1, *shape)).")
    lead = tuple(value.shape[: value.dim() - len(shape)])
    return lead[:-1] if lead and lead[-1] == 1 else lead


__all__ = ["BatchedNetwork", "probe_inputs", "split_batch_dims"]
