"""The rest of the StableHLO opset: modules JAX writes with the ops the importer once refused
(``cbrt``, ``tan``, ``popcnt``, ``count_leading_zeros``, ``round_nearest_afz``, ``reduce_precision``,
``bitcast_convert`` across widths, integer ``convolution``, ``sort`` with a comparator, ``case`` /
``if``, ``map``, ``triangular_solve``), imported, compiled and compared with what JAX computes; and
modules written by hand from the StableHLO specification's examples, compared with NumPy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import kaun_ir as kn


def _run(module: str, *args):
    graph = kn.ir.from_stablehlo(module)
    graph.verify()
    optimized = kn.passes.run(graph, kn.runtime.pipelines.default_jit_pipeline())
    return graph, [np.asarray(a) for a in kn.runtime.compile(optimized)(*args)]


def _check(fn, *args, rtol=1e-6, atol=1e-6):
    """Import what ``jax.jit(fn)`` lowers to; the compiled graph must give what JAX gives."""
    jitted = jax.jit(fn)
    graph, got = _run(jitted.lower(*args).as_text(), *args)
    expected = jax.tree_util.tree_leaves(jitted(*args))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        e = np.asarray(e)
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
    return graph


R = np.random.default_rng(0)


# --------------------------------------------------------------------------- elementwise ops


def test_jax_elementwise_math():
    x = R.uniform(-3, 3, (4, 5)).astype(np.float32)
    x[0, :4] = [0.5, -0.5, 2.5, -2.5]  # ties: away from zero
    graph = _check(
        lambda x: (jnp.cbrt(x), jnp.tan(x * 0.4), lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO)), x
    )
    assert {"cbrt", "tan", "round_nearest_afz"} <= {n.op for n in graph.nodes}


def test_jax_bit_counts():
    i = np.array([0, 1, -1, 7, 2**31 - 1, -(2**31), 1 << 20], np.int32)
    u = i.view(np.uint32).astype(np.uint8)
    graph = _check(
        lambda i, u: (lax.population_count(i), lax.clz(i), lax.population_count(u), lax.clz(u)), i, u
    )
    assert {"popcnt", "count_leading_zeros"} <= {n.op for n in graph.nodes}


@pytest.mark.parametrize("bits", [(5, 10), (8, 7), (4, 3), (11, 52), (2, 1)])
def test_jax_reduce_precision(bits):
    x = np.concatenate(
        [R.standard_normal(20) * 10.0 ** R.integers(-8, 8, 20), [0.0, -0.0, np.inf, -np.inf, np.nan, 65520.0]]
    ).astype(np.float32)
    e, m = bits
    _check(lambda x: lax.reduce_precision(x, exponent_bits=e, mantissa_bits=m), x, rtol=0, atol=0)
