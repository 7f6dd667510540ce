"""Any PyTorch ``nn.Module`` as a flat posterior: :class:`BayesianModule` (vectorized chains through
``torch.func``, BatchNorm done as the papers do it), :func:`update_batchnorm`, data from a
``DataLoader`` (:class:`Batches`), the data transforms of the image studies (:func:`random_crop_flip`), and the papers' residual networks
in plain torch (:func:`resnet18`, :class:`ResNet`); for fine-tuning, the Bayesian part of a pre-trained
network (``BayesianModule(sampled=..., prior_mean="module")``) or its low-rank adapters
(:func:`low_rank_adapters`)."""

from .adapters import LowRankAdapter, low_rank_adapters
from .batches import Batches
from .batchnorm import update_batchnorm
from .module import BayesianModule
from .resnet import ResNet, resnet18
from .transforms import random_crop_flip

__all__ = ["BayesianModule", "Batches", "update_batchnorm", "random_crop_flip", "ResNet", "resnet18",
           "low_rank_adapters", "LowRankAdapter"]
