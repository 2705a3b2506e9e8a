"""Indexing primitives: dynamic_slice, dynamic_update_slice, gather, scatter_add and scatter.

These are the ops whose positions are data (operands) rather than attributes, so a traced
program can choose what to read or write at run time. Out-of-range positions follow StableHLO:
``dynamic_slice``, ``dynamic_update_slice`` and ``gather`` clamp each start so the slice fits
inside the operand; ``scatter_add`` skips every update window that does not fit entirely.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import GradientError, ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.emit import i64_array
from kaun_ir.ops.indexing_batch import (
    dynamic_slice_batch,
    dynamic_update_slice_batch,
    gather_batch,
    scatter_batch,
)
from kaun_ir.ops.rules import apply


def _rand(rng, shape, dtype=np.float32):
    dt = np.dtype(dtype)
    if dt == dtypes.bool_:
        return rng.random(shape) < 0.5
    if dt in dtypes.INTEGERS:
        return rng.integers(0 if dtypes.is_unsigned(dt) else -5, 6, size=shape).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def _index(value, dtype=np.int32) -> np.ndarray:
    """A scalar start index as the 0-d array the ops take."""
    return np.array(value, dtype=dtype)


def _zeros(like):
    """Zeros of ``like``'s type, for the VJP rules."""
    zero = apply("constant", value=np.zeros((), like.dtype))
    return apply("broadcast_in_dim", zero, shape=like.shape, broadcast_dimensions=()) if like.shape else zero


def _along_index_vector(indices, index_vector_dim: int, values: Sequence[int]):
    """A tensor of ``indices``' type holding ``values[k]`` at position k of every index vector."""
    info = np.iinfo(indices.dtype)
    values = np.clip(np.asarray(values, np.int64), info.min, info.max).astype(indices.dtype)
    if index_vector_dim == indices.ndim:  # the implicit vector of length 1
        bound = apply("constant", value=values.reshape(()))
        dims: tuple[int, ...] = ()
    else:
        bound = apply("constant", value=values)
        dims = (index_vector_dim,)
    return apply("broadcast_in_dim", bound, shape=indices.shape, broadcast_dimensions=dims)


def _clamp(start: int, size: int, window: int) -> int:
    """StableHLO's rule: move ``start`` so that ``[start, start + window)`` lies in ``[0, size)``."""
    return min(max(int(start), 0), size - window)


def _check_axes(axes: Sequence[int], bound: int, what: str, sorted_: bool = True) -> None:
    axes = tuple(axes)
    if len(set(axes)) != len(axes) or any(not 0 <= a < bound for a in axes):
        raise ShapeError(f"{what} {list(axes)} must be distinct axes in [0, {bound})")
    if sorted_ and list(axes) != sorted(axes):
        raise ShapeError(f"{what} {list(axes)} must be increasing")


def _require_integer(t: TensorType, what: str) -> None:
    if not dtypes.is_integer(t.dtype):
        raise TypeError(f"{what} must have an integer dtype, got {dtypes.short_name(t.dtype)}")


def _check_starts(x: TensorType, starts: Sequence[TensorType]) -> None:
    if len(starts) != x.ndim:
        raise ShapeError(f"needs one start index per operand axis ({x.ndim}), got {len(starts)}")
    for t in starts:
        if t.shape != ():
            raise ShapeError(f"start indices must be scalars, got {t}")
        _require_integer(t, "start indices")
    if len({t.dtype for t in starts}) > 1:
        raise TypeError("start indices must all have the same dtype")


# dynamic_slice ------------------------------------------------------------------------------


def _ds_infer(x: TensorType, *starts: TensorType, slice_sizes) -> TensorType:
    sizes = tuple(slice_sizes)
    _check_starts(x, starts)
    if len(sizes) != x.ndim:
        raise ShapeError(f"slice_sizes {list(sizes)} needs one entry per operand axis ({x.ndim})")
    for axis, (k, n) in enumerate(zip(sizes, x.shape)):
        if not 0 <= k <= n:
            raise ShapeError(f"axis {axis}: slice size {k} does not fit in size {n}")
    return TensorType(x.dtype, sizes)


def _ds_reference(x, *starts, slice_sizes):
    begin = [_clamp(s, n, k) for s, n, k in zip(starts, x.shape, slice_sizes)]
    return x[tuple(slice(b, b + k) for b, k in zip(begin, slice_sizes))].copy()


def _ds_vjp(ct, y, x, *starts, slice_sizes):
    # the same clamped starts address the same block
    return (apply("dynamic_update_slice", _zeros(x), ct, *starts),) + (None,) * len(starts)


def _ds_samples(rng):
    yield Sample((_rand(rng, (4, 5)), _index(1), _index(2)), {"slice_sizes": (2, 3)})
    # out of range on both sides: clamped to 0 and to size - slice size
    yield Sample((_rand(rng, (4, 5)), _index(-3), _index(10)), {"slice_sizes": (2, 3)})
    yield Sample((np.arange(7, dtype=np.int32), _index(5, np.int64)), {"slice_sizes": (4,)})
    yield Sample(
        (_rand(rng, (3, 4), dtypes.bfloat16), _index(2, np.uint32), _index(1, np.uint32)),
        {"slice_sizes": (1, 4)},
    )
    yield Sample((_rand(rng, (2, 3), dtypes.bool_), _index(1), _index(1)), {"slice_sizes": (0, 2)})
    yield Sample((_rand(rng, (2, 3, 4)), _index(1), _index(0), _index(3)), {"slice_sizes": (1, 3, 2)})
    yield Sample((_rand(rng, ()),), {"slice_sizes": ()})


