"""Recording a kernel's draws and per-draw statistics, for Pyro's driver and for a run that stops.

:class:`DrawRecording` is the part of :class:`~pyro_flat.kernels.TargetKernel` that keeps what a
chain has produced: the post-warm-up draws (so that a divergence or a Ctrl-C hands them back,
:attr:`~DrawRecording.partial_samples`), the per-draw statistics that
:func:`pyro_flat.to_arviz` turns into ``sample_stats``, and Pyro's divergence lists. With vectorized
chains every value has a leading chain dimension and is split per chain on the way out.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional, Sequence

import torch

from ..targets import Params


class DrawRecording:
    """Mixin: the draws and statistics of the chains a kernel runs (see the module docstring).

    Needs ``num_chains``, ``record_draws`` and ``transforms`` from the kernel.
    """

    num_chains: Optional[int]
    record_draws: bool

    def _reset_records(self) -> None:
        """Forget the current chain's draws (a new :meth:`setup`)."""
        self._draws: List[Params] = []
        self._stats: Dict[str, list] = defaultdict(list)
        self._divergences: List[List[int]] = [[] for _ in range(self.num_chains or 1)]
        self._last_stats: dict = {}
        self._last_draw: Optional[Params] = None

    def _forget_runs(self) -> None:
        """Forget every chain run so far (a new run)."""
        self._completed_draws: List[Dict[str, torch.Tensor]] = []

    def _complete_stats(self) -> None:
        """Hook: statistics still owed for the last draw."""

    def diagnostics(self) -> dict:
        """Pyro's per-chain divergence list and the per-draw ``sample_stats``.

        For vectorized chains the lists are per chain and every statistic is ``(draw, chain)``;
        :class:`pyro_flat.MCMC` splits them into Pyro's one-dict-per-chain layout.
        """
        self._complete_stats()
        stats = {name: self._stack_stat(values) for name, values in self._stats.items()}
        divergences = self._divergences
        if self.num_chains is None:
            divergences = divergences[0]
        return {"divergences": divergences, "sample_stats": stats}

    def cleanup(self) -> None:
        # Pyro calls cleanup twice per chain: keep it idempotent.
        if self._draws:
            self._completed_draws.extend(self._stack_draws(self._draws))
            self._draws = []

    def _stack_stat(self, values: Sequence) -> torch.Tensor:
        dtype = torch.get_default_dtype()
        if self.num_chains is None:
            return torch.as_tensor([float(v) for v in values], dtype=dtype)
        # per-chain tensors (C,), or one number for all chains
        return torch.stack([torch.as_tensor(v).detach().to("cpu", dtype).expand(self.num_chains)
                            for v in values])

    def _record_draw(self, params: Params) -> None:
        self._last_draw = params
        if self.record_draws:  # in host memory: a GPU's memory does not grow with the draws
            self._draw_device = next(iter(params.values())).device  # where _stack_draws constrains them
            self._draws.append({k: v.cpu() for k, v in params.items()})

    @property
    def partial_samples(self) -> List[Dict[str, torch.Tensor]]:
        """Post-warm-up draws of each chain run so far (finished chains, then the current ones)."""
        chains = list(self._completed_draws)
        if self._draws:
            chains.extend(self._stack_draws(self._draws))
        return chains

    def _stack_draws(self, draws: List[Params]) -> List[Dict[str, torch.Tensor]]:
        """``draws`` as one ``{site: (draw, ...)}`` dict per chain, in the constrained space (transformed on
        the device the chains ran on, where a transform's own tensors live)."""
        transforms, out = self.transforms, {}
        for name in draws[0]:
            z = torch.stack([d[name] for d in draws])
            out[name] = transforms[name].inv(z.to(self._draw_device)).cpu() if name in transforms else z
        chains = getattr(self, "_state_chains", None)
        if chains is None:
            return [out]
        return [{k: v[:, c] for k, v in out.items()} for c in range(chains)]


__all__ = ["DrawRecording"]
