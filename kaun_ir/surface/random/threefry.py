"""The counter-based hash under ``kn.random``: Threefry-2x32 (Salmon et al., "Parallel random
numbers: as easy as 1, 2, 3", SC 2011) as a composite of uint32 add / xor / shifts, and the random
bits it makes from a key and the counters 0, 1, ... laid out as jax lays them out.
"""

from __future__ import annotations

import math

import numpy as np

from kaun_ir import dtypes
from kaun_ir.surface.creation import arange, zeros
from kaun_ir.surface.indexing import getitem
from kaun_ir.surface.promotion import astype
from kaun_ir.surface.shapes import reshape

MASK32 = 0xFFFFFFFF

# Threefry-2x32's rotation constants (two alternating groups of four rounds) and key-schedule parity
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA


def _rotate_left(x, r: int):
    return (x << r) | (x >> (32 - r))  # >> is a logical shift on uint32


def threefry2x32(k1, k2, x1, x2):
    """Threefry-2x32 with 20 rounds: key words k1, k2 (uint32 scalars) and counter words x1, x2
    (uint32, one shape) -> two uint32 arrays of that shape."""
    ks = (k1, k2, k1 ^ k2 ^ _PARITY)
    x = [x1 + ks[0], x2 + ks[1]]
    for group in range(5):
        for r in _ROTATIONS[group % 2]:
            x[0] = x[0] + x[1]
            x[1] = _rotate_left(x[1], r) ^ x[0]
        # key injection after every four rounds, with the injection counter
        x = [x[0] + ks[(group + 1) % 3], x[1] + ks[(group + 2) % 3] + (group + 1)]
    return x[0], x[1]


def key_words(key):
    """The two uint32 scalars of a key, as graph values."""
    return getitem(key, 0), getitem(key, 1)


def hash_counts(key, shape: tuple[int, ...]):
    """Threefry of the counters 0, 1, ... (row-major over ``shape``) -> two uint32[shape]."""
    size = math.prod(shape)
    if size > MASK32:
        raise ValueError(f"at most 2**32 - 1 random values per call, asked for {size} (split the key)")
    # jax splits a 64-bit counter into (high, low) words; below 2**32 values the high word is 0
    low = reshape(arange(size, dtype=dtypes.uint32), shape)
    high = zeros(shape, dtypes.uint32)
    k1, k2 = key_words(key)
    return threefry2x32(k1, k2, high, low)


def random_bits(key, shape: tuple[int, ...], width: int):
    """``width``-bit unsigned random integers of ``shape``."""
    b1, b2 = hash_counts(key, shape)
    if width == 64:
        return (astype(b1, dtypes.uint64) << 32) | astype(b2, dtypes.uint64)
    mixed = b1 ^ b2
    return mixed if width == 32 else astype(mixed, np.dtype(f"uint{width}"))  # keeps the low bits
