"""Flat-seeking variational inference for ``pyro.infer.SVI``.

- :class:`SAM_ELBO`: the sharpness-aware posterior (SA-BBB): the likelihood after one SAM ascent
  step in θ;
- :class:`SABMA_ELBO`: SA-BMA: the ELBO's gradient at the worst variational parameters in a KL ball
  (with SAM and Fisher-SAM as options);
- :class:`AutoSWAG`: SWAG, the moments of SGD (or SAM) iterates as a low-rank Gaussian guide;
- :class:`LastLayerLaplace`: the Laplace approximation of a softmax network's last layer (full or
  diagonal GGN, prior precision by marginal likelihood);
- :func:`transfer_model`: only named sites (or submodules) variational, the rest pre-trained;
- :mod:`~pyro_flat.variational.fisher`: the Fisher information of Pyro's Gaussian autoguides.
"""

from .fisher import diagonal_fisher, gaussian_parameters
from .laplace import LastLayerLaplace
from .minibatch import SameMinibatch
from .sabma import GuideCovarianceError, SABMA_ELBO
from .sam import SAM_ELBO
from .swag import AutoSWAG
from .transfer import transfer_model

__all__ = ["SAM_ELBO", "SABMA_ELBO", "AutoSWAG", "LastLayerLaplace", "GuideCovarianceError", "transfer_model", "SameMinibatch", "gaussian_parameters", "diagonal_fisher"]
