"""``kn.datasets``: the bundled 8x8 digits (split, shapes, values against the raw archive) and
the MNIST IDX reader on small IDX files written here (plain and gzipped)."""

from __future__ import annotations

import gzip
import os
import struct
from importlib import resources

import numpy as np
import pytest

from kaun_ir import datasets


def raw_digits():
    with resources.files("kaun_ir.datasets").joinpath("digits.npz").open("rb") as handle:
        with np.load(handle) as archive:
            return archive["images"], archive["labels"]


def test_bundled_archive_and_license():
    images, labels = raw_digits()
    assert images.shape == (1797, 8, 8) and images.dtype == np.uint8
    assert labels.shape == (1797,) and labels.dtype == np.uint8
    assert images.max() == 16 and images.min() == 0
    assert sorted(np.unique(labels).tolist()) == list(range(10))
    assert np.bincount(labels).min() >= 170
    text = resources.files("kaun_ir.datasets").joinpath("DIGITS_LICENSE.txt").read_text()
    assert "CC BY 4.0" in text and "Alpaydin" in text and "scikit-learn" in text


def test_digits_shapes_dtypes_and_values():
    (xt, yt), (xs, ys) = datasets.digits()
    assert xt.shape == (1438, 1, 8, 8) and xs.shape == (359, 1, 8, 8)
    assert xt.dtype == xs.dtype == np.float32
    assert yt.dtype == ys.dtype == np.int32
    assert yt.shape == (1438,) and ys.shape == (359,)
    assert 0.0 <= xt.min() and xt.max() == 1.0
    np.testing.assert_array_equal(xt * 16, np.round(xt * 16))  # counts 0..16 scaled by 1/16


def test_digits_is_a_stratified_partition_of_the_archive():
    images, labels = raw_digits()
    (xt, yt), (xs, ys) = datasets.digits(test_fraction=0.25, seed=3)
    counts = np.bincount(labels)
    np.testing.assert_array_equal(np.bincount(ys), np.round(counts * 0.25).astype(int))
    np.testing.assert_array_equal(np.bincount(yt) + np.bincount(ys), counts)
    # every raw example appears exactly once, with its own label
    got = np.concatenate([xt, xs]).reshape(-1, 64) * 16
    got_rows = sorted(map(tuple, np.concatenate([got, np.concatenate([yt, ys])[:, None]], 1)))
    want_rows = sorted(
        map(
            tuple,
            np.concatenate(
                [images.reshape(-1, 64).astype(np.float32), labels[:, None].astype(np.float32)], 1
            ),
        )
    )
    assert got_rows == want_rows


def test_digits_split_is_fixed_by_seed():
    (a, ya), (b, yb) = datasets.digits(seed=0)
    (c, yc), (d, yd) = datasets.digits(seed=0)
    np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(yd, yb)
    (_, _), (e, _) = datasets.digits(seed=1)
    assert not np.array_equal(b, e)
    a[0] = -1  # results are fresh arrays: changing one does not change the next call
    assert datasets.digits()[0][0].min() >= 0


def test_digits_flatten_and_fraction():
    (xt, _), (xs, _) = datasets.digits(flatten=True)
    assert xt.shape == (1438, 64) and xs.shape == (359, 64)
    (xt, yt), (xs, ys) = datasets.digits(test_fraction=0.0)
    assert xt.shape[0] == 1797 and xs.shape == (0, 1, 8, 8) and ys.shape == (0,)
    for bad in (1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="test_fraction"):
            datasets.digits(test_fraction=bad)


# -- MNIST ----------------------------------------------------------------------------------------


def idx_bytes(arr: np.ndarray, code: int = 0x08) -> bytes:
    header = bytes([0, 0, code, arr.ndim]) + b"".join(struct.pack(">I", d) for d in arr.shape)
    dtype = {0x08: ">u1", 0x0C: ">i4", 0x0D: ">f4"}[code]
    return header + arr.astype(dtype).tobytes()


