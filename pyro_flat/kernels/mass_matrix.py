r"""Mass matrices for HMC, each given by a factor :math:`L` of the inverse mass :math:`M^{-1} = L L^\top`.

Three operations are all HMC needs: the momentum draw :math:`r = L^{-\top}\xi`
(:math:`r \sim \mathcal N(0, M)`), the velocity :math:`M^{-1} r` (one product with the stored
:math:`M^{-1}`) and the kinetic energy :math:`\tfrac12 r^\top M^{-1} r`. Preconditioned Langevin
(:mod:`~pyro_flat.kernels.preconditioning`) uses ``increment``, the drift :math:`M^{-1}\nabla U`
and the noise :math:`L\xi` (a draw of covariance :math:`M^{-1}`) of one step in one pass. Every tensor has a leading
chain dimension, so each chain has its own matrix.

:class:`CoupledFactor` is the metric of Entropy-HMC's joint move. Under the flat posterior
:math:`\theta_a = \theta + \delta` with :math:`\delta \sim \mathcal N(0, \eta I)` independent of
:math:`\theta`, so if :math:`\theta` has covariance :math:`\Sigma = S S^\top` the pair has

.. math:: \operatorname{Cov}\begin{pmatrix}\theta\\ \theta_a\end{pmatrix}
          = \begin{pmatrix}\Sigma & \Sigma E\\ E^\top\Sigma & E^\top\Sigma E + \eta I\end{pmatrix}
          = L L^\top, \qquad
          L = \begin{pmatrix} S & 0\\ E^\top S & \sqrt\eta\, I\end{pmatrix},

(:math:`E` selects the coupled coordinates, which come first). HMC with this inverse mass moves
:math:`\theta` and :math:`\theta_a` together and needs no small steps for the stiff direction
:math:`\theta - \theta_a` (variance :math:`\eta`), whatever :math:`\eta`.
"""

from __future__ import annotations

import math

import torch


class DiagonalFactor:
    """:math:`M^{-1} = \\operatorname{diag}(v)`, ``variance`` of shape ``(C, D)``; :math:`L = \\operatorname{diag}(\\sqrt v)`."""

    def __init__(self, variance: torch.Tensor):
        self.variance, self.sd = variance, variance.sqrt()

    def solve_lt(self, xi: torch.Tensor) -> torch.Tensor:
        return xi / self.sd

    def velocity(self, r: torch.Tensor) -> torch.Tensor:
        return self.variance * r

    def increment(self, g: torch.Tensor, xi: torch.Tensor, a: float, c: float) -> torch.Tensor:
        return self.sd * (c * xi - a * self.sd * g)

    def conditioned(self, coupling: torch.Tensor) -> "DiagonalFactor":
        r"""The metric of precision :math:`M + \operatorname{diag}(c)` (``coupling`` :math:`c`, ``(D,)``)."""
        return DiagonalFactor(1.0 / (1.0 / self.variance + coupling))


class PrecisionFactor:
    r""":math:`M^{-1} = P^{-1}` from a ``(C, D, D)`` precision :math:`P = K K^\top` (Cholesky):
    :math:`L = K^{-\top}`, so the velocity is two triangular solves and a draw of covariance
    :math:`M^{-1}` one (on this CPU a batched triangular solve of ``(4, 785, 785)`` took 0.1 ms, a
    batched matrix-vector product with the explicit covariance 2 ms)."""

    def __init__(self, precision: torch.Tensor):
        self.tril = torch.linalg.cholesky(precision)
        self.triu = self.tril.mT.contiguous()

    def solve_lt(self, xi: torch.Tensor) -> torch.Tensor:
        return (self.tril @ xi.unsqueeze(-1)).squeeze(-1)

    def velocity(self, r: torch.Tensor) -> torch.Tensor:
        half = torch.linalg.solve_triangular(self.tril, r.unsqueeze(-1), upper=False)
        return torch.linalg.solve_triangular(self.triu, half, upper=True).squeeze(-1)

    def increment(self, g: torch.Tensor, xi: torch.Tensor, a: float, c: float) -> torch.Tensor:
        r""":math:`K^{-\top}(c\,\xi - a K^{-1} g)`: two triangular solves."""
        half = torch.linalg.solve_triangular(self.tril, g.unsqueeze(-1), upper=False)
        return torch.linalg.solve_triangular(self.triu, c * xi.unsqueeze(-1) - a * half, upper=True).squeeze(-1)

    def conditioned(self, coupling: torch.Tensor) -> "PrecisionFactor":
        r"""The metric of precision :math:`P + \operatorname{diag}(c)` (``coupling`` :math:`c`, ``(D,)``)."""
        return PrecisionFactor(self.tril @ self.triu + torch.diag(coupling.to(self.tril)))


