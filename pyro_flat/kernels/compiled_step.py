r"""A stochastic-gradient kernel's whole iteration as one compiled graph (``jit_compile=True``).

After setup :class:`CompiledSteps` traces the kernel's own
:meth:`~pyro_flat.kernels.stochastic_gradient.StochasticGradientKernel.transition` (gradient, coupling,
preconditioner, noise and update, of any stochastic-gradient kernel or a user's subclass) with
``make_fx``, autograd's backward pass included, and hands the graph to inductor (a few seconds per
graph; ``jit_compile="fx"`` replays the traced graph). Each call draws the iteration's minibatch
indices eagerly (the graph's inputs) and runs the graph: Pyro's handlers, the distributions' Python
code and autograd's tape are gone from the loop.

Fused iterations: after warm-up, :meth:`CompiledSteps.fused` runs ``k`` iterations (a kept draw's) as
one graph: the ``k`` minibatches are inputs (drawn ahead from the batcher's own stream), the noise is
drawn inside in the eager order, and the graph returns the last state, the statistics at the first
and last iterations' starts, and every iteration's energy and state inf-norms, which the kernel
checks with one host sync per call. A divergence is replayed one iteration at a time on the same
random numbers, so that its report names the iteration and the chain.

The state a kernel carries beside the parameters (SGHMC's momenta, ``kernel.carried``) is an input and
an output of every graph, like the parameters.

On a GPU each graph is also captured as a CUDA graph (:func:`~pyro_flat.tracing.cuda_graph`), checked
against the eager iteration like any graph: one launch per call instead of one per kernel (see
``benchmarks/bench_deep.py``). A capture that fails is said once and the graph runs uncaptured.

The step size is a graph input (a 0-d tensor; fused: one per iteration), so one graph serves every
step of a schedule, a cyclical or decaying one included, and a fused graph's iterations may each have
their own step. A graph bakes in what is constant for it: the temperature (a cyclical schedule's
noise-free exploration phase gets a graph of its own), a preconditioner's frozen metric and the number
of fused iterations; at most :data:`MAX_GRAPHS` of them. A one-iteration graph is built once its key
repeats on consecutive iterations (or at its first use after a resume, where the run before it had
built it: :meth:`CompiledSteps.state_dict`), a fused graph at its first use; warm-up runs eagerly
while a preconditioner adapts. A kernel whose update needs a Python-number step
(:attr:`~pyro_flat.kernels.stochastic_gradient.StochasticGradientKernel.step_size_input` is ``False``:
SGHMC with ``friction=``; or a subclass that fails to trace with a tensor step, after a warning) gets
a graph per step size instead, and a schedule that changes the step at every iteration then runs
eagerly.

Per-chain random streams (:class:`~pyro_flat.chains.streams.ChainStreams`): a graph cannot hold a
``torch.Generator``, so their numbers are the graph's inputs, drawn before each call in the eager order
(``ChainStreams.recording`` lists them when the graph is built, ``feeding`` hands them to the trace).

Random numbers: the graph keeps the eager random operations in the eager order (inductor's own, slower
Philox generator is switched off), so a seeded compiled run repeats the eager run up to round-off; a
kernel that draws several minibatches per iteration (local entropy) draws them all before the noise.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Dict, List, Optional, Sequence

import torch

from ..targets import Params
from ..tracing import (compile_graph, cuda_graph, eager_mismatch, first_line, trace_graph, tracing_context,
                       untraceable_reason)
from .integrators import Transition

#: graphs kept per kernel (one per temperature, metric and number of fused iterations, and per step size
#: where the step is not an input)
MAX_GRAPHS = 4
#: the most iterations one fused graph unrolls (its trace and compile time grow with it)
MAX_FUSED_STEPS = 16
#: iterations in a row without a graph (a baked-in step that never repeats) after which a warning says so
MAX_MISSES = 50


class CompiledSteps:
    """``kernel.transition`` compiled per (temperature, metric), with the step size as an input (or per step
    size too, where :attr:`step_input` is off); ``None`` where a step must run eagerly. ``compile_seconds``
    is the time spent tracing and compiling."""

    def __init__(self, kernel, backend: str = "inductor"):
        self.kernel, self.backend = kernel, backend
        self.graphs: Dict[tuple, object] = {}
        self.compile_seconds = 0.0
        self.disabled: Optional[str] = None  # why the kernel runs eagerly
        self.fused_disabled: Optional[str] = None  # why iterations are not fused
        self.last_compiled = False  # whether the last iteration ran through a graph
        self.cuda_graphs = True  # on a GPU, replay each graph as a CUDA graph (off after a failed capture)
        self._previous_key = None
        self._resumed_keys: set = set()  # graphs the run before a resume had built: built at their first use
        self._misses = 0  # iterations in a row whose graph was not built (their key did not repeat)
        self.batches = kernel.target.batches  # where every minibatch of an iteration comes from
        self.step_input = bool(kernel.step_size_input)  # the step size is a graph input (else baked in)

    def state_dict(self) -> dict:
        """The last iteration's step size and temperature (and whether at the current metric), and those of each
        one-iteration graph built at the current metric: a resumed run builds a graph where an uninterrupted one
        would reuse it, so its iterations run compiled where the uninterrupted run's did, to the same numbers."""
        current = self._key(None, 0.0)[0][2]
        built = [key[:2] for key in self.graphs if len(key) == 3 and key[2] == current]
        if self._previous_key is None:
            return {"previous": None, "built": built}
        step_size, temperature, factor = self._previous_key
        return {"previous": (step_size, temperature, factor == current), "built": built}

    def load_state_dict(self, state: dict) -> None:
        built = state.get("built", [])
        if any(step_size is not None for step_size, _ in built):  # the run had fallen back to baked-in steps
            self.step_input = False
        self._resumed_keys = {self._key(step_size, temperature)[0] for step_size, temperature in built}
        previous = state["previous"]
        if previous is not None:
            step_size, temperature, same_metric = previous
            key = self._key(step_size, temperature)[0]
            self._previous_key = key if same_metric else (*key[:2], None)

    def _key(self, step_size: Optional[float], temperature: float) -> tuple:
        preconditioner = self.kernel.preconditioner
        factor = None if preconditioner is None else preconditioner.factor
        step = None if self.step_input or step_size is None else float(step_size)
        return (step, float(temperature), id(factor)), factor

    def _steps_tensor(self, step_sizes: Sequence[float], params: Params, fused: bool) -> List[torch.Tensor]:
        """The graph's step-size input: a 0-d float64 tensor (``fused``: one per iteration) on the values' device,
        from pinned memory without a host sync on a GPU (none where the step is baked in); the update rules cast
        it to each value's dtype (:func:`~pyro_flat.kernels.integrators.scaled_add`), as ``alpha=`` does."""
        if not self.step_input:
            return []
        values = [float(v) for v in step_sizes] if fused else float(step_sizes[0])
        device = next(iter(params.values())).device
        if device.type != "cuda":
            return [torch.tensor(values, dtype=torch.float64)]
        pinned = torch.tensor(values, dtype=torch.float64, pin_memory=True)
        return [pinned.to(device, non_blocking=True)]

    def __call__(self, params: Params, step_size: float, temperature: float):
        self.last_compiled = False
        if self.disabled is not None:
            return None
        key, keep_alive = self._key(step_size, temperature)
        entry = self.graphs.get(key)
        repeated, self._previous_key = key == self._previous_key, key
        self._misses *= not repeated
        if entry is None:
            # compile a key once it repeats: a schedule that changes a baked-in step at every iteration
            # never pays for a graph it would use once
            if not repeated and key not in self._resumed_keys:
                self._misses += 1
                if self._misses == MAX_MISSES and not self.step_input:  # else a cyclical run is silently eager
                    self.kernel.warn_jit(f"no step size repeated in {MAX_MISSES} iterations: the step is baked into "
                                         "each graph (step_size_input is False; SGHMC: with friction=, not "
                                         "momentum=), so a schedule that changes it at every iteration runs eagerly")
                return None
            if len(self.graphs) >= MAX_GRAPHS:
                self.kernel.warn_jit(f"{MAX_GRAPHS} graphs compiled already (one per temperature, metric and number "
                                     "of fused iterations, and per step size where the step is baked in); other "
                                     "iterations run eagerly")
                return None
            entry = self._cached_build(key, keep_alive, params, [step_size], temperature)
            if entry is None:
                return None
        graph, names, carried, plates, num_draws, stat_names, noise, _ = entry
        indices = [batch[p] for _ in range(num_draws) for batch in (self.batches.draw(),) for p in plates]
        steps = self._steps_tensor([step_size], params, fused=False)
        outputs = self._run(graph, names, params, carried, indices + self._noise(noise, 1) + steps)
        n = len(names)
        self.last_compiled = True
        return Transition(dict(zip(names, outputs[:n])), outputs[n], dict(zip(names, outputs[n + 1: 2 * n + 1])),
                          dict(zip(stat_names, outputs[2 * n + 1:])))

    def _noise(self, specs: list, iterations: int) -> List[torch.Tensor]:
        """``iterations`` iterations' draws from the per-chain streams (none without them), in order."""
        streams = self.kernel.chain_streams
        return [] if not specs else [t for _ in range(iterations) for t in streams.draw(specs)]

    def _run(self, graph, names: list, params: Params, carried: list, inputs: list) -> list:
        """Call ``graph`` on the values, the kernel's carried state and the other ``inputs`` (minibatch
        indices, per-chain noise); the new carried state goes back to the kernel, the other outputs are returned."""
        state = self.kernel.carried
        outputs = graph(*(params[n] for n in names), *(state[c] for c in carried), *inputs)
        n, m = len(names), len(carried)
        self.kernel.carried = dict(zip(carried, outputs[n: n + m]))
        return [*outputs[:n], *outputs[n + m:]]

    def fused(self, params: Params, step_sizes: Sequence[float], temperature: float):
        """``len(step_sizes)`` iterations in one graph call, each at its step size: ``(new params, energy and
        statistics at params, statistics at the last iteration's start, (2, length) energy and state
        inf-norms, the minibatches used)``, or ``None`` where no graph can do it (also where the steps
        differ and a graph bakes the step in)."""
        self.last_compiled = False
        length = len(step_sizes)
        if self.disabled is not None or self.fused_disabled is not None:
            return None
        if not self.step_input and len(set(step_sizes)) > 1:
            return None
        key, keep_alive = self._key(step_sizes[0], temperature)
        key = (*key, length)
        entry = self.graphs.get(key)
        if entry is None:
            if len(self.graphs) >= MAX_GRAPHS:
                return None
            entry = self._cached_build(key, keep_alive, params, step_sizes, temperature, length)
            if entry is None:
                return None
        graph, names, carried, plates, num_draws, stat_names, noise, _ = entry
        batches = [self.batches.draw() for _ in range(length * num_draws)]
        steps = self._steps_tensor(step_sizes, params, fused=True)
        outputs = self._run(graph, names, params, carried,
                            [batch[p] for batch in batches for p in plates] + self._noise(noise, length) + steps)
        n, m = len(names), len(stat_names)
        self.last_compiled = True
        return (dict(zip(names, outputs[:n])), outputs[n], dict(zip(stat_names, outputs[n + 1: n + 1 + m])),
                dict(zip(stat_names, outputs[n + 1 + m: n + 1 + 2 * m])), outputs[-1], batches)

    # ----------------------------------------------------------------- building a graph
    def _cached_build(self, key, keep_alive, params, step_sizes, temperature, length=None):
        """:meth:`_build`, timed into :attr:`compile_seconds` and kept under ``key`` (``None`` if it failed)."""
        start = time.perf_counter()
        entry = self._build(params, step_sizes, temperature, length)
        self.compile_seconds += time.perf_counter() - start
        if entry is None:
            return None
        if key[0] is None and not self.step_input:  # the step turned out to be baked in: key it
            key = (float(step_sizes[0]), *key[1:])
        self.graphs[key] = (*entry, keep_alive)
        return self.graphs[key]

    def _feeding(self, tensors) -> object:
        """The per-chain streams handing out ``tensors`` (nothing to do without streams)."""
        streams = self.kernel.chain_streams
        return nullcontext() if streams is None else streams.feeding(tensors)

    def _fused_traceable(self, names, carried, plates, num_draws, step_size, temperature, length: int, noise: int):
        """``length`` iterations as a function of flat tensors: the values, the kernel's carried state, every
        minibatch's indices, each iteration's ``noise`` draws from the per-chain streams, then (``step_size``
        ``None``) the ``(length,)`` step sizes; it returns the last values and carried state, the energy and
        statistics at the first iteration's start, the statistics at the last one's, and the (2, length)
        inf-norms of each iteration's energy and new state."""
        kernel, n, c, k = self.kernel, len(names), len(carried), len(plates)
        first_noise = n + c + length * num_draws * k

        def steps(*inputs):
            params, norms, first, stats = dict(zip(names, inputs[:n])), [], None, {}
            with kernel.carrying(dict(zip(carried, inputs[n: n + c]))):
                for j in range(length):
                    at = n + c + j * num_draws * k
                    batches = [dict(zip(plates, inputs[at + d * k: at + (d + 1) * k])) for d in range(num_draws)]
                    drawn = inputs[first_noise + j * noise: first_noise + (j + 1) * noise]
                    step = inputs[-1][j] if step_size is None else step_size
                    with self.batches.scripted(batches), self._feeding(drawn):
                        params, energy, _, stats = kernel.transition(params, step, temperature)
                    if first is None:
                        first = (energy, stats)
                    state = torch.stack([v.detach().abs().amax() for v in params.values()]).amax()
                    norms.append(torch.stack([energy.detach().abs().amax(), state]))
                state = kernel.carried
            return [*(params[m] for m in names), *(state[m] for m in carried), first[0], *first[1].values(),
                    *stats.values(), torch.stack(norms, 1)]

        return steps

    def _traceable(self, names, carried, plates, num_draws, step_size, temperature):
        """The iteration as a function of flat tensors: the values, the kernel's carried state, each draw's
        minibatch indices, its draws from the per-chain streams, then (``step_size`` ``None``) the 0-d step
        size; it returns the new values and carried state, the energy, the gradients and the target's
        statistics."""
        kernel, n, c, k = self.kernel, len(names), len(carried), len(plates)

        def step(*inputs):
            batches = [dict(zip(plates, inputs[n + c + d * k: n + c + (d + 1) * k])) for d in range(num_draws)]
            drawn = inputs[n + c + num_draws * k: len(inputs) - (step_size is None)]
            size = inputs[-1] if step_size is None else step_size
            with self.batches.scripted(batches), kernel.carrying(dict(zip(carried, inputs[n: n + c]))), \
                    self._feeding(drawn):
                new, energy, grads, stats = kernel.transition(dict(zip(names, inputs[:n])), size, temperature)
                state = kernel.carried
            return [*(new[m] for m in names), *(state[m] for m in carried), energy, *(grads[m] for m in names),
                    *stats.values()]

        return step

    def _trace(self, params: Params, step_sizes: Sequence[float], temperature: float, length: Optional[int]):
        """The traced graph of one iteration, or of ``length`` fused ones, checked against the eager
        iteration: ``(graph, its eager function, its example inputs, entry)``; raises where it cannot."""
        kernel, names, carried = self.kernel, list(params), list(self.kernel.carried)
        values = [params[n].detach() for n in names]
        state = [kernel.carried[c].detach() for c in carried]
        devices = [v.device for v in values if v.device.type == "cuda"]
        streams = kernel.chain_streams  # per-chain streams: what the probe draws, and back to where they were
        sizes = self._steps_tensor(step_sizes, params, fused=length is not None)  # none where baked in
        baked = None if sizes else step_sizes[0]
        with torch.random.fork_rng(devices=devices), tracing_context(), \
                (nullcontext() if streams is None else streams.forked()):
            with self.batches.scripted() as script, kernel.carrying(kernel.carried), \
                    (nullcontext([]) if streams is None else streams.recording()) as noise:
                probe = sizes[0][0] if sizes and length is not None else (sizes[0] if sizes else baked)
                stat_names = list(kernel.transition(dict(zip(names, values)), probe, temperature).stats)
            plates, num_draws = list(script.fixed), script.count
            # a distinct tensor (and minibatch) per draw: make_fx tells inputs apart by identity
            inputs = values + state + [self.batches.shifted(p, script.fixed[p], d)
                                       for d in range((length or 1) * num_draws) for p in plates]
            inputs += self._noise(noise, length or 1) + sizes
            if length is None:
                step = self._traceable(names, carried, plates, num_draws, baked, temperature)
            else:
                step = self._fused_traceable(names, carried, plates, num_draws, baked, temperature, length,
                                             len(noise))
            graph = trace_graph(step, inputs)
            self._check(graph, step, inputs, len(names), length, carried=len(carried))
        return graph, step, inputs, (names, carried, plates, num_draws, stat_names, noise)

    def _build(self, params: Params, step_sizes: Sequence[float], temperature: float, length: Optional[int] = None):
        """The graph of one iteration, or of ``length`` fused ones; ``None`` (after a warning) if it fails."""
        try:
            graph, step, inputs, entry = self._trace(params, step_sizes, temperature, length)
        except Exception as err:  # any failure to trace means: stay eager (or unfused), and say why
            traced = self._without_step_input(err, params, step_sizes, temperature, length)
            if traced is False:
                return None
            if traced is None:
                if length is None:
                    self._disable(_reason(err))
                else:
                    self.fused_disabled = _reason(err)
                    self.kernel.warn_jit(f"runs one iteration per graph call: fusing {length} failed "
                                         f"({self.fused_disabled})")
                return None
            graph, step, inputs, entry = traced
        names, carried = entry[:2]
        devices = [params[n].device for n in names if params[n].device.type == "cuda"]
        if self.backend == "inductor":
            try:
                compiled = compile_graph(graph, inputs, "inductor")
                with torch.random.fork_rng(devices=devices):
                    self._check(compiled, step, inputs, len(names), length, built=True, carried=len(carried))
                graph = compiled
            except Exception as err:
                self.kernel.warn_jit(f"inductor failed ({type(err).__name__}: {first_line(err)}); the traced graph "
                                "runs without it, as with jit_compile='fx'")
                self.backend = "fx"
        if devices and self.cuda_graphs:
            try:
                with torch.random.fork_rng(devices=devices):
                    captured = cuda_graph(graph, inputs)
                    self._check(captured, step, inputs, len(names), length, built=True, carried=len(carried))
                graph = captured
            except Exception as err:
                self.cuda_graphs = False
                self.kernel.warn_jit(f"capturing the graph as a CUDA graph failed ({type(err).__name__}: "
                                     f"{first_line(err)}); it runs uncaptured, one launch per kernel")
        return (graph, *entry)

    def _without_step_input(self, err: Exception, params: Params, step_sizes: Sequence[float], temperature: float,
                            length: Optional[int]):
        """After a failed trace with the step as an input: trace again with the step baked in. If that works,
        the kernel's update needs a Python-number step: from now on graphs are built per step size (said
        once), and the retraced graph is returned (``False`` where the steps differ, so it cannot serve this
        call). ``None`` where the step was not the cause (or was baked in already)."""
        if not self.step_input:
            return None
        self.step_input = False
        try:
            traced = self._trace(params, [step_sizes[0]] * (length or 1), temperature, length)
        except Exception:
            self.step_input = True  # the step was not the problem: the first failure is the reason
            return None
        self.graphs.clear()
        detail = str(err) if isinstance(err, _Mismatch) else f"{type(err).__name__}: {first_line(err)}"
        self.kernel.warn_jit(f"{type(self.kernel).__name__}.transition does not trace with the step size as a tensor "
                             f"({detail}), so a graph is built per step size, "
                             "once that step repeats, and a schedule that changes the step every iteration runs "
                             "eagerly. Use torch operations on step_size (pyro_flat.kernels.integrators.sqrt, "
                             "scaled_add), or set step_size_input = False on the class to skip this trace")
        return traced if len(set(step_sizes)) == 1 else False

    def _check(self, graph, step, inputs, n: int, length: Optional[int] = None, built: bool = False,
               carried: int = 0) -> None:
        """The traced graph against the eager iteration(s), on the same random numbers
        (:func:`~pyro_flat.tracing.eager_mismatch`): the ``n`` new values and ``carried`` tensors of carried state,
        energy, gradients (fused: the inf-norms) and the target's statistics."""
        labels = ["the new value"] * n + ["the carried state"] * carried + ["the energy"]
        labels += ["the gradient"] * (n if length is None else 0)
        reason = eager_mismatch(step, graph, inputs, labels, moved=n + carried, built=built,
                                autocast=getattr(self.kernel, "autocast", None),
                                rest="a statistic", last="the inf-norms" if length is not None else None)
        if reason is not None:
            raise _Mismatch(reason)

    def _disable(self, reason: str) -> None:
        self.disabled = reason
        self.kernel.warn_jit(f"runs eagerly: {reason}")


class _Mismatch(Exception):
    pass


def _reason(err: Exception) -> str:
    return str(err) if isinstance(err, _Mismatch) else untraceable_reason(err)


__all__ = ["CompiledSteps", "MAX_GRAPHS", "MAX_FUSED_STEPS"]
