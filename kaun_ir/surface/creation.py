"""Array creation: ``kn.zeros``, ``kn.ones``, ``kn.full``, their ``*_like`` forms and ``kn.arange``."""

from __future__ import annotations

import builtins

import numpy as np

from kaun_ir import dtypes
from kaun_ir.surface.function import op_function
from kaun_ir.surface.promotion import astype, is_weak
from kaun_ir.surface.tensor import apply, type_of

__all__ = ["arange", "full", "full_like", "ones", "ones_like", "zeros", "zeros_like"]


def _fill(shape, value, dtype):
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if any(isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
        raise ValueError(f"shape must be a sequence of non-negative ints, got {shape!r}")
    shape = tuple(int(d) for d in shape)
    scalar = np.asarray(value, dtype=dtypes.canonical(dtype))
    return (
        apply("broadcast_in_dim", scalar, shape=shape, broadcast_dimensions=())
        if shape
        else apply("reshape", scalar, shape=())
    )


@op_function
def full(shape, fill_value, dtype=None):
    """An array of ``shape`` filled with ``fill_value`` (dtype from the value if not given)."""
    dtype = (
        dtype
        if dtype is not None
        else (dtypes.dtype_of_scalar(fill_value) if is_weak(fill_value) else np.asarray(fill_value).dtype)
    )
    return _fill(shape, fill_value, dtype)


@op_function
def zeros(shape, dtype=dtypes.float32):
    """Zeros of ``shape`` and ``dtype`` (default float32)."""
    return _fill(shape, 0, dtype)


@op_function
def ones(shape, dtype=dtypes.float32):
    """Ones of ``shape`` and ``dtype`` (default float32)."""
    return _fill(shape, 1, dtype)


def zeros_like(x, dtype=None):
    """Zeros with the shape (and dtype) of ``x``."""
    t = type_of(x)
    return zeros(t.shape, dtype or t.dtype)


def ones_like(x, dtype=None):
    """Ones with the shape (and dtype) of ``x``."""
    t = type_of(x)
    return ones(t.shape, dtype or t.dtype)


def full_like(x, fill_value, dtype=None):
    """``fill_value`` with the shape (and dtype) of ``x``."""
    t = type_of(x)
    return full(t.shape, fill_value, dtype or t.dtype)


@op_function
def arange(start, stop=None, step=1, dtype=None):
    """``start, start + step, ...`` below ``stop`` (like ``np.arange``; int32 or float32)."""
    if stop is None:
        start, stop = 0, start
    for name, value in (("start", start), ("stop", stop), ("step", step)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TypeError(f"arange: {name} must be a Python or NumPy number, got {value!r}")
        if not np.isfinite(value):
            raise ValueError(f"arange: {name} must be finite, got {value!r}")
    if step == 0:
        raise ValueError("arange: step must not be zero")
    count = builtins.max(int(np.ceil((stop - start) / step)), 0)
    if dtype is None:
        dtype = dtypes.float32 if any(isinstance(v, float) for v in (start, stop, step)) else dtypes.int32
    dtype = dtypes.canonical(dtype)
    ramp = apply("iota", dtype=dtype, shape=(count,), dimension=0) if count else zeros((0,), dtype)
    if step != 1:
        ramp = ramp * astype(step, dtype)
    if start != 0:
        ramp = ramp + astype(start, dtype)
    return ramp