# dynamic_update_slice -----------------------------------------------------------------------


def _dus_infer(x: TensorType, update: TensorType, *starts: TensorType) -> TensorType:
    if update.dtype != x.dtype:
        raise TypeError("update must have the operand's dtype (convert explicitly first)")
    if update.ndim != x.ndim:
        raise ShapeError(f"update of rank {update.ndim} for an operand of rank {x.ndim}")
    for axis, (u, n) in enumerate(zip(update.shape, x.shape)):
        if u > n:
            raise ShapeError(f"axis {axis}: update size {u} exceeds operand size {n}")
    _check_starts(x, starts)
    return x


def _dus_reference(x, update, *starts):
    begin = [_clamp(s, n, u) for s, n, u in zip(starts, x.shape, update.shape)]
    out = x.copy()
    out[tuple(slice(b, b + u) for b, u in zip(begin, update.shape))] = update
    return out


def _dus_vjp(ct, y, x, update, *starts):
    ct_x = apply("dynamic_update_slice", ct, _zeros(update), *starts)
    ct_update = apply("dynamic_slice", ct, *starts, slice_sizes=update.shape)
    return (ct_x, ct_update) + (None,) * len(starts)


def _dus_samples(rng):
    yield Sample((_rand(rng, (4, 5)), _rand(rng, (2, 3)), _index(1), _index(2)))
    yield Sample((_rand(rng, (4, 5)), _rand(rng, (2, 3)), _index(-1), _index(4)))  # clamped
    yield Sample((np.arange(6, dtype=np.int32), np.array([9, 9], np.int32), _index(7, np.int64)))
    yield Sample((_rand(rng, (3, 3), dtypes.bool_), _rand(rng, (3, 0), dtypes.bool_), _index(1), _index(2)))
    yield Sample(
        (
            _rand(rng, (2, 3, 4), np.float64),
            _rand(rng, (2, 3, 4), np.float64),
            _index(1, np.uint8),
            _index(0, np.uint8),
            _index(3, np.uint8),
        )
    )
    yield Sample((_rand(rng, ()), _rand(rng, ())))


# gather -------------------------------------------------------------------------------------


def _index_vector_length(indices_shape: Sequence[int], index_vector_dim: int) -> int:
    return indices_shape[index_vector_dim] if index_vector_dim < len(indices_shape) else 1


def _batch_shape(indices_shape: Sequence[int], index_vector_dim: int) -> list[int]:
    return [n for i, n in enumerate(indices_shape) if i != index_vector_dim]


def _index_vector(indices: np.ndarray, batch_index: Sequence[int], index_vector_dim: int) -> list[int]:
    """The start index vector of one batch position (the implicit length-1 vector when
    ``index_vector_dim`` is the rank of ``indices``)."""
    if index_vector_dim == indices.ndim:
        return [int(indices[tuple(batch_index)])]
    where = list(batch_index)
    where.insert(index_vector_dim, slice(None))
    return [int(v) for v in indices[tuple(where)]]


def _gather_shape(
    operand_shape,
    indices_shape,
    offset_dims,
    collapsed_slice_dims,
    start_index_map,
    index_vector_dim,
    slice_sizes,
) -> tuple[int, ...]:
    rank = len(operand_shape)
    if not 0 <= index_vector_dim <= len(indices_shape):
        raise ShapeError(
            f"index_vector_dim {index_vector_dim} out of range for indices of rank {len(indices_shape)}"
        )
    vector = _index_vector_length(indices_shape, index_vector_dim)
    if len(start_index_map) != vector:
        raise ShapeError(
            f"start_index_map {list(start_index_map)} needs one entry per index vector element ({vector})"
        )
    _check_axes(start_index_map, rank, "start_index_map", sorted_=False)
    if len(slice_sizes) != rank:
        raise ShapeError(f"slice_sizes {list(slice_sizes)} needs one entry per operand axis ({rank})")
    for axis, (k, n) in enumerate(zip(slice_sizes, operand_shape)):
        if not 0 <= k <= n:
            raise ShapeError(f"axis {axis}: slice size {k} does not fit in size {n}")
    _check_axes(collapsed_slice_dims, rank, "collapsed_slice_dims")
    if any(slice_sizes[d] != 1 for d in collapsed_slice_dims):
        raise ShapeError("collapsed_slice_dims must have slice size 1")
    if len(offset_dims) + len(collapsed_slice_dims) != rank:
        raise ShapeError(
            "every operand axis must be either collapsed or an offset dim "
            f"({len(offset_dims)} + {len(collapsed_slice_dims)} != {rank})"
        )
    batch = _batch_shape(indices_shape, index_vector_dim)
    out_rank = len(batch) + len(offset_dims)
    _check_axes(offset_dims, out_rank, "offset_dims")
    offset_sizes = iter(slice_sizes[d] for d in range(rank) if d not in collapsed_slice_dims)
    batch_sizes = iter(batch)
    return tuple(next(offset_sizes) if d in offset_dims else next(batch_sizes) for d in range(out_rank))


