"""Importing StableHLO's ``gather`` and ``scatter``. Batching dimensions (StableHLO's batched
gather/scatter) have no attribute in the op table: they become explicit index components, so a
batched gather is imported as a plain one whose index vectors also name the batch position."""

from __future__ import annotations

from kaun_ir.errors import StableHLOImportError
from kaun_ir.runtime.interop.stablehlo_attrs import combiner, flag, ints
from kaun_ir.runtime.xla import mlir

# the op a scatter's update region applies -> the scatter kind of the op table
_SCATTER_KINDS = {
    "stablehlo.add": "add",
    "stablehlo.multiply": "multiply",
    "stablehlo.maximum": "max",
    "stablehlo.minimum": "min",
}


def _explicit_index_vector(imp, indices, index_vector_dim: int, batching: tuple[int, ...]):
    """``indices`` with its index vector as the last axis (added when implicit); returns the new
    indices and the positions of ``batching`` indices axes after the move."""
    if index_vector_dim == indices.type.ndim:
        indices = imp.add1("reshape", indices, shape=(*indices.type.shape, 1))
    elif index_vector_dim != indices.type.ndim - 1:
        perm = [d for d in range(indices.type.ndim) if d != index_vector_dim] + [index_vector_dim]
        indices = imp.add1("transpose", indices, permutation=tuple(perm))
    moved = tuple(b - (1 if b > index_vector_dim else 0) for b in batching)
    return indices, moved


def _add_batch_components(imp, indices, batch_axes: tuple[int, ...]):
    """Append, for each indices batch axis, an index component equal to the position along it."""
    shape = indices.type.shape
    parts = [indices]
    for axis in batch_axes:
        parts.append(imp.add1("iota", dtype=indices.dtype, shape=(*shape[:-1], 1), dimension=axis))
    return imp.add1("concatenate", *parts, dimension=len(shape) - 1) if len(parts) > 1 else indices


def gather(imp, op, xs, env):
    """``stablehlo.gather``, its batching dimensions made explicit index components."""
    operand, indices = xs
    d = mlir.dimension_numbers("gather", op.attributes["dimension_numbers"])
    collapsed, start_map, ivd = list(d.collapsed_slice_dims), list(d.start_index_map), d.index_vector_dim
    if d.operand_batching_dims:
        # a batched gather is a plain one whose index vectors also name the batch position
        indices, moved = _explicit_index_vector(imp, indices, ivd, tuple(d.start_indices_batching_dims))
        indices = _add_batch_components(imp, indices, moved)
        collapsed = sorted(collapsed + list(d.operand_batching_dims))
        start_map = start_map + list(d.operand_batching_dims)
        ivd = indices.type.ndim - 1
    return imp.add(
        "gather",
        operand,
        indices,
        offset_dims=tuple(d.offset_dims),
        collapsed_slice_dims=tuple(collapsed),
        start_index_map=tuple(start_map),
        index_vector_dim=ivd,
        slice_sizes=ints(op, "slice_sizes"),
        indices_are_sorted=flag(op, "indices_are_sorted"),
    )


def scatter(imp, op, xs, env):
    """``stablehlo.scatter`` of one operand whose update region sets, adds, multiplies or takes
    the min/max: ``scatter_add`` or ``scatter(kind=...)``."""
    if len(xs) != 3:
        raise StableHLOImportError("scatter of several operands at once is not supported")
    operand, indices, updates = xs
    applied = combiner(op)
    kind = "set" if applied == "set" else _SCATTER_KINDS.get(applied)
    if kind is None:
        raise StableHLOImportError("scatter whose update computation is not set/add/multiply/min/max")
    d = mlir.dimension_numbers("scatter", op.attributes["scatter_dimension_numbers"])
    inserted, to_operand, ivd = (
        list(d.inserted_window_dims),
        list(d.scattered_dims_to_operand_dims),
        d.index_vector_dim,
    )
    if d.input_batching_dims:
        indices, moved = _explicit_index_vector(imp, indices, ivd, tuple(d.scatter_indices_batching_dims))
        indices = _add_batch_components(imp, indices, moved)
        inserted = sorted(inserted + list(d.input_batching_dims))
        to_operand = to_operand + list(d.input_batching_dims)
        ivd = indices.type.ndim - 1
    dims = dict(
        update_window_dims=tuple(d.update_window_dims),
        inserted_window_dims=tuple(inserted),
        scatter_dims_to_operand_dims=tuple(to_operand),
        index_vector_dim=ivd,
        indices_are_sorted=flag(op, "indices_are_sorted"),
        unique_indices=flag(op, "unique_indices"),
    )
    if kind == "add":
        return imp.add("scatter_add", operand, indices, updates, **dims)
    return imp.add("scatter", operand, indices, updates, kind=kind, **dims)
