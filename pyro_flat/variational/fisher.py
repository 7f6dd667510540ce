r"""The Fisher information of Pyro's Gaussian autoguides in their own (unconstrained) parameters.

For a family :math:`q_\phi`, :math:`\mathrm{KL}(q_{\phi+\delta} \| q_\phi) = \tfrac12 \delta^\top F_\phi
\delta + O(\|\delta\|^3)`. SA-BMA needs :math:`F^{-1} g` for a gradient :math:`g`; this module
gives it per family, in the coordinates the optimiser steps in (``scale`` is
``softplus(s)``: :math:`\partial\sigma/\partial s = \mathrm{sigmoid}(s)`):

- ``AutoNormal`` and ``AutoDiagonalNormal``: :math:`F = \mathrm{diag}(1/\sigma^2)` for the loc and
  :math:`2\,\mathrm{sigmoid}(s)^2/\sigma^2` for ``s``, exactly;
- ``AutoLowRankMultivariateNormal`` (:math:`\Sigma = D_\sigma (W W^\top + I) D_\sigma`): the loc
  block is :math:`\Sigma^{-1}`, so :math:`F^{-1}g = \Sigma g` exactly (low-rank products); the
  Gaussian Fisher has no loc/covariance cross term, and the covariance block (``s`` and ``W``) is
  solved by conjugate gradients on exact Fisher-vector products, each a Hessian-vector product of
  the closed-form KL between two low-rank Gaussians. That block is singular (rotating W's columns,
  W ↦ W exp(A) with A skew-symmetric, leaves Σ unchanged): the gradient's part along those
  directions is projected out first, so the answer is the pseudo-inverse's (minimum-norm) one.

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
    store = pyro.get_param_store()
    prefix = guide._pyro_name
    if isinstance(guide, AutoNormal):
        sites = _autonormal_sites(guide)
        names = [f"{prefix}.{kind}.{site}" for site in sites for kind in ("locs", "scales")]
        roles = ["loc", "scale"] * len(sites)
    elif isinstance(guide, AutoDiagonalNormal):
        names, roles = [f"{prefix}.loc", f"{prefix}.scale"], ["loc", "scale"]
    else:
        names, roles = [f"{prefix}.loc", f"{prefix}.scale", f"{prefix}.cov_factor"], ["loc", "scale", "cov_factor"]
    missing = [n for n in names if n not in store]
    if missing:
        raise ValueError(f"the guide's parameters {missing} are not in Pyro's param store: run the guide "
                         "(or one SVI step) before asking for its Fisher information")
    tensors = [store.get_param(n).unconstrained() for n in names]
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


def _low_rank_solver(tensors, cg_steps: int = 50, tol: float = 1e-10):
    loc, s, w = (t.detach() for t in tensors)
    sigma = F.softplus(s)
    here = _low_rank_distribution(torch.zeros_like(loc), s, w)

    def covariance_fvp(v_s, v_w):
        """Fisher-vector product in (s, W): the Hessian of KL(q(s', W') || q(s, W)) at s', W' = s, W."""
        with torch.enable_grad():
            s_, w_ = s.clone().requires_grad_(), w.clone().requires_grad_()
            kl = torch.distributions.kl_divergence(_low_rank_distribution(torch.zeros_like(loc), s_, w_), here)
            g_s, g_w = torch.autograd.grad(kl, (s_, w_), create_graph=True)
            return torch.autograd.grad((g_s * v_s).sum() + (g_w * v_w).sum(), (s_, w_))

    def sigma_times(g):  # Σ g = D_σ (W Wᵀ + I) D_σ g
        x = sigma * g
        return sigma * (w @ (w.T @ x) + x)

    def solve(grads, loc_only=False):
        g_loc, g_s, g_w = grads
        if loc_only:
            return [sigma_times(g_loc), torch.zeros_like(g_s), torch.zeros_like(g_w)]
        x_s, x_w = _conjugate_gradients(covariance_fvp, (g_s, _without_rotations(w, g_w)), cg_steps, tol)
        return [sigma_times(g_loc), x_s, _without_rotations(w, x_w)]

    def quadratic(delta):
        d_loc, d_s, d_w = delta
        # loc block: δᵀ Σ⁻¹ δ, from the distribution's own Mahalanobis distance
        maha = -2 * (here.log_prob(d_loc) - here.log_prob(torch.zeros_like(d_loc)))
        f_s, f_w = covariance_fvp(d_s, d_w)
        return maha + (f_s * d_s).sum() + (f_w * d_w).sum()

    return solve, quadratic


def _without_rotations(w: torch.Tensor, g_w: torch.Tensor) -> torch.Tensor:
    """``g_w`` minus its projection on the rotations ``W A`` (A skew-symmetric), which leave Σ
    unchanged: the null space of the covariance block of F. A sampled gradient has a part there
    (the reparameterised draw depends on W itself, not only on Σ), which F cannot invert."""
    k = w.shape[-1]
    pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]
    if not pairs:
        return g_w
    basis = []
    for i, j in pairs:
        a = torch.zeros(k, k, dtype=w.dtype)
        a[i, j], a[j, i] = 1.0, -1.0
        basis.append((w @ a).reshape(-1))
    basis = torch.stack(basis)  # (pairs, D K)
    coef = torch.linalg.lstsq(basis @ basis.T, basis @ g_w.reshape(-1)).solution
    return g_w - (coef @ basis).reshape(g_w.shape)


def _conjugate_gradients(matvec, b, steps: int, tol: float):
    """Solve ``A x = b`` for a symmetric positive-definite ``A`` given as ``matvec`` on tuples."""
    x = tuple(torch.zeros_like(t) for t in b)
    r = tuple(t.clone() for t in b)
    p = tuple(t.clone() for t in r)
    rr = sum((t * t).sum() for t in r)
    target = tol * rr
    for _ in range(steps):
        if rr <= target or rr == 0:
            break
        ap = matvec(*p)
        curvature = sum((a * q).sum() for a, q in zip(ap, p))
        if not curvature > 1e-12 * sum((q * q).sum() for q in p):
            break  # a null direction of F (rotations of W leave Σ unchanged): g has no part there
        alpha = rr / curvature
        x = tuple(xi + alpha * pi for xi, pi in zip(x, p))
        r = tuple(ri - alpha * ai for ri, ai in zip(r, ap))
        rr_new = sum((t * t).sum() for t in r)
        p = tuple(ri + (rr_new / rr) * pi for ri, pi in zip(r, p))
        rr = rr_new
    return x


__all__ = ["diagonal_fisher", "gaussian_parameters", "GaussianParameters", "SUPPORTED"]