def _gather_infer(
    operand: TensorType,
    indices: TensorType,
    offset_dims,
    collapsed_slice_dims,
    start_index_map,
    index_vector_dim,
    slice_sizes,
    indices_are_sorted,
) -> TensorType:
    _require_integer(indices, "indices")
    shape = _gather_shape(
        operand.shape,
        indices.shape,
        tuple(offset_dims),
        tuple(collapsed_slice_dims),
        tuple(start_index_map),
        index_vector_dim,
        tuple(slice_sizes),
    )
    return TensorType(operand.dtype, shape)


def _gather_reference(
    operand,
    indices,
    offset_dims,
    collapsed_slice_dims,
    start_index_map,
    index_vector_dim,
    slice_sizes,
    indices_are_sorted,
):
    """StableHLO gather, one result element at a time (the spec's definition, literally)."""
    out_shape = _gather_shape(
        operand.shape,
        indices.shape,
        offset_dims,
        collapsed_slice_dims,
        start_index_map,
        index_vector_dim,
        slice_sizes,
    )
    rank = operand.ndim
    batch_dims = [d for d in range(len(out_shape)) if d not in offset_dims]
    window_axes = [d for d in range(rank) if d not in collapsed_slice_dims]  # operand axis of each offset dim
    out = np.zeros(out_shape, operand.dtype)
    for out_index in np.ndindex(*out_shape):
        start = _index_vector(indices, [out_index[d] for d in batch_dims], index_vector_dim)
        position = [0] * rank
        for k, axis in enumerate(start_index_map):
            position[axis] = _clamp(start[k], operand.shape[axis], slice_sizes[axis])
        for dim, axis in zip(offset_dims, window_axes):
            position[axis] += out_index[dim]
        out[out_index] = operand[tuple(position)]
    return out


def _gather_vjp(
    ct,
    y,
    operand,
    indices,
    offset_dims,
    collapsed_slice_dims,
    start_index_map,
    index_vector_dim,
    slice_sizes,
    indices_are_sorted,
):
    # Scatter the cotangent back onto the windows gather read. Gather clamps starts but scatter
    # skips windows that do not fit, so clamp the indices first: both then see the same windows.
    upper = [operand.shape[d] - slice_sizes[d] for d in start_index_map]
    zero = apply("constant", value=np.zeros((), indices.dtype))
    clamped = apply("clamp", zero, indices, _along_index_vector(indices, index_vector_dim, upper))
    ct_operand = apply(
        "scatter_add",
        _zeros(operand),
        clamped,
        ct,
        update_window_dims=offset_dims,
        inserted_window_dims=collapsed_slice_dims,
        scatter_dims_to_operand_dims=start_index_map,
        index_vector_dim=index_vector_dim,
        indices_are_sorted=indices_are_sorted,
    )
    return ct_operand, None


def _gather_samples(rng):
    x = _rand(rng, (5, 4))
    # rows of a matrix (x[idx]), with out-of-range indices that clamp
    yield Sample(
        (x, np.array([0, 4, 2, -1, 7], np.int32)),
        {
            "offset_dims": (1,),
            "collapsed_slice_dims": (0,),
            "start_index_map": (0,),
            "index_vector_dim": 1,
            "slice_sizes": (1, 4),
        },
    )
    # columns (x[:, idx]) with a 2-D index array and an explicit trailing index vector dim
    yield Sample(
        (x, np.array([[[3], [0]], [[1], [1]]], np.int64)),
        {
            "offset_dims": (0,),
            "collapsed_slice_dims": (1,),
            "start_index_map": (1,),
            "index_vector_dim": 2,
            "slice_sizes": (5, 1),
        },
    )
    # point gather x[rows, cols]: index vectors along axis 0, start_index_map reversed
    yield Sample(
        (_rand(rng, (3, 4), np.int32), np.array([[1, 3, 0], [2, 0, 5]], np.int32)),
        {
            "offset_dims": (),
            "collapsed_slice_dims": (0, 1),
            "start_index_map": (1, 0),
            "index_vector_dim": 0,
            "slice_sizes": (1, 1),
        },
    )
    # windows that are not collapsed: 2x2 patches at clamped starts
    yield Sample(
        (_rand(rng, (4, 5, 3)), np.array([[0, 1], [3, 4], [-2, 2]], np.int32)),
        {
            "offset_dims": (1, 2, 3),
            "collapsed_slice_dims": (),
            "start_index_map": (0, 1),
            "index_vector_dim": 1,
            "slice_sizes": (2, 2, 3),
        },
    )
    yield from _gather_more_samples(rng, x)


