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
    r"""The exact joint metric of the module docstring over :math:`(\theta, \theta_a)`:

    .. math:: M^{-1} = \begin{pmatrix}\Sigma & \Sigma E\\ E^\top\Sigma & E^\top\Sigma E + \eta I\end{pmatrix},
              \qquad L = \begin{pmatrix} S & 0\\ E^\top S & \sqrt\eta\, I\end{pmatrix}.

    ``inner`` is the metric of :math:`\Sigma = S S^\top` (over the ``D`` coordinates of
    :math:`\theta`), the first ``num_coupled`` of which have a twin. Every product goes through
    ``inner`` once: the joint costs what :math:`\Sigma` costs."""

    def __init__(self, inner, eta: float, num_coupled: int):
        self.inner, self.eta, self.num_coupled = inner, eta, num_coupled

    def _pad(self, r2: torch.Tensor, dim: int) -> torch.Tensor:
        return torch.nn.functional.pad(r2, (0, dim - self.num_coupled))

    def solve_lt(self, xi: torch.Tensor) -> torch.Tensor:
        r""":math:`L^\top r = \xi`: :math:`r_2 = \xi_2/\sqrt\eta`, :math:`r_1 = S^{-\top}\xi_1 - E r_2`."""
        dim = xi.shape[-1] - self.num_coupled
        r2 = xi[..., dim:] / math.sqrt(self.eta)
        return torch.cat([self.inner.solve_lt(xi[..., :dim]) - self._pad(r2, dim), r2], -1)

    def velocity(self, r: torch.Tensor) -> torch.Tensor:
        r""":math:`M^{-1} r = (x,\ E^\top x + \eta r_2)` with :math:`x = \Sigma(r_1 + E r_2)`."""
        dim = r.shape[-1] - self.num_coupled
        r2 = r[..., dim:]
        x = self.inner.velocity(r[..., :dim] + self._pad(r2, dim))
        return torch.cat([x, x[..., : self.num_coupled] + self.eta * r2], -1)

    def increment(self, g: torch.Tensor, xi: torch.Tensor, a: float, c: float) -> torch.Tensor:
        r""":math:`c\,L\xi - a M^{-1} g`: with :math:`x = c S\xi_1 - a\Sigma(g_1 + E g_2)`, the
        increment is :math:`(x,\ E^\top x + c\sqrt\eta\,\xi_2 - a\eta g_2)`."""
        dim = g.shape[-1] - self.num_coupled
        g2, xi2 = g[..., dim:], xi[..., dim:]
        x = self.inner.increment(g[..., :dim] + self._pad(g2, dim), xi[..., :dim], a, c)
        return torch.cat([x, x[..., : self.num_coupled] + (c * math.sqrt(self.eta) * xi2 - a * self.eta * g2)], -1)


class PairedDiagonalFactor:
    r"""A metric over :math:`(\theta, \theta_a)` made of independent :math:`2 \times 2` blocks: coordinate
    :math:`i < n` of :math:`\theta` (``num_coupled`` :math:`= n`) and its twin have the covariance
    :math:`\begin{pmatrix} s_i & x_i\\ x_i & v_i\end{pmatrix}`, the other coordinates of
    :math:`\theta` the variance :math:`s_i` alone. ``variance`` is :math:`s` ``(C, D)``, ``cross``
    :math:`x` and ``twin_variance`` :math:`v` are ``(C, n)``; per block
    :math:`L = \begin{pmatrix}\sqrt{s} & 0\\ x/\sqrt{s} & \sqrt{v - x^2/s}\end{pmatrix}`."""

    def __init__(self, variance: torch.Tensor, cross: torch.Tensor, twin_variance: torch.Tensor):
        self.num_coupled = cross.shape[-1]
        self.variance, self.sd = variance, variance.sqrt()
        self.cross, self.twin_variance = cross, twin_variance
        self.lower = cross / self.sd[..., : self.num_coupled]
        self.root = (twin_variance - self.lower ** 2).sqrt()

    def _split(self, z: torch.Tensor):
        dim = self.variance.shape[-1]
        return z[..., :dim], z[..., : self.num_coupled], z[..., dim:]

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, self.variance.shape[-1] - self.num_coupled))

    def solve_lt(self, xi: torch.Tensor) -> torch.Tensor:
        xi1, _, xi2 = self._split(xi)
        r2 = xi2 / self.root
        return torch.cat([(xi1 - self._pad(self.lower * r2)) / self.sd, r2], -1)

    def velocity(self, r: torch.Tensor) -> torch.Tensor:
        r1, r1c, r2 = self._split(r)
        return torch.cat([self.variance * r1 + self._pad(self.cross * r2), self.cross * r1c + self.twin_variance * r2], -1)

    def increment(self, g: torch.Tensor, xi: torch.Tensor, a: float, c: float) -> torch.Tensor:
        g1, g1c, g2 = self._split(g)
        xi1, xi1c, xi2 = self._split(xi)
        first = self.sd * (c * xi1 - a * self.sd * g1) - a * self._pad(self.cross * g2)
        second = c * (self.lower * xi1c + self.root * xi2) - a * (self.cross * g1c + self.twin_variance * g2)
        return torch.cat([first, second], -1)