class CoupledFactor:
    r"""The joint metric of the module docstring over :math:`(\theta, \theta_a)`, with the
    cross-covariance scaled by :math:`\kappa \in [0, 1]`:

    .. math:: M^{-1} = \begin{pmatrix}\Sigma & \kappa\Sigma E\\ \kappa E^\top\Sigma &
              E^\top\Sigma E + \eta I\end{pmatrix}, \qquad
              L = \begin{pmatrix} S & 0\\ \kappa E^\top S & R\end{pmatrix},\quad
              R R^\top = (1 - \kappa^2) E^\top\Sigma E + \eta I .

    ``inner`` is the metric of :math:`\Sigma = S S^\top` (over the ``D`` coordinates of
    :math:`\theta`), the first ``num_coupled`` of which have a twin. :math:`\kappa = 1` (the
    default) is the exact covariance of the pair, :math:`R = \sqrt\eta\, I`; with
    :math:`\kappa < 1` the drift of :math:`\theta` keeps a pull toward :math:`\theta_a`
    (:mod:`~pyro_flat.kernels.preconditioning`)."""

    def __init__(self, inner, eta: float, num_coupled: int, kappa: float = 1.0):
        self.inner, self.eta, self.num_coupled, self.kappa = inner, eta, num_coupled, float(kappa)
        if self.kappa == 1.0:
            self.schur = None  # R = √η I
        elif isinstance(inner, DiagonalFactor):
            self.schur = DiagonalFactor((1 - self.kappa ** 2) * inner.variance[..., :num_coupled] + eta)
        else:
            cov = torch.cholesky_inverse(inner.tril)[..., :num_coupled, :num_coupled]
            eye = torch.eye(num_coupled, dtype=cov.dtype, device=cov.device)
            self.schur = factor_from_covariance((1 - self.kappa ** 2) * cov + eta * eye)

    def _pad(self, r2: torch.Tensor, dim: int) -> torch.Tensor:
        return torch.nn.functional.pad(r2, (0, dim - self.num_coupled))

    def _cross(self, x: torch.Tensor) -> torch.Tensor:
        """``κ x`` (no work at κ = 1, the exact metric's per-step path)."""
        return x if self.schur is None else self.kappa * x

    def _schur_increment(self, g2, xi2, a: float, c: float) -> torch.Tensor:
        if self.schur is None:
            return c * math.sqrt(self.eta) * xi2 - a * self.eta * g2
        return self.schur.increment(g2, xi2, a, c)

    def solve_lt(self, xi: torch.Tensor) -> torch.Tensor:
        r""":math:`L^\top r = \xi`: :math:`r_2 = R^{-\top}\xi_2`, :math:`r_1 = S^{-\top}\xi_1 - \kappa E r_2`."""
        dim = xi.shape[-1] - self.num_coupled
        r2 = xi[..., dim:] / math.sqrt(self.eta) if self.schur is None else self.schur.solve_lt(xi[..., dim:])
        return torch.cat([self.inner.solve_lt(xi[..., :dim]) - self._cross(self._pad(r2, dim)), r2], -1)

    def velocity(self, r: torch.Tensor) -> torch.Tensor:
        r""":math:`M^{-1} r = (x,\ \kappa E^\top x + R R^\top r_2)` with :math:`x = \Sigma(r_1 + \kappa E r_2)`."""
        dim = r.shape[-1] - self.num_coupled
        r2 = r[..., dim:]
        x = self.inner.velocity(r[..., :dim] + self._cross(self._pad(r2, dim)))
        second = self.eta * r2 if self.schur is None else self.schur.velocity(r2)
        return torch.cat([x, self._cross(x[..., : self.num_coupled]) + second], -1)

    def increment(self, g: torch.Tensor, xi: torch.Tensor, a: float, c: float) -> torch.Tensor:
        r""":math:`c\,L\xi - a M^{-1} g` with one use of the inner metric: with
        :math:`x = c S\xi_1 - a\Sigma(g_1 + \kappa E g_2)`, the increment is
        :math:`(x,\ \kappa E^\top x + c R\xi_2 - a R R^\top g_2)`."""
        dim = g.shape[-1] - self.num_coupled
        g2, xi2 = g[..., dim:], xi[..., dim:]
        x = self.inner.increment(g[..., :dim] + self._cross(self._pad(g2, dim)), xi[..., :dim], a, c)
        return torch.cat([x, self._cross(x[..., : self.num_coupled]) + self._schur_increment(g2, xi2, a, c)], -1)


