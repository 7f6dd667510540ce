r"""Corrupted copies of test images at five severities: the image study's robustness sets.

Five corruptions of ``(N, C, H, W)`` images with pixels in [0, 1], each at severities 1 to 5, in the
spirit of CIFAR-10-C (Hendrycks & Dietterich, 2019) but generated here, so that they exist for any
image set (the digits here; on CIFAR-10 the study reads CIFAR-10-C's own files when they are there):

============== ====================================================================== ======================
kind           what it does                                                            severities 1 .. 5
============== ====================================================================== ======================
rotation       rotate about the centre (bilinear, zeros come in)                       15, 30, 45, 60, 75 degrees
gaussian_noise add :math:`\mathcal N(0, s^2)` noise per pixel, clip to [0, 1]           s = 0.1, 0.2, 0.3, 0.4, 0.5
blur           Gaussian blur (separable, reflected edges)                              sigma = 0.5, 0.75, 1, 1.5, 2 px
contrast       :math:`x \mapsto \bar x + c\,(x - \bar x)`, :math:`\bar x` the image's mean c = 0.75, 0.5, 0.4, 0.3, 0.2
shift          translate by k pixels in a random direction per image (zeros come in)   k = 2, 4, 6, 8, 10 px
============== ====================================================================== ======================

The random ones (noise, the shift's directions) draw from their own generator seeded with ``seed``,
so a corrupted set is the same in every run and leaves the global random stream alone.

>>> images = torch.rand(8, 1, 28, 28)
>>> corrupt(images, "contrast", 5).shape
torch.Size([8, 1, 28, 28])
>>> sorted(corrupted_test_sets(images)) [:2]
[('blur', 1), ('blur', 2)]
"""

from __future__ import annotations

import math
from typing import Dict, Tuple

import torch
import torch.nn.functional as F

#: kind -> the strength at severities 1..5 (see the module's table)
SEVERITIES: Dict[str, Tuple[float, ...]] = {
    "rotation": (15.0, 30.0, 45.0, 60.0, 75.0),
    "gaussian_noise": (0.1, 0.2, 0.3, 0.4, 0.5),
    "blur": (0.5, 0.75, 1.0, 1.5, 2.0),
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.2),
    "shift": (2.0, 4.0, 6.0, 8.0, 10.0),
}
KINDS = tuple(SEVERITIES)


def _check(images: torch.Tensor, kind: str, severity: int) -> float:
    if not torch.is_tensor(images) or images.dim() != 4 or not images.is_floating_point():
        raise ValueError("images must be a floating-point (N, C, H, W) tensor with pixels in [0, 1], got "
                         f"{type(images).__name__}{tuple(images.shape) if torch.is_tensor(images) else ''}; "
                         "e.g. uint8 images as images.float() / 255.")
    if kind not in SEVERITIES:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    if isinstance(severity, bool) or not isinstance(severity, int) or not 1 <= severity <= 5:
        raise ValueError(f"severity must be an integer from 1 to 5, got {severity!r}.")
    return SEVERITIES[kind][severity - 1]


def _affine(images: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def rotate(images: torch.Tensor, degrees: float) -> torch.Tensor:
    """``images`` (N, C, H, W) rotated by ``degrees`` about their centre, counter-clockwise on screen
    (bilinear; zeros come in at the corners)."""
    angle = math.radians(degrees)
    cos, sin = math.cos(angle), math.sin(angle)
    # grid_sample reads the output pixel at (x, y) from the input at theta @ (x, y, 1), y pointing down:
    # the inverse rotation, so the picture turns counter-clockwise on screen
    theta = images.new_tensor([[cos, -sin, 0.0], [sin, cos, 0.0]]).expand(len(images), 2, 3)
    return _affine(images, theta)


def gaussian_noise(images: torch.Tensor, sd: float, generator: torch.Generator) -> torch.Tensor:
    """``images`` plus Gaussian noise of sd ``sd`` drawn from ``generator`` (on the CPU, so that a seed gives the
    same images on any device), clipped to [0, 1]."""
    noise = torch.randn(images.shape, generator=generator, dtype=images.dtype).to(images.device)
    return (images + sd * noise).clamp(0.0, 1.0)


def _shift(images: torch.Tensor, pixels: float, generator: torch.Generator) -> torch.Tensor:
    """Translate each image by ``pixels`` in a random direction (whole pixels along each axis)."""
    n, _, h, w = images.shape
    angle = torch.rand(n, generator=generator, dtype=torch.float64) * 2 * math.pi
    dx, dy = (pixels * angle.cos()).round().long(), (pixels * angle.sin()).round().long()
    out = torch.zeros_like(images)
    for i in range(n):  # whole-pixel moves: exact, no interpolation
        x, y = int(dx[i]), int(dy[i])
        out[i, :, max(y, 0):h + min(y, 0), max(x, 0):w + min(x, 0)] = \
            images[i, :, max(-y, 0):h + min(-y, 0), max(-x, 0):w + min(-x, 0)]
    return out


def _blur(images: torch.Tensor, sigma: float) -> torch.Tensor:
    radius = max(1, math.ceil(3 * sigma))
    x = torch.arange(-radius, radius + 1, dtype=images.dtype, device=images.device)
    kernel = torch.exp(-0.5 * (x / sigma) ** 2)
    kernel = kernel / kernel.sum()
    c = images.shape[1]
    padded = F.pad(images, (radius, radius, radius, radius), mode="reflect")
    rows = F.conv2d(padded, kernel.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)
    return F.conv2d(rows, kernel.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)


def corrupt(images: torch.Tensor, kind: str, severity: int, *, seed: int = 0) -> torch.Tensor:
    """``images`` (N, C, H, W) in [0, 1] under corruption ``kind`` at ``severity`` 1-5 (the module's table)."""
    strength = _check(images, kind, severity)
    generator = torch.Generator().manual_seed(int(seed))
    if kind == "rotation":
        return rotate(images, strength)
    if kind == "gaussian_noise":
        return gaussian_noise(images, strength, generator)
    if kind == "blur":
        return _blur(images, strength)
    if kind == "contrast":
        mean = images.mean(dim=(1, 2, 3), keepdim=True)
        return mean + strength * (images - mean)
    return _shift(images, strength, generator)


def corrupted_test_sets(images: torch.Tensor, *, seed: int = 0) -> Dict[Tuple[str, int], torch.Tensor]:
    """Every corruption of :data:`KINDS` at every severity: ``{(kind, severity): images}``."""
    return {(kind, severity): corrupt(images, kind, severity, seed=seed)
            for kind in KINDS for severity in range(1, 6)}


__all__ = ["KINDS", "SEVERITIES", "corrupt", "corrupted_test_sets", "rotate", "gaussian_noise"]
