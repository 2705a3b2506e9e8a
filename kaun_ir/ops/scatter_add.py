"""``scatter_add``, and the StableHLO scatter semantics that ``scatter`` shares with it: the
shape rule, the element-by-element reference, the update computations and the emission.

Updates are written at start positions held in an index array, ``x.at[idx].add(u)`` in general
form; a window that does not fit entirely inside the operand is skipped (what XLA does), and
duplicate indices combine (accumulate, for ``+``).
"""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.indexing_batch import scatter_batch
from kaun_ir.ops.indexing_common import (
    batch_shape,
    check_axes,
    dims_attr,
    hlo_bool,
    index_vector,
    index_vector_length,
    random_array,
    require_integer,
)
from kaun_ir.ops.scatter_vjp import scatter_add_vjp


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
    vector = index_vector_length(indices_shape, index_vector_dim)
    if len(scatter_dims_to_operand_dims) != vector:
        raise ShapeError(
            f"scatter_dims_to_operand_dims {list(scatter_dims_to_operand_dims)} needs one "
            f"entry per index vector element ({vector})"
        )
    check_axes(scatter_dims_to_operand_dims, rank, "scatter_dims_to_operand_dims", sorted_=False)
    check_axes(update_window_dims, len(updates_shape), "update_window_dims")
    check_axes(inserted_window_dims, rank, "inserted_window_dims")
    if len(update_window_dims) + len(inserted_window_dims) != rank:
        raise ShapeError(
            "every operand axis must be either inserted or an update window dim "
            f"({len(update_window_dims)} + {len(inserted_window_dims)} != {rank})"
        )
    scatter_sizes = [n for d, n in enumerate(updates_shape) if d not in update_window_dims]
    batch = batch_shape(indices_shape, index_vector_dim)
    if scatter_sizes != batch:
        raise ShapeError(f"the update scatter dims {scatter_sizes} must match the index batch shape {batch}")
    window_axes = [d for d in range(rank) if d not in inserted_window_dims]
    for dim, axis in zip(update_window_dims, window_axes):
        if updates_shape[dim] > operand_shape[axis]:
            raise ShapeError(
                f"update window dim {dim} of size {updates_shape[dim]} exceeds operand axis "
                f"{axis} of size {operand_shape[axis]}"
            )


def scatter_infer(
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
    """The result type of a scatter: the operand's, once indices, updates and the dimension
    numbers are checked against it."""
    require_integer(indices, "indices")
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


def scatter_reference(
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
        start = index_vector(indices, [update_index[d] for d in scatter_dims], index_vector_dim)
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


# kind -> (StableHLO op of the update computation, NumPy combine(old, new))
SCATTER_COMBINERS = {
    "set": (None, lambda old, new: new),
    "add": ("stablehlo.add", lambda old, new: old + new),
    "multiply": ("stablehlo.multiply", lambda old, new: old * new),
    "min": ("stablehlo.minimum", np.minimum),
    "max": ("stablehlo.maximum", np.maximum),
}


def scatter_emit(em, node, operand, indices, updates, kind="add"):
    """``stablehlo.scatter`` whose update region is the computation of ``kind`` (the update
    itself for 'set')."""
    scalar = TensorType(node.types[0].dtype, ())

    def body(inner, args):
        if kind == "set":
            return [args[1]]
        return inner.op(SCATTER_COMBINERS[kind][0], args, [scalar, scalar], [scalar])

    combine = em.region([scalar, scalar], body)
    dims = dims_attr(
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
            "indices_are_sorted": hlo_bool(node.attr("indices_are_sorted")),
            "unique_indices": hlo_bool(node.attr("unique_indices")),
        },
    )


def _scatter_samples(rng):
    x = random_array(rng, (5, 3))
    # x.at[idx].add(rows): duplicate 1 accumulates, -1 and 5 are out of range and skipped
    yield Sample(
        (x, np.array([1, 4, 1, -1, 5], np.int32), random_array(rng, (5, 3))),
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
            random_array(rng, (3, 4), np.int32),
            np.array([[0, 1], [2, 3], [0, 1], [2, 4]], np.int32),
            random_array(rng, (4,), np.int32),
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
        (
            random_array(rng, (4, 4)),
            np.array([[0, 0], [2, 1], [3, 0], [1, 2]], np.int64),
            random_array(rng, (4, 2, 2)),
        ),
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
        (
            random_array(rng, (2, 5), np.float64),
            np.array([[4, 0, 4]], np.int32),
            random_array(rng, (2, 1, 3), np.float64),
        ),
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
        (random_array(rng, (3, 2)), np.zeros((0,), np.int32), np.zeros((0, 2), np.float32)),
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
            random_array(rng, (4,), dtypes.bfloat16),
            np.array([[1], [1], [3]], np.int32),
            random_array(rng, (3,), dtypes.bfloat16),
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


def scatter_flops(inputs, outputs, **attrs) -> int:
    """One operation per update element, except for ``kind="set"``, which only moves data."""
    return 0 if attrs.get("kind") == "set" else inputs[-1].size


OPS = [
    OpDef(
        name="scatter_add",
        traits=(),
        stablehlo=None,  # a stablehlo.scatter adding its updates: imported from that
        flops=scatter_flops,
        batch=scatter_batch("scatter_add"),
        arity=3,
        attrs=(
            "update_window_dims",
            "inserted_window_dims",
            "scatter_dims_to_operand_dims",
            "index_vector_dim",
        ),
        optional={"indices_are_sorted": False, "unique_indices": False},
        infer=scatter_infer,
        reference=scatter_reference,
        emit=scatter_emit,
        samples=_scatter_samples,
        vjp=scatter_add_vjp,
        doc="scatter_add(operand, indices, updates): StableHLO scatter with ``+`` as the update "
        "computation; duplicate indices accumulate and a window that does not fit in the operand "
        "is skipped. Batching dims are not supported.",
    ),
]
