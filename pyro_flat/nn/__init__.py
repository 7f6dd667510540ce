"""Any PyTorch ``nn.Module`` as a flat posterior: :class:`BayesianModule` (vectorized chains through
``torch.func``, BatchNorm done as the papers do it), :func:`update_batchnorm`, data from a
``DataLoader`` (:class:`Batches`), and the data transforms of the image studies (:func:`random_crop_flip`)."""

from .batches import Batches
from .batchnorm import update_batchnorm
from .module import BayesianModule
from .transforms import random_crop_flip

__all__ = ["BayesianModule", "Batches", "update_batchnorm", "random_crop_flip"]
