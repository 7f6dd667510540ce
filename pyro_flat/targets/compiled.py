r"""The compiled fast path (``jit_compile=True``): a target's energy and gradient as one traced graph.

After setup a kernel knows the model's structure: its latent sites, their shapes and its
subsampled plates. :func:`compile_target` then traces

.. math:: (z, \text{minibatch indices}) \mapsto \big(U(z), \nabla U(z)\big)

once, with ``torch.func.grad_and_value`` under ``make_fx``: Pyro's handlers, the distributions'
Python code and autograd's tape run once, at tracing, and every later call replays the recorded
ATen operations (dead code removed), which costs a fraction of the eager evaluation. With
``backend="inductor"`` inductor also fuses it into generated C++ (:func:`compile_graph`; seconds
to compile, see ``benchmarks/bench_compiled.py``).

Minibatch indices stay an input, drawn eagerly as before, so a compiled run consumes the random
stream exactly as an eager one does: seeded runs give the same draws up to floating-point
round-off (the traced backward may sum in another order, about 1e-6 relative in float32). One
exception: HMC's step-size search tries unstable trajectories, which amplify that round-off until
a Metropolis decision flips, so an adapted EntropyHMC run draws a different (equally valid) chain.

A trace records one path through the model's Python control flow. A model that branches on
data or parameter values, or that cannot be traced at all, falls back to the eager target:
:func:`compile_target` compares the graph with the eager target at two points and two
minibatches and returns the reason when they differ.

>>> import torch, pyro, pyro.distributions as dist
>>> from pyro_flat.targets import ModelPotential
>>> def model(y):
...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
...     with pyro.plate("data", len(y), subsample_size=5):
...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y[:5])
>>> eager = ModelPotential(model, (torch.zeros(20),))
>>> compiled, why_not = compile_target(eager, eager.initial_params())
>>> type(compiled).__name__, why_not
('CompiledTarget', None)
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Dict, Optional, Tuple

import pyro
import torch

from .potential import CoupledPotential, Params

#: how far the compiled energy and gradient may differ from the eager ones (relative, float32)
TOLERANCE = 1e-4


class CompiledTarget:
    """A target whose :meth:`potential_and_grad` replays a traced graph; everything else (the
    sites, the initial point, the full-data potential, ``__call__``) is the eager target's."""

    def __init__(self, target, graph, names, plates):
        self.target, self.graph = target, graph
        self._names, self._plates = list(names), list(plates)

    def __getattr__(self, name):  # sites, transforms, initial_params, full_data, batchers, ...
        if "target" not in self.__dict__:  # copy/pickle probe before __init__ ran
            raise AttributeError(name)
        return getattr(self.__dict__["target"], name)

    def __call__(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None) -> torch.Tensor:
        return self.target(params, indices)

    def potential_and_grad(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None
                           ) -> Tuple[torch.Tensor, Params]:
        if indices is None:
            indices = self.target.draw_indices()
        outputs = self.graph(*(params[n] for n in self._names), *(indices[p] for p in self._plates))
        return outputs[-1], dict(zip(self._names, outputs[:-1]))


@contextmanager
def tracing_context():
    """What a trace needs: Pyro's argument checks off, and the support checks of distributions built
    with validation on (a ``PyroSample`` prior made at import) off too. Both branch on values; the
    eager setup has run them already."""
    original = torch.distributions.Distribution._validate_sample
    torch.distributions.Distribution._validate_sample = lambda self, value: None
    try:
        with pyro.validation_enabled(False):
            yield
    finally:
        torch.distributions.Distribution._validate_sample = original


def untraceable_reason(err: Exception) -> str:
    """Why a trace failed, in words that say what to change."""
    if "_local_scalar_dense" in str(err) or "data-dependent" in str(err):
        return ("tracing failed: the model reads a tensor's value in Python (an `if` on data or parameters, "
                ".item(), float(...)), which a trace cannot record; write the branch with torch.where to "
                "compile it")
    return f"tracing failed: {type(err).__name__}: {first_line(err)}"


def first_line(err: Exception) -> str:
    return (str(err).splitlines() or [""])[0].rstrip(".")


