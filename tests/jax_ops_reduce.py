"""JAX equivalents (jax.lax) of the reduce primitives, for the VJP tests (merged into jax_ops.JAX_OPS)."""

from jax import lax

_REDUCERS = {"sum": lax.reduce_sum, "prod": lax.reduce_prod, "max": lax.reduce_max,
             "min": lax.reduce_min, "and": lax.reduce_and, "or": lax.reduce_or}

JAX_OPS = {"reduce": lambda x, kind, dimensions: _REDUCERS[kind](x, tuple(dimensions))}
