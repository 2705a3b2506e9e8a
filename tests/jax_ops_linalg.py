"""JAX equivalents (jax.lax) of the linalg and window primitives, for the VJP tests (merged into
jax_ops.JAX_OPS). Same attribute names as kaun_ir's ops.

Where jax has no differentiable equivalent the oracle is built from pieces jax does differentiate:

- ``reduce_window``: jax does not differentiate the init value, so the window reduction runs with
  the kind's identity and the init is combined afterwards (``init + window sum``; for max/min
  ``where(window max > init, window max, init)``, so a tie gives the init the cotangent, as kaun_ir
  does). jax.vjp of ``lax.reduce_window`` max/min has no rule for window dilation and fails on
  negative padding; those samples use explicit window taps and ``argmax`` (the first maximum).
- ``select_and_scatter_add``: jax.vjp of ``lax.reduce_window`` max (that vjp *is* a
  select-and-scatter-add with the first maximum of each window chosen) plus the init.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

HIGHEST = lax.Precision.HIGHEST


def _dot_general(lhs, rhs, lhs_batch, rhs_batch, lhs_contracting, rhs_contracting, preferred_dtype=None):
    dims = ((tuple(lhs_contracting), tuple(rhs_contracting)), (tuple(lhs_batch), tuple(rhs_batch)))
    return lax.dot_general(lhs, rhs, dims, precision=HIGHEST, preferred_element_type=preferred_dtype)


def _convolution(
    lhs,
    rhs,
    window_strides,
    padding,
    lhs_dilation,
    rhs_dilation,
    lhs_spec,
    rhs_spec,
    out_spec,
    feature_group_count=1,
    batch_group_count=1,
):
    numbers = lax.ConvDimensionNumbers(tuple(lhs_spec), tuple(rhs_spec), tuple(out_spec))
    return lax.conv_general_dilated(
        lhs,
        rhs,
        tuple(window_strides),
        [tuple(p) for p in padding],
        tuple(lhs_dilation),
        tuple(rhs_dilation),
        numbers,
        feature_group_count=feature_group_count,
        batch_group_count=batch_group_count,
        precision=HIGHEST,
    )


_COMBINE = {"sum": lax.add, "max": lax.max, "min": lax.min}


def _identity(kind, dtype):
    if kind == "sum":
        return np.zeros((), dtype)
    return np.array(-np.inf if kind == "max" else np.inf, dtype)


def _taps_reduce(x, kind, window_dimensions, window_strides, base_dilations, window_dilations, padding):
    """max/min over windows by stacking every window offset's strided slice and picking the first
    extreme with argmax/argmin: jax differentiates that for any dilation."""
    identity = _identity(kind, x.dtype)
    config = [(lo, hi, b - 1) for (lo, hi), b in zip(padding, base_dilations)]
    padded = lax.pad(x, jnp.asarray(identity, x.dtype), config)
    out_shape = [
        (n - ((w - 1) * d + 1)) // s + 1
        for n, w, d, s in zip(padded.shape, window_dimensions, window_dilations, window_strides)
    ]
    taps = []
    for offset in itertools.product(*(range(w) for w in window_dimensions)):
        start = [k * d for k, d in zip(offset, window_dilations)]
        limit = [st + s * (m - 1) + 1 for st, s, m in zip(start, window_strides, out_shape)]
        taps.append(lax.slice(padded, start, limit, tuple(window_strides)))
    stacked = jnp.stack(taps)
    pick = jnp.argmax(stacked, axis=0) if kind == "max" else jnp.argmin(stacked, axis=0)
    return jnp.take_along_axis(stacked, pick[None], axis=0)[0]


def _reduce_window(
    x, init, kind, window_dimensions, window_strides, base_dilations, window_dilations, padding
):
    args = (
        tuple(window_dimensions),
        tuple(window_strides),
        tuple(tuple(p) for p in padding),
        tuple(base_dilations),
        tuple(window_dilations),
    )
    if kind != "sum" and (any(d != 1 for d in window_dilations) or min(min(p) for p in padding) < 0):
        reduced = _taps_reduce(x, kind, *args[:2], args[3], args[4], args[2])
    else:
        reduced = lax.reduce_window(x, _identity(kind, x.dtype), _COMBINE[kind], *args)
    if kind == "sum":
        return reduced + init
    wins = reduced > init if kind == "max" else reduced < init
    return jnp.where(wins, reduced, init)


def _select_and_scatter_add(x, source, init, window_dimensions, window_strides, padding):
    def max_pool(v):
        return lax.reduce_window(
            v,
            -jnp.inf,
            lax.max,
            tuple(window_dimensions),
            tuple(window_strides),
            tuple(tuple(p) for p in padding),
        )

    _, pullback = jax.vjp(max_pool, x)
    return pullback(source)[0] + init


def _triangular_solve(a, b, left_side, lower, unit_diagonal, transpose_a):
    return lax.linalg.triangular_solve(
        a,
        b,
        left_side=left_side,
        lower=lower,
        unit_diagonal=unit_diagonal,
        transpose_a=transpose_a != "NO_TRANSPOSE",
        conjugate_a=transpose_a == "ADJOINT",
    )


JAX_OPS: dict = {
    "triangular_solve": _triangular_solve,
    "dot_general": _dot_general,
    "convolution": _convolution,
    "reduce_window": _reduce_window,
    "select_and_scatter_add": _select_and_scatter_add,
}
