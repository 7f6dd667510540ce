"""MNIST loading (official files, IDX/npz round trips, damaged files) and the sharp/flat mixtures."""

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from pyro_flat import datasets
from pyro_flat.datasets import MNISTFileError, load_mnist79, load_mnist_digits, read_idx, write_idx

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"
needs_shared = pytest.mark.skipif(not (SHARED / "t10k-images-idx3-ubyte.gz").exists(),
                                  reason="../shared/data/mnist is not beside the project")


@needs_shared
def test_official_test_files_have_1028_sevens_and_1009_nines():
    X, y = load_mnist79(SHARED, split="test", normalize=False)
    assert X.shape == (2037, 784) and X.dtype == torch.float32
    assert int((y == 0).sum()) == 1028 and int((y == 1).sum()) == 1009
    # Spot-check pixels against the raw bytes: image i starts at byte 16 + 784 i, label i at 8 + i.
    raw_images = gzip.open(SHARED / "t10k-images-idx3-ubyte.gz").read()
    raw_labels = gzip.open(SHARED / "t10k-labels-idx1-ubyte.gz").read()
    positions = [i for i in range(10_000) if raw_labels[8 + i] in (7, 9)]
    assert len(positions) == 2037
    for row in (0, 1, 500, 2036):
        i = positions[row]
        expected = torch.tensor(list(raw_images[16 + 784 * i: 16 + 784 * (i + 1)]), dtype=torch.float32)
        assert torch.equal(X[row], expected)
        assert y[row] == (raw_labels[8 + i] == 9)
    Xn, _ = load_mnist79(SHARED, split="test")
    assert torch.allclose(Xn, X / 255) and float(Xn.max()) == 1.0


@needs_shared
def test_official_files_without_the_training_split_name_the_missing_file():
    with pytest.raises(MNISTFileError, match="train-images-idx3-ubyte.gz .*not found in"):
        load_mnist79(SHARED, split="train")


