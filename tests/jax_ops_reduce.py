"""JAX equivalents (jax.lax) of the reduce primitives, for the VJP tests (merged into jax_ops.JAX_OPS)."""

from jax import lax

_REDUCERS = {
    "sum": lax.reduce_sum,
    "prod": lax.reduce_prod,
    "max": lax.reduce_max,
    "min": lax.reduce_min,
    "and": lax.reduce_and,
    "or": lax.reduce_or,
}


def _sort(x, axis, descending, index_dtype):
    """Stable sort of ``(x, iota)`` by two keys: NaN or not (NaN last ascending, first descending),
    then the value (negated when descending)."""
    import jax.numpy as jnp

    iota = lax.broadcasted_iota(index_dtype, x.shape, axis)
    nan = jnp.isnan(x) if jnp.issubdtype(x.dtype, jnp.floating) else jnp.zeros(x.shape, bool)
    nan_key = jnp.where(nan, 0, 1) if descending else jnp.where(nan, 1, 0)
    value_key = jnp.where(nan, jnp.zeros_like(x), -x if descending else x)
    _, _, values, indices = lax.sort(
        (nan_key, value_key, x, iota), dimension=axis, is_stable=True, num_keys=2
    )
    return values, indices


JAX_OPS = {"reduce": lambda x, kind, dimensions: _REDUCERS[kind](x, tuple(dimensions)), "sort": _sort}
