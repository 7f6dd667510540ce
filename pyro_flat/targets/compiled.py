r"""The compiled fast path (``jit_compile=True``): a target's energy and gradient as one traced graph.

After setup a kernel knows the model's structure: its latent sites, their shapes and its
subsampled plates. :func:`compile_target` then traces

.. math:: (z, \text{minibatch indices}) \mapsto \big(U(z), \nabla U(z)\big)

once, with ``torch.func.grad_and_value`` under ``make_fx``: Pyro's handlers, the distributions'
Python code and autograd's tape run once, at tracing, and every later call replays the recorded
ATen operations (dead code removed), which costs a fraction of the eager evaluation. With
``backend="inductor"`` the graph is also handed to ``torch.compile``, which fuses it into
generated C++ (tens of seconds to compile; it pays only for large graphs, see
``benchmarks/bench_compiled.py``).

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

    def __init__(self, target, graph, names, plates, backend: str):
        self.target, self.graph, self.backend = target, graph, backend
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
        grads, (_, energy) = self.graph([params[n] for n in self._names], [indices[p] for p in self._plates])
        return energy, dict(zip(self._names, grads))


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


def _trace(target, params: Params, indices: Dict[str, torch.Tensor]):
    from torch.fx.experimental.proxy_tensor import make_fx

    names, plates = list(params), list(indices)
    expected = () if target.num_chains is None else (target.num_chains,)

    def energy(values, index_values):
        u = target(dict(zip(names, values)), dict(zip(plates, index_values)))
        return u.sum(), u.detach().reshape(expected)

    with tracing_context():
        graph = make_fx(torch.func.grad_and_value(energy, has_aux=True))(
            [params[n].detach() for n in names], [indices[p] for p in plates])
    graph.graph.eliminate_dead_code()
    graph.recompile()
    return graph, names, plates


def _mismatch(compiled: CompiledTarget, target, params: Params, indices: Dict[str, torch.Tensor]) -> Optional[str]:
    eager_energy, eager_grads = target.potential_and_grad(params, indices)
    energy, grads = compiled.potential_and_grad(params, indices)
    pairs = [("the energy", eager_energy, energy)] + [
        (f"the gradient of {n!r}", eager_grads[n], grads[n]) for n in eager_grads]
    for what, want, got in pairs:
        scale = float(want.abs().max()) if want.numel() else 0.0
        if want.shape != got.shape or not bool(torch.isfinite(got).all()) or (
                float((want - got).abs().max()) > TOLERANCE * max(1.0, scale)):
            return (f"the traced graph gives {what} {float(got.reshape(-1)[0]):.6g} where the model gives "
                    f"{float(want.reshape(-1)[0]):.6g}: the model's Python control flow depends on values "
                    "(an `if` on data or parameters), which a trace records only one way")
    return None


def compile_target(target, params: Params, *, backend: str = "fx"):
    """``(compiled target, None)``, or ``(target, why not)`` when the target cannot be compiled.

    :param target: a :class:`~pyro_flat.targets.ModelPotential` or
        :class:`~pyro_flat.targets.CallablePotential`, or a
        :class:`~pyro_flat.targets.CoupledPotential` (its base is compiled; the coupling is closed
        form already).
    :param params: the initial point (unconstrained); the trace specialises on its shapes.
    :param backend: ``"fx"`` (replay the traced ATen graph) or ``"inductor"`` (also
        ``torch.compile`` it).
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
        graph, names, plates = _trace(target, params, indices)
    except Exception as err:  # any failure to trace means: stay eager, and say why
        return target, untraceable_reason(err)
    if backend == "inductor":
        graph = torch.compile(graph, backend="inductor", dynamic=False, options={"fallback_random": True})
    compiled = CompiledTarget(target, graph, names, plates, backend)
    generator = torch.Generator().manual_seed(0)  # leaves the global random stream alone
    moved = {k: v + 0.1 * (1 + v.abs()) * torch.randn(v.shape, generator=generator).to(v) for k, v in params.items()}
    other = {p: (i + i.numel()) % _plate_size(target, p, i) for p, i in indices.items()}  # another minibatch
    try:
        for point, batch in ((params, indices), (moved, other)):
            reason = _mismatch(compiled, target, point, batch)
            if reason is not None:
                return target, reason
    except Exception as err:
        return target, f"the traced graph failed: {type(err).__name__}: {first_line(err)}"
    return compiled, None


def _plate_size(target, plate: str, indices: torch.Tensor) -> int:
    batcher = getattr(target, "batchers", {}).get(plate)
    return batcher.size if batcher is not None else max(1, int(indices.max()) + 1)


__all__ = ["CompiledTarget", "compile_target"]