def write_mnist(directory, n_train=6, n_test=4, gz=False, dotted=False, seed=0):
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)).astype(np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)).astype(np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test).astype(np.uint8),
    }
    for name, arr in arrays.items():
        if dotted:
            name = name.replace("-idx", ".idx")
        path = os.path.join(directory, name + (".gz" if gz else ""))
        opener = gzip.open if gz else open
        with opener(path, "wb") as handle:
            handle.write(idx_bytes(arr))
    return arrays


@pytest.mark.parametrize("gz, dotted", [(False, False), (True, False), (True, True)])
def test_mnist_reads_idx_files(tmp_path, gz, dotted):
    arrays = write_mnist(str(tmp_path), gz=gz, dotted=dotted)
    (xt, yt), (xs, ys) = datasets.mnist(tmp_path)
    assert xt.shape == (6, 1, 28, 28) and xs.shape == (4, 1, 28, 28)
    assert xt.dtype == np.float32 and yt.dtype == np.int32
    np.testing.assert_allclose(xt[:, 0], arrays["train-images-idx3-ubyte"] / 255.0, rtol=1e-6)
    np.testing.assert_allclose(xs[:, 0], arrays["t10k-images-idx3-ubyte"] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(yt, arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(ys, arrays["t10k-labels-idx1-ubyte"])
    (ft, _), _ = datasets.mnist(str(tmp_path), fashion=True, flatten=True)
    assert ft.shape == (6, 784)


def test_mnist_missing_files_lists_expected_names(tmp_path):
    write_mnist(str(tmp_path))
    os.remove(tmp_path / "t10k-labels-idx1-ubyte")
    with pytest.raises(FileNotFoundError) as err:
        datasets.mnist(tmp_path)
    message = str(err.value)
    assert "missing" in message and "t10k-labels-idx1-ubyte" in message
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte"):
        assert name in message  # the full list of expected files
    with pytest.raises(FileNotFoundError, match="Fashion-MNIST files missing"):
        datasets.mnist(tmp_path / "nowhere", fashion=True)


def test_mnist_default_directory_from_environment(tmp_path, monkeypatch):
    os.makedirs(tmp_path / "fashion-mnist")
    write_mnist(str(tmp_path / "fashion-mnist"), n_train=2, n_test=1)
    monkeypatch.setenv("KAUN_IR_DATA", str(tmp_path))
    (xt, _), (xs, _) = datasets.mnist(fashion=True)
    assert xt.shape[0] == 2 and xs.shape[0] == 1


def test_mnist_inconsistent_or_malformed_files(tmp_path):
    arrays = write_mnist(str(tmp_path))
    with open(tmp_path / "train-labels-idx1-ubyte", "wb") as handle:
        handle.write(idx_bytes(arrays["train-labels-idx1-ubyte"][:5]))
    with pytest.raises(ValueError, match="do not match"):
        datasets.mnist(tmp_path)
    with open(tmp_path / "train-labels-idx1-ubyte", "wb") as handle:
        handle.write(b"\x08\x03junk")
    with pytest.raises(ValueError, match="not an IDX file"):
        datasets.mnist(tmp_path)
    with open(tmp_path / "train-labels-idx1-ubyte", "wb") as handle:
        handle.write(idx_bytes(arrays["train-labels-idx1-ubyte"])[:-1])
    with pytest.raises(ValueError, match="needs 6"):
        datasets.mnist(tmp_path)


def test_read_idx_other_types(tmp_path):
    ints = np.array([[1, -2, 70000], [3, 4, -5]], np.int32)
    (tmp_path / "i.idx").write_bytes(idx_bytes(ints, 0x0C))
    got = datasets.read_idx(tmp_path / "i.idx")
    assert got.dtype == np.int32 and got.dtype.isnative
    np.testing.assert_array_equal(got, ints)
    floats = np.array([0.5, -1.25], np.float32)
    with gzip.open(tmp_path / "f.idx.gz", "wb") as handle:
        handle.write(idx_bytes(floats, 0x0D))
    np.testing.assert_array_equal(datasets.read_idx(tmp_path / "f.idx.gz"), floats)
