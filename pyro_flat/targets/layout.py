"""Named site tensors <-> one flat vector, the layout every flat-vector algorithm shares.

:class:`SiteLayout` packs ``{site: tensor}`` into the last dimension of one tensor (leading batch
dimensions, e.g. vectorized chains, are kept) and unpacks it back into views. EntropyHMC's
trajectories and the flatness module's Hessians both work on this vector.

>>> import torch
>>> layout = SiteLayout({"w": torch.Size([2, 3]), "b": torch.Size([])})
>>> x = layout.pack({"w": torch.ones(4, 2, 3), "b": torch.zeros(4)}, batch_dims=1)
>>> x.shape, layout.slices["b"], layout.unpack(x)["w"].shape
(torch.Size([4, 7]), slice(6, 7, None), torch.Size([4, 2, 3]))
"""

from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional

import torch

#: named tensors, one per site
Params = Dict[str, torch.Tensor]


class SiteLayout:
    """Sites in a fixed order, each a block of :attr:`dim` entries: ``slices[name]``."""

    def __init__(self, shapes: Mapping[str, torch.Size], names: Optional[List[str]] = None):
        self.names = list(shapes) if names is None else list(names)
        self.shapes = {n: torch.Size(shapes[n]) for n in self.names}
        self.sizes = [math.prod(self.shapes[n]) for n in self.names]
        self.dim = sum(self.sizes)
        starts = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        self.slices = {n: slice(a, a + s) for n, a, s in zip(self.names, starts, self.sizes)}

    def pack(self, params: Mapping[str, torch.Tensor], batch_dims: int = 0) -> torch.Tensor:
        """One tensor ``(*batch, dim)`` from the sites' values ``(*batch, *shape)``."""
        return torch.cat([params[n].reshape(params[n].shape[:batch_dims] + (-1,)) for n in self.names], -1)

    def unpack(self, flat: torch.Tensor, names: Optional[List[str]] = None) -> Params:
        """``{site: (*batch, *shape)}`` views of ``flat`` ``(*batch, dim)``; ``names`` renames the
        sites in order (e.g. θ's blocks read as θa's)."""
        batch = flat.shape[:-1]
        return {name: part.reshape(batch + self.shapes[n])
                for name, n, part in zip(names or self.names, self.names, flat.split(self.sizes, -1))}


class ChainLayout:
    """A :class:`SiteLayout` whose flat vectors are always ``(chains, dim)``: with ``batched=False``
    (one chain, Pyro's own driver) the sites carry no chain dim and the vector gets a leading 1.

    >>> layout = ChainLayout({"w": torch.Size([2])}, ["w"], batched=False)
    >>> layout.pack({"w": torch.ones(2)}).shape, layout.unpack(torch.zeros(1, 2))["w"].shape
    (torch.Size([1, 2]), torch.Size([2]))
    """

    def __init__(self, shapes: Mapping[str, torch.Size], names: List[str], batched: bool):
        self.layout, self.batched = SiteLayout(shapes, names), batched
        self.names, self.dim = self.layout.names, self.layout.dim

    def pack(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        flat = self.layout.pack(params, batch_dims=1 if self.batched else 0)
        return flat if self.batched else flat.unsqueeze(0)

    def unpack(self, flat: torch.Tensor, names: Optional[List[str]] = None) -> Params:
        return self.layout.unpack(flat if self.batched else flat[0], names)


def per_chain_norm(tensors: Params, num_chains: Optional[int]) -> torch.Tensor:
    """The Euclidean norm over all sites: a scalar, or ``(C,)`` (one per chain), shaped to broadcast
    against ``(C, ...)`` tensors through :func:`expand_like`."""
    if num_chains is None:
        return torch.sqrt(sum(t.square().sum() for t in tensors.values()))
    return torch.sqrt(sum(t.reshape(num_chains, -1).square().sum(-1) for t in tensors.values()))


def expand_like(per_chain: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """A scalar or ``(C,)`` tensor reshaped to broadcast against ``tensor`` (leading chain dim)."""
    return per_chain if per_chain.dim() == 0 else per_chain.reshape((-1,) + (1,) * (tensor.dim() - 1))
