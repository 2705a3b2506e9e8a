"""``kn.datasets``: small data sets shipped with (or read locally by) kaun_ir.

:func:`shakespeare` is a text corpus (about 1 MB of public-domain plays, shipped); the others
are image-classification data sets as NumPy arrays.

Both loaders return ``((x_train, y_train), (x_test, y_test))`` on the host:

* images: ``float32``, values in ``[0, 1]``, shape ``[N, 1, H, W]`` — NCHW with the channel
  axis included, ready for ``kn.fn.conv2d`` / convolution layers; with ``flatten=True`` the
  shape is ``[N, H * W]`` for dense models;
* labels: ``int32`` class indices, shape ``[N]``.

:func:`digits` ships inside the package (works offline). :func:`mnist` reads the standard IDX
files from a local directory; nothing is downloaded.
"""

from __future__ import annotations

import functools
import gzip
import os
from importlib import resources

import numpy as np

from kaun_ir.names import public_dir

__all__ = ["digits", "mnist", "read_idx", "shakespeare"]


Split = tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def _images(pixels: np.ndarray, scale: float, flatten: bool) -> np.ndarray:
    """``[N, H, W]`` integer pixels -> float32 in [0, 1], ``[N, 1, H, W]`` or ``[N, H*W]``."""
    x = pixels.astype(np.float32) / np.float32(scale)
    n = x.shape[0]
    return x.reshape(n, -1) if flatten else x.reshape(n, 1, *x.shape[1:])


# -- the 8x8 digits -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _digits_raw() -> tuple[np.ndarray, np.ndarray]:
    source = resources.files(__name__).joinpath("digits.npz")
    with source.open("rb") as handle, np.load(handle) as archive:
        images, labels = archive["images"], archive["labels"]
    images.setflags(write=False)  # cached and shared between calls
    labels.setflags(write=False)
    return images, labels


def _stratified_split(labels: np.ndarray, test_fraction: float, seed: int):
    """Indices ``(train, test)``: from every class, ``round(count * test_fraction)`` examples
    chosen at random (by ``seed``) go to the test set; both keep the original order."""
    rng = np.random.default_rng(seed)
    test = []
    for cls in np.unique(labels):
        members = np.flatnonzero(labels == cls)
        k = int(round(len(members) * test_fraction))
        test.append(rng.permutation(members)[:k])
    test_idx = np.sort(np.concatenate(test)) if test else np.zeros(0, np.int64)
    mask = np.ones(len(labels), bool)
    mask[test_idx] = False
    return np.flatnonzero(mask), test_idx


def digits(test_fraction: float = 0.2, seed: int = 0, flatten: bool = False) -> Split:
    """The 8x8 handwritten digits: 1,797 grey images of the digits 0-9 (about 180 per class).

    Source: UCI "Optical Recognition of Handwritten Digits" (E. Alpaydin, C. Kaynak; CC BY 4.0),
    the copy distributed with scikit-learn; see ``DIGITS_LICENSE.txt`` next to this module.
    Each pixel counts the "on" pixels of a 4x4 block (0..16); here it is divided by 16.

    The split is stratified and fixed by ``seed``: from each class ``round(count *
    test_fraction)`` images go to the test set (359 of 1,797 with the defaults); both sets keep
    the file's order (already mixed across classes).

    Returns ``((x_train, y_train), (x_test, y_test))``: ``x`` float32 ``[N, 1, 8, 8]`` in
    ``[0, 1]`` (``[N, 64]`` with ``flatten=True``), ``y`` int32 ``[N]``. Raises ``ValueError``
    unless ``0 <= test_fraction < 1``.
    """
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"datasets.digits: test_fraction must be in [0, 1), got {test_fraction}")
    images, labels = _digits_raw()
    train, test = _stratified_split(labels, test_fraction, seed)
    x = _images(images, 16.0, flatten)
    y = labels.astype(np.int32)
    return (x[train], y[train]), (x[test], y[test])


# -- MNIST / Fashion-MNIST from IDX files ---------------------------------------------------------

_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

_MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (the MNIST format; gzip-compressed when the name ends in ``.gz``).

    The header is two zero bytes, a type code (0x08 ubyte, 0x09 byte, 0x0B short, 0x0C int,
    0x0D float, 0x0E double), the number of dimensions, then each dimension as a big-endian
    uint32; the data follows in C order. Returns an array of that shape (native byte order).
    Raises ``ValueError`` on a malformed file.
    """
    path = os.fspath(path)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as handle:
        data = handle.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file (bad magic number {data[:4].hex()})")
    dtype, ndim = _IDX_DTYPES[data[2]], data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{path}: IDX header truncated")
    shape = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) - header != expected:
        raise ValueError(
            f"{path}: IDX data has {len(data) - header} bytes, the header {shape} needs {expected}"
        )
    arr = np.frombuffer(data, dtype, offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="))


def _find(directory: str, base: str) -> str | None:
    # the original site serves "train-images-idx3-ubyte.gz"; some copies use a dot before "idx"
    dotted = base.replace("-idx", ".idx")
    for name in (base, base + ".gz", dotted, dotted + ".gz"):
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate):
            return candidate
    return None


def _default_dir(fashion: bool) -> str:
    root = os.environ.get("KAUN_IR_DATA") or os.path.join(os.path.expanduser("~"), ".cache", "kaun_ir")
    return os.path.join(root, "fashion-mnist" if fashion else "mnist")


def mnist(path: str | os.PathLike | None = None, fashion: bool = False, flatten: bool = False) -> Split:
    """MNIST (or Fashion-MNIST with ``fashion=True``) from the four standard IDX files in the
    directory ``path``:

    ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
    ``t10k-labels-idx1-ubyte`` — each optionally gzipped (``.gz``) and also accepted with
    ``.idx`` in place of ``-idx``. Both data sets use the same names, so ``fashion`` only
    chooses the default directory when ``path`` is ``None``: ``$KAUN_IR_DATA/mnist`` (or
    ``fashion-mnist``), else ``~/.cache/kaun_ir/mnist``. Nothing is downloaded.

    Returns ``((x_train, y_train), (x_test, y_test))``: ``x`` float32 ``[N, 1, 28, 28]`` in
    ``[0, 1]`` (pixels / 255; ``[N, 784]`` with ``flatten=True``), ``y`` int32 ``[N]``
    (60,000 / 10,000 examples for the real data sets). Raises ``FileNotFoundError`` listing the
    expected names when files are missing, ``ValueError`` for malformed or inconsistent files.
    """
    directory = os.fspath(path) if path is not None else _default_dir(fashion)
    found = {key: _find(directory, base) for key, base in _MNIST_FILES.items()}
    missing = [_MNIST_FILES[key] for key, where in found.items() if where is None]
    if missing:
        what = "Fashion-MNIST" if fashion else "MNIST"
        raise FileNotFoundError(
            f"datasets.mnist: {what} files missing in {directory!r}: {', '.join(missing)} "
            f"(each may also end in .gz). Expected the four IDX files "
            f"{', '.join(_MNIST_FILES.values())}; download them and pass their directory."
        )
    splits = []
    for part in ("train", "test"):
        images = read_idx(found[f"{part}_images"])
        labels = read_idx(found[f"{part}_labels"])
        if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
            raise ValueError(
                f"datasets.mnist: {part} images {images.shape} and labels "
                f"{labels.shape} do not match (expected [N, H, W] and [N])"
            )
        splits.append((_images(images, 255.0, flatten), labels.astype(np.int32)))
    return splits[0], splits[1]


# -- text -----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def shakespeare() -> str:
    """About 1 MB (1,036,489 characters) of public-domain Shakespeare as one ASCII string: eight
    plays (Hamlet, Macbeth, Romeo and Juliet, King Lear, Othello, Julius Caesar, The Tempest, A
    Midsummer Night's Dream) joined by blank lines, shipped inside the package (works offline).

    The text comes unchanged from the ``shakespeare`` package 0.6 (Open Shakespeare, Open
    Knowledge Foundation), which sourced it from Project Gutenberg; see
    ``SHAKESPEARE_LICENSE.txt`` beside this module for the attribution.
    """
    source = resources.files(__name__).joinpath("shakespeare.txt.gz")
    with source.open("rb") as handle:
        return gzip.decompress(handle.read()).decode("ascii")


__dir__ = public_dir(__all__)
