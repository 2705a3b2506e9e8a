"""The JAX equivalent of every differentiable primitive: the oracle for VJP tests.

``JAX_OPS[name](*inputs, **attrs)`` computes the same function as kaun_ir's op ``name`` with
``jax.lax``; the generated tests compare kaun_ir's VJP rules against ``jax.vjp`` of these.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def _broadcast_in_dim(x, shape, broadcast_dimensions):
    return lax.broadcast_in_dim(x, tuple(shape), tuple(broadcast_dimensions))


def _pad(x, value, low, high, interior):
    return lax.pad(x, value, [(lo, hi, mid) for lo, hi, mid in zip(low, high, interior)])


def _select(pred, on_true, on_false):
    return jnp.where(pred, on_true, on_false)


JAX_OPS = {
    "negate": lax.neg,
    "abs": lax.abs,
    "sign": lax.sign,
    "exponential": lax.exp,
    "exponential_minus_one": lax.expm1,
    "log": lax.log,
    "log_plus_one": lax.log1p,
    "sqrt": lax.sqrt,
    "rsqrt": lax.rsqrt,
    "tanh": lax.tanh,
    "logistic": lax.logistic,
    "sine": lax.sin,
    "cosine": lax.cos,
    "floor": lax.floor,
    "ceil": lax.ceil,
    "round_nearest_even": lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN),
    "erf": lax.erf,
    "round_nearest_afz": lambda x: lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO),
    "cbrt": lax.cbrt,
    "tan": lax.tan,
    "reduce_precision": lambda x, exponent_bits, mantissa_bits: lax.reduce_precision(
        x, exponent_bits=exponent_bits, mantissa_bits=mantissa_bits
    ),
    "add": lax.add,
    "subtract": lax.sub,
    "multiply": lax.mul,
    "divide": lax.div,
    "power": lax.pow,
    "maximum": lax.max,
    "minimum": lax.min,
    "remainder": lax.rem,
    "atan2": lax.atan2,
    "select": _select,
    # lax.clamp's own VJP breaks on scalar bounds; broadcasting first gives the same function
    "clamp": lambda lo, x, hi: lax.clamp(jnp.broadcast_to(lo, x.shape), x, jnp.broadcast_to(hi, x.shape)),
    "convert": lambda x, dtype: lax.convert_element_type(x, dtype),
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": lambda x, shape: lax.reshape(x, tuple(shape)),
    "transpose": lambda x, permutation: lax.transpose(x, tuple(permutation)),
    "slice": lambda x, start_indices, limit_indices, strides: lax.slice(
        x, tuple(start_indices), tuple(limit_indices), tuple(strides)
    ),
    "concatenate": lambda *xs, dimension: lax.concatenate(xs, dimension),
    "pad": _pad,
    "reverse": lambda x, dimensions: lax.rev(x, tuple(dimensions)),
    "stop_gradient": lax.stop_gradient,
    "sharding_constraint": lambda x, mesh, spec: x,  # the identity on values
}

from jax_ops_control import JAX_OPS as _CONTROL  # noqa: E402
from jax_ops_custom import JAX_OPS as _CUSTOM  # noqa: E402
from jax_ops_indexing import JAX_OPS as _INDEXING  # noqa: E402
from jax_ops_linalg import JAX_OPS as _LINALG  # noqa: E402
from jax_ops_reduce import JAX_OPS as _REDUCE  # noqa: E402

JAX_OPS.update(_INDEXING)
JAX_OPS.update(_LINALG)
JAX_OPS.update(_REDUCE)
JAX_OPS.update(_CONTROL)
JAX_OPS.update(_CUSTOM)
