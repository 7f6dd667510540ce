r"""Strongly convex test problems whose constants and reference laws are known.

A *problem* is what :func:`pyro_flat.check_convergence` needs besides a sampler: a potential over
one site ``"theta"`` (batched over chains, optionally with per-chain minibatches), its constants
:math:`(m, M)`, a bound on the minibatch gradient noise, a starting point and a reference law
for each target (``"posterior"``, ``"flat"``, ``"joint"``, ``"mode"``).

- :class:`GaussianProblem`: :math:`f = \tfrac12(\theta-\mu)^\top A(\theta-\mu)`; everything in
  closed form, including the exact law of every kernel's chain (:meth:`GaussianProblem.exact_w2`).
- :class:`LogisticRegressionProblem`: Bayesian logistic regression; the reference is a long
  :class:`~pyro_flat.EntropyHMC` run (exact, Metropolis-corrected; made by
  :func:`pyro_flat.convergence.references.reference_draws`, above the kernels), the mode an L-BFGS fit.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ..models.zoo import LogisticRegressionPotential
from ..validation import check_positive, to_numpy
from .constants import logistic_gradient_noise, logistic_regression_constants
from .gaussian import gaussian_targets

SITE = "theta"
TARGETS = ("posterior", "flat", "joint", "mode")


class Problem:
    """The interface :func:`pyro_flat.check_convergence` uses (see the module)."""

    dim: int
    temperature: float = 1.0

    def potential_fn(self, batch_size: Optional[int] = None) -> Callable[[Dict[str, torch.Tensor]], torch.Tensor]:
        raise NotImplementedError

    def constants(self) -> Tuple[float, float]:
        raise NotImplementedError

    def gradient_noise(self, batch_size: Optional[int]) -> float:
        raise NotImplementedError

    def curvature_bounds(self) -> Tuple[np.ndarray, np.ndarray]:
        """``(lower, upper)``: matrices between which the Hessian of the potential lies everywhere
        (Loewner order), for the constants of a preconditioned potential."""
        raise NotImplementedError

    def initial_point(self) -> torch.Tensor:
        return torch.zeros(self.dim)

    def reference(self, target: str, eta: Optional[float] = None):
        """``(mean, cov)`` or samples ``(N, p)`` of the target law (``p = 2d`` for ``"joint"``)."""
        raise NotImplementedError

    def mode(self) -> np.ndarray:
        raise NotImplementedError


def _check_target(target: str, eta) -> None:
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}.")
    if target in ("flat", "joint") and eta is None:
        raise ValueError(f"the {target!r} law depends on eta: pass eta=.")


class GaussianProblem(Problem):
    r""":math:`f(\theta) = \tfrac12(\theta - \mu)^\top A(\theta - \mu)` at temperature :math:`T`.

    :param precision: :math:`A`, symmetric positive definite ``(d, d)``.
    :param mean: :math:`\mu` (default 0).

    Example::

        >>> import torch
        >>> from pyro_flat.theory.problems import GaussianProblem
        >>> problem = GaussianProblem(torch.diag(torch.tensor([1.0, 10.0])))
        >>> problem.constants()
        (1.0, 10.0)
    """

    def __init__(self, precision, mean=None, temperature: float = 1.0):
        A = to_numpy(precision)
        if A.ndim != 2 or A.shape[0] != A.shape[1] or not np.allclose(A, A.T):
            raise ValueError(f"precision must be a symmetric (d, d) matrix, got shape {A.shape}.")
        eig = np.linalg.eigvalsh(A)
        if eig[0] <= 0:
            raise ValueError(f"precision must be positive definite (smallest eigenvalue "
                             f"{eig[0]:.3g}): the potential is not strongly convex.")
        self.A, self.dim = A, A.shape[0]
        self.mean = np.zeros(self.dim) if mean is None else to_numpy(mean).reshape(self.dim)
        self.temperature = check_positive("temperature", temperature)
        self._eig = eig
        self._A_t = torch.as_tensor(A, dtype=torch.get_default_dtype())
        self._mu_t = torch.as_tensor(self.mean, dtype=torch.get_default_dtype())

    def potential_fn(self, batch_size: Optional[int] = None):
        if batch_size is not None:
            raise ValueError("GaussianProblem has no data to subsample: use batch_size=None.")
        A, mu = self._A_t, self._mu_t

        def potential(params):
            r = params[SITE] - mu
            return 0.5 * ((r @ A) * r).sum(-1)

        return potential

    def constants(self) -> Tuple[float, float]:
        return float(self._eig[0]) / self.temperature, float(self._eig[-1]) / self.temperature

    def curvature_bounds(self) -> Tuple[np.ndarray, np.ndarray]:
        return self.A, self.A

    def gradient_noise(self, batch_size: Optional[int]) -> float:
        return 0.0

    def reference(self, target: str, eta: Optional[float] = None):
        _check_target(target, eta)
        if target == "mode":
            return self.mean, np.zeros((self.dim, self.dim))
        return gaussian_targets(self.A, self.mean, eta, self.temperature)[target]

    def mode(self) -> np.ndarray:
        return self.mean

    def exact_w2(self, chain, target: str, iterations, initial_point=None, eta=None) -> np.ndarray:
        """:math:`W_2` to ``target`` at ``iterations`` of a :class:`~pyro_flat.theory.LinearGaussianChain`
        (a chain over :math:`\theta`, or over :math:`(\theta, \theta_a)` started at :math:`\theta_a = \theta`)
        from ``initial_point``. :func:`pyro_flat.convergence.references.exact_chain` gives a kernel's chain."""
        x0 = to_numpy(self.initial_point() if initial_point is None else initial_point)
        p = chain.B.shape[0]
        start = np.concatenate([x0, x0]) if p == 2 * self.dim else x0
        ref = self.reference(target, eta)
        project = slice(None) if target == "joint" or p == self.dim else (
            slice(self.dim, None) if target == "flat" else slice(0, self.dim))
        return chain.w2_trajectory(start, np.zeros((p, p)), iterations, ref, project)


