"""JAX equivalents (jax.lax) of the indexing primitives, for the VJP tests (merged into jax_ops.JAX_OPS)."""

import jax.numpy as jnp
from jax import lax


def _index_vector_last(indices, index_vector_dim):
    if index_vector_dim == indices.ndim:
        return indices[..., None]
    return jnp.moveaxis(indices, index_vector_dim, -1)


def _gather(
    operand,
    indices,
    offset_dims,
    collapsed_slice_dims,
    start_index_map,
    index_vector_dim,
    slice_sizes,
    indices_are_sorted=False,
):
    dims = lax.GatherDimensionNumbers(tuple(offset_dims), tuple(collapsed_slice_dims), tuple(start_index_map))
    return lax.gather(
        operand,
        _index_vector_last(indices, index_vector_dim),
        dims,
        tuple(slice_sizes),
        indices_are_sorted=indices_are_sorted,
        mode=lax.GatherScatterMode.CLIP,
    )


def _scatter_add(
    operand,
    indices,
    updates,
    update_window_dims,
    inserted_window_dims,
    scatter_dims_to_operand_dims,
    index_vector_dim,
    indices_are_sorted=False,
    unique_indices=False,
):
    dims = lax.ScatterDimensionNumbers(
        tuple(update_window_dims), tuple(inserted_window_dims), tuple(scatter_dims_to_operand_dims)
    )
    return lax.scatter_add(
        operand,
        _index_vector_last(indices, index_vector_dim),
        updates,
        dims,
        indices_are_sorted=indices_are_sorted,
        unique_indices=unique_indices,
        mode=lax.GatherScatterMode.FILL_OR_DROP,
    )


# StableHLO clamps a negative start to 0; lax would count it from the end first
def _dynamic_slice(x, *starts, slice_sizes):
    return lax.dynamic_slice(x, [jnp.maximum(s, 0) for s in starts], tuple(slice_sizes))


def _dynamic_update_slice(x, update, *starts):
    return lax.dynamic_update_slice(x, update, [jnp.maximum(s, 0) for s in starts])


JAX_OPS = {
    "gather": _gather,
    "scatter_add": _scatter_add,
    "dynamic_slice": _dynamic_slice,
    "dynamic_update_slice": _dynamic_update_slice,
}


def _scatter(
    operand,
    indices,
    updates,
    kind,
    update_window_dims,
    inserted_window_dims,
    scatter_dims_to_operand_dims,
    index_vector_dim,
    indices_are_sorted=False,
    unique_indices=False,
):
    dims = lax.ScatterDimensionNumbers(
        tuple(update_window_dims), tuple(inserted_window_dims), tuple(scatter_dims_to_operand_dims)
    )
    fn = {
        "set": lax.scatter,
        "add": lax.scatter_add,
        "multiply": lax.scatter_mul,
        "min": lax.scatter_min,
        "max": lax.scatter_max,
    }[kind]
    return fn(
        operand,
        _index_vector_last(indices, index_vector_dim),
        updates,
        dims,
        indices_are_sorted=indices_are_sorted,
        unique_indices=unique_indices,
        mode=lax.GatherScatterMode.FILL_OR_DROP,
    )


JAX_OPS["scatter"] = _scatter
