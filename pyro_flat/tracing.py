"""Graph tools shared by the compiled targets and the compiled kernel steps (``jit_compile``).

A trace records a computation over flat tensors into one ``torch.fx`` graph. Tracing a Pyro model
needs value checks off (:func:`tracing_context`); a traced graph is accepted only if it agrees
with the eager computation (:func:`mismatch`); inductor then fuses it (:func:`compile_graph`).
Nothing here knows a target or a kernel: :mod:`pyro_flat.targets.compiled` and
:mod:`pyro_flat.kernels.compiled_step` both build on it.

>>> import torch
>>> mismatch([("the energy", torch.tensor([1.0]), torch.tensor([1.0 + 1e-6]))]) is None
True
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterable, List, Optional

import pyro
import torch

#: how far a traced graph's outputs may differ from the eager ones (relative, float32)
TOLERANCE = 1e-4
_depth = [0]  # tracing_context()s entered and not left


def is_tracing() -> bool:
    """Whether a trace is being recorded (inside :func:`tracing_context`): no time measured there is real."""
    return _depth[0] > 0


@contextmanager
def tracing_context():
    """What a trace needs: Pyro's argument checks off, and the support checks of distributions built
    with validation on (a ``PyroSample`` prior made at import) off too. Both branch on values; the
    eager setup has run them already."""
    original = torch.distributions.Distribution._validate_sample
    torch.distributions.Distribution._validate_sample = lambda self, value: None
    _depth[0] += 1
    try:
        with pyro.validation_enabled(False):
            yield
    finally:
        _depth[0] -= 1
        torch.distributions.Distribution._validate_sample = original


def first_line(err: Exception) -> str:
    return (str(err).splitlines() or [""])[0].rstrip(".")


def untraceable_reason(err: Exception) -> str:
    """Why a trace failed, in words that say what to change."""
    if "_local_scalar_dense" in str(err) or "data-dependent" in str(err):
        return ("tracing failed: the model reads a tensor's value in Python (an `if` on data or parameters, "
                ".item(), float(...)), which a trace cannot record; write the branch with torch.where to "
                "compile it")
    return f"tracing failed: {type(err).__name__}: {first_line(err)}"


def mismatch(pairs: Iterable[tuple], *, built: bool = False, tolerance: float = TOLERANCE) -> Optional[str]:
    """``None`` if every ``(what, eager, traced)`` pair agrees (same shape, same non-finite entries, within
    ``tolerance`` relative to ``max(1, max |finite eager|)``), else what differs, at the entry that differs most (a
    finite entry against a non-finite one first), and the likely cause: for a traced graph, Python control flow on
    values; for inductor's ``built`` graph of a traced graph that matched, the build. A pair may carry its own
    tolerance as a fourth item (under autocast, see :func:`graph_tolerance`)."""
    for what, want, got, *own in pairs:
        tol = own[0] if own else tolerance
        if want.shape != got.shape:
            return f"the traced graph gives {what} of shape {tuple(got.shape)}, the eager run {tuple(want.shape)}"
        if want.numel() == 0:
            continue
        finite = torch.isfinite(want)
        scale = max(1.0, float(want[finite].abs().max())) if bool(finite.any()) else 1.0
        gaps = (want - got).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).abs().reshape(-1)
        differ = (finite != torch.isfinite(got)).reshape(-1)
        if bool(differ.any()) or float(gaps.max()) > tol * scale:
            worst = int(torch.where(differ, torch.full_like(gaps, math.inf), gaps).argmax())
            where = (f"{'inductor' if built else 'the traced graph'} gives {what} {float(got.reshape(-1)[worst]):.6g} "
                     f"where the eager run gives {float(want.reshape(-1)[worst]):.6g} (entry {worst}; tolerance "
                     f"{tol:.2g} x {scale:.3g})")
            if built:
                return (f"{where}, though the traced graph it built matches the eager run: inductor's build of it "
                        "computes something else (not the model's control flow)")
            return (f"{where}: the model's Python control flow depends on values (an `if` on data or parameters, or "
                    "Python state), which a trace records only one way")
    return None


def graph_tolerance(autocast: Optional[torch.dtype] = None) -> float:
    """How far a graph's energy, gradients and statistics may differ from the eager run's, relative: :data:`TOLERANCE`
    in float32; under ``autocast`` (bf16) 8 of its unit round-offs, since inductor fuses the low-precision operations
    in another order (measured on logistic regression: 1e-3 to 4e-3 of the scale in bf16, where the traced graph
    matched eager exactly). The new values, fp32, differ by the step times that: :func:`move_tolerance`."""
    if autocast is None:
        return TOLERANCE
    return max(TOLERANCE, 8 * torch.finfo(autocast).eps / 2)


def move_tolerance(old: torch.Tensor, new: torch.Tensor, autocast: Optional[torch.dtype] = None) -> float:
    """How far a graph's new value may differ from the eager one's, relative to ``max(1, |new|)``: :data:`TOLERANCE`,
    plus under ``autocast`` :func:`graph_tolerance` of the eager move ``new - old`` (the step's gradient carries the
    low precision's round-off, its noise none: a noise or an augmentation drawn in another order moves a value by
    far more)."""
    if autocast is None or old.shape != new.shape or new.numel() == 0:
        return TOLERANCE
    move = float((new - old).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).abs().max())
    finite = new[torch.isfinite(new)]
    scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
    return TOLERANCE + graph_tolerance(autocast) * move / scale


def eager_mismatch(step, graph, inputs: list, labels: List[str], *, moved: int, built: bool = False,
                   autocast: Optional[torch.dtype] = None, rest: str = "an output",
                   last: Optional[str] = None) -> Optional[str]:
    """:func:`mismatch` of ``graph`` against the eager ``step`` on ``inputs``, each run from the same seed (the
    devices' streams: call it under ``torch.random.fork_rng``) on fresh copies of the inputs (a model may know a
    minibatch by its tensor, :class:`~pyro_flat.nn.batches.RowMemo`, and must draw its random numbers anew in
    each call, as a step of the run does). The outputs are named by ``labels``, then ``rest`` (``last`` for the last
    one); the first ``moved`` are new values of the first ``moved`` inputs (:func:`move_tolerance`), the others at
    :func:`graph_tolerance` of ``autocast``."""
    seed = int(torch.randint(0, 2**31 - 1, ()))
    outputs = []
    for fn in (step, graph):
        torch.random.default_generator.manual_seed(seed)
        if inputs[0].device.type == "cuda":
            with torch.cuda.device(inputs[0].device):  # the inputs' device, not the current one
                torch.cuda.manual_seed(seed)
        outputs.append(fn(*(x.clone() for x in inputs)))
    names = labels + [rest] * (len(outputs[0]) - len(labels) - (last is not None)) + ([last] if last else [])
    tolerances = [move_tolerance(inputs[i], outputs[0][i], autocast) for i in range(moved)]
    tolerances += [graph_tolerance(autocast)] * (len(names) - moved)
    return mismatch(zip(names, *outputs, tolerances), built=built)


def compile_graph(graph, inputs: list, backend: str):
    """``graph`` (a traced ``GraphModule`` over flat tensors) as it runs: itself (``"fx"``) or built by
    inductor directly, without dynamo's per-call guards, keeping ATen's random operations
    (``fallback_random``: inductor's own generator is slower on the CPU and changes the stream)."""
    if backend == "fx":
        return graph
    from torch._inductor import config

    devices = [x.device for x in inputs if x.device.type == "cuda"]
    with torch.random.fork_rng(devices=devices), config.patch(fallback_random=True):
        compiled = torch._inductor.compile(graph, [x.contiguous() for x in inputs])
    # the build assumes its inputs' strides: a view (EntropyHMC's blocks of one flat vector) is copied
    return lambda *xs: compiled(*(x.contiguous() for x in xs))


def cuda_graph(fn, inputs: list):
    """``fn`` (a traced or built graph over CUDA tensors) captured as a CUDA graph: a call copies its
    arguments into the capture's input buffers, replays every kernel with one launch, and returns
    copies of the outputs (the next replay overwrites them). A network's iteration is otherwise bound
    by the host's launches, one per kernel. Random operations draw from the device's generator at
    the replay's offset, so a seeded replay gives the numbers of the uncaptured call. Call it under
    ``torch.random.fork_rng``: the warm-up and the capture draw random numbers. The streams and the capture
    are the inputs' device's (``cuda:1`` under torchrun's second rank), whichever device is current."""
    device = next(x.device for x in inputs if x.device.type == "cuda")
    with torch.cuda.device(device):
        static = [x.clone() for x in inputs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # lazy initialisations (cuBLAS, cuDNN) happen outside the capture
            fn(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):  # the inputs' device's stream, not a first capture's
            outputs = fn(*static)

    def replay(*xs):  # multi-tensor copies: a network's hundreds of tensors in a few launches, not one each
        with torch.cuda.device(device):
            torch._foreach_copy_(static, list(xs))
            graph.replay()
            fresh = [torch.empty_like(out) for out in outputs]
            torch._foreach_copy_(fresh, outputs)
        return fresh

    return replay


def trace_graph(fn, inputs: list):
    """``fn`` over the flat tensors ``inputs`` as a ``GraphModule`` (``make_fx`` under
    :func:`tracing_context`, dead code removed). ``make_fx`` tells inputs apart by identity: pass a
    distinct tensor for each input."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with tracing_context():
        graph = make_fx(fn)(*inputs)
    graph.graph.eliminate_dead_code()
    graph.recompile()
    return graph


__all__ = ["TOLERANCE", "tracing_context", "is_tracing", "first_line", "untraceable_reason", "mismatch",
           "eager_mismatch", "graph_tolerance", "move_tolerance", "compile_graph", "cuda_graph", "trace_graph"]
