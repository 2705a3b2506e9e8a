"""The discrete samplers of ``kn.random``: raw bits, Bernoulli booleans, integers in a range and
categorical draws (the Gumbel-max trick)."""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.surface.creation import full
from kaun_ir.surface.elementwise import add, clip, mod, where
from kaun_ir.surface.function import op_function
from kaun_ir.surface.indexing import getitem
from kaun_ir.surface.promotion import astype, dtype_of, shape_of
from kaun_ir.surface.random.checks import check_broadcast, check_key, check_shape
from kaun_ir.surface.random.continuous import gumbel, uniform
from kaun_ir.surface.random.keys import split
from kaun_ir.surface.random.threefry import random_bits
from kaun_ir.surface.reductions import argmax
from kaun_ir.surface.shapes import expand_dims
from kaun_ir.surface.tensor import apply, type_of


@op_function
def bits(key, shape=(), dtype=dtypes.uint32):
    """Uniform random bits: u32[2] -> ``dtype[shape]`` for uint8/16/32/64 (``jax.random.bits``)."""
    check_key(key, "bits")
    dt = dtypes.canonical(dtype)
    if dt not in dtypes.UNSIGNED:
        raise TypeError(
            f"kn.random.bits: dtype must be an unsigned integer dtype, got {dtypes.short_name(dt)}"
        )
    return random_bits(key, check_shape(shape, "bits"), 8 * dt.itemsize)


@op_function
def bernoulli(key, p=0.5, shape=None):
    """Random booleans that are True with probability ``p``: u32[2] -> ``bool[shape]``.

    ``p`` is a scalar or an array broadcastable to ``shape`` (default: ``p``'s shape); the
    draw is ``uniform(key, shape, p.dtype) < p`` (float32 for Python or integer ``p``).
    """
    check_key(key, "bernoulli")
    if isinstance(p, (bool, int, float)):
        p = np.asarray(p, np.float32)
    elif isinstance(p, (np.ndarray, np.generic)):
        p = np.asarray(p) if np.asarray(p).dtype in dtypes.FLOATS else np.asarray(p, np.float32)
    elif not dtypes.is_float(dtype_of(p)):
        p = astype(p, dtypes.float32)
    p_shape, p_dtype = shape_of(p), dtype_of(p)
    shape = p_shape if shape is None else check_shape(shape, "bernoulli")
    check_broadcast("bernoulli", "p", p_shape, shape)
    return uniform(key, shape, p_dtype) < p


