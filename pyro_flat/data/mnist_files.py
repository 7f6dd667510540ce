"""MNIST's files on disk: read, verify, write and download them (the datasets built from them are
in :mod:`pyro_flat.datasets`).

Reads the files users actually keep -- the IDX files (gzip or raw, also in the ``MNIST/raw/``
layout torchvision writes) or Keras' ``mnist.npz`` -- and verifies them as they are read: magic
numbers, shapes, sizes, the pixel scale and, for the official files, their item counts and content
hashes. :func:`download_mnist` fetches the official files and checks their MD5 sums.

>>> import tempfile
>>> path = write_idx(Path(tempfile.mkdtemp()) / "labels-idx1-ubyte.gz", np.array([7, 9, 9], np.uint8))
>>> read_idx(path).tolist()
[7, 9, 9]
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import shutil
import tempfile
import urllib.request
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import Iterable, Optional, Sequence, Tuple, Union

import numpy as np

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

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_IDX_CODES = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09, np.dtype(">i2"): 0x0B,
              np.dtype(">i4"): 0x0C, np.dtype(">f4"): 0x0D, np.dtype(">f8"): 0x0E}


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


def check_root(root: object) -> None:
    """A ``TypeError`` unless ``root`` is a path (``str`` or ``os.PathLike``) or ``None``."""
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"root must be a path (a str or pathlib.Path) or None, got {type(root).__name__} "
                        f"root={root!r}; pass the directory with the MNIST files, or None for the embedded subset.")


def read_mnist_split(root: Path, split: str, verify: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    """Images ``(n, 28, 28)`` on MNIST's 0..255 scale and labels of one split, read from ``root``.

    ``root`` is the path of an ``.npz`` file or a directory with the IDX files (gzip or raw, also
    ``MNIST/raw/`` or ``raw/``) or ``mnist.npz``; the IDX files take precedence. With ``verify``,
    IDX files under the official names must be the official files (item count and content hash).
    """
    if not root.exists():
        raise MNISTFileError(f"MNIST data directory {root} does not exist; pass the directory that "
                             "holds the IDX files or mnist.npz, or none (root=None, no --data-dir) for the embedded subset")
    if root.is_file():
        return _read_npz_split(root, split)
    if _locate(root, MNIST_FILES[split][0]) is None and (root / "mnist.npz").is_file():
        return _read_npz_split(root / "mnist.npz", split)  # IDX files take precedence
    return _read_idx_split(root, split, verify)


def download_mnist(root: PathLike, *, splits: Iterable[str] = ("train", "test"),
                   mirrors: Sequence[str] = MNIST_MIRRORS) -> Path:
    """Download the official MNIST IDX files into ``root``, verifying each file's MD5.

    Needs the internet (``mirrors`` may also be ``file://`` URLs). Files already present with the
    right checksum are kept.
    """
    if root is None:
        raise TypeError("root must be the directory to download MNIST into, got root=None.")
    check_root(root)
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
