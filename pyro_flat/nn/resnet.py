r"""Residual networks in plain torch: the CIFAR ResNet-18 of the Entropy-MCMC experiments, and small ones.

The CIFAR variant of ResNet-18: a 3x3 stem convolution (no 7x7 stem, no max-pooling), four stages of
two basic blocks (64, 128, 256 and 512 channels, strides 1, 2, 2, 2), BatchNorm after every
convolution, a 1x1 projection on the shortcut where the shape changes, global average pooling and one
linear layer: 11,173,962 weights for 10 classes. Each block computes

.. math:: h = \mathrm{ReLU}\big(\mathrm{BN}(W_2 * \mathrm{ReLU}(\mathrm{BN}(W_1 * x))) + S(x)\big),

with :math:`S` the identity or the projection. ``ResNet(blocks=(1, 1, 1), width=16, in_channels=1)``
is the small network of the image study on digits (78k weights). Written here because torchvision
cannot be used beside the CPU build of torch; the parameters have the usual names of the CIFAR
ResNet-18 (``conv1``, ``layer1.0.conv1``, ``layer2.0.shortcut.0``, ``linear``), so a ``state_dict``
of that network loads.

>>> import torch
>>> net = resnet18(num_classes=10)
>>> sum(p.numel() for p in net.parameters())
11173962
>>> ResNet(blocks=(1, 1), width=8, in_channels=1)(torch.randn(2, 1, 28, 28)).shape
torch.Size([2, 10])
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm, and the shortcut (a strided 1x1 projection where the shape changes)."""

    def __init__(self, in_channels: int, channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class ResNet(nn.Module):
    """A CIFAR-style residual network: a 3x3 stem, ``len(blocks)`` stages, average pooling, a linear head.

    :param blocks: basic blocks per stage; stage ``k`` has ``width * 2**k`` channels and stride 2 after
        the first stage. ``(2, 2, 2, 2)`` with ``width=64`` is ResNet-18.
    :param width: channels of the stem and the first stage.
    :param in_channels: 3 for colour images, 1 for digits.
    :param num_classes: outputs of the head (class logits).
    """

    def __init__(self, blocks: Sequence[int] = (2, 2, 2, 2), width: int = 64, in_channels: int = 3,
                 num_classes: int = 10):
        super().__init__()
        if not blocks or any(int(b) < 1 for b in blocks):
            raise ValueError(f"ResNet: blocks={tuple(blocks)!r} must be one positive count per stage, e.g. (2, 2, 2, 2)")
        if int(width) < 1 or int(in_channels) < 1 or int(num_classes) < 1:
            raise ValueError(f"ResNet: width={width}, in_channels={in_channels} and num_classes={num_classes} "
                             "must be positive integers")
        self.conv1 = nn.Conv2d(in_channels, width, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        channels = width
        for stage, count in enumerate(blocks):
            out = width * 2 ** stage
            layers = [BasicBlock(channels, out, stride=1 if stage == 0 else 2)]
            layers += [BasicBlock(out, out) for _ in range(int(count) - 1)]
            self.add_module(f"layer{stage + 1}", nn.Sequential(*layers))
            channels = out
        self.num_stages = len(blocks)
        self.linear = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        for stage in range(self.num_stages):
            h = getattr(self, f"layer{stage + 1}")(h)
        return self.linear(torch.flatten(nn.functional.adaptive_avg_pool2d(h, 1), 1))


def resnet18(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    """ResNet-18 as in the Entropy-MCMC CIFAR experiments (11.2 million weights for 10 classes)."""
    return ResNet(blocks=(2, 2, 2, 2), width=64, in_channels=in_channels, num_classes=num_classes)
