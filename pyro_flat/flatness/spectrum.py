r"""Hessian spectra: exact for small dimensions, Lanczos for the top eigenvalues, stochastic
Lanczos quadrature (SLQ) for the eigenvalue density, and power iteration as the plain baseline.

All of them see the Hessian only through Hessian-vector products
(:class:`~pyro_flat.flatness.loss.HessianOperator`). Lanczos with :math:`m` steps builds an
orthonormal basis :math:`Q_m` of the Krylov space :math:`\{v, Hv, \dots, H^{m-1}v\}` in which
:math:`Q_m^\top H Q_m = T_m` is tridiagonal; the eigenvalues of :math:`T_m` (Ritz values)
approach the extreme eigenvalues of :math:`H` first, and a Ritz pair
:math:`(\vartheta_i, Q_m s_i)` has residual :math:`\lVert H Q_m s_i - \vartheta_i Q_m s_i\rVert
= \beta_m \lvert s_{m,i}\rvert`, the stopping rule used here. Vectors are reorthogonalised in
full against the whole basis (in float64), so no spurious copies of converged eigenvalues appear.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from ..validation import check_number, check_positive, check_positive_int
from .loss import FlatLoss, HessianOperator, LossFn, as_flat_loss
from .probes import check_seed, rademacher, seeded_generator

__all__ = [
    "top_eigenvalues",
    "hessian_eigenvalues",
    "power_iteration",
    "eigenvalue_density",
    "SpectralDensity",
    "lanczos",
]

#: ``top_eigenvalues(method="auto")`` forms the Hessian up to this dimension
AUTO_EXACT_DIM = 200
#: the largest dimension for which the dense Hessian is ever formed
MAX_EXACT_DIM = 4096


def lanczos(op: HessianOperator, start: torch.Tensor, max_steps: int,
            stop: Optional[Callable[[np.ndarray, np.ndarray, float], bool]] = None
            ) -> Tuple[np.ndarray, np.ndarray, float]:
    r"""Lanczos tridiagonalisation of ``op`` from ``start`` with full reorthogonalisation.

    Runs until ``max_steps``, an invariant subspace (:math:`\beta_j \approx 0`), or
    ``stop(alphas, betas, beta_next)`` returns true. Returns the diagonal ``alphas`` (m,), the
    off-diagonal ``betas`` (m - 1,) of :math:`T_m` and :math:`\beta_m`, the norm of the next
    residual (0 on an invariant subspace: the Ritz values are then exact eigenvalues).
    """
    max_steps = check_positive_int("max_steps", max_steps, hint="It caps the Lanczos steps, e.g. max_steps=100.")
    q = start.to(torch.float64)
    q = q / q.norm()
    basis = torch.empty(max_steps, op.dim, dtype=torch.float64, device=q.device)
    alphas: List[float] = []
    betas: List[float] = []
    beta, q_prev, scale = 0.0, None, 0.0
    for j in range(max_steps):
        basis[j] = q
        w = op.matvec(q).to(torch.float64)
        alpha = float(w @ q)
        w = w - alpha * q if q_prev is None else w - alpha * q - beta * q_prev
        for _ in range(2):  # "twice is enough" (Kahan-Parlett)
            w = w - basis[: j + 1].T @ (basis[: j + 1] @ w)
        alphas.append(alpha)
        beta_next = float(w.norm())
        scale = max(scale, abs(alpha), beta_next)
        if beta_next <= 1e-10 * max(scale, 1e-30) or j + 1 == max_steps:
            return np.array(alphas), np.array(betas), (0.0 if beta_next <= 1e-10 * max(scale, 1e-30) else beta_next)
        if stop is not None and stop(np.array(alphas), np.array(betas), beta_next):
            return np.array(alphas), np.array(betas), beta_next
        betas.append(beta_next)
        q_prev, q, beta = q, w / beta_next, beta_next
    return np.array(alphas), np.array(betas), 0.0  # not reached: max_steps >= 1


def _ritz(alphas: np.ndarray, betas: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (ascending) and eigenvectors of the tridiagonal :math:`T_m`."""
    T = np.diag(alphas) + np.diag(betas, 1) + np.diag(betas, -1)
    return np.linalg.eigh(T)


