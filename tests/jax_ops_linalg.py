"""JAX equivalents (jax.lax) of the linalg primitives, for the VJP tests (merged into jax_ops.JAX_OPS)."""

JAX_OPS: dict = {}
