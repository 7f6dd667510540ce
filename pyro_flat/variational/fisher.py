r"""The Fisher information of Pyro's Gaussian autoguides in their own (unconstrained) parameters.

For a family :math:`q_\phi`, :math:`\mathrm{KL}(q_{\phi+\delta} \| q_\phi) = \tfrac12 \delta^\top F_\phi
\delta + O(\|\delta\|^3)`. SA-BMA needs :math:`F^{-1} g` for a gradient :math:`g`; this module
gives it per family, in the coordinates the optimiser steps in (``scale`` is
``softplus(s)``: :math:`\partial\sigma/\partial s = \mathrm{sigmoid}(s)`):

- ``AutoNormal`` and ``AutoDiagonalNormal``: :math:`F = \mathrm{diag}(1/\sigma^2)` for the loc and
  :math:`2\,\mathrm{sigmoid}(s)^2/\sigma^2` for ``s``, exactly;
- ``AutoLowRankMultivariateNormal`` (:math:`\Sigma = D_\sigma (W W^\top + I) D_\sigma`): the loc
  block is :math:`\Sigma^{-1}`, so :math:`F^{-1}g = \Sigma g` exactly (low-rank products). For the
  covariance block (``s`` and ``W``) the family's own Fisher is degenerate wherever a column of W is
  small (W ↦ W Wᵀ is singular at 0) and singular along rotations of W: there a sampled gradient's
  noise is amplified without bound and the second-order ball stops describing the KL (a step with
  ½δᵀFδ = 0.01 had an exact KL 1,400 times larger). It uses instead the Fisher of the *complete
  data* (z, ε) of the factor model :math:`z = \mu + D_\sigma W \varepsilon + D_\sigma \xi`, which is
  diagonal in per-row coordinates, never singular, and bounds the family's Fisher from above (the
  chain rule of KL): the ball it draws lies inside the guide's own KL ball.

>>> import torch
>>> s = torch.tensor([0.0, 1.0])
>>> sigma = torch.nn.functional.softplus(s)
>>> diagonal_fisher(sigma, s)[1]     # Fisher of s: 2 sigmoid(s)^2 / sigma^2
tensor([1.0407, 0.6198])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List

import torch
import torch.nn.functional as F

import pyro
from pyro.infer.autoguide import AutoDiagonalNormal, AutoLowRankMultivariateNormal, AutoNormal

SUPPORTED = (AutoNormal, AutoDiagonalNormal, AutoLowRankMultivariateNormal)


def diagonal_fisher(sigma: torch.Tensor, s: torch.Tensor):
    """Fisher diagonals of a diagonal Gaussian in (loc, s), with ``sigma = softplus(s)``."""
    return 1.0 / sigma ** 2, 2.0 * torch.sigmoid(s) ** 2 / sigma ** 2


@dataclass
class GaussianParameters:
    """The guide's variational parameters: unconstrained leaves by role, and how to solve ``F x = g``."""

    names: List[str]
    tensors: List[torch.Tensor]
    roles: List[str]  # "loc", "scale" or "cov_factor"
    solve: Callable[[List[torch.Tensor], bool], List[torch.Tensor]]
    quadratic: Callable[[List[torch.Tensor]], torch.Tensor]  # δ ↦ δᵀ F δ


def gaussian_parameters(guide) -> GaussianParameters:
    """The Gaussian parameters of an initialised autoguide (run the guide once before)."""
    if not isinstance(guide, SUPPORTED):
        raise ValueError(f"SABMA_ELBO needs a Gaussian autoguide ({', '.join(c.__name__ for c in SUPPORTED)}); "
                         f"got {type(guide).__name__}. Use e.g. AutoNormal(model) or "
                         "AutoLowRankMultivariateNormal(model, rank=K).")
    if isinstance(guide, AutoNormal):
        sites = _autonormal_sites(guide)
        names = [f"{kind}.{site}" for site in sites for kind in ("locs", "scales")]
        roles = ["loc", "scale"] * len(sites)
    elif isinstance(guide, AutoDiagonalNormal):
        names, roles = ["loc", "scale"], ["loc", "scale"]
    else:
        names, roles = ["loc", "scale", "cov_factor"], ["loc", "scale", "cov_factor"]
    params = dict(guide.named_pyro_params())  # constrained values, each with its unconstrained leaf
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(f"the guide's parameters {missing} are not set up: run the guide "
                         "(or one SVI step) before asking for its Fisher information")
    tensors = [params[n].unconstrained() for n in names]
    names = [pyro.get_param_store().param_name(t) for t in tensors]  # the param store's names (prefixed)
    if isinstance(guide, AutoLowRankMultivariateNormal):
        return GaussianParameters(names, tensors, roles, *_low_rank_solver(tensors))
    return GaussianParameters(names, tensors, roles, *_diagonal_solver(tensors, roles))


