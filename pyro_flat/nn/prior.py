r"""The default prior of :class:`~pyro_flat.nn.BayesianModule`: one Normal scale on every weight of a tensor.

.. math:: \log p(w) = -\frac{\lVert w\rVert^2}{2 s^2} - n \log\big(s\sqrt{2\pi}\big),
          \qquad w \in \mathbb R^n,

the density of ``Normal(0, s).expand(shape).to_event(len(shape))`` (weight decay :math:`1/(2s^2)`),
computed in one reduction, with a gradient of one scaled copy. The generic form costs about seven elementwise passes over the tensor
forward and as many backward, and a check of the value's support, which on a GPU is a host sync per
weight tensor: for ResNet-18's 62 tensors that was most of an iteration's kernel launches. Here the
forward is one norm and the backward one scaled copy.

>>> import torch, pyro.distributions as dist
>>> prior = IsotropicNormal(2.0, (3, 4))
>>> w = torch.randn(3, 4)
>>> reference = dist.Normal(0.0, 2.0).expand((3, 4)).to_event(2).log_prob(w)
>>> bool(torch.isclose(prior.log_prob(w), reference))
True
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import pyro.distributions as dist
from pyro.distributions import TorchDistribution, constraints

from ..targets.sites import nonfinite_parameter


class _ScaledSquaredNorm(torch.autograd.Function):
    r""":math:`a\lVert x\rVert^2 + b` over the last dim, whose gradient :math:`2a\,x\,g` is one scaled copy of
    ``x`` (autograd's own, through the norm and the square, takes five kernels); differentiable twice."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, a: float, b: float) -> torch.Tensor:
        return torch.linalg.vector_norm(x, dim=-1).square() * a + b

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(inputs[0])
        ctx.a = inputs[1]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        return x * (grad * (2 * ctx.a)).unsqueeze(-1), None, None


class IsotropicNormal(TorchDistribution):
    """``Normal(loc, scale)`` on every entry of a tensor of ``shape``, as one event (batch shape ``()``); ``loc``
    is 0 or a tensor of ``shape`` (a pre-trained network's weights: ``BayesianModule(prior_mean="module")``)."""

    arg_constraints = {}
    has_rsample = True

    def __init__(self, scale: float, shape: Sequence[int], *, dtype: torch.dtype = torch.float32,
                 device: torch.device = torch.device("cpu"), loc: Optional[torch.Tensor] = None):
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (scale > 0 and math.isfinite(scale)):
            raise ValueError(f"scale must be a positive finite float (the prior sd), got {scale!r}.")
        self.scale, self.dtype, self.device = float(scale), dtype, torch.device(device)
        shape = torch.Size(shape)
        if loc is not None and (not torch.is_tensor(loc) or loc.shape != shape):
            raise ValueError(f"loc must be a tensor of shape {tuple(shape)}, got "
                             f"{tuple(loc.shape) if torch.is_tensor(loc) else type(loc).__name__}.")
        self.loc = None if loc is None else loc.detach().to(dtype=dtype, device=device)
        self._size = math.prod(shape)
        super().__init__(torch.Size(), shape, validate_args=False)

    @property
    def support(self):
        return constraints.independent(constraints.real, len(self.event_shape))

    @property
    def mean(self) -> torch.Tensor:
        if self.loc is not None:
            return self.loc.expand(self.batch_shape + self.event_shape)
        return torch.zeros(self.event_shape, dtype=self.dtype, device=self.device)

    @property
    def variance(self) -> torch.Tensor:
        return torch.full(self.event_shape, self.scale ** 2, dtype=self.dtype, device=self.device)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(IsotropicNormal, _instance)
        new.scale, new.dtype, new.device, new._size, new.loc = self.scale, self.dtype, self.device, self._size, self.loc
        TorchDistribution.__init__(new, torch.Size(batch_shape), self.event_shape, validate_args=False)
        return new

    def rsample(self, sample_shape=torch.Size()) -> torch.Tensor:
        shape = self._extended_shape(sample_shape)
        noise = self.scale * torch.randn(shape, dtype=self.dtype, device=self.device)
        return noise if self.loc is None else noise + self.loc

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        events = len(self.event_shape)
        if tuple(value.shape[value.dim() - events:]) != tuple(self.event_shape):
            raise ValueError(f"IsotropicNormal over shape {tuple(self.event_shape)} was given a value of shape "
                             f"{tuple(value.shape)}: its last {events} dims must be that shape.")
        centred = value if self.loc is None else value - self.loc
        flat = centred.reshape(value.shape[:value.dim() - events] + (self._size,))
        constant = -self._size * (math.log(self.scale) + 0.5 * math.log(2 * math.pi))
        log_prob = _ScaledSquaredNorm.apply(flat, -0.5 / self.scale ** 2, constant)
        if self.batch_shape:
            log_prob = log_prob.expand(torch.broadcast_shapes(log_prob.shape, self.batch_shape))
        return log_prob

    def entropy(self) -> torch.Tensor:
        value = self._size * (0.5 + 0.5 * math.log(2 * math.pi) + math.log(self.scale))
        return torch.full(self.batch_shape, value, dtype=self.dtype, device=self.device)


def site_prior(prior, name: str, parameter: torch.Tensor, *, centred: bool = False) -> dist.Distribution:
    """The prior of ``parameter`` (named ``name``) from :class:`~pyro_flat.nn.BayesianModule`'s ``prior``: a
    positive finite sd, or a callable ``(name, parameter) -> distribution`` of finite parameters and its shape;
    ``centred``: a Normal around the parameter's value (``prior_mean="module"``), for an sd only."""
    shape = tuple(parameter.shape)
    if callable(prior) and centred:
        raise ValueError("prior_mean='module' centres the Normal of a prior sd on the module's weights; a callable "
                         "prior sets its own mean: give it loc=parameter.detach() (or pass prior as an sd).")
    if callable(prior):
        try:
            d = prior(name, parameter)
        except ValueError as err:  # torch's check of a distribution's parameters
            if not str(err).startswith("Expected parameter"):
                raise
            raise ValueError(f"prior({name!r}, parameter) made a distribution of invalid parameters "
                             f"({str(err).split(', but found')[0]}): give the prior finite parameters (a positive "
                             "scale).") from err
        if not isinstance(d, dist.Distribution):
            raise TypeError(f"prior({name!r}, parameter) must return a pyro distribution, got {type(d).__name__}.")
        bad = nonfinite_parameter(d)
        if bad is not None:
            raise ValueError(f"prior({name!r}, parameter) returned a distribution whose {bad} holds NaN or inf: "
                             "give the prior finite parameters (a positive scale), e.g. dist.Normal(0., 1.).")
        if tuple(d.batch_shape) + tuple(d.event_shape) != shape:
            raise ValueError(f"prior({name!r}, parameter) has batch shape {tuple(d.batch_shape)} and event shape "
                             f"{tuple(d.event_shape)}; together they must be the parameter's shape {shape} "
                             f"(e.g. dist.Normal(0., 1.).expand({list(shape)}).to_event({len(shape)})).")
        return d.to_event(len(d.batch_shape)) if d.batch_shape else d
    if isinstance(prior, bool) or not isinstance(prior, (int, float)) or not 0 < prior < math.inf:
        raise ValueError(f"prior must be a positive prior sd s (Normal(0, s) on every weight; s finite) or a callable "
                         f"(name, parameter) -> distribution, got {prior!r}.")
    return IsotropicNormal(float(prior), shape, dtype=parameter.dtype, device=parameter.device,
                           loc=parameter.detach().clone() if centred else None)


__all__ = ["IsotropicNormal", "site_prior"]