def _gather_more_samples(rng, x):
    """Offset dims before the batch dim, empty and scalar index batches, sorted indices."""
    # offset dims before the batch dim, unsigned indices, bfloat16 data
    yield Sample(
        (_rand(rng, (3, 6), dtypes.bfloat16), np.array([5, 0, 2], np.uint32)),
        {
            "offset_dims": (0, 2),
            "collapsed_slice_dims": (),
            "start_index_map": (1,),
            "index_vector_dim": 1,
            "slice_sizes": (3, 2),
            "indices_are_sorted": False,
        },
    )
    # empty index batch, bool data
    yield Sample(
        (_rand(rng, (4, 2), dtypes.bool_), np.zeros((0,), np.int32)),
        {
            "offset_dims": (1,),
            "collapsed_slice_dims": (0,),
            "start_index_map": (0,),
            "index_vector_dim": 1,
            "slice_sizes": (1, 2),
        },
    )
    # scalar index into a vector: a 0-d result
    yield Sample(
        (np.arange(6, dtype=np.float64), np.array(4, np.int32)),
        {
            "offset_dims": (),
            "collapsed_slice_dims": (0,),
            "start_index_map": (0,),
            "index_vector_dim": 0,
            "slice_sizes": (1,),
        },
    )
    # sorted indices may say so
    yield Sample(
        (x, np.array([0, 1, 1, 3], np.int32)),
        {
            "offset_dims": (1,),
            "collapsed_slice_dims": (0,),
            "start_index_map": (0,),
            "index_vector_dim": 1,
            "slice_sizes": (1, 2),
            "indices_are_sorted": True,
        },
    )


def _dims_attr(kind: str, fields: Sequence[tuple[str, Sequence[int] | int]]) -> str:
    """``#stablehlo.gather<...>`` / ``#stablehlo.scatter<...>``; empty lists are left out, as
    StableHLO prints them."""
    parts = []
    for name, value in fields:
        if isinstance(value, int):
            parts.append(f"{name} = {value}")
        elif value:
            parts.append(f"{name} = [{', '.join(str(int(v)) for v in value)}]")
    return f"#stablehlo.{kind}<{', '.join(parts)}>"


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _gather_emit(em, node, operand, indices):
    dims = _dims_attr(
        "gather",
        [
            ("offset_dims", node.attr("offset_dims")),
            ("collapsed_slice_dims", node.attr("collapsed_slice_dims")),
            ("start_index_map", node.attr("start_index_map")),
            ("index_vector_dim", node.attr("index_vector_dim")),
        ],
    )
    return em.simple(
        "stablehlo.gather",
        node,
        operand,
        indices,
        attrs={
            "dimension_numbers": dims,
            "slice_sizes": i64_array(node.attr("slice_sizes")),
            "indices_are_sorted": _bool(node.attr("indices_are_sorted")),
        },
    )


# scatter_add --------------------------------------------------------------------------------


def _scatter_check(
    operand_shape,
    indices_shape,
    updates_shape,
    update_window_dims,
    inserted_window_dims,
    scatter_dims_to_operand_dims,
    index_vector_dim,
) -> None:
    rank = len(operand_shape)
    if not 0 <= index_vector_dim <= len(indices_shape):
        raise ShapeError(
            f"index_vector_dim {index_vector_dim} out of range for indices of rank {len(indices_shape)}"
        )
    vector = _index_vector_length(indices_shape, index_vector_dim)
    if len(scatter_dims_to_operand_dims) != vector:
        raise ShapeError(
            f"scatter_dims_to_operand_dims {list(scatter_dims_to_operand_dims)} needs one "
            f"entry per index vector element ({vector})"
        )
    _check_axes(scatter_dims_to_operand_dims, rank, "scatter_dims_to_operand_dims", sorted_=False)
    _check_axes(update_window_dims, len(updates_shape), "update_window_dims")
    _check_axes(inserted_window_dims, rank, "inserted_window_dims")
    if len(update_window_dims) + len(inserted_window_dims) != rank:
        raise ShapeError(
            "every operand axis must be either inserted or an update window dim "
            f"({len(update_window_dims)} + {len(inserted_window_dims)} != {rank})"
        )
    scatter_sizes = [n for d, n in enumerate(updates_shape) if d not in update_window_dims]
    batch = _batch_shape(indices_shape, index_vector_dim)
    if scatter_sizes != batch:
        raise ShapeError(f"the update scatter dims {scatter_sizes} must match the index batch shape {batch}")
    window_axes = [d for d in range(rank) if d not in inserted_window_dims]
    for dim, axis in zip(update_window_dims, window_axes):
        if updates_shape[dim] > operand_shape[axis]:
            raise ShapeError(
                f"update window dim {dim} of size {updates_shape[dim]} exceeds operand axis "
                f"{axis} of size {operand_shape[axis]}"
            )


def _scatter_infer(
    operand: TensorType,
    indices: TensorType,
    updates: TensorType,
    update_window_dims,
    inserted_window_dims,
    scatter_dims_to_operand_dims,
    index_vector_dim,
    indices_are_sorted,
    unique_indices,
) -> TensorType:
    _require_integer(indices, "indices")
    if updates.dtype != operand.dtype:
        raise TypeError("updates must have the operand's dtype (convert explicitly first)")
    _scatter_check(
        operand.shape,
        indices.shape,
        updates.shape,
        tuple(update_window_dims),
        tuple(inserted_window_dims),
        tuple(scatter_dims_to_operand_dims),
        index_vector_dim,
    )
    return operand


