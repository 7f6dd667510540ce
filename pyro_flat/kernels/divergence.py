"""The report of a diverged stochastic-gradient step: which chain, which site, what to change.

:func:`blow_up_of` (and :func:`fused_blow_up` for fused iterations) tells a divergence, and
:func:`divergence_error` turns a step it called a divergence into a :class:`~pyro_flat.DivergenceError` whose message names the chain, the
iteration, the site and a smaller step size, and which carries the draws made before it.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Tuple, Union

import torch

from ..targets import Params
from ..chains.shard import global_chain
from ..errors import DivergenceError


def inf_norm(params: Params) -> float:
    """The largest absolute coordinate of a state (NaN if it holds one), with one host sync."""
    return float(torch.stack(torch._foreach_norm(list(params.values()), math.inf)).amax())


def _blow_up(energy_norm: float, norm_after: float, norm_before: float, max_growth: Optional[float]) -> Optional[str]:
    if not (math.isfinite(energy_norm) and math.isfinite(norm_after)):
        return "non-finite"
    if max_growth is not None and norm_after > max_growth * max(1.0, norm_before):
        return "growth"
    return None


def fused_blow_up(norms: torch.Tensor, norm_before: float, max_growth: Optional[float]) -> Tuple[Optional[str], float]:
    """:func:`blow_up_of` for ``k`` fused iterations, from the graph's ``(2, k)`` output of
    ``[energy inf-norm, state inf-norm]`` per iteration; one host sync. ``(why the first divergent
    iteration is one or None, the last state's largest |coordinate|)``."""
    energy_norms, state_norms = norms.tolist()
    for energy_norm, norm_after in zip(energy_norms, state_norms):
        problem = _blow_up(energy_norm, norm_after, norm_before, max_growth)
        if problem is not None:
            return problem, norm_after
        norm_before = norm_after
    return None, norm_before


def step_norms(energy: torch.Tensor, new_params: Params) -> torch.Tensor:
    """``[energy inf-norm, new state inf-norm]`` of a step, on the device (no host sync): what
    :func:`blow_up_of` reads."""
    norms = torch.stack(torch._foreach_norm([energy.reshape(-1), *new_params.values()], math.inf))
    return torch.stack([norms[0], norms[1:].amax()])


class PendingRead:
    """A small tensor's values on their way to the host. On a GPU they are copied into pinned memory behind the work
    queued so far, and reading them (:meth:`tolist`) waits for that work only, not for steps queued after it (a
    plain ``.tolist()`` would wait for the whole stream). On a CPU, the tensor itself."""

    def __init__(self, values: torch.Tensor):
        self._event = None
        if values.device.type == "cuda":
            self._host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self._host.copy_(values, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(values.device))
        else:
            self._host = values

    def tolist(self) -> list:
        if self._event is not None:
            self._event.synchronize()
        return self._host.tolist()


def blow_up_of(norms: Union[torch.Tensor, PendingRead], norm_before: float, max_growth: Optional[float]) -> Tuple[Optional[str], float]:
    """``(why the step is a divergence or None, the new state's largest |coordinate|)`` from its
    :func:`step_norms`; one host read.

    A divergence is either a NaN/inf energy or state, or a finite blow-up: the largest absolute
    coordinate of the state growing more than ``max_growth`` times in one iteration,
    :math:`\\|\\theta_{k+1}\\|_\\infty > g \\max(1, \\|\\theta_k\\|_\\infty)`
    (``None`` turns that part off); ``norm_before`` is :math:`\\|\\theta_k\\|_\\infty`, the previous
    step's second value. The largest absolute value of each tensor (an inf-norm, which keeps NaN)
    is finite exactly when the tensor is: unlike a sum, it cannot overflow while every entry is finite.
    """
    energy_norm, norm_after = norms.tolist()
    return _blow_up(energy_norm, norm_after, norm_before, max_growth), norm_after


def _growth(params: Params, new_params: Params, num_chains: Optional[int], max_growth: float
            ) -> Tuple[Optional[int], str, str]:
    """``(chain or None, site, what happened)`` for a finite blow-up of the largest coordinate."""
    def per_chain(tensors):  # largest |coordinate| of each chain (or of the one chain)
        rows = [v.reshape(v.shape[0] if num_chains is not None else 1, -1).abs().amax(-1)
                for v in tensors.values()]
        return torch.stack(rows).amax(0)

    before, after = per_chain(params), per_chain(new_params)
    c = int((after / before.clamp(min=1.0)).argmax())
    pick: Callable = (lambda v: v[c]) if num_chains is not None else (lambda v: v)
    site = max(new_params, key=lambda n: float(pick(new_params[n]).abs().max()))
    where = (f"its largest absolute value grew from {float(before[c]):.3g} to {float(after[c]):.3g} "
             f"in one iteration (site {site!r}), more than max_growth = {max_growth:g} times: a "
             "finite blow-up (set kernel.max_growth = None to allow such jumps)")
    return (c if num_chains is not None else None), site, where


def _non_finite(params: Params, grads: Params, new_params: Params, energy: torch.Tensor,
                num_chains: Optional[int]) -> Tuple[Optional[int], str, str]:
    """``(chain or None, site, what happened)`` for a NaN/inf energy, gradient or state."""
    chain, pick = None, (lambda v: v)
    if num_chains is not None:  # name the first chain that went non-finite
        finite = torch.isfinite(energy)
        for tensors in (grads, new_params, params):
            for value in tensors.values():
                finite = finite & torch.isfinite(value.reshape(value.shape[0], -1)).all(-1)
        chain = int((~finite).nonzero()[0, 0])
        pick = lambda v: v[chain]  # noqa: E731  (that chain's slice of a batched tensor)
    for label, tensors in (("gradient", grads), ("value", new_params), ("value", params)):
        for name, value in tensors.items():
            if not bool(torch.isfinite(pick(value)).all()):
                return chain, name, f"the {label} of site {name!r} became NaN/inf"
    # the energy overflowed first: name the site pushing hardest
    site = max(grads, key=lambda n: float(pick(grads[n]).norm()))
    return chain, site, (f"the potential energy became {float(pick(energy.reshape(-1)))} "
                         f"(largest gradient at site {site!r})")


def divergence_error(kernel_name: str, problem: str, *, params: Params, grads: Params, new_params: Params,
                     energy: torch.Tensor, step_size: float, base_step_size: float, iteration: int,
                     warming_up: bool, chain: int, num_chains: Optional[int], max_growth: Optional[float],
                     num_draws: int, draws: List[Dict[str, torch.Tensor]],
                     completed_chains: List[Dict[str, torch.Tensor]]) -> DivergenceError:
    """The error for a step from ``params`` to ``new_params`` that diverged (``problem`` is
    ``"growth"`` or ``"non-finite"``). ``chain`` is the driver's chain index (one chain per setup);
    with ``num_chains`` vectorized chains the failing one is found. ``draws`` holds each current
    chain's ``num_draws`` draws so far: the failing chain's go to ``.samples``, the others to ``.completed_chains``."""
    if problem == "growth":
        found, site, where = _growth(params, new_params, num_chains, max_growth)
    else:
        found, site, where = _non_finite(params, grads, new_params, energy, num_chains)
    if found is not None:
        chain = global_chain(found, num_chains)  # chains split over ranks: its number in the whole run
    phase = "warm-up" if warming_up else "sampling"
    vectorized = num_chains is not None
    return DivergenceError(
        f"{kernel_name}: chain {chain} diverged at iteration {iteration} "
        f"({phase}): {where} with step size {step_size:.3g}. Use a smaller "
        f"step_size (e.g. {base_step_size / 10:.3g}) or a schedule that decays it. "
        f"The {num_draws} draw(s) made by this chain before it are kept in the exception's "
        "`.samples` (finished chains in `.completed_chains`).",
        site=site,
        iteration=iteration,
        chain=chain,
        step_size=step_size,
        samples=(draws[found] if vectorized else draws[0]) if draws else {},
        completed_chains=list(completed_chains) + [d for c, d in enumerate(draws) if vectorized and c != found],
    )


__all__ = ["divergence_error", "step_norms", "blow_up_of", "PendingRead", "fused_blow_up", "inf_norm"]
