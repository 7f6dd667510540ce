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

from typing import Dict, Optional

import torch

from ..tracing import compile_graph, first_line, mismatch, trace_graph, untraceable_reason
from .layout import Params
from .protocol import Evaluation, TargetBase


class CompiledTarget(TargetBase):
    """A target whose :meth:`potential_and_grad` replays a traced graph; everything else (the
    sites, the initial point, the full-data potential, ``__call__``) is the eager target's."""

    is_compiled = True

    def __init__(self, target, graph, names, plates):
        self.target, self.graph = target, graph
        self._names, self._plates = list(names), list(plates)

    def __getattr__(self, name):  # sites, transforms, initial_params, full_data, batchers, ...
        if "target" not in self.__dict__:  # copy/pickle probe before __init__ ran
            raise AttributeError(name)
        return getattr(self.__dict__["target"], name)

    def __call__(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None) -> torch.Tensor:
        return self.target(params, indices)

    def evaluate(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None) -> Evaluation:
        if indices is None:
            indices = self.draw_indices()
        outputs = self.graph(*(params[n] for n in self._names), *(indices[p] for p in self._plates))
        return Evaluation(outputs[-1], dict(zip(self._names, outputs[:-1])), {})


def _trace(target, params: Params, indices: Dict[str, torch.Tensor]):
    """The energy and gradient as a graph over flat tensors: the values, then the plates' indices;
    it returns the gradients, then the energy."""
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
    return trace_graph(flat, inputs), names, plates, inputs


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
    if target.coupling is not None:  # compile the base: the coupling is closed form already
        base_params = {k: v for k, v in params.items() if k not in target.coupling.pairs}
        compiled, reason = compile_target(target.base, base_params, backend=backend)
        if reason is None:
            target.base = compiled
        return target, reason
    if not callable(target):
        return target, f"{type(target).__name__} has no traceable potential"
    indices = target.fixed_batch()
    try:
        graph, names, plates, inputs = _trace(target, params, indices)
    except Exception as err:  # any failure to trace means: stay eager, and say why
        return target, untraceable_reason(err)
    generator = torch.Generator().manual_seed(0)  # leaves the global random stream alone
    moved = {k: v + 0.1 * (1 + v.abs()) * torch.randn(v.shape, generator=generator).to(v) for k, v in params.items()}
    other = {p: target.batches.shifted(p, i, 1) for p, i in indices.items()}  # another minibatch
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