def _scatter_reference(
    operand,
    indices,
    updates,
    update_window_dims,
    inserted_window_dims,
    scatter_dims_to_operand_dims,
    index_vector_dim,
    indices_are_sorted,
    unique_indices,
    combine=lambda old, new: old + new,
):
    """StableHLO scatter, one update element at a time in order; a window that does not fit
    entirely inside the operand is skipped (what XLA does). ``combine(old, new)`` is the update
    computation (``+`` for scatter_add: duplicates accumulate)."""
    rank = operand.ndim
    scatter_dims = [d for d in range(updates.ndim) if d not in update_window_dims]
    window_axes = [d for d in range(rank) if d not in inserted_window_dims]
    window_size = [1] * rank
    for dim, axis in zip(update_window_dims, window_axes):
        window_size[axis] = updates.shape[dim]
    out = operand.copy()
    for update_index in np.ndindex(*updates.shape):
        start = _index_vector(indices, [update_index[d] for d in scatter_dims], index_vector_dim)
        position = [0] * rank
        for k, axis in enumerate(scatter_dims_to_operand_dims):
            position[axis] = start[k]
        if any(not 0 <= p <= n - w for p, n, w in zip(position, operand.shape, window_size)):
            continue
        for dim, axis in zip(update_window_dims, window_axes):
            position[axis] += update_index[dim]
        where = tuple(position)
        out[where] = combine(out[where], updates[update_index])
    return out


def _scatter_vjp(
    ct,
    y,
    operand,
    indices,
    updates,
    update_window_dims,
    inserted_window_dims,
    scatter_dims_to_operand_dims,
    index_vector_dim,
    indices_are_sorted,
    unique_indices,
):
    rank = operand.ndim
    window_axes = [d for d in range(rank) if d not in inserted_window_dims]
    slice_sizes = [1] * rank
    for dim, axis in zip(update_window_dims, window_axes):
        slice_sizes[axis] = updates.shape[dim]
    gathered = apply(
        "gather",
        ct,
        indices,
        offset_dims=update_window_dims,
        collapsed_slice_dims=inserted_window_dims,
        start_index_map=scatter_dims_to_operand_dims,
        index_vector_dim=index_vector_dim,
        slice_sizes=tuple(slice_sizes),
        indices_are_sorted=indices_are_sorted,
    )
    # A skipped window (one that does not fit) contributed nothing, so its cotangent is zero;
    # gather would have clamped it onto some other window instead.
    upper = [operand.shape[d] - slice_sizes[d] for d in scatter_dims_to_operand_dims]
    lower = _along_index_vector(indices, index_vector_dim, [0] * len(upper))
    upper = _along_index_vector(indices, index_vector_dim, upper)
    fits = apply(
        "and",
        apply("compare", indices, lower, direction="GE"),
        apply("compare", indices, upper, direction="LE"),
    )
    if index_vector_dim < indices.ndim:
        fits = apply("reduce", fits, kind="and", dimensions=(index_vector_dim,))
    scatter_dims = tuple(d for d in range(updates.ndim) if d not in update_window_dims)
    mask = apply("broadcast_in_dim", fits, shape=updates.shape, broadcast_dimensions=scatter_dims)
    return ct, None, apply("select", mask, gathered, _zeros(updates))


def _scatter_samples(rng):
    x = _rand(rng, (5, 3))
    # x.at[idx].add(rows): duplicate 1 accumulates, -1 and 5 are out of range and skipped
    yield Sample(
        (x, np.array([1, 4, 1, -1, 5], np.int32), _rand(rng, (5, 3))),
        {
            "update_window_dims": (1,),
            "inserted_window_dims": (0,),
            "scatter_dims_to_operand_dims": (0,),
            "index_vector_dim": 1,
        },
    )
    # point updates x.at[rows, cols].add(v) with int data
    yield Sample(
        (
            _rand(rng, (3, 4), np.int32),
            np.array([[0, 1], [2, 3], [0, 1], [2, 4]], np.int32),
            _rand(rng, (4,), np.int32),
        ),
        {
            "update_window_dims": (),
            "inserted_window_dims": (0, 1),
            "scatter_dims_to_operand_dims": (0, 1),
            "index_vector_dim": 1,
        },
    )
    # 2x2 windows: the one starting at row 3 would cross the edge and is skipped as a whole
    yield Sample(
        (_rand(rng, (4, 4)), np.array([[0, 0], [2, 1], [3, 0], [1, 2]], np.int64), _rand(rng, (4, 2, 2))),
        {
            "update_window_dims": (1, 2),
            "inserted_window_dims": (),
            "scatter_dims_to_operand_dims": (0, 1),
            "index_vector_dim": 1,
        },
    )
    yield from _scatter_more_samples(rng)


def _scatter_more_samples(rng):
    """Column and vector updates, an empty scatter and low-precision accumulation."""
    # column updates with a 2-D index batch and the window dim first; float64
    yield Sample(
        (_rand(rng, (2, 5), np.float64), np.array([[4, 0, 4]], np.int32), _rand(rng, (2, 1, 3), np.float64)),
        {
            "update_window_dims": (0,),
            "inserted_window_dims": (1,),
            "scatter_dims_to_operand_dims": (1,),
            "index_vector_dim": 2,
            "indices_are_sorted": False,
            "unique_indices": False,
        },
    )
    # unique, sorted indices into a vector (unsigned indices)
    yield Sample(
        (np.arange(6, dtype=np.float32), np.array([0, 2, 5], np.uint32), np.array([10, 20, 30], np.float32)),
        {
            "update_window_dims": (),
            "inserted_window_dims": (0,),
            "scatter_dims_to_operand_dims": (0,),
            "index_vector_dim": 1,
            "indices_are_sorted": True,
            "unique_indices": True,
        },
    )
    # nothing to scatter
    yield Sample(
        (_rand(rng, (3, 2)), np.zeros((0,), np.int32), np.zeros((0, 2), np.float32)),
        {
            "update_window_dims": (1,),
            "inserted_window_dims": (0,),
            "scatter_dims_to_operand_dims": (0,),
            "index_vector_dim": 1,
        },
    )
    # bfloat16 accumulation of duplicates
    yield Sample(
        (
            _rand(rng, (4,), dtypes.bfloat16),
            np.array([[1], [1], [3]], np.int32),
            _rand(rng, (3,), dtypes.bfloat16),
        ),
        {
            "update_window_dims": (),
            "inserted_window_dims": (0,),
            "scatter_dims_to_operand_dims": (0,),
            "index_vector_dim": 1,
        },
        rtol=2e-2,
        atol=2e-2,
    )


