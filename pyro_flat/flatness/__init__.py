r"""Measuring flatness: Hessian spectra, traces, loss curves and local entropy.

Every measure takes ``loss_fn`` (a flat ``(d,)`` tensor to a scalar) and ``params`` (the point),
or a :class:`FlatLoss` that carries both, plus named blocks for ``per_site=True``:

- :func:`hessian_eigenvalues` (dense, small ``d``), :func:`top_eigenvalues` (Lanczos),
  :func:`power_iteration` (the plain baseline), :func:`eigenvalue_density` (stochastic Lanczos
  quadrature, :class:`SpectralDensity`);
- :func:`hessian_trace` (Hutchinson, with a standard error: :class:`TraceEstimate`);
- :func:`interpolation_curve` and :func:`perturbation_curve` (:class:`Curve`, with ``.plot()``);
- :func:`local_entropy`: :math:`F(\theta;\eta)`, the log density of the flat posterior;
- :func:`minimum_energy_path` (NEB with a climbing image and AutoNEB's pivots, :class:`EnergyPath`),
  :func:`straight_path`, :func:`curvature_along_path`, :func:`projected_dynamics` and
  :func:`plot_path_profiles`;
- :func:`flatness_at_samples`: top eigenvalues and traces of a Pyro model's potential at MCMC draws.

Sources of losses: :meth:`FlatLoss.from_model` (a Pyro model's full-data potential at a draw, in
unconstrained coordinates, one block per site) and :meth:`FlatLoss.from_module` (an ``nn.Module``
and a criterion, one block per parameter tensor).

Example::

    >>> import torch
    >>> from pyro_flat.flatness import top_eigenvalues, hessian_trace
    >>> A = torch.diag(torch.tensor([4., 2., 1.]))
    >>> loss = lambda x: 0.5 * x @ A @ x
    >>> top_eigenvalues(loss, torch.zeros(3), k=1)
    [4.0]
    >>> round(hessian_trace(loss, torch.zeros(3), num_probes=10).value, 6)
    7.0
"""

from .curves import Curve, interpolation_curve, perturbation_curve
from .local_entropy import LocalEntropyEstimate, local_entropy
from .loss import FlatLoss, HessianOperator
from .paths import (
    EnergyPath,
    curvature_along_path,
    minimum_energy_path,
    plot_path_profiles,
    straight_path,
)
from .path_dynamics import PathDynamics, projected_dynamics
from .samples import flatness_at_samples
from .spectrum import (
    SpectralDensity,
    eigenvalue_density,
    hessian_eigenvalues,
    lanczos,
    power_iteration,
    top_eigenvalues,
)
from .trace import TraceEstimate, hessian_trace

__all__ = [
    "FlatLoss",
    "HessianOperator",
    "hessian_eigenvalues",
    "top_eigenvalues",
    "power_iteration",
    "eigenvalue_density",
    "SpectralDensity",
    "lanczos",
    "hessian_trace",
    "TraceEstimate",
    "interpolation_curve",
    "perturbation_curve",
    "Curve",
    "local_entropy",
    "LocalEntropyEstimate",
    "flatness_at_samples",
    "EnergyPath",
    "minimum_energy_path",
    "straight_path",
    "curvature_along_path",
    "PathDynamics",
    "projected_dynamics",
    "plot_path_profiles",
]