class LogisticRegressionProblem(Problem):
    r"""Bayesian logistic regression :math:`y_i \sim \mathrm{Bernoulli}(\sigma(x_i^\top\theta))`,
    :math:`\theta \sim \mathcal N(0, \Lambda^{-1})`, at temperature :math:`T`.

    :param X: ``(n, d)`` design (add a column of ones for an intercept: ``intercept=True`` does).
    :param y: ``(n,)`` labels in {0, 1}.
    :param prior_precision: :math:`\lambda > 0` (a number or a ``(d,)`` vector).
    :param test_data: optional ``(X_test, y_test)`` for :meth:`accuracy` (same columns as ``X``
        before the intercept).

    The potential's minibatches (``potential_fn(batch_size=B)``) are drawn independently per
    chain, so that many chains are independent draws of one chain's law: the ensemble estimates
    :math:`W_2(\nu_k, \pi)`.

    Example::

        >>> import torch
        >>> from pyro_flat.theory.problems import LogisticRegressionProblem
        >>> X = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> problem = LogisticRegressionProblem(X, torch.tensor([1.0, 0.0, 1.0]), prior_precision=1.0)
        >>> problem.dim, problem.potential_fn()({"theta": torch.zeros(4, 3)}).shape
        (3, torch.Size([4]))
    """

    def __init__(self, X, y, prior_precision=1.0, temperature: float = 1.0, *,
                 intercept: bool = True, test_data=None):
        X = torch.as_tensor(X, dtype=torch.get_default_dtype())
        y = torch.as_tensor(y, dtype=X.dtype)
        if X.dim() != 2 or y.shape != (X.shape[0],):
            raise ValueError(f"X must be (n, d) and y (n,), got {tuple(X.shape)} and {tuple(y.shape)}.")
        if not (torch.isfinite(X).all() and torch.isfinite(y).all()):
            raise ValueError("X or y has NaN/inf entries; clean the data first.")
        if not bool(((y == 0) | (y == 1)).all()):
            raise ValueError("y must hold labels 0 and 1.")
        self.intercept = intercept
        self.X = self._design(X)
        self.y = y
        self.dim = self.X.shape[1]
        self.prior_precision = prior_precision
        self.temperature = check_positive("temperature", temperature)
        self._constants = logistic_regression_constants(self.X, prior_precision, self.temperature)
        self._precision = torch.as_tensor(prior_precision, dtype=X.dtype).expand(self.dim)
        self.test_data = None if test_data is None else (self._design(torch.as_tensor(test_data[0], dtype=X.dtype)),
                                                         torch.as_tensor(test_data[1], dtype=X.dtype))
        self._references: Dict[float, Dict[str, np.ndarray]] = {}
        self._mode: Optional[np.ndarray] = None

    def _design(self, X: torch.Tensor) -> torch.Tensor:
        return torch.cat([X, X.new_ones(X.shape[0], 1)], 1) if self.intercept else X

    @classmethod
    def mnist79(cls, root=None, *, prior_precision: float = 4.0, temperature: float = 1.0):
        """MNIST 7 (label 0) vs 9 (label 1), 784 pixels in [0, 1] plus an intercept; the embedded
        split by default (800 training, 200 test images), or the IDX/npz files under ``root``.
        ``prior_precision=4`` is the study's default (prior sd 0.5)."""
        from ..data.datasets import load_mnist79

        X, y = load_mnist79(root, split="train")
        test = load_mnist79(root, split="test")
        return cls(X, y, prior_precision, temperature, test_data=test)

    def potential_fn(self, batch_size: Optional[int] = None):
        n = self.X.shape[0]
        if batch_size is not None:
            if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= n:
                raise ValueError(f"batch_size must be an integer in [1, {n}] or None, got {batch_size!r}.")
            if batch_size == n:
                batch_size = None
        return LogisticRegressionPotential(self.X, self.y, self._precision, batch_size)

    def constants(self) -> Tuple[float, float]:
        return self._constants

    def curvature_bounds(self) -> Tuple[np.ndarray, np.ndarray]:
        r""":math:`\Lambda \preceq \nabla^2 U \preceq X^\top X/4 + \Lambda` (:math:`\sigma' \le 1/4`)."""
        X = self.X.double().numpy()
        prior = np.diag(self._precision.double().numpy())
        return prior, X.T @ X / 4 + prior

    def gradient_noise(self, batch_size: Optional[int]) -> float:
        return 0.0 if batch_size is None else logistic_gradient_noise(self.X, batch_size)

    def mode(self) -> np.ndarray:
        """The MAP (full-batch L-BFGS in double precision)."""
        if self._mode is None:
            X, s = self.X.double(), (2 * self.y - 1).double()
            prec = self._precision.double()
            w = torch.zeros(self.dim, dtype=torch.float64, requires_grad=True)
            opt = torch.optim.LBFGS([w], max_iter=500, tolerance_grad=1e-10, tolerance_change=1e-14,
                                    line_search_fn="strong_wolfe")

            def closure():
                opt.zero_grad()
                loss = F.softplus(-s * (X @ w)).sum() + 0.5 * (prec * w * w).sum()
                loss.backward()
                return loss

            opt.step(closure)
            self._mode = w.detach().numpy()
        return self._mode

    def reference_eta(self, eta: Optional[float]) -> float:
        """The coupling of the joint whose draws give the ``"posterior"`` reference (any works:
        θ's marginal is the posterior for every η; 0.01 unless one is given)."""
        return 0.01 if eta is None else float(eta)

    def store_reference(self, eta: float, draws: Dict[str, np.ndarray]) -> None:
        """Keep draws ``{"theta", "theta_aux"}`` of the joint at ``eta`` for :meth:`reference`
        (:func:`pyro_flat.convergence.references.reference_draws` makes them with EntropyHMC)."""
        self._references[float(eta)] = draws

    def stored_reference(self, eta: float) -> Optional[Dict[str, np.ndarray]]:
        return self._references.get(float(eta))

    def reference(self, target: str, eta: Optional[float] = None):
        _check_target(target, eta)
        if target == "mode":
            return self.mode(), np.zeros((self.dim, self.dim))
        draws = self.stored_reference(self.reference_eta(eta))
        if draws is None:
            raise ValueError(f"no reference draws for eta={self.reference_eta(eta)}: make them with "
                             "pyro_flat.convergence.references.reference_draws(problem, eta) (check_convergence "
                             "does this itself).")
        if target == "posterior":
            return draws[SITE]
        if target == "flat":
            return draws[SITE + "_aux"]
        return np.concatenate([draws[SITE], draws[SITE + "_aux"]], 1)

    def accuracy(self, theta) -> Tuple[float, float]:
        """Test accuracy of the Bayesian model average over the rows of ``theta`` ``(S, d)`` and
        the mean accuracy of one row."""
        if self.test_data is None:
            raise ValueError("this problem has no test_data.")
        X, y = self.test_data
        probs = torch.sigmoid(torch.as_tensor(theta, dtype=X.dtype) @ X.T)  # (S, n)
        bma = float(((probs.mean(0) > 0.5).to(X.dtype) == y).to(X.dtype).mean())
        single = float(((probs > 0.5).to(X.dtype) == y).to(X.dtype).mean())
        return bma, single