def _int_bound(value, dt, shape, what: str):
    """``(tensor of dt, value exceeds dt's maximum)``; Python ints are clipped to dt's range."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"kn.random.randint: {what} must be an integer, got a bool")
    if isinstance(value, (int, np.integer)):
        info = np.iinfo(dt)
        value = int(value)
        clipped = min(max(value, int(info.min)), int(info.max))
        return full((), clipped, dt), value > info.max
    t = type_of(value)
    if not dtypes.is_integer(t.dtype):
        raise TypeError(f"kn.random.randint: {what} must be an integer array, got {t}")
    check_broadcast("randint", what, t.shape, shape)
    return apply("convert", value, dtype=dt), False


def _clip_int(value, low: int, high: int):
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return min(max(int(value), low), high)
    t = type_of(value)
    if not dtypes.is_integer(t.dtype):
        raise TypeError(f"kn.random.randint: bounds must be integers, got {t}")
    return clip(astype(value, dtypes.int32), low, high)


@op_function
def randint(key, shape, minval, maxval, dtype=dtypes.int32):
    """Random integers in ``[minval, maxval)``: u32[2] -> ``dtype[shape]`` (``jax.random.randint``).

    ``dtype`` is an 8-, 16- or 32-bit integer dtype. ``minval`` / ``maxval`` are Python ints,
    clipped to the dtype's range (``maxval`` may be one past its maximum), or integer arrays
    broadcastable to ``shape`` (converted to ``dtype``; clipped too for 8/16-bit dtypes, which
    are sampled as int32 and converted, as jax does). Where ``maxval <= minval`` the result is
    ``minval``. Like jax, two random words per value are reduced modulo the span, so the bias for
    spans that are not powers of two is small.
    """
    check_key(key, "randint")
    shape = check_shape(shape, "randint")
    dt = dtypes.canonical(dtype)
    if not dtypes.is_integer(dt) or dt.itemsize > 4:
        raise TypeError(
            f"kn.random.randint: dtype must be an 8-, 16- or 32-bit integer dtype, got "
            f"{dtypes.short_name(dt)}"
        )
    if dt.itemsize < 4:  # as jax: clip to dt's range (maxval may be one past it), sample in int32
        info = np.iinfo(dt)
        minval = _clip_int(minval, int(info.min), int(info.max))
        maxval = _clip_int(maxval, int(info.min), int(info.max) + 1)
        return astype(_randint(key, shape, minval, maxval, dtypes.int32), dt)
    return _randint(key, shape, minval, maxval, dt)


def _randint(key, shape, minval, maxval, dt):
    """randint for a 32-bit integer dtype ``dt``."""
    nbits = 8 * dt.itemsize
    udt = np.dtype(f"uint{nbits}")
    low, _ = _int_bound(minval, dt, shape, "minval")
    high, high_out_of_range = _int_bound(maxval, dt, shape, "maxval")
    keys = split(key)
    higher = random_bits(getitem(keys, 0), shape, nbits)
    lower = random_bits(getitem(keys, 1), shape, nbits)
    span = apply("convert", high - low, dtype=udt)  # wraps modulo 2**nbits, as intended
    span = where(high <= low, 1, span)
    if high_out_of_range:  # e.g. randint(k, s, 0, 2**32, uint32): the span is one larger
        span = where(high > low, span + 1, span)
    # A span of 0 (the full range, wrapped) means "no reduction": XLA defines x % 0 = x, but its
    # constant folder crashes (SIGFPE) on a constant zero divisor, so the divisor is never 0.
    wrapped = span == 0
    divisor = where(wrapped, 1, span)

    def rem(x):
        return where(wrapped, x, mod(x, divisor))

    # (higher * 2**nbits + lower) mod span without overflow: multiplier = 2**nbits mod span
    multiplier = rem(full((), 2 ** (nbits // 2), udt))
    multiplier = rem(multiplier * multiplier)
    offset = rem(rem(higher) * multiplier + rem(lower))
    return low + apply("convert", offset, dtype=dt)


@op_function
def categorical(key, logits, axis: int = -1, shape=None):
    """Samples from the categorical distributions ``softmax(logits, axis)``: int32 indices along
    ``axis`` (``jax.random.categorical``'s semantics), drawn by the Gumbel-max trick
    ``argmax(logits + gumbel, axis)``.

    ``logits`` ``[..., n, ...]`` (unnormalised log-probabilities; ``-inf`` excludes a class);
    ``shape`` (default: ``logits``' shape without ``axis``) is the shape of the result and must
    end with that batch shape (leading axes draw independent samples). Top-k sampling::

        values, indices = kn.top_k(logits, k)                    # [B, k] each
        choice = kn.random.categorical(key, values)              # [B] positions among the k
        token = kn.take_along_axis(indices, choice[:, None], axis=-1)[:, 0]

    Outside a trace the whole draw is one compiled executable per signature.
    """
    check_key(key, "categorical")
    if isinstance(logits, (list, tuple, int, float)):
        logits = np.asarray(logits, np.float32)
    logits_shape = tuple(shape_of(logits))
    ndim = len(logits_shape)
    if ndim == 0:
        raise ValueError("kn.random.categorical: logits must have at least one axis")
    if isinstance(axis, bool) or not isinstance(axis, int) or not -ndim <= axis < ndim:
        raise ValueError(
            f"kn.random.categorical: axis {axis!r} is out of range for logits of shape {list(logits_shape)}"
        )
    axis = axis % ndim
    batch = logits_shape[:axis] + logits_shape[axis + 1 :]
    shape = batch if shape is None else check_shape(shape, "categorical")
    if len(shape) < len(batch) or tuple(shape[len(shape) - len(batch) :]) != batch:
        raise ValueError(
            f"kn.random.categorical: shape {list(shape)} must end with the logits' batch shape "
            f"{list(batch)} (the logits' shape without axis {axis})"
        )
    prefix = tuple(shape[: len(shape) - len(batch)])
    noise_shape = prefix + logits_shape
    dt = dtype_of(logits)
    if not dtypes.is_float(dt):
        logits, dt = astype(logits, dtypes.float32), dtypes.float32
    for _ in prefix:
        logits = expand_dims(logits, 0)
    return argmax(add(logits, gumbel(key, noise_shape, dt)), axis=len(prefix) + axis)
