r"""The local entropy :math:`F(\theta; \eta)` at a point: the log density of the flat posterior.

.. math:: F(\theta; \eta) = \log \int \exp\Big(-f(\theta') - \frac{\lVert\theta'-\theta\rVert^2}{2\eta}\Big)\, d\theta'
          = \log \mathbb E_{\varepsilon \sim \mathcal N(0, \eta I)}\big[e^{-f(\theta + \varepsilon)}\big]
            + \tfrac d2 \log(2\pi\eta),

so that :math:`p(\theta_a \mid D) \propto \exp F(\theta_a; \eta)`. The second form is the
:math:`\theta \mid \theta_a` relation of the joint, :math:`\theta' = \theta_a + \varepsilon`,
read as an expectation; :func:`local_entropy` estimates it

- ``method="monte_carlo"``: by a log-mean-exp over ``num_samples`` Gaussian perturbations, with a
  delta-method standard error and the effective sample size (it degrades when
  :math:`\eta\,\lambda_{\max}(H)` is large in many directions: check ``ess``);
- ``method="laplace"``: from the second-order expansion of :math:`f` at :math:`\theta`, exact for
  quadratics,

  .. math:: F \approx -f(\theta) + \tfrac12 g^\top (H + I/\eta)^{-1} g
            - \tfrac12 \log\det(I + \eta H) + \tfrac d2 \log(2\pi\eta),

  with :math:`(H + I/\eta)^{-1}g` by conjugate gradients on Hessian-vector products and the
  log-determinant exact (small :math:`d`) or by stochastic Lanczos quadrature. The
  :math:`\log\det` term is where flatness enters: each sharp direction costs
  :math:`\tfrac12\log(1+\eta\lambda_i)`.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Union

import numpy as np
import torch
from torch.func import vmap

from ..validation import check_eta
from .loss import FlatLoss, HessianOperator, LossFn, as_flat_loss
from .probes import seeded_generator
from .spectrum import AUTO_EXACT_DIM, eigenvalue_density, hessian_eigenvalues

__all__ = ["local_entropy", "LocalEntropyEstimate"]


class LocalEntropyEstimate(NamedTuple):
    """``value`` of :math:`F(\\theta;\\eta)`, its ``stderr`` and, for Monte Carlo, the effective
    sample size ``ess`` of the perturbations (``nan`` for the Laplace method)."""

    value: float
    stderr: float
    ess: float


def _losses(loss: FlatLoss, points: torch.Tensor, chunk_size: int) -> torch.Tensor:
    with torch.no_grad():
        try:
            return torch.cat([vmap(loss.fn)(c) for c in points.split(chunk_size)])
        except Exception:  # a loss that vmap cannot trace: one at a time
            return torch.stack([loss.fn(p).reshape(()) for p in points])


def local_entropy(loss_fn: Union[FlatLoss, LossFn], params: Optional[torch.Tensor] = None, *,
                  eta: float, method: str = "monte_carlo", num_samples: int = 1000,
                  num_probes: int = 20, seed: Optional[int] = 0, chunk_size: int = 256
                  ) -> LocalEntropyEstimate:
    """Estimate the local entropy :math:`F(\\theta;\\eta)` of ``loss_fn`` (the negative log
    density :math:`f`) at ``params`` (see the module docstring for both methods).

    :param eta: the smoothing scale :math:`\\eta > 0` (as in :func:`~pyro_flat.flat_posterior`).
    :param num_samples: Gaussian perturbations for ``"monte_carlo"``.
    :param num_probes: SLQ probes for the log-determinant of ``"laplace"`` when ``d`` is large.

    >>> import torch
    >>> est = local_entropy(lambda x: 0.5 * (x ** 2).sum(), torch.zeros(2), eta=1.0, method="laplace")
    >>> round(est.value, 6)   # log(2 pi / 2) exactly
    1.14473
    """
    eta = check_eta(eta)
    loss = as_flat_loss(loss_fn, params)
    d, theta = loss.dim, loss.params
    const = 0.5 * d * math.log(2 * math.pi * eta)
    if method == "monte_carlo":
        if num_samples < 2:
            raise ValueError(f"num_samples must be >= 2, got {num_samples}.")
        eps = torch.randn(num_samples, d, generator=seeded_generator(seed), dtype=torch.float64)
        points = theta + (math.sqrt(eta) * eps).to(theta)
        v = -_losses(loss, points, chunk_size).to(torch.float64)
        top = v.max()
        w = (v - top).exp()
        log_mean = float(top + w.mean().log())
        stderr = float(w.std(unbiased=True) / (math.sqrt(num_samples) * w.mean()))
        ess = float(w.sum() ** 2 / (w ** 2).sum())
        return LocalEntropyEstimate(log_mean + const, stderr, ess)
    if method != "laplace":
        raise ValueError(f"method must be 'monte_carlo' or 'laplace', got {method!r}.")
    from scipy.sparse.linalg import LinearOperator, cg

    op = HessianOperator(loss)
    x = theta.detach().clone().requires_grad_(True)
    value = loss.fn(x)
    (g,) = torch.autograd.grad(value, x)
    value = float(value.detach())
    if d <= AUTO_EXACT_DIM:
        lam = hessian_eigenvalues(loss)
        bad = lam.min() * eta <= -1
        logdet, logdet_se = float(np.log1p(eta * lam).sum()) if not bad else float("nan"), 0.0
    else:
        rho = eigenvalue_density(loss, num_probes=num_probes, num_steps=min(64, d), seed=seed)
        bad = rho.nodes.min() * eta <= -1
        mean, se = rho.expect(lambda x: np.log1p(eta * np.maximum(x, -1 / eta + 1e-12)))
        logdet, logdet_se = d * mean, d * se
    if bad:
        raise ValueError(
            f"local_entropy(method='laplace') needs H + I/eta positive definite, but the Hessian has "
            f"an eigenvalue below -1/eta = {-1 / eta:.3g} here: use method='monte_carlo' or a "
            "smaller eta."
        )
    g64 = g.detach().to(torch.float64).cpu().numpy()

    def apply(v: np.ndarray) -> np.ndarray:
        hv = op.matvec(torch.as_tensor(v, device=theta.device)).to(torch.float64).cpu().numpy()
        return hv + v / eta

    solution, info = cg(LinearOperator((d, d), matvec=apply, dtype=np.float64), g64, rtol=1e-8,
                        maxiter=10 * d)
    if info != 0:
        raise RuntimeError(f"local_entropy: conjugate gradients did not converge (info={info}).")
    value = -value + 0.5 * float(g64 @ solution) - 0.5 * logdet + const
    return LocalEntropyEstimate(value, 0.5 * logdet_se, float("nan"))
