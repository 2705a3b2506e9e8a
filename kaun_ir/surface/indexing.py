"""Indexing with run-time positions: ``take``, ``take_along_axis``, ``one_hot``, ``dynamic_slice``,
``dynamic_update_slice`` and NumPy's integer-array ("advanced") indexing behind ``x[idx]``.

Everything lowers to the ``gather`` / ``dynamic_slice`` / ``dynamic_update_slice`` primitives
(``kaun_ir/ops/indexing.py``). Index values unknown until run time cannot raise an error, so
out-of-range positions are *clamped* into range, as XLA does; negative positions count from the
end first, as in NumPy.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.surface.function import op_function
from kaun_ir.surface.numeric import (
    astype,
    broadcast_shapes,
    broadcast_to,
    dtype_of,
    equal,
    getitem,
    reshape,
    shape_of,
    stack,
    where,
    zeros,
)
from kaun_ir.surface.tensor import Tensor, apply

__all__ = ["take", "take_along_axis", "one_hot", "dynamic_slice", "dynamic_update_slice", "advanced_getitem"]


# ------------------------------------------------------------------------------ helpers


def _normalize_axis(axis: int, ndim: int, op: str) -> int:
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"{op}: axis must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ShapeError(f"{op}: axis {axis} is out of range for a tensor of rank {ndim}")
    return int(axis) % ndim


def _is_static(index: Any) -> bool:
    """Python ints and (nested) lists are known while tracing; arrays and Tensors are data."""
    return isinstance(index, (int, list, tuple)) and not isinstance(index, bool)


def _index_array(index: Any, op: str, mask_error: bool = True) -> Any:
    """``index`` as an integer Tensor/array; lists and ints become NumPy arrays.

    Bool indices raise IndexError (a mask selects a data-dependent number of elements, so the
    result shape would be unknown while tracing), or TypeError where no mask is meant
    (``mask_error=False``); other non-integer indices raise TypeError.
    """
    if _is_static(index):
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


def _index_dtype(*indices: Any) -> np.dtype:
    """int32 unless some index needs 64 bits (int64, uint32, uint64)."""
    wide = {dtypes.int64, dtypes.uint32, dtypes.uint64}
    return dtypes.int64 if any(dtype_of(i) in wide for i in indices) else dtypes.int32


def _wrap_negative(index: Any, size: int, dtype) -> Any:
    """``index`` as ``dtype`` with negative entries counted from the end (``-1`` -> ``size - 1``)."""
    index = astype(index, dtype)
    if isinstance(index, np.ndarray):
        return np.where(index < 0, index + size, index).astype(dtype)
    return where(index < 0, index + np.asarray(size, dtype), index)


def _check_static_bounds(index: Any, size: int, axis: int) -> None:
    """NumPy's IndexError for out-of-range positions that are known while tracing."""
    arr = np.asarray(index)
    bad = arr[(arr < -size) | (arr >= size)]
    if bad.size:
        raise IndexError(f"index {int(bad.flat[0])} is out of bounds for axis {axis} with size {size}")


def _empty_or_raise(out_shape: Sequence[int], dtype, op: str, axis: int):
    """Gathering from an axis of size 0: fine when nothing is gathered, an error otherwise."""
    if int(np.prod(out_shape, dtype=np.int64)) == 0:
        return zeros(tuple(out_shape), dtype)
    raise IndexError(f"{op}: cannot index axis {axis} of size 0")


def _gather_axis(x: Any, index: Any, axis: int, op: str) -> Any:
    """``x`` with axis ``axis`` replaced by the axes of ``index`` (entries already in range or
    clamped by gather): shape ``x.shape[:axis] + index.shape + x.shape[axis + 1:]``."""
    shape = shape_of(x)
    index_shape = shape_of(index)
    out_shape = shape[:axis] + index_shape + shape[axis + 1 :]
    if shape[axis] == 0:
        return _empty_or_raise(out_shape, dtype_of(x), op, axis)
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


# ------------------------------------------------------------------------------ take


@op_function
def take(x, indices, axis=None):
    """Elements of ``x`` at ``indices`` along ``axis``, like ``np.take`` / ``jnp.take``.

    ``x``: ``[*pre, n, *post]`` (with ``axis`` at ``n``); ``indices``: any integer shape ``I``;
    result: ``[*pre, *I, *post]``. With ``axis=None`` ``x`` is flattened first (result ``I``).
    Negative indices count from the end; indices still out of range are clamped to
    ``[0, n - 1]`` (``jnp.take(..., mode="clip")``), since run-time values cannot raise.
    """
    if axis is None:
        x = reshape(x, (-1,))
        axis = 0
    axis = _normalize_axis(axis, len(shape_of(x)), "take")
    indices = _index_array(indices, "take")
    size = shape_of(x)[axis]
    indices = _wrap_negative(indices, size, _index_dtype(indices))
    return _gather_axis(x, indices, axis, "take")


