r"""``LastLayerLaplace``: the Laplace approximation of a softmax network's last (linear) layer.

The features :math:`\phi_n \in \mathbb R^D` of a trained network are held fixed and only its head
:math:`f(\phi) = W\phi + b` (``K`` classes) is Bayesian (Daxberger et al., NeurIPS 2021). At the head's
MAP :math:`\theta^* = \mathrm{vec}([W, b])` (row by row, :math:`M = K(D+1)` numbers, :math:`K D` without a
bias), with :math:`\tilde\phi = [\phi, 1]`, :math:`p_n = \mathrm{softmax}(f(\phi_n))` and the logits' Jacobian
:math:`J_n = I_K \otimes \tilde\phi_n^\top`:

.. math::
    H = \sum_n J_n^\top\big(\mathrm{diag}(p_n) - p_n p_n^\top\big) J_n
      = \sum_n \big(\mathrm{diag}(p_n) - p_n p_n^\top\big) \otimes \tilde\phi_n\tilde\phi_n^\top, \qquad
    P = H + \lambda I, \qquad q(\theta) = \mathcal N\big(\theta^*, P^{-1}\big).

:math:`H` is the generalized Gauss-Newton matrix, here the exact Hessian of the negative log-likelihood
(a linear head with the canonical link); ``hessian="diag"`` keeps its diagonal
:math:`\sum_n p_{nk}(1 - p_{nk})\tilde\phi_{nd}^2` (for heads too big for an :math:`M \times M` matrix).
The prior is :math:`\mathcal N(\mu_0, \lambda^{-1} I)`; ``prior_precision="marglik"`` takes the λ of a
log grid that maximises the Laplace evidence

.. math::
    \log p(y \mid X, \lambda) \approx \log p(y \mid X, \theta^*) + \log\mathcal N(\theta^*; \mu_0, \lambda^{-1} I)
    + \tfrac M2 \log 2\pi - \tfrac12 \log\det P,

and the predictive is the Monte Carlo average :math:`\frac1S \sum_s \mathrm{softmax}(W_s\phi + b_s)`,
:math:`\theta_s \sim q`. Everything is computed in float64; what is returned has the inputs' dtype.

>>> import torch
>>> g = torch.Generator().manual_seed(0)
>>> features = torch.randn(200, 4, generator=g)            # a trained network's last hidden layer
>>> y = (features[:, 0] > 0).long() + (features[:, 1] > 1).long()
>>> head = torch.nn.Linear(4, 3)                            # its trained head (here untrained)
>>> la = LastLayerLaplace(features, y, head.weight.detach(), head.bias.detach())
>>> la.posterior_precision.shape, la.prior_precision in LastLayerLaplace.PRIOR_PRECISION_GRID.tolist()
(torch.Size([15, 15]), True)
>>> draws = la.sample(50, generator=g)
>>> draws["weight"].shape, draws["bias"].shape
(torch.Size([50, 3, 4]), torch.Size([50, 3]))
>>> probs = la.predictive(features[:5], num_samples=100, generator=g)
>>> probs.shape, probs.dtype, bool(torch.allclose(probs.sum(-1), torch.ones(5)))
(torch.Size([5, 3]), torch.float32, True)
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Union

import torch
from torch import Tensor

from ..validation import check_positive, check_positive_int

#: float64 numbers in one batch of the Hessian's construction (and of the predictive's logits): 32 MB
_BATCH_ELEMENTS = 2 ** 22


def _matrix(name: str, value, what: str) -> Tensor:
    if not isinstance(value, Tensor) or value.dim() != 2 or not value.is_floating_point():
        shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise ValueError(f"{name} must be a 2-D floating-point tensor {what}, got {shape}.")
    return value.detach()


def _finite(name: str, value: Tensor, hint: str) -> Tensor:
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name} holds NaN or infinite values; {hint}")
    return value


class LastLayerLaplace:
    """The Laplace posterior :math:`\\mathcal N(\\theta^*, (H + \\lambda I)^{-1})` of a softmax head.

    :param features: ``(N, D)``, the inputs of the head (the network's last hidden layer) on the training data.
    :param y: ``(N,)`` integer class labels in ``[0, K)``.
    :param weight: ``(K, D)``, the head's weight at its MAP.
    :param bias: ``(K,)``, its bias, or ``None`` for a head without one.
    :param hessian: ``"full"``: the exact GGN over ``vec([W, b])`` (at most ``MAX_FULL_PARAMS`` numbers);
        ``"diag"``: its diagonal.
    :param prior_precision: λ > 0, or ``"marglik"``: the value of ``PRIOR_PRECISION_GRID`` with the largest
        :meth:`log_marginal_likelihood`.
    :param prior_mean: ``{"weight": (K, D), "bias": (K,)}``, the prior's mean (a missing key: 0).

    ``prior_precision`` is the λ used, ``posterior_precision`` P (``(M, M)``, or its diagonal ``(M,)``
    with ``hessian="diag"``), ``num_params`` M.
    """

    PRIOR_PRECISION_GRID = 10.0 ** torch.linspace(-4.0, 4.0, 41, dtype=torch.float64)
    MAX_FULL_PARAMS = 20_000

    def __init__(self, features: Tensor, y: Tensor, weight: Tensor, bias: Optional[Tensor] = None, *,
                 hessian: str = "full", prior_precision: Union[float, str] = "marglik",
                 prior_mean: Optional[Dict[str, Tensor]] = None):
        if not isinstance(hessian, str) or hessian not in ("full", "diag"):
            raise ValueError(f"hessian must be 'full' (the exact GGN) or 'diag' (its diagonal), got hessian={hessian!r}; "
                             "pass hessian='full', or hessian='diag' for a big head.")
        self.hessian = hessian
        weight = _finite("weight", _matrix("weight", weight, "(K, D): the head's weight at its MAP"),
                         "pass the trained head's weight.")
        num_classes, dim = weight.shape
        features = self._check_features(features, dim)
        self._check_labels(y, features.shape[0], num_classes)
        if bias is not None:
            if not isinstance(bias, Tensor) or tuple(bias.shape) != (num_classes,):
                shape = tuple(bias.shape) if isinstance(bias, Tensor) else type(bias).__name__
                raise ValueError(f"bias must be a tensor of shape ({num_classes},) (one per row of weight), got {shape}; "
                                 "pass the head's bias, or bias=None for a head without one.")
            _finite("bias", bias, "pass the trained head's bias.")
        self.dtype, self.device = weight.dtype, features.device
        self.num_classes, self.num_features, self.has_bias = num_classes, dim, bias is not None
        self.num_params = num_classes * (dim + self.has_bias)
        if hessian == "full" and self.num_params > self.MAX_FULL_PARAMS:
            raise ValueError(f"hessian='full' would be a {self.num_params} x {self.num_params} matrix (K={num_classes} "
                             f"classes x {dim + self.has_bias} weights), above the {self.MAX_FULL_PARAMS} parameters "
                             "a full Hessian allows; pass hessian='diag'.")
        self._map = self._flat(weight, bias)
        self._prior_mean = self._check_prior_mean(prior_mean, weight, bias)
        phi = self._augment(features)
        logits = phi @ self._map.view(num_classes, -1).T
        self._log_likelihood = float(-torch.nn.functional.cross_entropy(logits, y.to(self.device), reduction="sum"))
        self._hessian = self._build_hessian(phi, torch.softmax(logits, dim=-1))
        self._eigenvalues: Optional[Tensor] = None
        self._cholesky: Optional[Tensor] = None
        if isinstance(prior_precision, str):
            if prior_precision != "marglik":
                raise ValueError(f"prior_precision must be a positive number or 'marglik', got "
                                 f"prior_precision={prior_precision!r}; pass e.g. prior_precision=1.0.")
            grid = self.PRIOR_PRECISION_GRID.tolist()
            evidence = [self.log_marginal_likelihood(lam) for lam in grid]
            prior_precision = grid[max(range(len(grid)), key=evidence.__getitem__)]
        self.prior_precision = check_positive("prior_precision", prior_precision,
                                              hint="Pass a positive prior precision, e.g. 1.0, or 'marglik'.")
        if hessian == "full":
            self._precision = self._hessian + self.prior_precision * torch.eye(
                self.num_params, dtype=torch.float64, device=self.device)
        else:
            self._precision = self._hessian + self.prior_precision
        self.posterior_precision = self._precision.to(self.dtype)

    # ------------------------------------------------------------------ checks
    def _check_features(self, features, dim: int) -> Tensor:
        features = _matrix("features", features, f"(N, {dim}): the head's inputs")
        if features.shape[1] != dim:
            raise ValueError(f"features has {features.shape[1]} columns but weight has {dim} (weight is (K, D), "
                             f"features (N, D)); pass the features the head takes, of shape (N, {dim}).")
        return _finite("features", features, "drop or impute those rows before the Laplace approximation.")

    @staticmethod
    def _check_labels(y, n: int, num_classes: int) -> None:
        if (not isinstance(y, Tensor) or y.dim() != 1 or y.dtype == torch.bool
                or y.is_floating_point() or y.is_complex()):
            what = f"{y.dtype} of shape {tuple(y.shape)}" if isinstance(y, Tensor) else type(y).__name__
            raise ValueError(f"y must be a 1-D integer tensor of class labels, got {what}; pass e.g. y.long().")
        if y.shape[0] != n:
            raise ValueError(f"y has {y.shape[0]} labels but features has {n} rows; pass one label per row of features.")
        if n == 0:
            raise ValueError("features and y are empty; pass at least one training example.")
        low, high = int(y.min()), int(y.max())
        if low < 0 or high >= num_classes:
            raise ValueError(f"y holds labels from {low} to {high}, outside [0, {num_classes}) (weight has "
                             f"{num_classes} rows, one per class); pass labels 0 to {num_classes - 1}, or a head "
                             "with a row per class.")

    def _check_prior_mean(self, prior_mean, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        if prior_mean is None:
            return torch.zeros_like(self._map)
        allowed = ("weight", "bias") if bias is not None else ("weight",)
        if not isinstance(prior_mean, dict) or not set(prior_mean) <= set(allowed):
            keys = sorted(prior_mean) if isinstance(prior_mean, dict) else type(prior_mean).__name__
            raise ValueError(f"prior_mean must be a dict with keys among {list(allowed)}, got {keys}; pass e.g. "
                             "prior_mean={'weight': torch.zeros_like(weight)} (a missing key means 0).")
        parts = {"weight": torch.zeros_like(weight), "bias": None if bias is None else torch.zeros_like(bias)}
        for key, value in prior_mean.items():
            if not isinstance(value, Tensor) or value.shape != parts[key].shape:
                shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise ValueError(f"prior_mean[{key!r}] must have the shape of {key}, {tuple(parts[key].shape)}, "
                                 f"got {shape}; pass a tensor shaped like the head's {key}.")
            parts[key] = _finite(f"prior_mean[{key!r}]", value.detach(), "pass finite prior means.")
        return self._flat(parts["weight"], parts["bias"])

    # ------------------------------------------------------------------ the Hessian
    def _flat(self, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        """``vec([W, b])`` row by row, in float64."""
        weight = weight.detach().to(device=self.device, dtype=torch.float64)
        if bias is not None:
            weight = torch.cat([weight, bias.detach().to(device=self.device, dtype=torch.float64)[:, None]], dim=1)
        return weight.reshape(-1)

    def _augment(self, features: Tensor) -> Tensor:
        """φ̃ = [φ, 1] (φ without a bias) in float64."""
        phi = features.to(device=self.device, dtype=torch.float64)
        return torch.cat([phi, phi.new_ones(phi.shape[0], 1)], dim=1) if self.has_bias else phi

    def _build_hessian(self, phi: Tensor, probs: Tensor) -> Tensor:
        """Σ_n (diag(p_n) - p_n p_nᵀ) ⊗ φ̃_n φ̃_nᵀ, or its diagonal, in batches of rows."""
        if self.hessian == "diag":
            return torch.einsum("nk,nd->kd", probs * (1.0 - probs), phi.square()).reshape(-1)
        k, width, m = self.num_classes, phi.shape[1], self.num_params
        hessian = phi.new_zeros(m, m)
        blocks = phi.new_zeros(k, width, width)  # the diag(p_n) ⊗ φ̃φ̃ᵀ part: block-diagonal
        rows = max(1, _BATCH_ELEMENTS // m)
        for start in range(0, phi.shape[0], rows):
            p, x = probs[start:start + rows], phi[start:start + rows]
            blocks += torch.einsum("nk,nd,ne->kde", p, x, x)
            outer = (p[:, :, None] * x[:, None, :]).reshape(-1, m)  # rows (p_n ⊗ φ̃_n)ᵀ
            hessian.addmm_(outer.T, outer, alpha=-1.0)
        index = torch.arange(k, device=self.device)
        hessian.view(k, width, k, width)[index, :, index, :] += blocks
        return hessian

    def _hessian_eigenvalues(self) -> Tensor:
        if self._eigenvalues is None:  # once: log det(H + λI) = Σ log(e_i + λ) for every λ
            self._eigenvalues = torch.linalg.eigvalsh(self._hessian).clamp_min(0.0)
        return self._eigenvalues

    # ------------------------------------------------------------------ the public methods
    def log_marginal_likelihood(self, prior_precision: float) -> float:
        """The Laplace evidence at prior precision λ, with the posterior's mode held at the given MAP:
        log p(y|X,θ*) - λ/2 ‖θ* - μ₀‖² + M/2 log λ - ½ log det(H + λI)."""
        lam = check_positive("prior_precision", prior_precision,
                             hint="Pass a positive prior precision, e.g. log_marginal_likelihood(1.0).")
        eigenvalues = self._hessian_eigenvalues() if self.hessian == "full" else self._hessian
        log_det = float(torch.log(eigenvalues + lam).sum())
        distance = float((self._map - self._prior_mean).square().sum())
        return self._log_likelihood - 0.5 * lam * distance + 0.5 * self.num_params * math.log(lam) - 0.5 * log_det

    def _draw(self, num: int, generator: Optional[torch.Generator]) -> Tensor:
        """``num`` draws of θ from N(θ*, P⁻¹), float64, shaped ``(num, K, D [+ 1])``."""
        noise = torch.randn(num, self.num_params, generator=generator, dtype=torch.float64, device=self.device)
        if self.hessian == "diag":
            delta = noise / self._precision.sqrt()
        else:
            if self._cholesky is None:
                factor, info = torch.linalg.cholesky_ex(self._precision)
                if int(info):
                    raise ValueError(f"the posterior precision H + {self.prior_precision:g} I is not numerically "
                                     "positive definite; pass a larger prior_precision.")
                self._cholesky = factor
            # P = L Lᵀ, so θ* + L⁻ᵀz has covariance L⁻ᵀL⁻¹ = P⁻¹
            delta = torch.linalg.solve_triangular(self._cholesky.T, noise.T, upper=True).T
        return (self._map + delta).view(num, self.num_classes, -1)

    def sample(self, num: int, generator: Optional[torch.Generator] = None) -> Dict[str, Tensor]:
        """``num`` posterior draws: ``{"weight": (num, K, D), "bias": (num, K)}`` (``"bias"`` only for a head
        with one), in the weight's dtype."""
        num = check_positive_int("num", num, hint="Pass the number of posterior draws, e.g. sample(100).")
        theta = self._draw(num, generator)
        out = {"weight": theta[..., :self.num_features].to(self.dtype)}
        if self.has_bias:
            out["bias"] = theta[..., self.num_features].to(self.dtype)
        return out

    def predictive(self, features: Tensor, num_samples: int = 100,
                   generator: Optional[torch.Generator] = None) -> Tensor:
        """``(N, K)`` class probabilities: the average of softmax(W_s φ + b_s) over ``num_samples`` draws."""
        features = self._check_features(features, self.num_features)
        num_samples = check_positive_int("num_samples", num_samples,
                                         hint="Pass the number of posterior draws to average, e.g. 100.")
        phi = self._augment(features)
        total = phi.new_zeros(phi.shape[0], self.num_classes)
        chunk = max(1, _BATCH_ELEMENTS // max(1, phi.shape[0] * self.num_classes))
        for start in range(0, num_samples, chunk):
            theta = self._draw(min(chunk, num_samples - start), generator)
            total += torch.softmax(torch.einsum("nd,skd->snk", phi, theta), dim=-1).sum(0)
        return (total / num_samples).to(features.dtype)


__all__ = ["LastLayerLaplace"]
