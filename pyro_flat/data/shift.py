r"""Distribution-shift test sets made from test images, as CIFAR-10-C is made from CIFAR-10.

Two corruptions at several strengths each, applied to flattened square images with pixels in [0, 1]:

- **rotation** by :math:`\alpha` degrees about the image centre (bilinear, zeros outside);
- **additive Gaussian noise** of sd :math:`s`, clipped back to [0, 1]:
  :math:`x' = \min(1, \max(0, x + s\,\xi))`, :math:`\xi \sim \mathcal N(0, I)`.

Each corrupted set keeps the labels of the clean one, so accuracy, NLL and ECE are measured on it
as on the test set. The noise is drawn from its own seeded generator: the same seed gives the same
sets.

>>> import torch
>>> x = torch.zeros(1, 784); x[0, 14 * 28 + 20] = 1.0   # one bright pixel right of the centre
>>> r = rotate_images(x, 90.0).reshape(28, 28)
>>> divmod(int(r.argmax()), 28), round(float(r.max()), 4)  # a quarter turn counter-clockwise: above the centre
((7, 14), 1.0)
>>> sets = shifted_test_sets(torch.rand(5, 784), rotations=(30,), noise_sds=(0.2, 0.4))
>>> [(kind, strength, tuple(images.shape)) for kind, strength, images in sets]
[('rotation', 30.0, (5, 784)), ('noise', 0.2, (5, 784)), ('noise', 0.4, (5, 784))]
"""

from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import torch

from .corruptions import gaussian_noise, rotate
from ..validation import check_number

#: the corruptions of :func:`shifted_test_sets`, in the order it returns them
SHIFT_KINDS = ("rotation", "noise")


def _square_side(images: torch.Tensor) -> int:
    if images.dim() != 2:
        raise ValueError(f"images must be (N, side * side) flattened square images, got shape {tuple(images.shape)}")
    side = math.isqrt(images.shape[1])
    if side * side != images.shape[1]:
        raise ValueError(f"images have {images.shape[1]} pixels, not a square number: pass flattened square images "
                         "such as MNIST's (N, 784)")
    return side


def rotate_images(images: torch.Tensor, degrees: float) -> torch.Tensor:
    """``images`` (N, side²) rotated by ``degrees`` about their centre (bilinear; zeros come in at
    the corners)."""
    side = _square_side(images)
    check_number("degrees", degrees, "30")
    return rotate(images.reshape(-1, 1, side, side), float(degrees)).reshape(images.shape)


def add_noise(images: torch.Tensor, sd: float, generator: torch.Generator) -> torch.Tensor:
    """``images`` plus Gaussian noise of sd ``sd``, clipped to [0, 1]."""
    check_number("sd", sd, "0.2")
    if sd < 0:
        raise ValueError(f"sd must be >= 0, got sd={sd}: it is the noise's standard deviation in pixel units")
    return gaussian_noise(images, float(sd), generator)


def shifted_test_sets(images: torch.Tensor, *, rotations: Sequence[float] = (15.0, 30.0, 45.0, 60.0),
                      noise_sds: Sequence[float] = (0.2, 0.4, 0.6, 0.8),
                      seed: int = 0) -> List[Tuple[str, float, torch.Tensor]]:
    """The corrupted copies of ``images``: ``[(kind, strength, images), ...]``, every rotation in
    ``rotations`` (degrees), then every noise sd in ``noise_sds`` (pixel units)."""
    generator = torch.Generator().manual_seed(int(seed))
    out = [("rotation", float(a), rotate_images(images, a)) for a in rotations]
    out += [("noise", float(s), add_noise(images, s, generator)) for s in noise_sds]
    return out


__all__ = ["rotate_images", "add_noise", "shifted_test_sets", "SHIFT_KINDS"]