@op_function
def take_along_axis(x, indices, axis):
    """Pick one element of ``x`` per entry of ``indices`` along ``axis`` (``np.take_along_axis``).

    ``x``: ``[d0, ..., n, ..., dk]``; ``indices``: same rank, ``m`` at ``axis``, every other axis
    broadcasting against ``x``'s; result: the broadcast shape with ``m`` at ``axis``, where
    ``result[..., j, ...] = x[..., indices[..., j, ...], ...]``. ``axis=None`` works on the
    flattened ``x`` with 1-D ``indices``. Negative indices count from the end; indices still out
    of range are clamped.
    """
    indices = _index_array(indices, "take_along_axis")
    if axis is None:
        x = reshape(x, (-1,))
        if len(shape_of(indices)) != 1:
            raise ShapeError(
                "take_along_axis: with axis=None the indices must be 1-D, got shape "
                f"{list(shape_of(indices))}"
            )
        axis = 0
    shape, index_shape = shape_of(x), shape_of(indices)
    if len(index_shape) != len(shape):
        raise ShapeError(
            f"take_along_axis: indices of rank {len(index_shape)} for x of rank {len(shape)} "
            "(they must have the same rank)"
        )
    axis = _normalize_axis(axis, len(shape), "take_along_axis")
    out_shape = list(
        broadcast_shapes(
            [1 if d == axis else n for d, n in enumerate(shape)],
            [1 if d == axis else n for d, n in enumerate(index_shape)],
            op="take_along_axis",
        )
    )
    out_shape[axis] = index_shape[axis]
    out_shape = tuple(out_shape)
    if int(np.prod(out_shape, dtype=np.int64)) == 0 or shape[axis] == 0:
        return _empty_or_raise(out_shape, dtype_of(x), "take_along_axis", axis)
    dtype = _index_dtype(indices)
    indices = broadcast_to(_wrap_negative(indices, shape[axis], dtype), out_shape)
    # The full coordinate of every result element: ``indices`` on ``axis`` and the element's own
    # position on every other axis (0 where ``x`` has size 1 and broadcasts).
    coords = []
    for d in range(len(shape)):
        if d == axis:
            coords.append(indices)
        elif shape[d] == 1:
            coords.append(zeros(out_shape, dtype))
        else:
            coords.append(apply("iota", dtype=dtype, shape=out_shape, dimension=d))
    points = stack(coords, axis=-1)
    every = tuple(range(len(shape)))
    return apply(
        "gather",
        x,
        points,
        offset_dims=(),
        collapsed_slice_dims=every,
        start_index_map=every,
        index_vector_dim=len(out_shape),
        slice_sizes=(1,) * len(shape),
    )


# ------------------------------------------------------------------------------ one_hot


@op_function
def one_hot(labels, num_classes, dtype=dtypes.float32, axis=-1):
    """One-hot encoding: ``labels`` of integer shape ``S`` -> ``S + [num_classes]`` (new axis at
    ``axis``, default last) of ``dtype``, 1 where the class equals the label and 0 elsewhere.

    A label outside ``[0, num_classes)`` (negative included) gives an all-zero row, like
    ``jax.nn.one_hot``.
    """
    if not isinstance(num_classes, (int, np.integer)) or num_classes < 0:
        raise TypeError(f"one_hot: num_classes must be a non-negative int, got {num_classes!r}")
    labels = _index_array(labels, "one_hot", mask_error=False)
    labels = astype(labels, _index_dtype(labels))
    shape = shape_of(labels)
    axis = _normalize_axis(axis, len(shape) + 1, "one_hot")
    out_shape = shape[:axis] + (int(num_classes),) + shape[axis:]
    label_dims = tuple(d for d in range(len(out_shape)) if d != axis)
    spread = apply("broadcast_in_dim", labels, shape=out_shape, broadcast_dimensions=label_dims)
    classes = apply("iota", dtype=dtype_of(labels), shape=out_shape, dimension=axis)
    return astype(equal(spread, classes), dtype)


# ------------------------------------------------------------------------- dynamic slices