def mismatch(pairs) -> Optional[str]:
    """``None`` if every ``(what, eager, traced)`` pair agrees (same shape, same non-finite entries,
    within :data:`TOLERANCE` relative), else what differs and the likely cause."""
    for what, want, got in pairs:
        if want.shape != got.shape:
            return f"the traced graph gives {what} of shape {tuple(got.shape)}, the eager run {tuple(want.shape)}"
        if want.numel() == 0:
            continue
        scale = max(1.0, float(want.abs().max()))
        if not torch.equal(torch.isfinite(want), torch.isfinite(got)) or float(
                (want - got).nan_to_num().abs().max()) > TOLERANCE * scale:
            return (f"the traced graph gives {what} {float(got.reshape(-1)[0]):.6g} where the eager run gives "
                    f"{float(want.reshape(-1)[0]):.6g}: the model's Python control flow depends on values (an "
                    "`if` on data or parameters, or Python state), which a trace records only one way")
    return None


def shifted_batch(target, plate: str, indices: torch.Tensor, shift: int) -> torch.Tensor:
    """``indices`` of ``target``'s subsampled ``plate`` moved along by ``shift`` minibatches: another
    valid minibatch, for comparisons and for tracing several draws as distinct inputs."""
    return (indices + shift * indices.shape[-1]) % target.batchers[plate].size


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


def _trace(target, params: Params, indices: Dict[str, torch.Tensor]):
    """The energy and gradient as a graph over flat tensors: the values, then the plates' indices;
    it returns the gradients, then the energy."""
    from torch.fx.experimental.proxy_tensor import make_fx

    names, plates, n = list(params), list(indices), len(params)
    expected = () if target.num_chains is None else (target.num_chains,)

    def energy(*inputs):
        u = target(dict(zip(names, inputs[:n])), dict(zip(plates, inputs[n:])))
        return u.sum(), u.detach().reshape(expected)

    gradient_and_energy = torch.func.grad_and_value(energy, argnums=tuple(range(n)), has_aux=True)

    def flat(*inputs):
        grads, (_, u) = gradient_and_energy(*inputs)
        return [*grads, u]

    inputs = [params[name].detach() for name in names] + [indices[p] for p in plates]
    with tracing_context():
        graph = make_fx(flat)(*inputs)
    graph.graph.eliminate_dead_code()
    graph.recompile()
    return graph, names, plates, inputs


def compile_target(target, params: Params, *, backend: str = "fx"):
    """``(compiled target, None)``, or ``(target, why not)`` when the target cannot be compiled.

    :param target: a :class:`~pyro_flat.targets.ModelPotential` or
        :class:`~pyro_flat.targets.CallablePotential`, or a
        :class:`~pyro_flat.targets.CoupledPotential` (its base is compiled; the coupling is closed
        form already).
    :param params: the initial point (unconstrained); the trace specialises on its shapes.
    :param backend: ``"fx"`` (replay the traced ATen graph) or ``"inductor"`` (also compile it, see
        :func:`compile_graph`).
    """
    if backend not in ("fx", "inductor"):
        raise ValueError(f"backend must be 'fx' or 'inductor', got {backend!r}.")
    if isinstance(target, CoupledPotential):
        base_params = {k: v for k, v in params.items() if k not in target.pairs}
        compiled, reason = compile_target(target.base, base_params, backend=backend)
        if reason is None:
            target.base = compiled
        return target, reason
    if not hasattr(target, "draw_indices"):
        return target, f"{type(target).__name__} has no traceable potential"
    indices = target.fixed_batch() if hasattr(target, "fixed_batch") else {}
    try:
        graph, names, plates, inputs = _trace(target, params, indices)
    except Exception as err:  # any failure to trace means: stay eager, and say why
        return target, untraceable_reason(err)
    generator = torch.Generator().manual_seed(0)  # leaves the global random stream alone
    moved = {k: v + 0.1 * (1 + v.abs()) * torch.randn(v.shape, generator=generator).to(v) for k, v in params.items()}
    other = {p: shifted_batch(target, p, i, 1) for p, i in indices.items()}  # another minibatch
    try:
        compiled = CompiledTarget(target, compile_graph(graph, inputs, backend), names, plates)
        for point, batch in ((params, indices), (moved, other)):
            eager_energy, eager_grads = target.potential_and_grad(point, batch)
            energy, grads = compiled.potential_and_grad(point, batch)
            reason = mismatch([("the energy", eager_energy, energy)] + [
                (f"the gradient of {n!r}", eager_grads[n], grads[n]) for n in eager_grads])
            if reason is not None:
                return target, reason
    except Exception as err:
        return target, f"the traced graph failed: {type(err).__name__}: {first_line(err)}"
    return compiled, None


__all__ = ["CompiledTarget", "compile_target"]
