r"""Low-rank adapters (LoRA) as the Bayesian part of a pre-trained network.

:func:`low_rank_adapters` puts a :class:`LowRankAdapter` around chosen ``Linear`` and ``Conv2d`` layers of a
copy of a network and freezes everything else. An adapted layer computes

.. math:: h = W_0 x + \frac{\alpha}{r} B A x, \qquad A \in \mathbb R^{r \times d_\text{in}},\;
          B \in \mathbb R^{d_\text{out} \times r},

with :math:`W_0` the pre-trained weight (and bias) kept as they are, :math:`A` initialised as PyTorch
initialises a layer and :math:`B = 0`, so that the adapted network starts as the pre-trained one. For a
convolution, :math:`A` is a convolution with the layer's kernel, stride and padding into :math:`r`
channels and :math:`B` a :math:`1 \times 1` convolution out of them. Given to
:class:`~pyro_flat.nn.BayesianModule`, the factors ``"<layer>.lora_A"`` and ``"<layer>.lora_B"`` are the
sample sites (and the twins of Entropy-MCMC's :math:`\theta_a`); the frozen weights are fixed.

>>> import torch
>>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
>>> adapted = low_rank_adapters(net, rank=2, targets=["2"])
>>> [n for n, p in adapted.named_parameters() if p.requires_grad]
['2.lora_A', '2.lora_B']
>>> x = torch.randn(5, 4)
>>> bool(torch.equal(adapted(x), net(x)))  # B = 0: the pre-trained network
True
"""

from __future__ import annotations

import copy
import fnmatch
import math
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F


class LowRankAdapter(torch.nn.Module):
    r"""``base(x) + (alpha / rank) * B(A(x))`` for a frozen ``Linear`` or ``Conv2d`` ``base`` (see the module)."""

    def __init__(self, base: Union[torch.nn.Linear, torch.nn.Conv2d], rank: int, alpha: float):
        super().__init__()
        self.base, self.rank, self.scaling = base, rank, alpha / rank
        base.requires_grad_(False)
        weight = base.weight
        if isinstance(base, torch.nn.Linear):
            a_shape, b_shape = (rank, base.in_features), (base.out_features, rank)
        else:
            a_shape, b_shape = (rank, base.in_channels, *base.kernel_size), (base.out_channels, rank, 1, 1)
        self.lora_A = torch.nn.Parameter(torch.empty(a_shape, dtype=weight.dtype, device=weight.device))
        self.lora_B = torch.nn.Parameter(torch.empty(b_shape, dtype=weight.dtype, device=weight.device))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """A as PyTorch initialises a layer of its shape, B = 0 (the adapted layer is the base layer)."""
        torch.nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        torch.nn.init.zeros_(self.lora_B)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = self.base
        if isinstance(base, torch.nn.Linear):
            update = F.linear(F.linear(x, self.lora_A), self.lora_B)
        else:
            update = F.conv2d(F.conv2d(x, self.lora_A, None, base.stride, base.padding, base.dilation), self.lora_B)
        return base(x) + self.scaling * update

    def extra_repr(self) -> str:
        return f"rank={self.rank}, scaling={self.scaling:g}"


def low_rank_adapters(module: torch.nn.Module, *, rank: int, targets: Optional[Union[str, Sequence[str]]] = None,
                      alpha: Optional[float] = None) -> torch.nn.Module:
    """A copy of ``module`` with a :class:`LowRankAdapter` of ``rank`` around each targeted layer, and every
    other parameter frozen (``requires_grad=False``).

    :param rank: the adapters' rank ``r`` (a positive integer, at most the layer's smaller side).
    :param targets: the layers to adapt, by name in ``module.named_modules()`` or fnmatch pattern
        (``"layer4.*"``, ``"fc"``); default every ``Linear`` and ``Conv2d``.
    :param alpha: the update's scale is ``alpha / rank`` (default ``alpha = rank``: 1).
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank must be a positive integer (the adapters' rank), got {rank!r}.")
    if alpha is None:
        alpha = float(rank)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (0 < alpha < math.inf):
        raise ValueError(f"alpha must be a positive number (the update is scaled by alpha / rank), got {alpha!r}.")
    patterns = _target_patterns(targets)
    adapted = copy.deepcopy(module)
    layers = {n: m for n, m in adapted.named_modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)) and n}
    if patterns is not None:
        unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in layers)]
        if unmatched:
            raise ValueError(f"targets {unmatched} match no Linear or Conv2d layer of {type(module).__name__}; its "
                             f"layers are {preview_names(layers)} (names from module.named_modules(); patterns such as "
                             "'layer4.*').")
        layers = {n: m for n, m in layers.items() if any(fnmatch.fnmatchcase(n, p) for p in patterns)}
    if not layers:
        raise ValueError(f"{type(module).__name__} has no Linear or Conv2d layer to adapt.")
    for name, layer in layers.items():
        if isinstance(layer, torch.nn.Conv2d) and (layer.groups != 1 or layer.padding_mode != "zeros"):
            raise ValueError(f"layer {name!r} is a convolution with groups={layer.groups} and padding_mode="
                             f"{layer.padding_mode!r}; low-rank adapters take groups=1 and zero padding: leave it out "
                             "of targets.")
        smaller = min(layer.weight.shape[0], math.prod(layer.weight.shape[1:]))
        if rank > smaller:
            raise ValueError(f"rank={rank} is more than the smaller side of layer {name!r} ({smaller}): pass a rank "
                             f"of at most {smaller}, or leave the layer out of targets.")
    adapted.requires_grad_(False)
    for name, layer in layers.items():
        parent, _, child = name.rpartition(".")
        setattr(adapted.get_submodule(parent) if parent else adapted, child, LowRankAdapter(layer, rank, alpha))
    return adapted


def _target_patterns(targets) -> Optional[list]:
    """``targets`` as a list of layer names or patterns (``None``: every ``Linear`` and ``Conv2d``), else a
    ``TypeError`` (or, for an empty list, a ``ValueError``) naming ``targets=`` and what it takes."""
    if targets is None:
        return None
    takes = ("targets= takes the layers to adapt: a layer name or fnmatch pattern (str) from module.named_modules(), "
             "a list of them (e.g. targets=['layer4.*', 'fc']), or None (the default) for every Linear and Conv2d "
             "layer")
    if isinstance(targets, str):
        return [targets]
    if not isinstance(targets, (list, tuple, set, frozenset)):
        raise TypeError(f"{takes}; got {type(targets).__name__} {targets!r}.")
    patterns = list(targets)
    if not patterns:
        raise ValueError(f"{takes}; got an empty {type(targets).__name__}, which adapts no layer.")
    wrong = [p for p in patterns if not isinstance(p, str)]
    if wrong:
        raise TypeError(f"{takes}; got {targets!r}, whose {wrong[0]!r} is of type {type(wrong[0]).__name__}, not str.")
    return patterns


def frozen_by_adapters(module: torch.nn.Module) -> set:
    """The names of the parameters :func:`low_rank_adapters` froze in ``module``: every parameter but the
    adapters' factors, when ``module`` holds adapters (none otherwise)."""
    factors = {f"{n}.{f}" if n else f for n, m in module.named_modules() if isinstance(m, LowRankAdapter)
               for f in ("lora_A", "lora_B")}
    return {n for n, _ in module.named_parameters()} - factors if factors else set()


def preview_names(names, limit: int = 8) -> str:
    """The first ``limit`` names, quoted, and how many there are in all."""
    names = list(names)
    return ", ".join(map(repr, names[:limit])) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


__all__ = ["LowRankAdapter", "low_rank_adapters", "frozen_by_adapters"]