def _start_scalars(start_indices: Any, ndim: int, shape: Sequence[int], op: str) -> list:
    """One integer scalar per axis, negative ones counted from the end (like XLA's dynamic slicing).

    ``start_indices`` is a sequence of ints / integer scalars, or a 1-D integer array of length
    ``ndim``.
    """
    if isinstance(start_indices, (list, tuple)):
        starts = list(start_indices)
    else:
        start_indices = _index_array(start_indices, op, mask_error=False)
        if shape_of(start_indices) != (ndim,):
            raise ShapeError(
                f"{op}: start_indices must be a sequence or a 1-D array of length {ndim}, "
                f"got shape {list(shape_of(start_indices))}"
            )
        starts = [getitem(start_indices, i) for i in range(ndim)]
    if len(starts) != ndim:
        raise ShapeError(f"{op}: {len(starts)} start indices for a tensor of rank {ndim}")
    starts = [_index_array(s, op, mask_error=False) for s in starts]
    for s in starts:
        if shape_of(s) != ():
            raise ShapeError(f"{op}: each start index must be a scalar, got shape {list(shape_of(s))}")
    dtype = _index_dtype(*starts)
    return [_wrap_negative(s, n, dtype) for s, n in zip(starts, shape)]


@op_function
def dynamic_slice(x, start_indices, slice_sizes):
    """The block of ``x`` of shape ``slice_sizes`` starting at run-time ``start_indices``.

    ``x``: ``[n0, ..., nk]``; ``start_indices``: k+1 integer scalars (or a 1-D integer array);
    ``slice_sizes``: k+1 static ints with ``0 <= slice_sizes[i] <= ni``; result: ``slice_sizes``.
    A negative start counts from the end; then each start is clamped into
    ``[0, ni - slice_sizes[i]]`` so the block always fits (StableHLO ``dynamic_slice`` semantics).
    """
    shape = shape_of(x)
    sizes = tuple(int(k) for k in slice_sizes)
    if len(sizes) != len(shape):
        raise ShapeError(f"dynamic_slice: {len(sizes)} slice sizes for a tensor of rank {len(shape)}")
    starts = _start_scalars(start_indices, len(shape), shape, "dynamic_slice")
    return apply("dynamic_slice", x, *starts, slice_sizes=sizes)


@op_function
def dynamic_update_slice(x, update, start_indices):
    """``x`` with the block ``update`` written at run-time ``start_indices``.

    ``x``: ``[n0, ..., nk]``; ``update``: same rank, ``[u0, ..., uk]`` with ``ui <= ni``, converted
    to ``x``'s dtype; ``start_indices``: k+1 integer scalars (or a 1-D integer array); result:
    ``x``'s shape. A negative start counts from the end; then each start is clamped into
    ``[0, ni - ui]`` so the block always fits (StableHLO ``dynamic_update_slice`` semantics).
    """
    shape = shape_of(x)
    if len(shape_of(update)) != len(shape):
        raise ShapeError(
            f"dynamic_update_slice: update of rank {len(shape_of(update))} for a tensor of rank {len(shape)}"
        )
    starts = _start_scalars(start_indices, len(shape), shape, "dynamic_update_slice")
    return apply("dynamic_update_slice", x, astype(update, dtype_of(x)), *starts)


# ---------------------------------------------------------------------- advanced indexing


class _Slice(NamedTuple):
    """A hashable stand-in for ``slice`` (``kn.jit`` keys static arguments by value)."""

    start: Any
    stop: Any
    step: Any


def advanced_getitem(x, index):
    """``x[index]`` where ``index`` holds integer arrays (NumPy "advanced" indexing).

    ``index`` is a tuple mixing ints, slices, ``None``, one ``Ellipsis`` and integer arrays
    (NumPy / jax arrays, Tensors or nested lists). As in NumPy, the ints and arrays are the
    *advanced* indices: they broadcast together to a shape ``B``, and the result has the axes of
    the basic indices (slices, ``None``) with ``B`` inserted where the first advanced index was
    if the advanced indices are adjacent, else in front. Examples for ``x`` of shape
    ``[5, 6, 7]`` and ``idx`` of shape ``[2, 3]``: ``x[idx]`` -> ``[2, 3, 6, 7]``,
    ``x[:, idx]`` -> ``[5, 2, 3, 7]``, ``x[idx, 1:3]`` -> ``[2, 3, 2, 7]``,
    ``x[rows, cols]`` -> ``B + [7]``, ``x[0, :, idx]`` -> ``[2, 3, 6]``.

    Negative indices count from the end. Out-of-range ints and list entries raise IndexError;
    out-of-range entries of arrays and Tensors (values not known while tracing) are clamped.
    Boolean masks raise IndexError (their result shape depends on the data), non-integer
    indices TypeError.
    """
    index = index if isinstance(index, tuple) else (index,)
    items = []
    for item in index:
        if isinstance(item, slice):
            item = _Slice(item.start, item.stop, item.step)
        elif isinstance(item, np.integer):
            item = int(item)  # a static position, like a Python int
        items.append(item)
    return _advanced_getitem(x, tuple(items))