def _small_mnist(n=40, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = np.arange(n, dtype=np.uint8) % 10
    return images, labels


@pytest.mark.parametrize("layout", ["gz", "raw", "torchvision", "npz", "npz-file"])
def test_small_files_round_trip_exactly(tmp_path, layout):
    images, labels = _small_mnist()
    test_images, test_labels = _small_mnist(20, seed=1)
    if layout.startswith("npz"):
        np.savez(tmp_path / "mnist.npz", x_train=images, y_train=labels, x_test=test_images, y_test=test_labels)
        root = tmp_path / "mnist.npz" if layout == "npz-file" else tmp_path
    else:
        root = tmp_path
        folder = tmp_path / "MNIST" / "raw" if layout == "torchvision" else tmp_path
        folder.mkdir(parents=True, exist_ok=True)
        ext = "" if layout == "raw" else ".gz"
        for (name_i, name_l, _), (im, lb) in zip(datasets.MNIST_FILES.values(),
                                                 [(images, labels), (test_images, test_labels)]):
            write_idx(folder / (name_i + ext), im)
            write_idx(folder / (name_l + ext), lb)
    for split, (im, lb) in (("train", (images, labels)), ("test", (test_images, test_labels))):
        X, y = load_mnist79(root, split=split, normalize=False, dtype=torch.float64, verify=False)
        keep = np.isin(lb, [7, 9])
        assert np.array_equal(X.numpy(), im[keep].reshape(-1, 784).astype(np.float64))
        assert np.array_equal(y.numpy(), (lb[keep] == 9).astype(np.float64))
        digits_images, digits_labels = load_mnist_digits(root, split=split, verify=False)
        assert np.array_equal(digits_images, im) and np.array_equal(digits_labels, lb)


def test_idx_round_trip_other_dtypes(tmp_path):
    a = np.arange(24, dtype=">i4").reshape(2, 3, 4) - 5
    b = np.linspace(-1, 1, 6).astype(np.float64).reshape(3, 2)
    assert np.array_equal(read_idx(write_idx(tmp_path / "a.idx", a)), a)
    assert np.array_equal(read_idx(write_idx(tmp_path / "b.idx.gz", b)), b)


def _write_split(folder, images, labels, ext=".gz", split="test"):
    name_i, name_l, _ = datasets.MNIST_FILES[split]
    write_idx(folder / (name_i + ext), images)
    write_idx(folder / (name_l + ext), labels)
    return folder / (name_i + ext), folder / (name_l + ext)


def test_truncated_files_are_named(tmp_path):
    images, labels = _small_mnist()
    img_path, _ = _write_split(tmp_path, images, labels, ext="")
    img_path.write_bytes(img_path.read_bytes()[:-100])
    with pytest.raises(MNISTFileError, match=r"t10k-images-idx3-ubyte: the header announces shape \(40, 28, 28\).*truncated"):
        load_mnist79(tmp_path, split="test")
    gz_dir = tmp_path / "gz"
    gz_dir.mkdir()
    img_gz, _ = _write_split(gz_dir, images, labels)
    img_gz.write_bytes(img_gz.read_bytes()[: len(img_gz.read_bytes()) // 2])
    with pytest.raises(MNISTFileError, match="t10k-images-idx3-ubyte.gz: cannot be read.*truncated or corrupt"):
        load_mnist79(gz_dir, split="test")


def test_mislabelled_and_swapped_files(tmp_path):
    images, labels = _small_mnist()
    bad = labels.copy()
    bad[3] = 12
    _write_split(tmp_path, images, bad)
    with pytest.raises(MNISTFileError, match="labels outside 0-9"):
        load_mnist79(tmp_path, split="test", verify=False)
    _write_split(tmp_path, images, labels[:-1])
    with pytest.raises(MNISTFileError, match="40 images but 39 labels"):
        load_mnist79(tmp_path, split="test", verify=False)
    _write_split(tmp_path, labels, images)  # the two files swapped
    with pytest.raises(MNISTFileError, match=r"expected images of shape \(n, 28, 28\).*is it a labels file"):
        load_mnist79(tmp_path, split="test")
    _write_split(tmp_path, images, labels)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"\x01\x02junk"))
    with pytest.raises(MNISTFileError, match="not an IDX file"):
        load_mnist79(tmp_path, split="test")


@needs_shared
@pytest.mark.parametrize("ext", [".gz", ""])
def test_a_modified_official_file_fails_its_checksum_gzip_or_raw(tmp_path, ext):
    labels = read_idx(SHARED / "t10k-labels-idx1-ubyte.gz").copy()
    labels[0] = (labels[0] + 1) % 10  # one flipped label, official name and size
    write_idx(tmp_path / ("t10k-images-idx3-ubyte" + ext), read_idx(SHARED / "t10k-images-idx3-ubyte.gz"))
    write_idx(tmp_path / ("t10k-labels-idx1-ubyte" + ext), labels)
    with pytest.raises(MNISTFileError, match=f"t10k-labels-idx1-ubyte{ext}: SHA-256 .* differs from the official"):
        load_mnist79(tmp_path, split="test")
    write_idx(tmp_path / ("t10k-labels-idx1-ubyte" + ext), read_idx(SHARED / "t10k-labels-idx1-ubyte.gz"))
    X, _ = load_mnist79(tmp_path, split="test")  # the official content, re-encoded: accepted
    assert X.shape == (2037, 784)


@needs_shared
@pytest.mark.parametrize("ext", [".gz", ""])
def test_test_files_renamed_train_are_refused(tmp_path, ext):
    for kind in ("images-idx3", "labels-idx1"):
        data = read_idx(SHARED / f"t10k-{kind}-ubyte.gz")
        write_idx(tmp_path / f"train-{kind}-ubyte{ext}", data)
    with pytest.raises(MNISTFileError, match="holds 10,000 items, the official train-images-idx3-ubyte holds "
                                             "60,000. That is the size of the test split: is it the test file renamed"):
        load_mnist79(tmp_path, split="train")
    X, _ = load_mnist79(tmp_path, split="train", verify=False)  # said explicitly: read as given
    assert X.shape == (2037, 784)


def test_missing_directory_and_bad_npz(tmp_path):
    with pytest.raises(MNISTFileError, match="does not exist"):
        load_mnist79(tmp_path / "nowhere")
    with pytest.raises(MNISTFileError, match=r"t10k-images-idx3-ubyte.gz \(or t10k-images-idx3-ubyte\) not found"):
        load_mnist79(tmp_path, split="test")
    np.savez(tmp_path / "other.npz", x_train=np.zeros((2, 28, 28)))
    with pytest.raises(MNISTFileError, match=r"no array\(s\) \['x_test', 'y_test'\]"):
        load_mnist79(tmp_path / "other.npz", split="test")
    with pytest.raises(ValueError, match="split must be 'train' or 'test'"):
        load_mnist79(split="validation")


def test_embedded_default_is_balanced_and_disjoint():
    X_train, y_train = load_mnist79(split="train")
    X_test, y_test = load_mnist79(split="test")
    assert X_train.shape == (800, 784) and X_test.shape == (200, 784)
    assert float(y_train.mean()) == 0.5 and float(y_test.mean()) == 0.5
    assert 0.0 <= float(X_train.min()) and float(X_train.max()) <= 1.0
    train_rows = {tuple(r) for r in (X_train * 255).round().to(torch.uint8).tolist()}
    assert not any(tuple(r) in train_rows for r in (X_test * 255).round().to(torch.uint8).tolist())


@needs_shared
def test_download_verifies_checksums(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for f in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(SHARED / f, mirror / f)
    root = datasets.download_mnist(tmp_path / "data", splits=["test"], mirrors=[mirror.as_uri() + "/"])
    X, y = load_mnist79(root, split="test")
    assert X.shape == (2037, 784)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "t10k-images-idx3-ubyte.gz").write_bytes(b"wrong")
    with pytest.raises(MNISTFileError, match="could not download t10k-images.*checksum mismatch"):
        datasets.download_mnist(tmp_path / "data2", splits=["test"], mirrors=[bad.as_uri() + "/"])
    assert not list((tmp_path / "data2").glob("*"))  # nothing half-written is left behind
