"""``gather``: slices of an operand at start positions held in an index array, StableHLO's
general form of ``x[idx]``. Starts are clamped so each slice fits inside the operand.
"""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.emit import i64_array
from kaun_ir.ops.indexing_batch import gather_batch
from kaun_ir.ops.indexing_common import (
    along_index_vector,
    batch_shape,
    check_axes,
    clamp_start,
    dims_attr,
    hlo_bool,
    index_vector,
    index_vector_length,
    random_array,
    require_integer,
    zeros_like,
)
from kaun_ir.ops.rules import apply


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
    vector = index_vector_length(indices_shape, index_vector_dim)
    if len(start_index_map) != vector:
        raise ShapeError(
            f"start_index_map {list(start_index_map)} needs one entry per index vector element ({vector})"
        )
    check_axes(start_index_map, rank, "start_index_map", sorted_=False)
    if len(slice_sizes) != rank:
        raise ShapeError(f"slice_sizes {list(slice_sizes)} needs one entry per operand axis ({rank})")
    for axis, (k, n) in enumerate(zip(slice_sizes, operand_shape)):
        if not 0 <= k <= n:
            raise ShapeError(f"axis {axis}: slice size {k} does not fit in size {n}")
    check_axes(collapsed_slice_dims, rank, "collapsed_slice_dims")
    if any(slice_sizes[d] != 1 for d in collapsed_slice_dims):
        raise ShapeError("collapsed_slice_dims must have slice size 1")
    if len(offset_dims) + len(collapsed_slice_dims) != rank:
        raise ShapeError(
            "every operand axis must be either collapsed or an offset dim "
            f"({len(offset_dims)} + {len(collapsed_slice_dims)} != {rank})"
        )
    batch = batch_shape(indices_shape, index_vector_dim)
    out_rank = len(batch) + len(offset_dims)
    check_axes(offset_dims, out_rank, "offset_dims")
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
    require_integer(indices, "indices")
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
        start = index_vector(indices, [out_index[d] for d in batch_dims], index_vector_dim)
        position = [0] * rank
        for k, axis in enumerate(start_index_map):
            position[axis] = clamp_start(start[k], operand.shape[axis], slice_sizes[axis])
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
    clamped = apply("clamp", zero, indices, along_index_vector(indices, index_vector_dim, upper))
    ct_operand = apply(
        "scatter_add",
        zeros_like(operand),
        clamped,
        ct,
        update_window_dims=offset_dims,
        inserted_window_dims=collapsed_slice_dims,
        scatter_dims_to_operand_dims=start_index_map,
        index_vector_dim=index_vector_dim,
        indices_are_sorted=indices_are_sorted,
    )
    return ct_operand, None


def _gather_emit(em, node, operand, indices):
    dims = dims_attr(
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
            "indices_are_sorted": hlo_bool(node.attr("indices_are_sorted")),
        },
    )


def _gather_samples(rng):
    x = random_array(rng, (5, 4))
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
        (random_array(rng, (3, 4), np.int32), np.array([[1, 3, 0], [2, 0, 5]], np.int32)),
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
        (random_array(rng, (4, 5, 3)), np.array([[0, 1], [3, 4], [-2, 2]], np.int32)),
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
        (random_array(rng, (3, 6), dtypes.bfloat16), np.array([5, 0, 2], np.uint32)),
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
        (random_array(rng, (4, 2), dtypes.bool_), np.zeros((0,), np.int32)),
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


OPS = [
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
]