def _scatter_emit(em, node, operand, indices, updates, kind="add"):
    scalar = TensorType(node.types[0].dtype, ())

    def body(inner, args):
        if kind == "set":
            return [args[1]]
        return inner.op(_SCATTER_COMBINERS[kind][0], args, [scalar, scalar], [scalar])

    combine = em.region([scalar, scalar], body)
    dims = _dims_attr(
        "scatter",
        [
            ("update_window_dims", node.attr("update_window_dims")),
            ("inserted_window_dims", node.attr("inserted_window_dims")),
            ("scatter_dims_to_operand_dims", node.attr("scatter_dims_to_operand_dims")),
            ("index_vector_dim", node.attr("index_vector_dim")),
        ],
    )
    return em.simple(
        "stablehlo.scatter",
        node,
        operand,
        indices,
        updates,
        regions=[combine],
        attrs={
            "scatter_dimension_numbers": dims,
            "indices_are_sorted": _bool(node.attr("indices_are_sorted")),
            "unique_indices": _bool(node.attr("unique_indices")),
        },
    )


# scatter (general) --------------------------------------------------------------------------

# kind -> (StableHLO op of the update computation, NumPy combine(old, new))
_SCATTER_COMBINERS = {
    "set": (None, lambda old, new: new),
    "add": ("stablehlo.add", lambda old, new: old + new),
    "multiply": ("stablehlo.multiply", lambda old, new: old * new),
    "min": ("stablehlo.minimum", np.minimum),
    "max": ("stablehlo.maximum", np.maximum),
}


def _general_scatter_infer(
    operand: TensorType,
    indices: TensorType,
    updates: TensorType,
    kind,
    update_window_dims,
    inserted_window_dims,
    scatter_dims_to_operand_dims,
    index_vector_dim,
    indices_are_sorted,
    unique_indices,
) -> TensorType:
    if kind not in _SCATTER_COMBINERS:
        raise ValueError(f"kind must be one of {', '.join(_SCATTER_COMBINERS)}, got {kind!r}")
    if kind != "set" and dtypes.is_bool(operand.dtype):
        raise TypeError(f"scatter kind {kind!r} needs numeric operands, got bool")
    return _scatter_infer(
        operand,
        indices,
        updates,
        update_window_dims,
        inserted_window_dims,
        scatter_dims_to_operand_dims,
        index_vector_dim,
        indices_are_sorted,
        unique_indices,
    )


def _general_scatter_reference(operand, indices, updates, kind, **dims):
    return _scatter_reference(operand, indices, updates, combine=_SCATTER_COMBINERS[kind][1], **dims)


def _window_slice_sizes(operand, updates, update_window_dims, inserted_window_dims) -> tuple[int, ...]:
    window_axes = [d for d in range(operand.ndim) if d not in inserted_window_dims]
    sizes = [1] * operand.ndim
    for dim, axis in zip(update_window_dims, window_axes):
        sizes[axis] = updates.shape[dim]
    return tuple(sizes)


def _window_gather(
    x,
    indices,
    updates,
    update_window_dims,
    inserted_window_dims,
    scatter_dims_to_operand_dims,
    index_vector_dim,
    indices_are_sorted,
    **_,
):
    """``x`` read back at the places each update element was written to (shaped like updates);
    meaningful where :func:`_window_fits` holds."""
    return apply(
        "gather",
        x,
        indices,
        offset_dims=update_window_dims,
        collapsed_slice_dims=inserted_window_dims,
        start_index_map=scatter_dims_to_operand_dims,
        index_vector_dim=index_vector_dim,
        slice_sizes=_window_slice_sizes(x, updates, update_window_dims, inserted_window_dims),
        indices_are_sorted=indices_are_sorted,
    )


def _window_fits(
    operand,
    indices,
    updates,
    update_window_dims,
    inserted_window_dims,
    scatter_dims_to_operand_dims,
    index_vector_dim,
    **_,
):
    """Bool, shaped like updates: whether the element's window fits (else scatter skipped it)."""
    sizes = _window_slice_sizes(operand, updates, update_window_dims, inserted_window_dims)
    upper = [operand.shape[d] - sizes[d] for d in scatter_dims_to_operand_dims]
    lower = _along_index_vector(indices, index_vector_dim, [0] * len(upper))
    upper = _along_index_vector(indices, index_vector_dim, upper)
    fits = apply(
        "and",
        apply("compare", indices, lower, direction="GE"),
        apply("compare", indices, upper, direction="LE"),
    )
    if index_vector_dim < indices.ndim:
        fits = apply("reduce", fits, kind="and", dimensions=(index_vector_dim,))
    scatter_dims = tuple(d for d in range(updates.ndim) if d not in update_window_dims)
    return apply("broadcast_in_dim", fits, shape=updates.shape, broadcast_dimensions=scatter_dims)