class RotatedFactor:
    r"""A metric over :math:`(\theta, \theta_a)` that is ``paired`` (a :class:`PairedDiagonalFactor`) in
    the eigenbasis :math:`Q` (``(C, D, D)``, orthogonal) of both blocks:
    :math:`M^{-1} = \mathcal Q\, M_{\text{paired}}^{-1} \mathcal Q^\top`, :math:`\mathcal Q =
    \mathrm{blockdiag}(Q, Q)`, with the factor :math:`L = \mathcal Q L_{\text{paired}} \mathcal Q^\top`.

    **Why** :math:`L` **ends in** :math:`\mathcal Q^\top`: :math:`\mathcal Q L_{\text{paired}}` is a factor
    too, but it depends on the choice of :math:`Q` inside an eigenspace of a repeated eigenvalue, which
    is arbitrary (a prior-only direction of ``pyro-flat mnist79``'s Hessian, every pixel that is 0 in
    every image, has the prior's curvature 1: hundreds of equal eigenvalues). A round-off change of the
    Hessian (the same chains run on another number of ranks, where a matrix product sums in another
    order) then rotated that eigenspace and changed the noise :math:`L\xi` of the same :math:`\xi` by
    order 1. :math:`\mathcal Q L_{\text{paired}}\mathcal Q^\top` is the same matrix for any such
    choice (the paired blocks are equal across a repeated eigenvalue), so the step is a continuous
    function of the Hessian. Each step reads :math:`Q` twice (into the basis and back), as many
    passes as :class:`CoupledFactor`'s two triangular solves; the gradient and the noise go into the
    basis in one product."""

    def __init__(self, paired: PairedDiagonalFactor, basis: torch.Tensor):
        self.paired, self.basis = paired, basis.contiguous()

    def _times(self, z: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        """Each ``D``-long piece of ``z`` as a row times ``right``: ``right.mT @ piece`` for each, in one
        product (on this CPU, row vectors times a matrix took 0.4 ms for (4, 2, 785) @ (4, 785, 785), a
        batched matrix times a column 2.8 ms; one stored :math:`Q` read both ways stays in cache, a
        second transposed copy doubled the time)."""
        return (z.unflatten(-1, (-1, self.basis.shape[-1])) @ right).flatten(-2)

    def _into(self, z: torch.Tensor) -> torch.Tensor:
        r""":math:`\mathcal Q^\top z` (``z`` may hold several pairs side by side)."""
        return self._times(z, self.basis)

    def _back(self, z: torch.Tensor) -> torch.Tensor:
        r""":math:`\mathcal Q z`."""
        return self._times(z, self.basis.mT)

    def solve_lt(self, xi: torch.Tensor) -> torch.Tensor:
        return self._back(self.paired.solve_lt(self._into(xi)))

    def velocity(self, r: torch.Tensor) -> torch.Tensor:
        return self._back(self.paired.velocity(self._into(r)))

    def increment(self, g: torch.Tensor, xi: torch.Tensor, a: float, c: float) -> torch.Tensor:
        g_in, xi_in = self._into(torch.cat([g, xi], -1)).chunk(2, -1)
        return self._back(self.paired.increment(g_in, xi_in, a, c))


class PulledFactor:
    r"""The joint metric with a pull of strength :math:`\varepsilon \in [0, 1]`: the exact inverse Hessian
    of the joint with :math:`\varepsilon K` taken off its cross-covariance,

    .. math:: M^{-1} = \begin{pmatrix}\Sigma & (\Sigma - \varepsilon K)E\\
              E^\top(\Sigma - \varepsilon K) & E^\top\Sigma E + \eta I\end{pmatrix},
              \qquad K = (\Sigma^{-1} + E E^\top/\eta)^{-1}

    (:math:`K` is the covariance of :math:`\theta \mid \theta_a`). :math:`\theta`'s drift is then
    :math:`-\alpha\,[\Sigma\nabla f + \varepsilon K E(\theta_E - \theta_a)/\eta]`: preconditioned SGLD on
    :math:`f` plus a pull toward :math:`\theta_a` of weight :math:`\alpha\varepsilon/(1 + \lambda\eta)`
    along a direction of curvature :math:`\lambda`; see :mod:`~pyro_flat.kernels.preconditioning` for the
    eigenvalues. :math:`\varepsilon = 0` is :class:`CoupledFactor`.

    ``inner`` is the metric of :math:`\Sigma`. Every block is diagonal where :math:`\Sigma` is, so the
    metric is a :class:`PairedDiagonalFactor` of :math:`2 \times 2` blocks, per coordinate for a
    :class:`DiagonalFactor`, per eigenvector (:class:`RotatedFactor`; ``spectrum``, the eigenvalues and
    eigenvectors of :math:`\Sigma^{-1}` that the dense estimate already computed, else one ``eigh``) for a
    dense metric whose every coordinate is coupled. A dense metric with uncoupled coordinates
    (``sites=``) is held as the joint's precision (:class:`PrecisionFactor` of size :math:`D + n`,
    about four times a step's cost)."""

    def __init__(self, inner, eta: float, num_coupled: int, strength: float, *, spectrum=None):
        self.inner, self.eta, self.num_coupled, self.strength = inner, eta, num_coupled, float(strength)
        if isinstance(inner, DiagonalFactor):
            self.joint = self._paired(inner.variance, num_coupled)
            return
        dtype = inner.tril.dtype
        if num_coupled == inner.tril.shape[-1]:
            if spectrum is None:  # a fixed covariance: the eigenbasis of its precision
                tril = inner.tril.double()
                spectrum = torch.linalg.eigh(tril @ tril.mT)
            curvature, basis = spectrum
            self.joint = RotatedFactor(self._paired((1.0 / curvature).to(dtype), num_coupled), basis.to(dtype))
            return
        n = num_coupled
        sigma = torch.cholesky_inverse(inner.tril.double())
        cross = (sigma - self.strength * conditional_covariance(sigma, eta, n))[..., :n]
        eye = torch.eye(n, dtype=sigma.dtype, device=sigma.device).expand(*sigma.shape[:-2], n, n)
        cov = torch.cat([torch.cat([sigma, cross], -1),
                         torch.cat([cross.mT, sigma[..., :n, :n] + eta * eye], -1)], -2)
        joint_precision = torch.cholesky_inverse(torch.linalg.cholesky(cov))
        self.joint = PrecisionFactor(((joint_precision + joint_precision.mT) / 2).to(dtype))

    def _paired(self, variance: torch.Tensor, n: int) -> PairedDiagonalFactor:
        r"""Per coordinate :math:`i < n`: :math:`x_i = s_i - \varepsilon k_i`, :math:`k_i = 1/(1/s_i + 1/\eta)`,
        :math:`v_i = s_i + \eta`."""
        s = variance[..., :n]
        return PairedDiagonalFactor(variance, s - self.strength / (1.0 / s + 1.0 / self.eta), s + self.eta)

    def solve_lt(self, xi: torch.Tensor) -> torch.Tensor:
        return self.joint.solve_lt(xi)

    def velocity(self, r: torch.Tensor) -> torch.Tensor:
        return self.joint.velocity(r)

    def increment(self, g: torch.Tensor, xi: torch.Tensor, a: float, c: float) -> torch.Tensor:
        return self.joint.increment(g, xi, a, c)


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
