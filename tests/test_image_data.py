"""The image study's data: CIFAR-10/100, SVHN and CIFAR-10-C readers on generated files of the official
layouts (no CIFAR data can be downloaded here), damaged and missing files named; the generated
corruptions against what each one must do to an image."""

import math
import pickle

import numpy as np
import pytest
import torch

from pyro_flat.data.cifar_files import ImageFileError, read_cifar, read_cifar10c, read_svhn_test, write_cifar
from pyro_flat.data.corruptions import KINDS, SEVERITIES, corrupt, corrupted_test_sets


def _images(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)


@pytest.mark.parametrize("dataset, classes", [("cifar10", 10), ("cifar100", 100)])
def test_cifar_files_in_the_official_layout_read_back_pixel_for_pixel(tmp_path, dataset, classes):
    train, test = _images(10, 1), _images(4, 2)
    train_labels, test_labels = np.arange(10) % classes, np.array([classes - 1, 0, 3, 2])
    write_cifar(tmp_path, dataset, "train", train, train_labels, parts=5)
    write_cifar(tmp_path, dataset, "test", test, test_labels)
    for split, images, labels in (("train", train, train_labels), ("test", test, test_labels)):
        got, got_labels = read_cifar(tmp_path, dataset, split)
        np.testing.assert_array_equal(got, images)
        np.testing.assert_array_equal(got_labels, labels)
    # the official row layout: 1024 red bytes, then green, then blue, each row-major over the 32x32 image
    folder = tmp_path / ("cifar-10-batches-py/test_batch" if dataset == "cifar10" else "cifar-100-python/test")
    row = pickle.loads(folder.read_bytes(), encoding="bytes")[b"data"][1]
    assert row[0] == test[1, 0, 0, 0] and row[1024 + 33] == test[1, 1, 1, 1] and row[2048 + 31] == test[1, 2, 0, 31]


def test_missing_and_damaged_cifar_files_are_named_with_where_to_get_them(tmp_path):
    with pytest.raises(ImageFileError, match=r"cifar-10-batches-py: missing; get cifar-10-python.tar.gz"):
        read_cifar(tmp_path, "cifar10", "test")
    write_cifar(tmp_path, "cifar10", "train", _images(5), np.arange(5), parts=2)
    with pytest.raises(ImageFileError, match=r"data_batch_3: missing"):
        read_cifar(tmp_path, "cifar10", "train")
    test = tmp_path / "cifar-10-batches-py" / "test_batch"
    write_cifar(tmp_path, "cifar10", "test", _images(3), np.arange(3))
    test.write_bytes(test.read_bytes()[:200])
    with pytest.raises(ImageFileError, match=r"test_batch: not a readable CIFAR batch.*truncated or damaged"):
        read_cifar(tmp_path, "cifar10", "test")
    test.write_bytes(pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}))
    with pytest.raises(ImageFileError, match=r"\(N, 3072\) bytes"):
        read_cifar(tmp_path, "cifar10", "test")
    test.write_bytes(pickle.dumps({b"data": _images(2).reshape(2, -1), b"labels": [0, 10]}))
    with pytest.raises(ImageFileError, match=r"labels outside 0..9"):
        read_cifar(tmp_path, "cifar10", "test")
    test.write_bytes(pickle.dumps(__import__("collections").OrderedDict(a=1)))  # a class that is not data
    with pytest.raises(ImageFileError, match="not a readable CIFAR batch"):
        read_cifar(tmp_path, "cifar10", "test")
    with pytest.raises(ValueError, match="dataset must be one of"):
        read_cifar(tmp_path, "cifar1000", "test")
    with pytest.raises(ValueError, match="split must be"):
        read_cifar(tmp_path, "cifar10", "valid")


def test_svhn_test_set_reads_as_channels_first_digits_with_ten_as_zero(tmp_path):
    from scipy.io import savemat

    images = _images(3)
    savemat(tmp_path / "test_32x32.mat", {"X": images.transpose(2, 3, 1, 0), "y": np.array([[10], [1], [9]])})
    got, labels = read_svhn_test(tmp_path)
    np.testing.assert_array_equal(got, images)
    assert labels.tolist() == [0, 1, 9]
    (tmp_path / "test_32x32.mat").write_bytes(b"not a mat file")
    with pytest.raises(ImageFileError, match="test_32x32.mat: not a readable MATLAB file"):
        read_svhn_test(tmp_path)
    with pytest.raises(ImageFileError, match=r"test_32x32.mat: missing; get test_32x32.mat"):
        read_svhn_test(tmp_path / "elsewhere")


def test_cifar10c_gives_each_severitys_block_of_the_test_images(tmp_path):
    folder = tmp_path / "CIFAR-10-C"
    folder.mkdir()
    blocks = np.stack([np.full((2, 32, 32, 3), s, np.uint8) for s in range(1, 6)]).reshape(10, 32, 32, 3)
    np.save(folder / "fog.npy", blocks)
    np.save(folder / "labels.npy", np.tile([4, 7], 5))
    images, labels = read_cifar10c(tmp_path, "fog", 3)
    assert images.shape == (2, 3, 32, 32) and (images == 3).all() and labels.tolist() == [4, 7]
    with pytest.raises(ImageFileError, match="contrast.npy: missing"):
        read_cifar10c(tmp_path, "contrast", 1)
    np.save(folder / "fog.npy", blocks[:7])
    with pytest.raises(ImageFileError, match=r"\(5 x N, 32, 32, 3\)"):
        read_cifar10c(tmp_path, "fog", 1)
    for bad, named in ((dict(corruption="rain", severity=1), "corruption"), (dict(corruption="fog", severity=6), "severity")):
        with pytest.raises(ValueError, match=named):
            read_cifar10c(tmp_path, **bad)


