r"""Per-minibatch data transforms, run on the inputs' device: each image its own random draw.

:func:`random_crop_flip` is the CIFAR augmentation of the papers' experiments: pad by 4 pixels
(zeros), crop back to the image's size at a random offset, and flip left-right with probability
1/2. Images are ``(..., channels, height, width)``: any leading dims (chains, then the minibatch).

>>> x = torch.arange(16.).reshape(1, 1, 4, 4)
>>> random_crop_flip(x, padding=0, flip=False).equal(x)
True
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def random_crop_flip(x: torch.Tensor, padding: int = 4, flip: bool = True) -> torch.Tensor:
    """``x`` padded by ``padding`` zeros on each side, cropped back at a random offset per image, and (with
    ``flip``) mirrored left-right with probability 1/2 per image."""
    if x.dim() < 3:
        raise ValueError(f"random_crop_flip takes images (..., channels, height, width), got shape {tuple(x.shape)}.")
    *lead, c, h, w = x.shape
    images = x.reshape(-1, c, h, w)
    n = images.shape[0]
    if padding:
        padded = F.pad(images, (padding, padding, padding, padding))
        top = torch.randint(0, 2 * padding + 1, (n,), device=x.device)
        left = torch.randint(0, 2 * padding + 1, (n,), device=x.device)
        rows = (top[:, None] + torch.arange(h, device=x.device))[:, None, :, None]   # (n, 1, h, 1)
        cols = (left[:, None] + torch.arange(w, device=x.device))[:, None, None, :]  # (n, 1, 1, w)
        batch = torch.arange(n, device=x.device)[:, None, None, None]
        channel = torch.arange(c, device=x.device)[None, :, None, None]
        images = padded[batch, channel, rows, cols]
    if flip:
        mirrored = torch.rand(n, device=x.device) < 0.5
        images = torch.where(mirrored[:, None, None, None], images.flip(-1), images)
    return images.reshape(*lead, c, h, w)


__all__ = ["random_crop_flip"]
