r"""How a network's passes run on its device: the activations' memory layout, and how several networks run together.

Two settings of :class:`~pyro_flat.nn.BayesianModule` (and of :class:`~pyro_flat.nn.functional.BatchedNetwork`),
neither of which changes the model, only the speed and the round-off:

- ``memory_format``: ``"channels_last"`` hands 4-d inputs to the network in NHWC layout, which 2-d convolutions and
  BatchNorm keep through the network, and which cuDNN's tensor-core kernels take without transposes (the layout of
  fast CIFAR trainers); ``"contiguous"`` keeps NCHW. ``"auto"``: channels_last on a GPU for a network with a 2-d
  convolution; NCHW on a CPU, where it gains nothing (measured: the ``bench_deep.py`` CNN's forward and backward at
  minibatch 128, one thread, 41-43 ms either way). Vectorized chains with their own minibatches, ``vmap``-ed, get
  their ``(C, B, channels, H, W)`` images laid out as ``(B, H, W, C, channels)`` in memory, which ``vmap``'s
  grouped convolution receives as NHWC. A network that cannot take NHWC activations (a ``.view`` where
  ``.reshape`` or ``.flatten`` would do) is found on two rows before the first pass (:func:`checked_layout`).
- ``networks``: how ``C`` networks (vectorized chains, blocks of draws) run: ``"vmap"`` (one ``torch.func.vmap``-ed
  pass), ``"loop"`` (one network after another), or ``"measure"``: at the first pass of ``C`` networks together,
  both ways are timed on that pass's own inputs (:func:`measure`: forward, and backward where a gradient is
  taken), and the faster is kept for every later pass of its kind (a :class:`Pass`: ``C``, whether a gradient is
  taken, the autocast dtype, the inputs' shape). ``"auto"``: ``"measure"`` on a GPU, where
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
import warnings
from typing import Callable, Dict, NamedTuple, Optional, Tuple

import torch

from ..tracing import first_line, is_tracing

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


def in_layout(x: torch.Tensor, memory_format: str, per_network: bool = False) -> torch.Tensor:
    """``x`` as the network takes it, for ``"channels_last"``: a 4-d batch of images in NHWC memory, and
    (``per_network``) images ``(C, B, channels, H, W)`` in ``(B, H, W, C, channels)`` memory (``vmap`` hands its
    grouped convolution ``(B, C * channels, H, W)`` in NHWC); anything else as it is. The values never change, only
    their order in memory."""
    if memory_format != "channels_last" or x.dim() != 4 + per_network:
        return x
    if not per_network:
        return x.contiguous(memory_format=torch.channels_last)
    return x.permute(1, 3, 4, 0, 2).contiguous().permute(3, 0, 4, 1, 2)


def checked_layout(module: torch.nn.Module, rows: torch.Tensor, memory_format: str, requested: str) -> str:
    """The layout ``module`` runs in: ``memory_format``, unless it is channels_last and ``module`` fails on ``rows``
    (two rows of its inputs, which ran in their own layout) in NHWC memory: then NCHW, said in a warning where
    ``"auto"`` had chosen channels_last, a ``ValueError`` naming the fix where it was asked for."""
    if memory_format != "channels_last" or rows.dim() != 4:
        return memory_format
    devices = [rows.device] if rows.device.type == "cuda" else []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            module(in_layout(rows, memory_format))
    except RuntimeError as err:
        fix = "write .reshape() or .flatten() where the module's forward has .view()"
        if requested != "auto":
            raise ValueError(f"memory_format='channels_last': the module {type(module).__name__} fails on images in "
                             f"NHWC memory ({first_line(err)}); {fix}, or pass memory_format='contiguous'.") from err
        warnings.warn(f"BayesianModule: the module {type(module).__name__} fails on images in channels_last (NHWC) "
                      f"memory ({first_line(err)}), so it runs in NCHW, which is slower on a GPU; {fix}.",
                      RuntimeWarning, stacklevel=5)
        return "contiguous"
    return memory_format


class Pass(NamedTuple):
    """The kind of pass a measured choice is for: how many ``networks`` run together, whether a gradient is taken
    (``backward``), the autocast dtype's name (``None`` without autocast) and the ``inputs``' shape (a choice timed
    on a few rows does not hold for a minibatch: a GPU left idle by one small network is busy with a large one)."""

    networks: int
    backward: bool
    autocast: Optional[str]
    inputs: Tuple[int, ...] = ()


def current_pass(networks: int, inputs: torch.Tensor) -> Pass:
    """The kind of pass ``networks`` networks make now on ``inputs``."""
    device = inputs.device
    autocast = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
    return Pass(networks, torch.is_grad_enabled(), None if autocast is None else str(autocast).split(".")[-1],
                tuple(inputs.shape))


def _synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Choice(NamedTuple):
    """A measured choice: the faster ``way`` and the ``seconds`` per call :func:`measure` gave each way."""

    way: str
    seconds: Dict[str, float]


def choose(ways: Dict[str, Callable[[], torch.Tensor]], inputs: Tuple[torch.Tensor, ...]) -> Optional[Choice]:
    """The faster of ``ways`` (:func:`measure`), with every way's time; ``None`` inside a trace, where no time is
    real (the caller then takes its default way without recording a choice)."""
    if is_tracing():
        return None
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


class MeasuredNetworks:
    """What :class:`~pyro_flat.nn.BayesianModule` says of the ways its networks run (a mixin over its
    ``_sampling`` and ``_predicting`` :class:`~pyro_flat.nn.functional.BatchedNetwork`): the measured choices, as a
    run's state (:class:`~pyro_flat.kernels.protocol.RunChoices`)."""

    @property
    def network_choices(self) -> Dict[str, Dict[Pass, Choice]]:
        """``networks="measure"``: for each kind of pass (:class:`Pass`) the way chosen and the seconds per call
        measured, while sampling and while predicting (``{}`` until a pass of several networks)."""
        return {k: dict(n.choices) for k, n in (("sampling", self._sampling), ("predicting", self._predicting)) if n}

    def run_choices(self) -> Dict[str, list]:
        """:attr:`network_choices` as plain data (a kernel's checkpoint keeps it)."""
        return {key: [(tuple(p), tuple(c)) for p, c in chosen.items()] for key, chosen in self.network_choices.items()}

    def load_run_choices(self, choices: Dict[str, list]) -> None:
        """Make the choices of the run that gave ``choices`` (:meth:`run_choices`): a resumed run goes on its way."""
        for key, chosen in choices.items():
            network = self._sampling if key == "sampling" else self._predicting
            if network is not None:
                network.choices.update({Pass(*p[:3], tuple(p[3]) if len(p) > 3 else ()): Choice(*c)
                                        for p, c in chosen})

    def _check_layout(self, x: torch.Tensor, lead: int) -> None:
        """:func:`checked_layout` on two rows of ``x`` (``lead`` leading dims before a row), for both networks."""
        for network in (self._sampling, self._predicting):
            if network is not None:
                network.memory_format = checked_layout(network.module, x.reshape(-1, *x.shape[lead:])[:2],
                                                       network.memory_format, self._memory_format_requested)
        self.memory_format = self._sampling.memory_format


__all__ = ["MEMORY_FORMATS", "NETWORK_WAYS", "Choice", "Pass", "MeasuredNetworks", "check_memory_format",
           "networks_way", "in_layout", "checked_layout", "current_pass", "choose", "measure"]