def _dot(side=28, row=14, col=14):
    image = torch.zeros(1, 1, side, side, dtype=torch.float64)
    image[0, 0, row, col] = 1.0
    return image


def test_each_corruption_does_what_its_table_says():
    g = torch.Generator().manual_seed(0)
    images = torch.rand(64, 1, 28, 28, generator=g, dtype=torch.float64)
    # contrast: the image's mean stays, its deviations shrink by c
    for severity, c in enumerate(SEVERITIES["contrast"], 1):
        out = corrupt(images, "contrast", severity)
        torch.testing.assert_close(out.mean((1, 2, 3)), images.mean((1, 2, 3)))
        torch.testing.assert_close(out.std((1, 2, 3)), c * images.std((1, 2, 3)))
    # noise on a mid-grey image far from the clip: the added noise has the table's sd (Monte Carlo: 784 x 64)
    grey = torch.full((64, 1, 28, 28), 0.5, dtype=torch.float64)
    added = corrupt(grey, "gaussian_noise", 1) - grey
    assert abs(float(added.std()) - 0.1) < 4 * 0.1 / math.sqrt(2 * added.numel())
    # blur: a dot spreads into the table's Gaussian (its variance along a row is sigma^2), mass kept
    for severity, sigma in enumerate(SEVERITIES["blur"], 1):
        out = corrupt(_dot(), "blur", severity)[0, 0]
        assert float(out.sum()) == pytest.approx(1.0, abs=1e-12)
        offsets = torch.arange(28, dtype=torch.float64) - 14
        along = out.sum(0)
        variance = float((along * offsets ** 2).sum())
        if sigma > 0.6:
            assert variance == pytest.approx(sigma ** 2, rel=0.02)
        else:  # a Gaussian of sd 0.5 sampled on whole pixels has a variance below sigma^2 (0.215)
            assert 0.15 < variance < sigma ** 2
    # shift: a dot moves by the table's distance (whole pixels, rounded per axis), the image is otherwise kept
    for severity, k in enumerate(SEVERITIES["shift"], 1):
        out = corrupt(_dot(), "shift", severity, seed=severity)[0, 0]
        (row, col), = torch.nonzero(out).tolist()
        assert float(out.sum()) == 1.0 and abs(math.hypot(row - 14, col - 14) - k) <= math.sqrt(2) / 2 + 1e-9
    # rotation: a dot turns about the centre (13.5, 13.5) by the table's angle, counter-clockwise on screen
    ys, xs = torch.meshgrid(torch.arange(28.0, dtype=torch.float64), torch.arange(28.0, dtype=torch.float64),
                            indexing="ij")

    def angle(picture):
        y, x = float((picture * ys).sum() / picture.sum()) - 13.5, float((picture * xs).sum() / picture.sum()) - 13.5
        return math.degrees(math.atan2(-y, x))

    start = angle(_dot(row=14, col=24)[0, 0])
    for severity, degrees in enumerate(SEVERITIES["rotation"], 1):
        assert angle(corrupt(_dot(row=14, col=24), "rotation", severity)[0, 0]) - start == pytest.approx(degrees, abs=1.0)


def test_corruptions_grow_with_severity_and_are_the_same_for_a_seed():
    g = torch.Generator().manual_seed(1)  # smooth pictures (4x4 random blocks, interpolated): a rotation of
    # pixel noise would be as far from it at 15 degrees as at 75
    images = torch.nn.functional.interpolate(torch.rand(16, 3, 4, 4, generator=g), size=(16, 16), mode="bilinear")
    sets = corrupted_test_sets(images, seed=3)
    assert sorted(sets) == sorted((k, s) for k in KINDS for s in range(1, 6))
    for kind in KINDS:
        distances = [float((sets[(kind, s)] - images).norm()) for s in range(1, 6)]
        if kind != "rotation":  # a turn of 75 degrees need not be further from a picture than one of 60 (its angle
            assert all(a < b for a, b in zip(distances, distances[1:])), (kind, distances)  # is tested above)
        assert torch.equal(sets[(kind, 2)], corrupt(images, kind, 2, seed=3))
    before = torch.get_rng_state()
    corrupt(images, "gaussian_noise", 3)
    assert torch.equal(before, torch.get_rng_state())  # the global stream is left alone


@pytest.mark.parametrize("args, match", [
    ((torch.rand(2, 28, 28), "blur", 1), r"\(N, C, H, W\)"), ((torch.zeros(2, 1, 8, 8, dtype=torch.uint8), "blur", 1),
                                                             "floating-point"),
    ((torch.rand(2, 1, 8, 8), "fog", 1), "kind must be one of"), ((torch.rand(2, 1, 8, 8), "blur", 6), "severity"),
    ((torch.rand(2, 1, 8, 8), "blur", 2.0), "severity"),
])
def test_bad_corruption_arguments_are_named(args, match):
    with pytest.raises(ValueError, match=match):
        corrupt(*args)
