"""Reverse mode through ``scatter`` and ``scatter_add``: the cotangent of each update element
is read back (with ``gather``) from where it was written, masked to zero where its window did
not fit and scatter skipped it; which elements receive it depends on the update computation.
"""

from __future__ import annotations

import numpy as np

from kaun_ir.errors import GradientError
from kaun_ir.ops.indexing_common import along_index_vector, zeros_like
from kaun_ir.ops.rules import apply


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
    lower = along_index_vector(indices, index_vector_dim, [0] * len(upper))
    upper = along_index_vector(indices, index_vector_dim, upper)
    fits = apply(
        "and",
        apply("compare", indices, lower, direction="GE"),
        apply("compare", indices, upper, direction="LE"),
    )
    if index_vector_dim < indices.ndim:
        fits = apply("reduce", fits, kind="and", dimensions=(index_vector_dim,))
    scatter_dims = tuple(d for d in range(updates.ndim) if d not in update_window_dims)
    return apply("broadcast_in_dim", fits, shape=updates.shape, broadcast_dimensions=scatter_dims)


def scatter_vjp(ct, y, operand, indices, updates, kind, **dims):
    """Cotangents of ``scatter`` with update computation ``kind`` (none for the indices)."""
    zeros_u = zeros_like(updates)
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
            apply("select", untouched, ct, zeros_like(operand)),
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
    count = apply("add", operand_won, apply("scatter_add", zeros_like(operand), indices, update_won, **dims))
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


def scatter_add_vjp(ct, y, operand, indices, updates, **dims):
    """Cotangents of ``scatter_add``: ``ct`` for the operand, ``ct`` read back where each update
    element was added (zero where its window was skipped) for the updates."""
    return scatter_vjp(ct, y, operand, indices, updates, "add", **dims)
