"""``x[index]``: NumPy's basic indexing (ints, slices, None, Ellipsis) by ``slice`` and
``reverse``, and its integer-array ("advanced") indexing by ``gather``.

Out-of-range positions known while tracing raise IndexError; positions in arrays and Tensors
(values unknown until run time) are clamped into range, as XLA does.
"""

from __future__ import annotations

import builtins
from typing import Any, NamedTuple

import numpy as np

from kaun_ir.errors import ShapeError
from kaun_ir.surface.function import op_function
from kaun_ir.surface.index_arrays import (
    check_static_bounds,
    empty_or_raise,
    index_array,
    index_dtype,
    is_static,
    wrap_negative,
)
from kaun_ir.surface.promotion import broadcast_shapes, broadcast_to, dtype_of, shape_of
from kaun_ir.surface.shapes import reshape, stack
from kaun_ir.surface.tensor import Tensor, apply

__all__ = ["getitem", "advanced_getitem"]


def _is_advanced(index: Any) -> bool:
    return isinstance(index, (Tensor, list, np.ndarray)) or (
        hasattr(index, "shape") and hasattr(index, "dtype") and not isinstance(index, np.generic)
    )


def getitem(x, index):
    """NumPy basic indexing (ints, slices with any step, None, Ellipsis); integer-array
    indices go through ``gather`` (``advanced_getitem``)."""
    index = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, (bool, np.bool_)) for i in index):
        # NumPy reads x[True] as a mask adding an axis, not as x[1]; we support neither silently
        raise IndexError("boolean scalar indices are not supported (they add a data-dependent axis)")
    if any(_is_advanced(i) for i in index):
        return advanced_getitem(x, index)
    shape = shape_of(x)
    starts, limits, strides, flips, out_shape = [], [], [], [], []
    axis = 0
    for item in _expand_ellipsis(index, len(shape)):
        if item is None:
            out_shape.append(1)
            continue
        if axis >= len(shape):
            break
        start, limit, stride, flipped, length = _basic_window(item, shape[axis], axis)
        starts.append(start), limits.append(limit), strides.append(stride)
        if flipped:
            flips.append(axis)
        if length is not None:
            out_shape.append(length)
        axis += 1
    while axis < len(shape):
        starts.append(0), limits.append(shape[axis]), strides.append(1)
        out_shape.append(shape[axis])
        axis += 1
    y = x
    if (tuple(starts), tuple(limits), tuple(strides)) != ((0,) * len(shape), tuple(shape), (1,) * len(shape)):
        y = apply(
            "slice", y, start_indices=tuple(starts), limit_indices=tuple(limits), strides=tuple(strides)
        )
    if flips:
        y = apply("reverse", y, dimensions=tuple(flips))
    return reshape(y, out_shape)


def _expand_ellipsis(index: tuple, rank: int) -> list:
    """``index`` with its ``...`` replaced by full slices; IndexError for too many indices or
    more than one ellipsis."""
    n_real = builtins.sum(1 for i in index if i is not None and i is not Ellipsis)
    if n_real > rank:
        raise IndexError(f"too many indices ({n_real}) for a tensor of rank {rank}")
    if builtins.sum(1 for i in index if i is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis")
    expanded = []
    for i in index:
        if i is Ellipsis:
            expanded += [slice(None)] * (rank - n_real)
        else:
            expanded.append(i)
    return expanded


def _basic_window(item, size: int, axis: int) -> tuple[int, int, int, bool, int | None]:
    """``(start, limit, stride, reversed, length)`` of an int or slice ``item`` on an axis of
    ``size``, as the ``slice`` op reads it (a negative step becomes a positive one and a
    ``reverse``); ``length`` is None for an int (the axis is dropped)."""
    if isinstance(item, (int, np.integer)):
        pos = int(item)
        if not -size <= pos < size:
            raise IndexError(f"index {pos} is out of bounds for axis {axis} with size {size}")
        pos %= size
        return pos, pos + 1, 1, False, None
    if not isinstance(item, slice):
        raise IndexError(f"unsupported index {item!r} (use ints, slices, None, ..., or integer arrays)")
    positions = range(*item.indices(size))
    if len(positions) == 0:
        return 0, 0, 1, False, 0
    if positions.step > 0:
        return positions[0], positions[-1] + 1, positions.step, False, len(positions)
    return positions[-1], positions[0] + 1, -positions.step, True, len(positions)


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
        index = index_array(item, "indexing")
        if is_static(item):
            check_static_bounds(index, y_shape[j], x_axis[j])
        indices.append(index)
    try:
        batch = broadcast_shapes(*[shape_of(i) for i in indices], op="indexing")
    except ShapeError:
        listed = " ".join(str(list(shape_of(i))) for i in indices)
        raise IndexError(
            f"shape mismatch: the index arrays of shapes {listed} do not broadcast together"
        ) from None
    dtype = index_dtype(*indices)
    indices = [broadcast_to(wrap_negative(i, y_shape[j], dtype), batch) for i, j in zip(indices, axes)]

    rest = [j for j in range(len(y_shape)) if j not in axes]
    first = axes[0] if adjacent else 0  # rest axes before ``first`` stay in front of the batch axes
    offset_dims = tuple(r if j < first else r + len(batch) for r, j in enumerate(rest))
    before = [y_shape[j] for j in rest if j < first]
    after = [y_shape[j] for j in rest if j >= first]
    out_shape = tuple(before) + tuple(batch) + tuple(after)
    empty = [j for j in axes if y_shape[j] == 0]
    if empty:
        return empty_or_raise(out_shape, dtype_of(x), "indexing", x_axis[empty[0]])
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
