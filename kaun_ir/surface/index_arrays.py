"""Index arrays: how the integer indices of ``kn.take``, ``x[idx]`` and the dynamic slices are
checked, given one dtype, counted from the end when negative, and gathered along an axis.

Index values unknown until run time cannot raise an error, so out-of-range positions are
*clamped* into range, as XLA does; negative positions count from the end first, as in NumPy.
Positions known while tracing (Python ints and lists) are checked and raise IndexError.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.surface.creation import zeros
from kaun_ir.surface.elementwise import where
from kaun_ir.surface.promotion import astype, dtype_of, shape_of
from kaun_ir.surface.tensor import Tensor, apply


def normalize_index_axis(axis: int, ndim: int, op: str) -> int:
    """``axis`` in ``[-ndim, ndim)`` as a non-negative int (TypeError / ShapeError naming ``op``)."""
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"{op}: axis must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ShapeError(f"{op}: axis {axis} is out of range for a tensor of rank {ndim}")
    return int(axis) % ndim


def is_static(index: Any) -> bool:
    """Python ints and (nested) lists are known while tracing; arrays and Tensors are data."""
    return isinstance(index, (int, list, tuple)) and not isinstance(index, bool)


def index_array(index: Any, op: str, mask_error: bool = True) -> Any:
    """``index`` as an integer Tensor/array; lists and ints become NumPy arrays.

    Bool indices raise IndexError (a mask selects a data-dependent number of elements, so the
    result shape would be unknown while tracing), or TypeError where no mask is meant
    (``mask_error=False``); other non-integer indices raise TypeError.
    """
    if is_static(index):
        arr = np.asarray(index)
        if arr.size == 0 and arr.dtype.kind == "f":  # ``[]`` is an empty index, as in NumPy
            arr = arr.astype(np.int32)
        if arr.dtype.kind not in "biu":
            raise TypeError(f"{op}: indices must be integers, got {index!r}")
        if arr.dtype.kind != "b" and arr.dtype != np.int64:
            arr = arr.astype(np.int32) if np.all(np.abs(arr) < 2**31) else arr.astype(np.int64)
        index = arr
    elif not isinstance(index, Tensor) and not hasattr(index, "dtype"):
        raise TypeError(f"{op}: indices must be integers or integer arrays, got {type(index).__name__}")
    dtype = dtype_of(index)
    if dtypes.is_bool(dtype) and mask_error:
        raise IndexError(
            f"{op}: boolean mask indices are not supported: the number of selected elements depends "
            "on the data, so the result shape is unknown while tracing; use kn.where(mask, x, 0) "
            "or integer indices instead"
        )
    if not dtypes.is_integer(dtype):
        raise TypeError(f"{op}: indices must have an integer dtype, got {dtypes.short_name(dtype)}")
    return index


def index_dtype(*indices: Any) -> np.dtype:
    """int32 unless some index needs 64 bits (int64, uint32, uint64)."""
    wide = {dtypes.int64, dtypes.uint32, dtypes.uint64}
    return dtypes.int64 if any(dtype_of(i) in wide for i in indices) else dtypes.int32


def wrap_negative(index: Any, size: int, dtype) -> Any:
    """``index`` as ``dtype`` with negative entries counted from the end (``-1`` -> ``size - 1``)."""
    index = astype(index, dtype)
    if isinstance(index, np.ndarray):
        return np.where(index < 0, index + size, index).astype(dtype)
    return where(index < 0, index + np.asarray(size, dtype), index)


def check_static_bounds(index: Any, size: int, axis: int) -> None:
    """NumPy's IndexError for out-of-range positions that are known while tracing."""
    arr = np.asarray(index)
    bad = arr[(arr < -size) | (arr >= size)]
    if bad.size:
        raise IndexError(f"index {int(bad.flat[0])} is out of bounds for axis {axis} with size {size}")


def empty_or_raise(out_shape: Sequence[int], dtype, op: str, axis: int):
    """Gathering from an axis of size 0: fine when nothing is gathered, an error otherwise."""
    if int(np.prod(out_shape, dtype=np.int64)) == 0:
        return zeros(tuple(out_shape), dtype)
    raise IndexError(f"{op}: cannot index axis {axis} of size 0")


def gather_axis(x: Any, index: Any, axis: int, op: str) -> Any:
    """``x`` with axis ``axis`` replaced by the axes of ``index`` (entries already in range or
    clamped by gather): shape ``x.shape[:axis] + index.shape + x.shape[axis + 1:]``."""
    shape = shape_of(x)
    index_shape = shape_of(index)
    out_shape = shape[:axis] + index_shape + shape[axis + 1 :]
    if shape[axis] == 0:
        return empty_or_raise(out_shape, dtype_of(x), op, axis)
    offset_dims = tuple(range(axis)) + tuple(range(axis + len(index_shape), len(out_shape)))
    slice_sizes = tuple(1 if d == axis else n for d, n in enumerate(shape))
    return apply(
        "gather",
        x,
        index,
        offset_dims=offset_dims,
        collapsed_slice_dims=(axis,),
        start_index_map=(axis,),
        index_vector_dim=len(index_shape),
        slice_sizes=slice_sizes,
    )
