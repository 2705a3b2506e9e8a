"""Gathering by position: ``kn.take``, ``kn.take_along_axis`` and ``kn.one_hot``.

Everything lowers to the ``gather`` primitive (``kaun_ir/ops/indexing.py``); out-of-range run-time
positions are clamped (see ``kaun_ir.surface.index_arrays``).
"""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ops.indexing_common import gather_along_axis
from kaun_ir.surface.elementwise import equal
from kaun_ir.surface.function import op_function
from kaun_ir.surface.index_arrays import (
    empty_or_raise,
    gather_axis,
    index_array,
    index_dtype,
    normalize_index_axis,
    wrap_negative,
)
from kaun_ir.surface.promotion import astype, broadcast_shapes, broadcast_to, dtype_of, shape_of
from kaun_ir.surface.shapes import reshape
from kaun_ir.surface.tensor import apply

__all__ = ["take", "take_along_axis", "one_hot"]


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
    axis = normalize_index_axis(axis, len(shape_of(x)), "take")
    indices = index_array(indices, "take")
    size = shape_of(x)[axis]
    indices = wrap_negative(indices, size, index_dtype(indices))
    return gather_axis(x, indices, axis, "take")


@op_function
def take_along_axis(x, indices, axis):
    """Pick one element of ``x`` per entry of ``indices`` along ``axis`` (``np.take_along_axis``).

    ``x``: ``[d0, ..., n, ..., dk]``; ``indices``: same rank, ``m`` at ``axis``, every other axis
    broadcasting against ``x``'s; result: the broadcast shape with ``m`` at ``axis``, where
    ``result[..., j, ...] = x[..., indices[..., j, ...], ...]``. ``axis=None`` works on the
    flattened ``x`` with 1-D ``indices``. Negative indices count from the end; indices still out
    of range are clamped.
    """
    indices = index_array(indices, "take_along_axis")
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
    axis = normalize_index_axis(axis, len(shape), "take_along_axis")
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
        return empty_or_raise(out_shape, dtype_of(x), "take_along_axis", axis)
    dtype = index_dtype(indices)
    indices = broadcast_to(wrap_negative(indices, shape[axis], dtype), out_shape)
    return gather_along_axis(x, indices, axis, x_shape=shape)


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
    labels = index_array(labels, "one_hot", mask_error=False)
    labels = astype(labels, index_dtype(labels))
    shape = shape_of(labels)
    axis = normalize_index_axis(axis, len(shape) + 1, "one_hot")
    out_shape = shape[:axis] + (int(num_classes),) + shape[axis:]
    label_dims = tuple(d for d in range(len(out_shape)) if d != axis)
    spread = apply("broadcast_in_dim", labels, shape=out_shape, broadcast_dimensions=label_dims)
    classes = apply("iota", dtype=dtype_of(labels), shape=out_shape, dimension=axis)
    return astype(equal(spread, classes), dtype)
