"""Keys of ``kn.random``: a key from a seed, and new independent keys by splitting or folding in
data (the same values as ``jax.random.PRNGKey`` / ``split`` / ``fold_in``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.surface.creation import zeros
from kaun_ir.surface.function import op_function
from kaun_ir.surface.promotion import astype
from kaun_ir.surface.random.checks import check_key, check_shape
from kaun_ir.surface.random.threefry import MASK32, hash_counts, key_words, threefry2x32
from kaun_ir.surface.shapes import stack
from kaun_ir.surface.tensor import type_of


def key(seed) -> Any:
    """A key (``uint32[2]``) from an integer seed: ``[seed >> 32, seed & 0xFFFFFFFF]``.

    A Python int is read as a 64-bit two's-complement integer (so ``key(s)`` equals
    ``jax.random.PRNGKey(s)`` for 0 <= s < 2**31, and for every s under ``jax_enable_x64``);
    a NumPy integer keeps its own width (a 32-bit seed has a zero high word). A Python or NumPy
    seed gives a NumPy array; a traced or device integer scalar gives a traced / device key.
    """
    if isinstance(seed, (bool, np.bool_)):
        raise TypeError("kn.random.key: the seed must be an integer, got a bool")
    if isinstance(seed, int):
        if not -(2**63) <= seed < 2**64:
            raise ValueError(f"kn.random.key: seed {seed} does not fit in 64 bits")
        return np.array([(seed >> 32) & MASK32, seed & MASK32], dtype=np.uint32)
    if isinstance(seed, (np.ndarray, np.generic)):
        arr = np.asarray(seed)
        if arr.shape != () or arr.dtype.kind not in "iu":
            raise TypeError(
                f"kn.random.key: the seed must be an integer scalar, got {arr.dtype}{list(arr.shape)}"
            )
        value = int(arr)
        high = (value >> 32) & MASK32 if arr.dtype.itemsize == 8 else 0
        return np.array([high, value & MASK32], dtype=np.uint32)
    if not (hasattr(seed, "dtype") and hasattr(seed, "shape")):
        raise TypeError(f"kn.random.key: the seed must be an integer, got {type(seed).__name__} {seed!r}")
    return _key_from_scalar(seed)


@op_function
def _key_from_scalar(seed):
    t = type_of(seed)
    if t.shape != () or not dtypes.is_integer(t.dtype):
        raise TypeError(f"kn.random.key: the seed must be an integer scalar, got {t}")
    low = astype(seed, dtypes.uint32)  # integer conversion keeps the low 32 bits
    # an arithmetic and a logical shift agree on the 32 bits that are kept
    high = astype(seed >> 32, dtypes.uint32) if t.dtype.itemsize == 8 else zeros((), dtypes.uint32)
    return stack([high, low])


@op_function
def split(key, num=2):
    """``num`` new keys from ``key``: u32[2] -> u32[num, 2] (``num`` may be a shape tuple).

    The new keys give statistically independent streams; same values as ``jax.random.split``.
    Do not keep drawing from ``key`` itself after splitting it.
    """
    check_key(key, "split")
    shape = check_shape(num, "split")
    b1, b2 = hash_counts(key, shape)
    return stack([b1, b2], axis=-1)


def fold_in(key, data) -> Any:
    """A new key from ``key`` and an integer ``data`` (e.g. a step or layer index): u32[2].

    ``data`` is a Python int (taken modulo 2**32), or an integer scalar array / traced value
    (converted to uint32). Same values as ``jax.random.fold_in``; as there, ``fold_in(key, i)``
    equals ``split(key, n)[i]``, so derive keys either by folding or by splitting, not both.
    """
    if isinstance(data, (bool, np.bool_)):
        raise TypeError("kn.random.fold_in: data must be an integer, got a bool")
    if isinstance(data, (int, np.integer)):
        # an array, not a static Python int, so new values do not compile new executables
        data = np.asarray(int(data) & MASK32, dtype=np.uint32)
    return _fold_in(key, data)


@op_function
def _fold_in(key, data):
    check_key(key, "fold_in")
    t = type_of(data)
    if t.shape != () or not dtypes.is_integer(t.dtype):
        raise TypeError(f"kn.random.fold_in: data must be an integer scalar, got {t}")
    k1, k2 = key_words(key)
    # the counter pair is (0, data): jax folds in threefry_seed(data) = [data >> 32, data]
    y1, y2 = threefry2x32(k1, k2, np.zeros((), np.uint32), astype(data, dtypes.uint32))
    return stack([y1, y2])