def _general_scatter_vjp(ct, y, operand, indices, updates, kind, **dims):
    zeros_u = _zeros(updates)
    fits = _window_fits(operand, indices, updates, **dims)
    if kind == "add":
        return ct, None, apply("select", fits, _window_gather(ct, indices, updates, **dims), zeros_u)
    if kind == "set":
        # Which update element won each written position: scatter element ids (1-based; 0 = none)
        # and read them back, as XLA applies duplicates in an unspecified order.
        ids = apply("iota", dtype=np.dtype(np.int32), shape=(updates.size,), dimension=0)
        one = apply(
            "broadcast_in_dim",
            apply("constant", value=np.ones((), np.int32)),
            shape=(updates.size,),
            broadcast_dimensions=(),
        )
        ids = apply("reshape", apply("add", ids, one), shape=updates.shape)
        owner = apply("scatter", _zeros_of(operand.shape, np.int32), indices, ids, kind="set", **dims)
        untouched = apply("compare", owner, _zeros_of(operand.shape, np.int32), direction="EQ")
        won = apply(
            "and",
            fits,
            apply("compare", _window_gather(owner, indices, updates, **dims), ids, direction="EQ"),
        )
        return (
            apply("select", untouched, ct, _zeros(operand)),
            None,
            apply("select", won, _window_gather(ct, indices, updates, **dims), zeros_u),
        )
    if kind == "multiply":
        if not dims["unique_indices"]:
            raise GradientError(
                "scatter with kind='multiply' is differentiable only with unique_indices=True (as in XLA/JAX)"
            )
        ct_operand = apply("scatter", ct, indices, updates, kind="multiply", **dims)
        ct_updates = _window_gather(apply("multiply", ct, operand), indices, updates, **dims)
        return ct_operand, None, apply("select", fits, ct_updates, zeros_u)
    # min / max: the winners share the cotangent equally (ties split it, as JAX does)
    dtype = operand.dtype
    operand_won = apply("convert", apply("compare", operand, y, direction="EQ"), dtype=dtype)
    update_won = apply(
        "and", fits, apply("compare", updates, _window_gather(y, indices, updates, **dims), direction="EQ")
    )
    update_won = apply("convert", update_won, dtype=dtype)
    count = apply("add", operand_won, apply("scatter_add", _zeros(operand), indices, update_won, **dims))
    one = apply(
        "broadcast_in_dim",
        apply("constant", value=np.ones((), dtype)),
        shape=operand.shape,
        broadcast_dimensions=(),
    )
    share = apply("divide", ct, apply("maximum", count, one))
    return (
        apply("multiply", share, operand_won),
        None,
        apply("multiply", _window_gather(share, indices, updates, **dims), update_won),
    )


def _zeros_of(shape, dtype):
    zero = apply("constant", value=np.zeros((), dtype))
    return apply("broadcast_in_dim", zero, shape=tuple(shape), broadcast_dimensions=()) if shape else zero


_ROWS = {
    "update_window_dims": (1,),
    "inserted_window_dims": (0,),
    "scatter_dims_to_operand_dims": (0,),
    "index_vector_dim": 1,
}


def _general_scatter_samples(rng):
    # x.at[idx].set(rows), unique rows; 7 is out of range and skipped
    yield Sample(
        (_rand(rng, (5, 3)), np.array([3, 0, 7], np.int32), _rand(rng, (3, 3))), {"kind": "set", **_ROWS}
    )
    # x.at[idx].max / .min with duplicates (no ties) and a skipped window
    for kind in ("max", "min"):
        yield Sample(
            (_rand(rng, (5, 3)), np.array([1, 4, 1, -1], np.int32), _rand(rng, (4, 3))),
            {"kind": kind, **_ROWS},
        )
    # x.at[idx].multiply with unique indices (differentiable) and with duplicates on ints
    yield Sample(
        (_rand(rng, (6,), np.float64), np.array([[5], [0], [2]], np.int32), _rand(rng, (3,), np.float64)),
        {
            "kind": "multiply",
            "update_window_dims": (),
            "inserted_window_dims": (0,),
            "scatter_dims_to_operand_dims": (0,),
            "index_vector_dim": 1,
            "unique_indices": True,
        },
    )
    yield Sample(
        (
            _rand(rng, (3, 4), np.int32),
            np.array([[0, 1], [0, 1], [2, 3]], np.int32),
            _rand(rng, (3,), np.int32),
        ),
        {
            "kind": "multiply",
            "update_window_dims": (),
            "inserted_window_dims": (0, 1),
            "scatter_dims_to_operand_dims": (0, 1),
            "index_vector_dim": 1,
        },
    )
    yield Sample(
        (_rand(rng, (5, 3)), np.array([1, 4, 1], np.int32), _rand(rng, (3, 3))), {"kind": "add", **_ROWS}
    )
    # 2x2 windows written with set; bool data; point writes with the index vector first
    yield Sample(
        (_rand(rng, (4, 4)), np.array([[0, 0], [2, 2], [3, 1]], np.int64), _rand(rng, (3, 2, 2))),
        {
            "kind": "set",
            "update_window_dims": (1, 2),
            "inserted_window_dims": (),
            "scatter_dims_to_operand_dims": (0, 1),
            "index_vector_dim": 1,
        },
    )
    yield Sample(
        (
            _rand(rng, (3, 4), dtypes.bool_),
            np.array([[0, 2], [3, 1]], np.int32),
            _rand(rng, (2,), dtypes.bool_),
        ),
        {
            "kind": "set",
            "update_window_dims": (),
            "inserted_window_dims": (0, 1),
            "scatter_dims_to_operand_dims": (0, 1),
            "index_vector_dim": 0,
        },
    )
    yield Sample(
        (
            _rand(rng, (4,), dtypes.bfloat16),
            np.array([[1], [3]], np.int32),
            _rand(rng, (2,), dtypes.bfloat16),
        ),
        {
            "kind": "max",
            "update_window_dims": (),
            "inserted_window_dims": (0,),
            "scatter_dims_to_operand_dims": (0,),
            "index_vector_dim": 1,
        },
    )


