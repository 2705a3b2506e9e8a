"""Batching rules of the indexing ops (``dynamic_slice``, ``gather``, ``scatter_add``, ``scatter``).

Positions that differ per example become index vectors with one more component, the example's
number, so one ``gather`` / ``scatter_add`` serves the whole batch; positions shared by every
example keep the op and let the batch axis ride along as a full-size window.
"""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.ops.batching import materialize, shift
from kaun_ir.ops.rules import apply


def _index_dtype(dt) -> np.dtype:
    """Indices are widened to int64 unless int32/int64 already: the example number must fit and
    unsigned starts must stay non-negative."""
    dt = np.dtype(dt)
    return dt if dt in (np.dtype(np.int32), np.dtype(np.int64)) else np.dtype(np.int64)


def _convert(x, dt):
    return x if x.dtype == dt else apply("convert", x, dtype=dt)


def _with_example_number(indices, batched: bool, size: int, index_vector_dim: int):
    """Batched indices whose index vectors start with the example number; returns the indices and
    the index vector dim in them."""
    idx = materialize([indices], [batched], size)[0]
    example_rank = idx.ndim - 1
    if index_vector_dim == example_rank:  # the implicit length-1 vector: make it explicit
        idx = apply("reshape", idx, shape=tuple(idx.shape) + (1,))
    vector_dim = index_vector_dim + 1
    idx = _convert(idx, _index_dtype(idx.dtype))
    shape = list(idx.shape)
    shape[vector_dim] = 1
    number = apply("iota", dtype=idx.dtype, shape=tuple(shape), dimension=0)
    return apply("concatenate", number, idx, dimension=vector_dim), vector_dim


def gather_batch(
    batched,
    size,
    operand,
    indices,
    offset_dims,
    collapsed_slice_dims,
    start_index_map,
    index_vector_dim,
    slice_sizes,
    indices_are_sorted,
):
    """Shared indices: the batch axis is one more (leading) offset dim, a full-size window.
    Per-example indices: each index vector gains the example number, for a collapsed new axis 0."""
    if not batched[1]:
        return apply(
            "gather",
            operand,
            indices,
            offset_dims=(0,) + shift(offset_dims),
            collapsed_slice_dims=shift(collapsed_slice_dims),
            start_index_map=shift(start_index_map),
            index_vector_dim=index_vector_dim,
            slice_sizes=(size,) + tuple(slice_sizes),
            indices_are_sorted=indices_are_sorted,
        )
    operand = materialize([operand], [batched[0]], size)[0]
    idx, vector_dim = _with_example_number(indices, True, size, index_vector_dim)
    return apply(
        "gather",
        operand,
        idx,
        offset_dims=shift(offset_dims),
        collapsed_slice_dims=(0,) + shift(collapsed_slice_dims),
        start_index_map=(0,) + shift(start_index_map),
        index_vector_dim=vector_dim,
        slice_sizes=(1,) + tuple(slice_sizes),
        indices_are_sorted=False,
    )


def scatter_batch(name: str):
    """The rule of ``scatter_add`` and ``scatter`` (any update computation). Shared indices: the
    batch axis is a leading update window dim covering the whole batch. Per-example indices: each
    index vector gains the example number (a new inserted axis 0), so examples never collide."""

    def rule(
        batched,
        size,
        operand,
        indices,
        updates,
        update_window_dims,
        inserted_window_dims,
        scatter_dims_to_operand_dims,
        index_vector_dim,
        indices_are_sorted,
        unique_indices,
        **extra,
    ):
        operand, updates = materialize([operand, updates], [batched[0], batched[2]], size)
        if not batched[1]:
            return apply(
                name,
                operand,
                indices,
                updates,
                update_window_dims=(0,) + shift(update_window_dims),
                inserted_window_dims=shift(inserted_window_dims),
                scatter_dims_to_operand_dims=shift(scatter_dims_to_operand_dims),
                index_vector_dim=index_vector_dim,
                indices_are_sorted=indices_are_sorted,
                unique_indices=unique_indices,
                **extra,
            )
        idx, vector_dim = _with_example_number(indices, True, size, index_vector_dim)
        return apply(
            name,
            operand,
            idx,
            updates,
            update_window_dims=shift(update_window_dims),
            inserted_window_dims=(0,) + shift(inserted_window_dims),
            scatter_dims_to_operand_dims=(0,) + shift(scatter_dims_to_operand_dims),
            index_vector_dim=vector_dim,
            indices_are_sorted=False,
            unique_indices=unique_indices,
            **extra,
        )

    rule.__doc__ = f"Batching rule of {name}: " + (scatter_batch.__doc__ or "").split(". ", 1)[1]
    return rule


