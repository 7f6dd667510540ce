r"""How a network's passes run on its device: the activations' memory layout, and how several networks run together.

Two settings of :class:`~pyro_flat.nn.BayesianModule` (and of :class:`~pyro_flat.nn.functional.BatchedNetwork`),
neither of which changes the model, only the speed and the round-off:

- ``memory_format``: ``"channels_last"`` hands 4-d inputs to the network in NHWC layout, which 2-d convolutions and
  BatchNorm keep through the network, and which cuDNN's tensor-core kernels take without transposes (the layout of
  fast CIFAR trainers); ``"contiguous"`` keeps NCHW. ``"auto"``: channels_last on a GPU for a network with a 2-d
  convolution; NCHW on a CPU, where it gains nothing (measured: the ``bench_deep.py`` CNN's forward and backward at
  minibatch 128, one thread, 41-43 ms either way).
- ``networks``: how ``C`` networks (vectorized chains, blocks of draws) run: ``"vmap"`` (one ``torch.func.vmap``-ed
  pass), ``"loop"`` (one network after another), or ``"measure"``: at the first pass of ``C`` networks together,
  both ways are timed on that pass's own inputs (:func:`measure`: forward, and backward where a gradient is
  taken), and the faster is kept for every later pass of ``C`` networks. ``"auto"``: ``"measure"`` on a GPU, where
  whether one network leaves the device idle depends on the network, the minibatch and ``C``. On a CPU a fixed
  way, so that a seeded run repeats another one's draws bit for bit (a timing can differ between two runs; the
  ways' draws agree only up to round-off), the one measured faster there: a loop for a network with a
  convolution, which already keeps the cores busy (``vmap``'s grouped convolutions took 1.4x to 2x a loop on
  ``bench_deep.py``'s CNN), ``vmap`` for one without (measured on 2 cores, one thread: 1.0x to 2.8x faster for
  MLPs of 59 to 1.8 million weights at 4 and 16 chains, and 10x for 48 networks of 59 weights).

A measured choice is part of a run's state: a :class:`~pyro_flat.nn.BayesianModule` hands its choices to the kernel's
checkpoint (``run_choices`` / ``load_run_choices``), so that a resumed run continues the same way, to the same draws.

>>> check_memory_format("auto", torch.nn.Conv2d(3, 8, 3), torch.device("cpu"))
'contiguous'
>>> conv = torch.nn.Conv2d(3, 8, 3)
>>> networks_way("auto", conv, torch.device("cpu")), networks_way("auto", conv, torch.device("cuda"))
('loop', 'measure')
>>> networks_way("auto", torch.nn.Linear(3, 2), torch.device("cpu"))
'vmap'
"""

from __future__ import annotations

import time
from typing import Callable, Dict, NamedTuple, Tuple

import torch

#: what ``memory_format=`` takes
MEMORY_FORMATS = ("auto", "channels_last", "contiguous")
#: what ``networks=`` takes
NETWORK_WAYS = ("auto", "vmap", "loop", "measure")
#: timed calls of each way after its warm-up call
MEASURED_CALLS = 3


def check_memory_format(value: str, module: torch.nn.Module, device: torch.device) -> str:
    """``memory_format=`` as ``"channels_last"`` or ``"contiguous"`` (``"auto"`` resolved for ``module`` on
    ``device``); anything else refused by name."""
    if value not in MEMORY_FORMATS:
        raise ValueError(f"memory_format must be one of {MEMORY_FORMATS}, got {value!r}.")
    if value != "auto":
        return value
    has_conv2d = any(isinstance(m, torch.nn.Conv2d) for m in module.modules())
    return "channels_last" if device.type == "cuda" and has_conv2d else "contiguous"


def networks_way(value: str, module: torch.nn.Module, device: torch.device) -> str:
    """``networks=`` as ``"vmap"``, ``"loop"`` or ``"measure"`` (``"auto"`` resolved for ``module`` on ``device``)."""
    if value not in NETWORK_WAYS:
        raise ValueError(f"networks must be one of {NETWORK_WAYS}, got {value!r}.")
    if value != "auto":
        return value
    if device.type == "cuda":
        return "measure"
    return "loop" if any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in module.modules()) else "vmap"


def in_layout(x: torch.Tensor, memory_format: str) -> torch.Tensor:
    """``x`` as the network takes it: a 4-d batch of images in NHWC memory for ``"channels_last"``; anything else
    as it is (the values never change, only their order in memory)."""
    if memory_format == "channels_last" and x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x


def _synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Choice(NamedTuple):
    """A measured choice: the faster ``way`` and the ``seconds`` per call :func:`measure` gave each way."""

    way: str
    seconds: Dict[str, float]


def choose(ways: Dict[str, Callable[[], torch.Tensor]], inputs: Tuple[torch.Tensor, ...]) -> Choice:
    """The faster of ``ways`` (:func:`measure`), with every way's time."""
    seconds = measure(ways, inputs)
    return Choice(min(seconds, key=seconds.get), seconds)


def measure(ways: Dict[str, Callable[[], torch.Tensor]], inputs: Tuple[torch.Tensor, ...],
            calls: int = MEASURED_CALLS, clock: Callable[[], float] = time.perf_counter) -> Dict[str, float]:
    """Seconds per call of each way (a function returning the networks' output): after one warm-up call (lazy
    initialisation, cuDNN's choice of kernels), the mean of ``calls`` calls, each with the backward pass to
    ``inputs`` that require a gradient (none under ``torch.no_grad``). Synchronised on a GPU; no random number is
    drawn (the networks run in evaluation mode)."""
    wanted = [t for t in inputs if t.requires_grad] if torch.is_grad_enabled() else []
    device = next((t.device for t in inputs), torch.device("cpu"))

    def once(way: Callable[[], torch.Tensor]) -> None:
        out = way()
        if wanted and out.requires_grad:
            torch.autograd.grad(out.float().sum(), wanted, allow_unused=True)

    seconds = {}
    for name, way in ways.items():
        once(way)
        _synchronise(device)
        start = clock()
        for _ in range(calls):
            once(way)
        _synchronise(device)
        seconds[name] = (clock() - start) / calls
    return seconds


__all__ = ["MEMORY_FORMATS", "NETWORK_WAYS", "Choice", "check_memory_format", "networks_way", "in_layout", "choose",
           "measure"]