def _check_k(k: int, dim: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got k={k!r}.")
    if k > dim:
        raise ValueError(f"k={k} exceeds the dimension of params ({dim}); ask for k <= {dim}.")
    return int(k)


def _check_tol(tol, example: str = "1e-4") -> float:
    check_number("tol", tol, example)
    return check_positive("tol", tol, hint=f"It is the relative accuracy, e.g. tol={example}.")


def hessian_eigenvalues(loss_fn: Union[FlatLoss, LossFn], params: Optional[torch.Tensor] = None, *,
                        per_site: bool = False) -> Union[np.ndarray, Dict[str, np.ndarray]]:
    """All Hessian eigenvalues, in decreasing order, from the dense Hessian (``d`` HVPs).

    For ``d > MAX_EXACT_DIM`` the dense Hessian is not formed: use :func:`top_eigenvalues` and
    :func:`eigenvalue_density` instead. ``per_site=True`` gives each block's spectrum
    (the eigenvalues of the diagonal blocks :math:`H_{ss}`), as a dict.

    >>> import torch
    >>> hessian_eigenvalues(lambda x: (x ** 2 * torch.tensor([1., 5.])).sum(), torch.zeros(2))
    array([10.,  2.])
    """
    loss = as_flat_loss(loss_fn, params)
    if per_site:
        return loss.per_block(hessian_eigenvalues)
    if loss.dim > MAX_EXACT_DIM:
        raise ValueError(
            f"params has dimension {loss.dim} > {MAX_EXACT_DIM}: the dense Hessian would hold "
            f"{loss.dim ** 2:,} entries. Use top_eigenvalues(...) for the largest eigenvalues and "
            "eigenvalue_density(...) for the spectrum."
        )
    H = HessianOperator(loss).dense().to(torch.float64)
    return torch.linalg.eigvalsh(H).flip(0).cpu().numpy()


def top_eigenvalues(loss_fn: Union[FlatLoss, LossFn], params: Optional[torch.Tensor] = None, k: int = 1,
                    *, method: str = "auto", tol: float = 1e-4, max_steps: Optional[int] = None,
                    seed: Optional[int] = 0, per_site: bool = False
                    ) -> Union[List[float], Dict[str, List[float]]]:
    r"""The ``k`` largest Hessian eigenvalues of ``loss_fn`` at ``params``, in decreasing order.

    :param loss_fn: ``(d,) tensor -> scalar`` or a :class:`FlatLoss` (then ``params`` may be
        omitted).
    :param params: the point, a 1-D tensor.
    :param method: ``"lanczos"`` (Hessian-vector products only), ``"exact"`` (the dense Hessian;
        above ``MAX_EXACT_DIM`` it warns and uses Lanczos), or ``"auto"`` (exact up to
        ``AUTO_EXACT_DIM``).
    :param tol: Lanczos stops when every one of the ``k`` Ritz pairs has residual
        :math:`\beta_m|s_{m,i}| \le` ``tol`` :math:`\cdot \max_i|\vartheta_i|`; the eigenvalue
        error is then at most the residual (Weyl), and typically its square over the gap.
    :param max_steps: Lanczos steps at most (default ``min(d, max(10k, 100))``); the result warns if
        it stopped unconverged.
    :param per_site: a dict ``{block: eigenvalues of H_ss}`` (``k`` capped at the block size).
    :returns: a list of ``k`` floats.

    >>> import torch
    >>> A = torch.diag(torch.arange(1., 301.))
    >>> [round(v, 3) for v in top_eigenvalues(lambda x: 0.5 * x @ A @ x, torch.zeros(300), k=2)]
    [300.0, 299.0]
    """
    tol, seed = _check_tol(tol), check_seed(seed)
    if max_steps is not None:
        max_steps = check_positive_int("max_steps", max_steps, hint="It caps the Lanczos steps; "
                                       "None: min(d, max(10k, 100)).")
    loss = as_flat_loss(loss_fn, params)
    if per_site:
        return loss.per_block(top_eigenvalues, k=k, method=method, tol=tol,
                         max_steps=max_steps, seed=seed)
    k = _check_k(k, loss.dim)
    if method not in ("auto", "exact", "lanczos"):
        raise ValueError(f"method must be 'auto', 'exact' or 'lanczos', got {method!r}.")
    if method == "exact" and loss.dim > MAX_EXACT_DIM:
        warnings.warn(
            f"top_eigenvalues: dimension {loss.dim} is too large for the exact Hessian "
            f"(> MAX_EXACT_DIM = {MAX_EXACT_DIM}); using Lanczos on Hessian-vector products instead.",
            UserWarning, stacklevel=2,
        )
        method = "lanczos"
    if method == "exact" or (method == "auto" and loss.dim <= AUTO_EXACT_DIM):
        return [float(v) for v in hessian_eigenvalues(loss)[:k]]
    op = HessianOperator(loss)
    max_steps = min(loss.dim, max(10 * k, 100)) if max_steps is None else min(max_steps, loss.dim)
    start = torch.randn(loss.dim, generator=seeded_generator(seed), dtype=torch.float64).to(loss.params.device)

    def converged(alphas, betas, beta_next) -> bool:
        if len(alphas) < k + 1:
            return False
        values, vectors = _ritz(alphas, betas)
        residuals = beta_next * np.abs(vectors[-1, -k:])
        return bool(np.all(residuals <= tol * np.max(np.abs(values))))

    alphas, betas, beta_next = lanczos(op, start, max_steps, converged)
    values, vectors = _ritz(alphas, betas)
    residuals = beta_next * np.abs(vectors[-1, -k:])
    if beta_next > 0 and np.any(residuals > tol * np.max(np.abs(values))):
        warnings.warn(
            f"top_eigenvalues: Lanczos did not converge in {len(alphas)} steps (largest residual "
            f"{residuals.max():.3g}, tol {tol:g} x {np.max(np.abs(values)):.3g}); raise max_steps "
            "or tol.", RuntimeWarning, stacklevel=2,
        )
    return [float(v) for v in values[::-1][:k]]


def power_iteration(loss_fn: Union[FlatLoss, LossFn], params: Optional[torch.Tensor] = None, k: int = 1,
                    *, tol: float = 1e-4, max_iter: int = 1000, seed: Optional[int] = 0) -> List[float]:
    r"""The ``k`` eigenvalues of largest magnitude by power iteration with deflation (the plain
    method of PyHessian, kept as the baseline of ``benchmarks/bench_flatness.py``).

    Eigenvalue ``i`` iterates :math:`v \leftarrow (I - U U^\top) H v / \lVert\cdot\rVert`
    against the eigenvectors :math:`U` found before, until the Rayleigh quotient changes by less
    than ``tol`` relative. One Hessian-vector product per iteration.
    """
    tol = _check_tol(tol)
    max_iter = check_positive_int("max_iter", max_iter, hint="It caps the iterations per eigenvalue, e.g. max_iter=1000.")
    loss = as_flat_loss(loss_fn, params)
    k = _check_k(k, loss.dim)
    op, gen = HessianOperator(loss), seeded_generator(seed)
    found: List[torch.Tensor] = []
    values: List[float] = []
    for _ in range(k):
        v = torch.randn(loss.dim, generator=gen, dtype=torch.float64).to(loss.params.device)
        value = None
        for _ in range(max_iter):
            for u in found:
                v = v - (u @ v) * u
            v = v / v.norm()
            w = op.matvec(v).to(torch.float64)
            new = float(v @ w)
            v = w
            if value is not None and abs(new - value) <= tol * max(abs(new), 1e-12):
                value = new
                break
            value = new
        for u in found:
            v = v - (u @ v) * u
        found.append(v / v.norm())
        values.append(value)
    return values


@dataclass(frozen=True)
class SpectralDensity:
    r"""The Hessian eigenvalue density from stochastic Lanczos quadrature.

    Probe :math:`p` (a unit Rademacher vector :math:`v_p`) gives an :math:`m`-point Gauss
    quadrature of the spectral measure :math:`\sum_i (v_p^\top u_i)^2 \delta_{\lambda_i}`:
    nodes :math:`\vartheta_{pj}` (Ritz values) and weights :math:`w_{pj} = s_{1j}^2`, summing to 1.
    Averaged over probes, :math:`\sum_j w_{pj}\, g(\vartheta_{pj})` estimates
    :math:`\operatorname{tr} g(H) / d` without bias for every polynomial :math:`g` of degree
    below :math:`2m` (Ubaru, Chen & Saad 2017; Ghorbani, Krishnan & Xiao 2019).

    :ivar nodes: ``(num_probes, m)`` Ritz values. :ivar weights: ``(num_probes, m)``.
    :ivar dim: ``d``.
    """

    nodes: np.ndarray
    weights: np.ndarray
    dim: int

    def expect(self, g: Callable[[np.ndarray], np.ndarray] = lambda x: x) -> Tuple[float, float]:
        r"""Estimate of :math:`\operatorname{tr} g(H)/d` and its standard error over probes."""
        per_probe = (self.weights * g(self.nodes)).sum(-1)
        stderr = per_probe.std(ddof=1) / math.sqrt(len(per_probe)) if len(per_probe) > 1 else float("nan")
        return float(per_probe.mean()), float(stderr)

    def default_bandwidth(self) -> float:
        span = float(self.nodes.max() - self.nodes.min())
        return max(span, 1e-12) / 100.0

    def density(self, grid: np.ndarray, bandwidth: Optional[float] = None) -> Tuple[np.ndarray, np.ndarray]:
        """The density smoothed by a Gaussian of sd ``bandwidth`` on ``grid``, and its standard
        error over probes (it integrates to 1)."""
        grid = np.asarray(grid, dtype=np.float64)
        h = self.default_bandwidth() if bandwidth is None else float(bandwidth)
        z = (grid[None, None, :] - self.nodes[:, :, None]) / h
        per_probe = (self.weights[:, :, None] * np.exp(-0.5 * z ** 2)).sum(1) / (h * math.sqrt(2 * math.pi))
        n = len(per_probe)
        stderr = per_probe.std(0, ddof=1) / math.sqrt(n) if n > 1 else np.full(grid.shape, np.nan)
        return per_probe.mean(0), stderr

    def share_above(self, grid: np.ndarray) -> np.ndarray:
        r"""The share of eigenvalues above each point of ``grid``, :math:`\#\{i: \lambda_i > x\}/d`,
        estimated as :math:`\frac1P\sum_p\sum_j w_{pj}\,[\vartheta_{pj} > x]` (no smoothing: it
        reads the top of the spectrum, where the density is a few isolated nodes)."""
        grid = np.asarray(grid, dtype=np.float64)
        above = self.nodes[:, :, None] > grid[None, None, :]
        return (self.weights[:, :, None] * above).sum(1).mean(0)

    def plot(self, ax=None, *, bandwidth: Optional[float] = None, label: Optional[str] = None,
             num_points: int = 400, log: bool = True):
        """Plot the smoothed density (log scale by default, as is usual for Hessian spectra)."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(5, 3.2))
        lo, hi = float(self.nodes.min()), float(self.nodes.max())
        pad = 0.05 * max(hi - lo, 1e-12)
        grid = np.linspace(lo - pad, hi + pad, num_points)
        values, _ = self.density(grid, bandwidth)
        ax.plot(grid, np.maximum(values, 1e-12) if log else values, label=label)
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("Hessian eigenvalue")
        ax.set_ylabel("density")
        return ax


def eigenvalue_density(loss_fn: Union[FlatLoss, LossFn], params: Optional[torch.Tensor] = None, *,
                       num_probes: int = 10, num_steps: int = 64, seed: Optional[int] = 0,
                       per_site: bool = False) -> Union[SpectralDensity, Dict[str, SpectralDensity]]:
    """The Hessian eigenvalue density by stochastic Lanczos quadrature (see :class:`SpectralDensity`).

    :param num_probes: independent Rademacher probes (their spread gives the standard errors).
    :param num_steps: Lanczos steps per probe, ``m`` (capped at ``d``): ``num_probes * m`` HVPs.

    >>> import torch
    >>> rho = eigenvalue_density(lambda x: 0.5 * (x ** 2 * torch.arange(1., 51.)).sum(),
    ...                          torch.zeros(50), num_steps=50)
    >>> round(rho.expect()[0], 4)   # tr(H) / d = mean of 1..50
    25.5
    """
    num_probes = check_positive_int("num_probes", num_probes, hint="e.g. num_probes=10.")
    num_steps = check_positive_int("num_steps", num_steps, hint="e.g. num_steps=64.")
    seed = check_seed(seed)
    loss = as_flat_loss(loss_fn, params)
    if per_site:
        return loss.per_block(eigenvalue_density, num_probes=num_probes, num_steps=num_steps, seed=seed)
    op = HessianOperator(loss)
    probes = rademacher(num_probes, loss.dim, seeded_generator(seed)).to(loss.params.device)
    m = min(num_steps, loss.dim)
    nodes = np.zeros((num_probes, m))
    weights = np.zeros((num_probes, m))
    for p, probe in enumerate(probes):
        alphas, betas, _ = lanczos(op, probe, m)
        values, vectors = _ritz(alphas, betas)
        j = len(values)  # fewer than m on an invariant subspace: pad with zero weights
        nodes[p, :j], weights[p, :j] = values, vectors[0] ** 2
        nodes[p, j:] = values[-1]
    return SpectralDensity(nodes, weights, loss.dim)
