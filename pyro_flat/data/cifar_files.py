"""CIFAR-10, CIFAR-100, SVHN and CIFAR-10-C files on disk, read as the image study needs them.

The official files, in the layouts their archives unpack to (nothing is downloaded: put them in one
folder, ``--data-dir``):

- CIFAR-10, python version (``cifar-10-python.tar.gz``): ``cifar-10-batches-py/data_batch_1`` ...
  ``data_batch_5`` and ``test_batch``, each a pickled dict of ``b"data"`` (10,000 x 3,072 bytes, each
  row the red, green and blue 32x32 planes) and ``b"labels"``;
- CIFAR-100, python version (``cifar-100-python.tar.gz``): ``cifar-100-python/train`` and ``test``,
  with ``b"fine_labels"`` (100 classes) and ``b"coarse_labels"``;
- SVHN's test set, format 2 (``test_32x32.mat``): ``X`` of shape (32, 32, 3, N), ``y`` of shape
  (N, 1) with the digit 0 labelled 10 (the out-of-distribution set of the CIFAR experiments);
- CIFAR-10-C (``CIFAR-10-C.tar``): ``CIFAR-10-C/<corruption>.npy``, (50,000, 32, 32, 3) bytes (the
  10,000 test images at severity 1, then 2, ... 5) and ``labels.npy``.

Every reader returns ``(images, labels)``: ``uint8`` images of shape (N, 3, 32, 32) and ``int64``
labels, checked as read; a missing, truncated or foreign file is a :class:`ImageFileError` that names
it and says where to get it. Pickles are read with a restricted unpickler that builds only plain
containers, numbers, strings, bytes and numpy arrays.

>>> import tempfile
>>> root = Path(tempfile.mkdtemp())
>>> write_cifar(root, "cifar10", "test", np.zeros((4, 3, 32, 32), np.uint8), np.arange(4))
>>> images, labels = read_cifar(root, "cifar10", "test")
>>> images.shape, labels.tolist()
((4, 3, 32, 32), [0, 1, 2, 3])
"""

from __future__ import annotations

import io
import os
import pickle
import reprlib
from pathlib import Path
from typing import Dict, Tuple, Union

import numpy as np

PathLike = Union[str, "os.PathLike[str]"]

#: dataset -> (folder, training files, test files, label key, classes, archive to fetch)
CIFAR_LAYOUT = {
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], b"labels", 10,
                "cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html"),
    "cifar100": ("cifar-100-python", ["train"], ["test"], b"fine_labels", 100,
                 "cifar-100-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html"),
}
#: the corruptions of CIFAR-10-C (Hendrycks & Dietterich, 2019), each a file ``<name>.npy``
CIFAR10C_CORRUPTIONS = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur",
                        "motion_blur", "zoom_blur", "snow", "frost", "fog", "brightness", "contrast",
                        "elastic_transform", "pixelate", "jpeg_compression")
SVHN_SOURCE = "test_32x32.mat from http://ufldl.stanford.edu/housenumbers/"
CIFAR10C_SOURCE = "CIFAR-10-C.tar from https://zenodo.org/record/2535967"
SIDE = 32


class ImageFileError(ValueError):
    """An image data file is missing, damaged or not of the expected layout."""


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles only what the CIFAR batches hold: containers, numbers, strings, bytes and numpy arrays."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
               ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a CIFAR batch")


def _source(dataset: str) -> str:
    return CIFAR_LAYOUT[dataset][5]


def _check_dataset(dataset: str) -> None:
    if dataset not in CIFAR_LAYOUT:
        raise ValueError(f"dataset must be one of {sorted(CIFAR_LAYOUT)}, got {dataset!r}.")


def _check_split(split: str) -> None:
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}.")


def _read_batch(path: Path, label_key: bytes, dataset: str) -> Tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        raise ImageFileError(f"{path}: missing; get {_source(dataset)} and unpack it into the data folder "
                             f"(it makes {path.parent.name}/).")
    try:
        with open(path, "rb") as file:
            batch = _PlainUnpickler(file, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError) as err:
        raise ImageFileError(f"{path}: not a readable CIFAR batch ({type(err).__name__}: {err}); the file is "
                             f"truncated or damaged: unpack {_source(dataset)} again.") from None
    if not isinstance(batch, dict) or b"data" not in batch or label_key not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise ImageFileError(f"{path}: a CIFAR batch holds b'data' and {label_key!r}, this one {keys}; is it the "
                             f"python version of {dataset}?")
    data = np.asarray(batch[b"data"])
    labels = _labels(path, batch[label_key], label_key, dataset)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * SIDE * SIDE or len(labels) != len(data):
        raise ImageFileError(f"{path}: b'data' must be (N, 3072) bytes with one label each, got {data.dtype} "
                             f"{data.shape} and {len(labels)} labels.")
    return data.reshape(-1, 3, SIDE, SIDE), labels


def _labels(path: Path, raw, label_key: bytes, dataset: str) -> np.ndarray:
    """``raw`` as ``int64`` labels, or an :class:`ImageFileError` naming the file unless it is a list of integers."""
    labels = np.asarray(raw) if isinstance(raw, (list, tuple, np.ndarray)) else None
    if labels is None or labels.ndim != 1 or (labels.size and labels.dtype.kind not in "iu"):
        raise ImageFileError(f"{path}: {label_key!r} must be a list of integer class labels, one per image, got "
                             f"{type(raw).__name__} {reprlib.repr(raw)}; is it the python version of {dataset}? "
                             f"Unpack {_source(dataset)} again.")
    return labels.astype(np.int64)


