"""Slices at run-time positions: ``kn.dynamic_slice`` and ``kn.dynamic_update_slice``.

They lower to the StableHLO primitives of the same names, which clamp each start so the block
always fits; a negative start counts from the end first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kaun_ir.errors import ShapeError
from kaun_ir.surface.function import op_function
from kaun_ir.surface.index_arrays import index_array, index_dtype, wrap_negative
from kaun_ir.surface.indexing import getitem
from kaun_ir.surface.promotion import astype, dtype_of, shape_of
from kaun_ir.surface.tensor import apply

__all__ = ["dynamic_slice", "dynamic_update_slice"]


def _start_scalars(start_indices: Any, ndim: int, shape: Sequence[int], op: str) -> list:
    """One integer scalar per axis, negative ones counted from the end (like XLA's dynamic slicing).

    ``start_indices`` is a sequence of ints / integer scalars, or a 1-D integer array of length
    ``ndim``.
    """
    if isinstance(start_indices, (list, tuple)):
        starts = list(start_indices)
    else:
        start_indices = index_array(start_indices, op, mask_error=False)
        if shape_of(start_indices) != (ndim,):
            raise ShapeError(
                f"{op}: start_indices must be a sequence or a 1-D array of length {ndim}, "
                f"got shape {list(shape_of(start_indices))}"
            )
        starts = [getitem(start_indices, i) for i in range(ndim)]
    if len(starts) != ndim:
        raise ShapeError(f"{op}: {len(starts)} start indices for a tensor of rank {ndim}")
    starts = [index_array(s, op, mask_error=False) for s in starts]
    for s in starts:
        if shape_of(s) != ():
            raise ShapeError(f"{op}: each start index must be a scalar, got shape {list(shape_of(s))}")
    dtype = index_dtype(*starts)
    return [wrap_negative(s, n, dtype) for s, n in zip(starts, shape)]


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