def _scatter_flops(inputs, outputs, **attrs) -> int:
    """One operation per update element, except for ``kind="set"``, which only moves data."""
    return 0 if attrs.get("kind") == "set" else inputs[-1].size


OPS = [
    OpDef(
        name="dynamic_slice",
        traits=(),
        batch=dynamic_slice_batch,
        arity=None,
        attrs=("slice_sizes",),
        infer=_ds_infer,
        reference=_ds_reference,
        emit=lambda em, node, x, *starts: em.simple(
            "stablehlo.dynamic_slice",
            node,
            x,
            *starts,
            attrs={"slice_sizes": i64_array(node.attr("slice_sizes"))},
        ),
        samples=_ds_samples,
        vjp=_ds_vjp,
        doc="dynamic_slice(x, *starts): the block of ``slice_sizes`` at run-time scalar integer "
        "starts (one per axis), each clamped into [0, size - slice size].",
    ),
    OpDef(
        name="dynamic_update_slice",
        traits=(),
        arity=None,
        infer=_dus_infer,
        reference=_dus_reference,
        batch=dynamic_update_slice_batch,
        emit=lambda em, node, x, update, *starts: em.simple(
            "stablehlo.dynamic_update_slice", node, x, update, *starts
        ),
        samples=_dus_samples,
        vjp=_dus_vjp,
        doc="dynamic_update_slice(x, update, *starts): ``x`` with ``update`` written at run-time "
        "scalar integer starts (one per axis), each clamped into [0, size - update size].",
    ),
    OpDef(
        name="gather",
        traits=(),
        batch=gather_batch,
        arity=2,
        attrs=("offset_dims", "collapsed_slice_dims", "start_index_map", "index_vector_dim", "slice_sizes"),
        optional={"indices_are_sorted": False},
        infer=_gather_infer,
        reference=_gather_reference,
        emit=_gather_emit,
        samples=_gather_samples,
        vjp=_gather_vjp,
        doc="gather(operand, indices): StableHLO gather (slices of ``slice_sizes`` at the start "
        "positions in ``indices``; starts are clamped so each slice fits). Batching dims "
        "(operand_batching_dims / start_indices_batching_dims) are not supported.",
    ),
    OpDef(
        name="scatter_add",
        traits=(),
        stablehlo=None,  # a stablehlo.scatter adding its updates: imported from that
        flops=_scatter_flops,
        batch=scatter_batch("scatter_add"),
        arity=3,
        attrs=(
            "update_window_dims",
            "inserted_window_dims",
            "scatter_dims_to_operand_dims",
            "index_vector_dim",
        ),
        optional={"indices_are_sorted": False, "unique_indices": False},
        infer=_scatter_infer,
        reference=_scatter_reference,
        emit=_scatter_emit,
        samples=_scatter_samples,
        vjp=_scatter_vjp,
        doc="scatter_add(operand, indices, updates): StableHLO scatter with ``+`` as the update "
        "computation; duplicate indices accumulate and a window that does not fit in the operand "
        "is skipped. Batching dims are not supported.",
    ),
    OpDef(
        name="scatter",
        traits=(),
        flops=_scatter_flops,
        arity=3,
        batch=scatter_batch("scatter"),
        attrs=(
            "kind",
            "update_window_dims",
            "inserted_window_dims",
            "scatter_dims_to_operand_dims",
            "index_vector_dim",
        ),
        optional={"indices_are_sorted": False, "unique_indices": False},
        infer=_general_scatter_infer,
        reference=_general_scatter_reference,
        emit=lambda em, node, *operands: _scatter_emit(em, node, *operands, kind=node.attr("kind")),
        samples=_general_scatter_samples,
        vjp=_general_scatter_vjp,
        doc="scatter(operand, indices, updates, kind=): StableHLO scatter whose update computation "
        "is ``kind``: 'set' (the update replaces; among duplicate indices one unspecified update "
        "wins), 'add', 'multiply', 'min' or 'max'. A window that does not fit in the operand is "
        "skipped. Gradients: 'multiply' needs unique_indices; 'min'/'max' split ties evenly. "
        "Batching dims are not supported.",
    ),
]