def read_cifar(root: PathLike, dataset: str = "cifar10", split: str = "train") -> Tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 or CIFAR-100 (``dataset``), ``split`` ``"train"`` (50,000) or ``"test"`` (10,000) from the
    official python-version files under ``root``: ``uint8`` images (N, 3, 32, 32) and ``int64`` labels
    (CIFAR-100: the 100 fine labels)."""
    _check_dataset(dataset)
    _check_split(split)
    folder, train, test, label_key, classes, _ = CIFAR_LAYOUT[dataset]
    root = Path(root).expanduser()
    if not (root / folder).is_dir():
        raise ImageFileError(f"{root / folder}: missing; get {_source(dataset)} and unpack it into {root}.")
    parts = [_read_batch(root / folder / name, label_key, dataset) for name in (train if split == "train" else test)]
    images, labels = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise ImageFileError(f"{root / folder}: labels outside 0..{classes - 1} (found {labels.min()}..{labels.max()}); "
                             f"these are not {dataset}'s files.")
    return images, labels


def read_svhn_test(root: PathLike) -> Tuple[np.ndarray, np.ndarray]:
    """SVHN's test images (format 2, ``test_32x32.mat``, 26,032 images) under ``root``: ``uint8`` (N, 3, 32, 32)
    and the digits 0-9 (the file's label 10 is the digit 0)."""
    from scipy.io import loadmat

    path = Path(root).expanduser() / "test_32x32.mat"
    if not path.is_file():
        raise ImageFileError(f"{path}: missing; get {SVHN_SOURCE} and put it in the data folder.")
    try:
        content = loadmat(path)
    except Exception as err:  # scipy raises several types for a damaged file
        raise ImageFileError(f"{path}: not a readable MATLAB file ({type(err).__name__}: {err}); download "
                             f"{SVHN_SOURCE} again.") from None
    X, y = content.get("X"), content.get("y")
    if X is None or y is None or X.dtype != np.uint8 or X.ndim != 4 or X.shape[:3] != (SIDE, SIDE, 3) \
            or y.reshape(-1).shape[0] != X.shape[3]:
        raise ImageFileError(f"{path}: SVHN's format 2 holds X (32, 32, 3, N) bytes and y (N, 1); got "
                             f"X {None if X is None else (X.dtype, X.shape)} and y {None if y is None else y.shape}.")
    labels = y.reshape(-1).astype(np.int64) % 10
    return np.ascontiguousarray(X.transpose(3, 2, 0, 1)), labels


def read_cifar10c(root: PathLike, corruption: str, severity: int) -> Tuple[np.ndarray, np.ndarray]:
    """The 10,000 CIFAR-10 test images under ``corruption`` at ``severity`` (1-5) from CIFAR-10-C's files
    under ``root`` (``CIFAR-10-C/<corruption>.npy`` and ``labels.npy``), memory-mapped and sliced."""
    if corruption not in CIFAR10C_CORRUPTIONS:
        raise ValueError(f"corruption must be one of CIFAR-10-C's {CIFAR10C_CORRUPTIONS}, got {corruption!r}.")
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or not 1 <= severity <= 5:
        raise ValueError(f"severity must be an integer from 1 to 5, got {severity!r}.")
    folder = Path(root).expanduser() / "CIFAR-10-C"
    arrays: Dict[str, np.ndarray] = {}
    for name in (corruption, "labels"):
        path = folder / f"{name}.npy"
        if not path.is_file():
            raise ImageFileError(f"{path}: missing; get {CIFAR10C_SOURCE} and unpack it into the data folder.")
        try:
            arrays[name] = np.load(path, mmap_mode="r")
        except (ValueError, OSError) as err:
            raise ImageFileError(f"{path}: not a readable .npy file ({err}); unpack {CIFAR10C_SOURCE} again.") from None
    images, labels = arrays[corruption], arrays["labels"]
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != (SIDE, SIDE, 3) \
            or images.shape[0] % 5 or len(labels) != images.shape[0]:
        raise ImageFileError(f"{folder}: {corruption}.npy must be (5 x N, 32, 32, 3) bytes with labels.npy of the "
                             f"same length, got {images.dtype} {images.shape} and {len(labels)} labels.")
    n = images.shape[0] // 5
    rows = slice((severity - 1) * n, severity * n)
    return (np.ascontiguousarray(np.asarray(images[rows]).transpose(0, 3, 1, 2)),
            np.asarray(labels[rows], dtype=np.int64))


def write_cifar(root: PathLike, dataset: str, split: str, images: np.ndarray, labels: np.ndarray,
                parts: int = 1) -> None:
    """Write ``images`` (N, 3, 32, 32) ``uint8`` and ``labels`` in the official python-version layout (the
    tests' generated files; ``parts`` training batches for CIFAR-10, whose official train split has 5)."""
    _check_dataset(dataset)
    _check_split(split)
    folder, train, test, label_key, _, _ = CIFAR_LAYOUT[dataset]
    names = (train[:parts] if dataset == "cifar10" else train) if split == "train" else test
    target = Path(root) / folder
    target.mkdir(parents=True, exist_ok=True)
    images = np.asarray(images, np.uint8).reshape(len(images), -1)
    for name, rows in zip(names, np.array_split(np.arange(len(images)), len(names))):
        batch = {b"data": images[rows], label_key: [int(v) for v in np.asarray(labels)[rows]]}
        buffer = io.BytesIO()
        pickle.dump(batch, buffer, protocol=2)
        (target / name).write_bytes(buffer.getvalue())


__all__ = ["ImageFileError", "CIFAR_LAYOUT", "CIFAR10C_CORRUPTIONS", "read_cifar", "read_svhn_test", "read_cifar10c",
           "write_cifar"]