def _start_vectors(starts, batched, size):
    """The per-example starts as one ``[size, rank + 1]`` index array (example number first)."""
    dt = _index_dtype(starts[0].dtype) if starts else np.dtype(np.int32)
    columns = [apply("iota", dtype=dt, shape=(size, 1), dimension=0)]
    for s, b in zip(starts, batched):
        s = _convert(s, dt)
        columns.append(apply("broadcast_in_dim", s, shape=(size, 1), broadcast_dimensions=(0,) if b else ()))
    return apply("concatenate", *columns, dimension=1)


def _zero_start(starts):
    dt = starts[0].dtype if starts else np.dtype(np.int32)
    return apply("constant", value=np.zeros((), dt))


def dynamic_slice_batch(batched, size, x, *starts, slice_sizes):
    """Shared starts: one dynamic_slice with a leading full-size block. Per-example starts: a
    gather of one block per example (gather clamps starts exactly like dynamic_slice)."""
    x = materialize([x], [batched[0]], size)[0]
    if not any(batched[1:]):
        return apply(
            "dynamic_slice", x, _zero_start(starts), *starts, slice_sizes=(size,) + tuple(slice_sizes)
        )
    rank = len(starts)
    idx = _start_vectors(starts, batched[1:], size)
    return apply(
        "gather",
        x,
        idx,
        offset_dims=tuple(range(1, rank + 1)),
        collapsed_slice_dims=(0,),
        start_index_map=tuple(range(rank + 1)),
        index_vector_dim=1,
        slice_sizes=(1,) + tuple(slice_sizes),
    )


def dynamic_update_slice_batch(batched, size, x, update, *starts):
    """Shared starts: one dynamic_update_slice over the whole batch. Per-example starts: the
    starts are clamped as dynamic_update_slice does, each example's update is scattered onto
    -0.0 (so every value, -0.0 included, arrives unchanged) and chosen where a scattered mask of
    ones says an update landed."""
    x, update = materialize([x, update], batched[:2], size)
    if not any(batched[2:]):
        return apply("dynamic_update_slice", x, update, _zero_start(starts), *starts)
    rank = len(starts)
    dt = _index_dtype(starts[0].dtype)
    clamped = []
    for s, n, u in zip(starts, x.shape[1:], update.shape[1:]):
        low = apply("constant", value=np.zeros((), dt))
        high = apply("constant", value=np.asarray(n - u, dt))
        clamped.append(apply("clamp", low, _convert(s, dt), high))
    idx = _start_vectors(clamped, batched[2:], size)
    numbers = dict(
        update_window_dims=tuple(range(1, rank + 1)),
        inserted_window_dims=(0,),
        scatter_dims_to_operand_dims=tuple(range(rank + 1)),
        index_vector_dim=1,
    )
    values, target = update, x
    if dtypes.is_bool(x.dtype):  # scatter adds; bools travel as uint8
        values, target = _convert(update, np.dtype(np.uint8)), _convert(x, np.dtype(np.uint8))
    base = np.asarray(-0.0 if dtypes.is_float(values.dtype) else 0, values.dtype)
    init = apply(
        "broadcast_in_dim", apply("constant", value=base), shape=target.shape, broadcast_dimensions=()
    )
    scattered = apply("scatter_add", init, idx, values, **numbers)
    one = apply("constant", value=np.ones((), np.int32))
    zero = apply("constant", value=np.zeros((), np.int32))
    ones = apply("broadcast_in_dim", one, shape=update.shape, broadcast_dimensions=())
    zeros = apply("broadcast_in_dim", zero, shape=x.shape, broadcast_dimensions=())
    hit = apply("scatter_add", zeros, idx, ones, **numbers)
    mask = apply("compare", hit, zeros, direction="GT")
    if dtypes.is_bool(x.dtype):
        scattered = apply(
            "compare",
            scattered,
            apply(
                "broadcast_in_dim",
                apply("constant", value=np.zeros((), np.uint8)),
                shape=x.shape,
                broadcast_dimensions=(),
            ),
            direction="NE",
        )
    return apply("select", mask, scattered, x)