class BlockFactor:
    r"""The block-Jacobi metric of the joint :math:`(\theta, \theta_a)`: the inverses of the two
    diagonal blocks of the joint Hessian
    :math:`\begin{pmatrix} P + EE^\top/\eta & -E/\eta\\ -E^\top/\eta & I/\eta\end{pmatrix}`,

    .. math:: M^{-1} = \begin{pmatrix} (P + EE^\top/\eta)^{-1} & 0\\ 0 & \eta I\end{pmatrix},

    with ``inner`` the metric of precision :math:`P` over :math:`\theta` (:math:`P = \Sigma^{-1}`,
    the curvature of :math:`f`). Unlike :class:`CoupledFactor` it keeps the off-diagonal blocks of the
    Hessian out of the metric, so :math:`\theta`'s drift :math:`-\alpha (P + EE^\top/\eta)^{-1}
    (\nabla f + (\theta - \theta_a)/\eta)` pulls :math:`\theta` toward :math:`\theta_a`, as
    in Entropy-MCMC's unpreconditioned update; see :mod:`~pyro_flat.kernels.preconditioning`."""

    def __init__(self, inner, eta: float, num_coupled: int):
        like = inner.variance if isinstance(inner, DiagonalFactor) else inner.tril
        dim = like.shape[-1]
        coupling = torch.zeros(dim, dtype=like.dtype, device=like.device)
        coupling[:num_coupled] = 1.0 / eta
        self.inner, self.theta = inner, inner.conditioned(coupling)
        self.eta, self.num_coupled, self.dim = eta, num_coupled, dim

    def solve_lt(self, xi: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.theta.solve_lt(xi[..., :self.dim]), xi[..., self.dim:] / math.sqrt(self.eta)], -1)

    def velocity(self, r: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.theta.velocity(r[..., :self.dim]), self.eta * r[..., self.dim:]], -1)

    def increment(self, g: torch.Tensor, xi: torch.Tensor, a: float, c: float) -> torch.Tensor:
        root = math.sqrt(self.eta)
        aux = root * (c * xi[..., self.dim:] - a * root * g[..., self.dim:])
        return torch.cat([self.theta.increment(g[..., :self.dim], xi[..., :self.dim], a, c), aux], -1)


def factor_from_covariance(cov: torch.Tensor):
    """The metric for a ``(C, D)`` variance (diagonal) or a ``(C, D, D)`` covariance (held as its
    precision's Cholesky factor: :class:`PrecisionFactor`'s triangular solves are the fast path)."""
    if cov.dim() == 2:
        return DiagonalFactor(cov)
    return PrecisionFactor(torch.cholesky_inverse(torch.linalg.cholesky(cov)))


def conditional_covariance(cov: torch.Tensor, eta: float, num_coupled: int) -> torch.Tensor:
    r"""Covariance of :math:`\theta \mid \theta_a` for a Gaussian :math:`\theta` of covariance
    ``cov``: :math:`(\Sigma^{-1} + E E^\top/\eta)^{-1}` (the Gibbs move's metric)."""
    coupling = torch.zeros(cov.shape[-1], dtype=cov.dtype, device=cov.device)
    coupling[:num_coupled] = 1.0 / eta
    if cov.dim() == 2:
        return 1.0 / (1.0 / cov + coupling)
    precision = torch.cholesky_inverse(torch.linalg.cholesky(cov)) + torch.diag(coupling)
    return torch.cholesky_inverse(torch.linalg.cholesky(precision))