def _classify(item: Any) -> str:
    if item is None:
        return "newaxis"
    if item is Ellipsis:
        return "ellipsis"
    if isinstance(item, (slice, _Slice)):
        return "slice"
    if isinstance(item, (bool, np.bool_)):
        raise IndexError("boolean scalar indices are not supported (they add a data-dependent axis)")
    if isinstance(item, (int, np.integer)):
        return "int"
    if isinstance(item, (float, np.floating)):
        raise TypeError(f"indices must be integers, got {item!r}")
    if isinstance(item, (list, tuple, np.ndarray, Tensor)) or hasattr(item, "dtype"):
        return "array"
    raise IndexError(f"unsupported index {item!r} (use ints, slices, None, ..., or integer arrays)")


@op_function
def _advanced_getitem(x, items):
    shape = shape_of(x)
    items = [slice(*item) if isinstance(item, _Slice) else item for item in items]
    kinds = [_classify(item) for item in items]
    if kinds.count("ellipsis") > 1:
        raise IndexError("an index can only have a single ellipsis")
    n_real = builtins.sum(1 for k in kinds if k in ("int", "slice", "array"))
    if n_real > len(shape):
        raise IndexError(f"too many indices ({n_real}) for a tensor of rank {len(shape)}")
    advanced = [i for i, k in enumerate(kinds) if k in ("int", "array")]
    if not any(k == "array" for k in kinds):
        return getitem(x, tuple(items))  # basic indexing after all
    # NumPy's placement rule: adjacent advanced indices keep their place, otherwise (a slice,
    # None or Ellipsis between them) their broadcast axes go first.
    adjacent = advanced == list(range(advanced[0], advanced[0] + len(advanced)))

    # One entry per result axis of the basic pass: ellipsis expanded, trailing axes filled in.
    fill = [("slice", slice(None))] * (len(shape) - n_real)
    expanded: list[tuple[str, Any]] = []
    for kind, item in zip(kinds, items):
        expanded += fill if kind == "ellipsis" else [(kind, item)]
    if "ellipsis" not in kinds:
        expanded += fill

    # Basic pass: slices and None applied, advanced axes kept whole (axis j of y <-> entry j).
    y = getitem(x, tuple(slice(None) if kind in ("int", "array") else item for kind, item in expanded))
    y_shape = shape_of(y)
    axes = [j for j, (kind, _) in enumerate(expanded) if kind in ("int", "array")]
    x_axis = {}  # axis of x each advanced entry indexes, for error messages
    count = 0
    for j, (kind, _) in enumerate(expanded):
        if kind in ("int", "array", "slice"):
            x_axis[j] = count
            count += 1

    indices = []
    for j in axes:
        kind, item = expanded[j]
        index = _index_array(item, "indexing")
        if _is_static(item):
            _check_static_bounds(index, y_shape[j], x_axis[j])
        indices.append(index)
    try:
        batch = broadcast_shapes(*[shape_of(i) for i in indices], op="indexing")
    except ShapeError:
        listed = " ".join(str(list(shape_of(i))) for i in indices)
        raise IndexError(
            f"shape mismatch: the index arrays of shapes {listed} do not broadcast together"
        ) from None
    dtype = _index_dtype(*indices)
    indices = [broadcast_to(_wrap_negative(i, y_shape[j], dtype), batch) for i, j in zip(indices, axes)]

    rest = [j for j in range(len(y_shape)) if j not in axes]
    first = axes[0] if adjacent else 0  # rest axes before ``first`` stay in front of the batch axes
    offset_dims = tuple(r if j < first else r + len(batch) for r, j in enumerate(rest))
    before = [y_shape[j] for j in rest if j < first]
    after = [y_shape[j] for j in rest if j >= first]
    out_shape = tuple(before) + tuple(batch) + tuple(after)
    empty = [j for j in axes if y_shape[j] == 0]
    if empty:
        return _empty_or_raise(out_shape, dtype_of(x), "indexing", x_axis[empty[0]])
    points = stack(indices, axis=-1)
    return apply(
        "gather",
        y,
        points,
        offset_dims=offset_dims,
        collapsed_slice_dims=tuple(axes),
        start_index_map=tuple(axes),
        index_vector_dim=len(batch),
        slice_sizes=tuple(1 if j in axes else n for j, n in enumerate(y_shape)),
    )