def _autonormal_sites(guide) -> List[str]:
    return [name for name, site in guide.prototype_trace.nodes.items()
            if site["type"] == "sample" and not site["is_observed"]]


def _diagonal_solver(tensors, roles):
    fishers = []
    for i, role in enumerate(roles):
        if role == "loc":
            sigma = F.softplus(tensors[i + 1].detach())
            fishers.append(1.0 / sigma ** 2)
        else:
            s = tensors[i].detach()
            fishers.append(diagonal_fisher(F.softplus(s), s)[1])

    def solve(grads, loc_only=False):
        return [g / f if (role == "loc" or not loc_only) else torch.zeros_like(g)
                for g, f, role in zip(grads, fishers, roles)]

    def quadratic(delta):
        return sum((f * d ** 2).sum() for f, d in zip(fishers, delta))

    return solve, quadratic


def _low_rank_distribution(loc, s, w):
    sigma = F.softplus(s)
    return torch.distributions.LowRankMultivariateNormal(loc, w * sigma.unsqueeze(-1), sigma ** 2)


def _low_rank_solver(tensors):
    r"""``F x = g`` for the low-rank family, with the complete-data Fisher in (s, W).

    With :math:`u_i = \mathrm{sigmoid}(s_i)/\sigma_i\, ds_i` (the relative change of σ_i) and
    :math:`e_i = dW_i + W_i u_i` (the change of row i of :math:`V = D_\sigma W`, over σ_i), the
    quadratic form is :math:`\sum_i 2u_i^2 + \lVert e_i\rVert^2`: diagonal in (u, e), so the
    solve is a change of coordinates there and back, O(D K).
    """
    loc, s, w = (t.detach() for t in tensors)
    sigma = F.softplus(s)
    rate = torch.sigmoid(s) / sigma  # dσ/σ per unit of s

    def sigma_times(g):  # Σ g = D_σ (W Wᵀ + I) D_σ g
        x = sigma * g
        return sigma * (w @ (w.T @ x) + x)

    def solve(grads, loc_only=False):
        g_loc, g_s, g_w = grads
        if loc_only:
            return [sigma_times(g_loc), torch.zeros_like(g_s), torch.zeros_like(g_w)]
        h_u = g_s / rate - (w * g_w).sum(-1)  # the gradient in (u, e) coordinates; h_e = g_w
        u, e = h_u / 2, g_w                   # the metric there is diag(2, I)
        return [sigma_times(g_loc), u / rate, e - w * u.unsqueeze(-1)]

    def quadratic(delta):
        d_loc, d_s, d_w = delta
        u = rate * d_s
        e = d_w + w * u.unsqueeze(-1)
        return _mahalanobis(d_loc, sigma, w) + 2 * (u ** 2).sum() + (e ** 2).sum()

    return solve, quadratic


def _mahalanobis(x: torch.Tensor, sigma: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """xᵀ Σ⁻¹ x for Σ = D_σ (W Wᵀ + I) D_σ, by Woodbury: y = x/σ, yᵀy − (Wᵀy)ᵀ (I + WᵀW)⁻¹ (Wᵀy)."""
    y = x / sigma
    wy = w.T @ y
    capacitance = torch.eye(w.shape[-1], dtype=w.dtype, device=w.device) + w.T @ w
    return (y * y).sum() - (wy * torch.linalg.solve(capacitance, wy)).sum()


__all__ = ["diagonal_fisher", "gaussian_parameters", "GaussianParameters", "SUPPORTED"]
