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
from kaun_ir.errors import StableHLOImportError


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


# --------------------------------------------------------------------------- bitcast and convolution


def test_jax_bitcast_across_widths():
    x = R.standard_normal((3, 2)).astype(np.float32)
    b = R.integers(0, 256, (2, 4), dtype=np.uint8)
    graph = _check(
        lambda x, b: (
            lax.bitcast_convert_type(x, jnp.int8),
            lax.bitcast_convert_type(x, jnp.uint16),
            lax.bitcast_convert_type(b, jnp.float32),
            lax.bitcast_convert_type(b.reshape(4, 2), jnp.int16),
        ),
        x,
        b,
        rtol=0,
        atol=0,
    )
    assert "bitcast_convert" in {n.op for n in graph.nodes}


_I1_MODULE = """
func.func @main(%x: tensor<3xi8>, %y: tensor<2x16xi1>) -> (tensor<3x8xi1>, tensor<2xi16>, tensor<2xf32>) {
  %0 = stablehlo.bitcast_convert %x : (tensor<3xi8>) -> tensor<3x8xi1>
  %1 = stablehlo.bitcast_convert %y : (tensor<2x16xi1>) -> tensor<2xi16>
  %2 = stablehlo.bitcast_convert %1 : (tensor<2xi16>) -> tensor<2x2xi8>
  %3 = stablehlo.bitcast_convert %2 : (tensor<2x2xi8>) -> tensor<2xf16>
  %4 = stablehlo.convert %3 : (tensor<2xf16>) -> tensor<2xf32>
  return %0, %1, %4 : tensor<3x8xi1>, tensor<2xi16>, tensor<2xf32>
}
"""


def test_bitcast_to_and_from_i1_is_one_bit_per_element():
    x = np.array([0, 1, -128], np.int8)
    y = R.random((2, 16)) < 0.5
    _, (bits, packed, halves) = _run(_I1_MODULE, x, y)
    np.testing.assert_array_equal(bits, np.unpackbits(x.view(np.uint8)[:, None], axis=1, bitorder="little"))
    want = np.packbits(y, axis=1, bitorder="little").view(np.int16).reshape(2)
    np.testing.assert_array_equal(packed, want)
    np.testing.assert_array_equal(halves, want.view(np.float16).astype(np.float32))


def test_bitcast_shape_rule_errors():
    from kaun_ir.ops import TABLE

    rule = TABLE["bitcast_convert"]
    with pytest.raises(kn.ShapeError, match="trailing axis of 4"):
        rule.infer_types([kn.ir.TensorType(np.dtype(np.int8), (3,))], {"dtype": np.dtype(np.int32)})
    with pytest.raises(TypeError, match="bool"):
        rule.infer_types([kn.ir.TensorType(np.dtype(np.bool_), (8,))], {"dtype": np.dtype(np.uint8)})


def test_jax_integer_convolution_accumulates_in_i32():
    x = R.integers(-128, 128, (2, 3, 9, 9)).astype(np.int8)
    w = R.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8)

    def conv(x, w):
        return lax.conv_general_dilated(x, w, (1, 1), "SAME", preferred_element_type=jnp.int32)

    _check(conv, x, w, rtol=0, atol=0)
    xf = R.standard_normal((1, 2, 5, 5)).astype(jnp.bfloat16)
    wf = R.standard_normal((3, 2, 3, 3)).astype(jnp.bfloat16)
    _check(
        lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "VALID", preferred_element_type=jnp.float32),
        xf,
        wf,
        rtol=1e-5,
        atol=1e-5,
    )
    want = lax.conv_general_dilated(
        x.astype(np.int64), w.astype(np.int64), (1, 1), "SAME"
    )  # the exact sums: no i32 overflow at these sizes
    _, (got,) = _run(jax.jit(conv).lower(x, w).as_text(), x, w)
    np.testing.assert_array_equal(got, np.asarray(want))


# --------------------------------------------------------------------------- sort with a comparator


def _sort_inputs():
    x = R.standard_normal((4, 7)).astype(np.float32)
    x[0, :5] = [np.nan, 1.0, -np.inf, np.nan, np.inf]
    x[1, :4] = [2.0, 2.0, -0.0, 0.0]
    i = R.integers(-3, 3, (4, 7)).astype(np.int32)
    return x, i


def test_jax_sort_argsort_and_multi_operand_sort():
    x, i = _sort_inputs()
    graph = _check(
        lambda x, i: (
            jnp.sort(x, axis=1),
            jnp.sort(x, axis=0, descending=True),
            jnp.argsort(x, axis=1),
            jnp.argsort(x, axis=1, descending=True, stable=False),
            jnp.sort(i, axis=1),
            lax.sort((x, i), dimension=1, num_keys=1),
            lax.sort((i, x), dimension=1, num_keys=2),
            lax.sort((i, x, i * 2), dimension=0, num_keys=1),
        ),
        x,
        i,
        rtol=0,
        atol=0,
    )
    assert "sort" in {n.op for n in graph.nodes}


def test_jax_sort_with_many_operands():
    x, i = _sort_inputs()
    ops = (i, x, i + 1, x * 2, i * 3)
    _check(lambda *ops: lax.sort(ops, dimension=1, num_keys=1), *ops, rtol=0, atol=0)
    _check(lambda *ops: lax.sort(ops, dimension=1, num_keys=3), *ops, rtol=0, atol=0)
    text = jax.jit(lambda *ops: lax.sort(ops, dimension=1, num_keys=4)).lower(*ops).as_text()
    with pytest.raises(StableHLOImportError, match="orders by operand 3: at most the first 3"):
        kn.ir.from_stablehlo(text)


def test_jax_sort_of_unsigned_and_bool_keys():
    u = R.integers(0, 5, (9,)).astype(np.uint32)
    b = R.random(9) < 0.5
    _check(lambda u, b: (jnp.sort(u), lax.sort((b, u), num_keys=1), jnp.argsort(b)), u, b, rtol=0, atol=0)


def test_jax_sort_of_64_bit_unsigned_keys():
    # the comparator is probed with the dtype's extremes: uint64's maximum must not overflow
    u = np.array([3, 2**64 - 1, 0, 2**63, 7], np.uint64)
    with jax.enable_x64(True):
        _check(lambda u: jnp.sort(u), u, rtol=0, atol=0)


_SORT_GT = """
func.func @main(%x: tensor<2x5xf32>, %y: tensor<2x5xi32>) -> (tensor<2x5xf32>, tensor<2x5xi32>) {
  %0:2 = "stablehlo.sort"(%x, %y) ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>, %c: tensor<i32>, %d: tensor<i32>):
    %p = stablehlo.compare GT, %a, %b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  }) {dimension = 1 : i64, is_stable = true}
    : (tensor<2x5xf32>, tensor<2x5xi32>) -> (tensor<2x5xf32>, tensor<2x5xi32>)
  return %0#0, %0#1 : tensor<2x5xf32>, tensor<2x5xi32>
}
"""


def test_plain_greater_than_comparator_sorts_descending():
    x = np.array([[3, 1, 2, 1, 5], [0, -1, 4, 4, 2]], np.float32)
    y = np.arange(10, dtype=np.int32).reshape(2, 5)
    _, (values, payload) = _run(_SORT_GT, x, y)
    order = np.argsort(-x, axis=1, kind="stable")
    np.testing.assert_array_equal(values, np.take_along_axis(x, order, 1))
    np.testing.assert_array_equal(payload, np.take_along_axis(y, order, 1))


def test_unrecognised_comparator_is_refused():
    module = _SORT_GT.replace("compare GT, %a, %b", "compare NE, %a, %b")
    with pytest.raises(StableHLOImportError, match=r"stablehlo\.sort.*not a lexicographic order"):
        kn.ir.from_stablehlo(module)


def test_total_order_compare_outside_sort():
    x = np.array([-np.nan, -np.inf, -1.0, -0.0, 0.0, 1.0, np.inf, np.nan], np.float32)
    module = """
func.func @main(%x: tensor<8xf32>, %y: tensor<8xf32>) -> tensor<8xi1> {
  %0 = stablehlo.compare LT, %x, %y, TOTALORDER : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xi1>
  return %0 : tensor<8xi1>
}"""
    for shift in range(1, 8):
        y = np.roll(x, shift)
        _, (got,) = _run(module, x, y)
        want = np.arange(8) < np.roll(np.arange(8), shift)  # x is listed in total order
        np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------- triangular_solve


def _triangular(m, batch=()):
    a = R.uniform(-1, 1, batch + (m, m)) + (m + 1) * np.eye(m)
    return a.astype(np.float32)


@pytest.mark.parametrize("left_side", [True, False])
@pytest.mark.parametrize("lower", [True, False])
def test_jax_triangular_solve_through_lapack_call(left_side, lower):
    a = _triangular(4, (2,))
    b = R.standard_normal((2, 4, 3) if left_side else (2, 3, 4)).astype(np.float32)

    def solve(a, b):
        return [
            lax.linalg.triangular_solve(
                a, b, left_side=left_side, lower=lower, transpose_a=t, conjugate_a=c, unit_diagonal=u
            )
            for t, c in ((False, False), (True, False), (True, True))
            for u in (False, True)
        ]

    graph = _check(solve, a, b, rtol=1e-5, atol=1e-5)
    assert sum(n.op == "triangular_solve" for n in graph.nodes) == 6


_TRSM = """
func.func @main(%a: tensor<3x3xf32>, %b: tensor<3x2xf32>) -> tensor<3x2xf32> {
  %0 = "stablehlo.triangular_solve"(%a, %b) {
    left_side = true, lower = true, unit_diagonal = false, transpose_a = #stablehlo<transpose ADJOINT>
  } : (tensor<3x3xf32>, tensor<3x2xf32>) -> tensor<3x2xf32>
  return %0 : tensor<3x2xf32>
}
"""


def test_triangular_solve_module_reads_only_its_triangle():
    a = _triangular(3)
    b = R.standard_normal((3, 2)).astype(np.float32)
    _, (x,) = _run(_TRSM, a, b)
    np.testing.assert_allclose(np.tril(a).T @ x, b, rtol=1e-5, atol=1e-5)
    _, (again,) = _run(_TRSM, np.tril(a) + np.triu(np.full((3, 3), 7.0, np.float32), 1), b)
    np.testing.assert_array_equal(again, x)


def test_triangular_solve_reference_ignores_a_unit_diagonal_that_is_not_finite():
    from kaun_ir.ir import optable

    a = _triangular(3)
    a[np.diag_indices(3)] = [np.inf, np.nan, -np.inf]
    b = R.standard_normal((3, 2)).astype(np.float32)
    attrs = {"left_side": True, "lower": True, "unit_diagonal": True, "transpose_a": "NO_TRANSPOSE"}
    got = optable.table()["triangular_solve"].reference(a, b, **attrs)
    want = lax.linalg.triangular_solve(a, b, left_side=True, lower=True, unit_diagonal=True)
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-5)


def test_triangular_solve_gradient_and_vmap_match_jax():
    a = _triangular(3, (4,))
    b = R.standard_normal((4, 3, 2)).astype(np.float32)

    def loss(a, b, solve):
        return (solve(a, b) ** 2).sum()

    def ours(a, b):
        from kaun_ir.ops.rules import apply

        return apply(
            "triangular_solve",
            a,
            b,
            left_side=True,
            lower=False,
            unit_diagonal=False,
            transpose_a="TRANSPOSE",
        )

    def theirs(a, b):
        return lax.linalg.triangular_solve(a, b, left_side=True, lower=False, transpose_a=True)

    got = kn.jit(kn.grad(lambda a, b: loss(a, b, ours), argnums=(0, 1)))(a, b)
    want = jax.grad(lambda a, b: loss(a, b, theirs), argnums=(0, 1))(a, b)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5)
    batched = kn.jit(kn.vmap(ours, in_axes=(None, 0)))(a[0], b)
    np.testing.assert_allclose(
        np.asarray(batched), np.asarray(jax.vmap(theirs, (None, 0))(a[0], b)), rtol=1e-5, atol=1e-5
    )


# --------------------------------------------------------------------------- case and if


def test_jax_cond_and_switch():
    x = R.standard_normal((3, 4)).astype(np.float32)
    w = R.standard_normal((4,)).astype(np.float32)

    def f(x, w, k):
        y = lax.cond(k > 1, lambda x: jnp.sin(x) * w, lambda x: x @ w[:, None] * w, x)
        z = lax.switch(k, [lambda x: x.sum(0), lambda x: x.max(0) + w, lambda x: jnp.tanh(w)], x)
        return y, z

    jitted = jax.jit(f)
    graph = kn.ir.from_stablehlo(jitted.lower(x, w, np.int32(0)).as_text())
    assert "case" in {n.op for n in graph.nodes}
    run = kn.runtime.compile(kn.passes.run(graph, kn.runtime.pipelines.default_jit_pipeline()))
    for k in range(-1, 5):
        for got, want in zip(run(x, w, np.int32(k)), jitted(x, w, np.int32(k))):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_jax_cond_inside_a_loop():
    def f(x):
        return lax.fori_loop(
            0, 5, lambda i, v: lax.cond(i % 2 == 0, lambda v: v * 2.0, lambda v: v - 1.0, v), x
        )

    _check(f, np.arange(3, dtype=np.float32))


_IF_MODULE = """
func.func @main(%p: tensor<i1>, %x: tensor<2xf32>) -> (tensor<2xf32>, tensor<i32>) {
  %0:2 = "stablehlo.if"(%p) ({
    %c = stablehlo.constant dense<1> : tensor<i32>
    stablehlo.return %x, %c : tensor<2xf32>, tensor<i32>
  }, {
    %n = stablehlo.negate %x : tensor<2xf32>
    %c = stablehlo.constant dense<2> : tensor<i32>
    stablehlo.return %n, %c : tensor<2xf32>, tensor<i32>
  }) : (tensor<i1>) -> (tensor<2xf32>, tensor<i32>)
  return %0#0, %0#1 : tensor<2xf32>, tensor<i32>
}
"""


def test_if_module_takes_the_true_branch_first():
    x = np.array([1.5, -2.0], np.float32)
    for pred, sign, branch in ((True, 1.0, 1), (False, -1.0, 2)):
        _, (y, which) = _run(_IF_MODULE, np.asarray(pred), x)
        np.testing.assert_array_equal(y, sign * x)
        assert int(which) == branch


def test_case_gradient_and_vmap_match_jax():
    x = R.standard_normal((5,)).astype(np.float32)

    def ours(k, x):
        from kaun_ir.ops.rules import apply, trace

        types = [kn.ir.TensorType(np.dtype(np.float32), (5,))]
        branches = (
            trace(lambda v: kn.sin(v) * v, types, "b0", record_source=False),
            trace(lambda v: v * v * v, types, "b1", record_source=False),
        )
        return apply("case", k, x, regions=branches)

    def theirs(k, x):
        return lax.switch(jnp.where((k < 0) | (k > 1), 1, k), [lambda v: jnp.sin(v) * v, lambda v: v**3], x)

    for k in (0, 3):
        got = kn.jit(kn.grad(lambda x, k: ours(k, x).sum()))(x, np.int32(k))
        want = jax.grad(lambda x, k: theirs(k, x).sum())(x, np.int32(k))
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    ks = np.array([0, 1, 1, -2], np.int32)
    xs = R.standard_normal((4, 5)).astype(np.float32)
    got = kn.jit(kn.vmap(ours))(ks, xs)
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.vmap(theirs)(ks, xs)), rtol=1e-5, atol=1e-6)
    got = kn.jit(kn.vmap(ours, in_axes=(None, 0)))(np.int32(1), xs)
    np.testing.assert_allclose(np.asarray(got), np.asarray(xs**3), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- map


_MAP_MODULE = """
func.func @main(%x: tensor<2x3xf32>, %y: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = "stablehlo.map"(%x, %y) ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %m = stablehlo.multiply %a, %b : tensor<f32>
    %c = stablehlo.constant dense<1.0> : tensor<f32>
    %s = stablehlo.add %m, %c : tensor<f32>
    %t = stablehlo.maximum %s, %a : tensor<f32>
    stablehlo.return %t : tensor<f32>
  }) {dimensions = array<i64: 0, 1>} : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
  return %0 : tensor<2x3xf32>
}
"""


def test_map_applies_its_body_to_every_element():
    x, y = R.standard_normal((2, 2, 3)).astype(np.float32)
    graph, (got,) = _run(_MAP_MODULE, x, y)
    np.testing.assert_allclose(got, np.maximum(x * y + 1.0, x), rtol=1e-6)
    assert "map" not in {n.op for n in graph.nodes}


# --------------------------------------------------------------------------- what stays out


_OUT = {
    "complex argument": (
        "func.func @main(%x: tensor<2xcomplex<f32>>) -> tensor<2xf32> {\n"
        "  %0 = stablehlo.real %x : (tensor<2xcomplex<f32>>) -> tensor<2xf32>\n"
        "  return %0 : tensor<2xf32>\n}",
        r"argument 0 of @main: element type complex<f32> is not supported: complex numbers",
    ),
    "complex op": (
        "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
        "  %c = stablehlo.complex %x, %x : tensor<2xcomplex<f32>>\n"
        "  %0 = stablehlo.imag %c : (tensor<2xcomplex<f32>>) -> tensor<2xf32>\n"
        "  return %0 : tensor<2xf32>\n}",
        r"stablehlo\.complex at .*complex numbers are not a kaun_ir dtype",
    ),
    "f8": (
        "func.func @main(%x: tensor<2xf8E4M3FN>) -> tensor<2xf32> {\n"
        "  %0 = stablehlo.convert %x : (tensor<2xf8E4M3FN>) -> tensor<2xf32>\n"
        "  return %0 : tensor<2xf32>\n}",
        r"f8E4M3FN is not supported: 8-bit floats",
    ),
    "f4": (
        "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
        "  %0 = stablehlo.convert %x : (tensor<2xf32>) -> tensor<2xf4E2M1FN>\n"
        "  %1 = stablehlo.convert %0 : (tensor<2xf4E2M1FN>) -> tensor<2xf32>\n"
        "  return %1 : tensor<2xf32>\n}",
        r"stablehlo\.convert at .*f4E2M1FN is not supported: 4-bit floats",
    ),
    "quantized": (
        "func.func @main(%x: tensor<2x!quant.uniform<i8:f32, 0.5:3>>) -> tensor<2xf32> {\n"
        "  %0 = stablehlo.uniform_dequantize %x\n"
        "    : (tensor<2x!quant.uniform<i8:f32, 0.5:3>>) -> tensor<2xf32>\n"
        "  return %0 : tensor<2xf32>\n}",
        r"quantized types are not kaun_ir dtypes",
    ),
    "dynamic shape": (
        "func.func @main(%x: tensor<?xf32>) -> tensor<?xf32> {\n"
        "  %0 = stablehlo.negate %x : tensor<?xf32>\n"
        "  return %0 : tensor<?xf32>\n}",
        r"dynamic shape: only static shapes are supported",
    ),
    "token": (
        "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
        "  %t = stablehlo.create_token : !stablehlo.token\n"
        "  return %x : tensor<2xf32>\n}",
        r"stablehlo\.create_token at .*tokens",
    ),
}


@pytest.mark.parametrize("kind", sorted(_OUT))
def test_what_stays_out_is_refused_with_its_reason(kind):
    module, message = _OUT[kind]
    with pytest.raises(StableHLOImportError, match=message):
        kn.ir.from_stablehlo(module)


# --------------------------------------------------------------------------- the specification's examples

# Each module is an example of the StableHLO specification's op section, written as a function of
# its operands; the expected values are the specification's.
_SPEC = {
    "popcnt": (
        "%r = stablehlo.popcnt %a : tensor<4xi64>",
        [np.array([0, 1, 2, 127], np.int64)],
        "tensor<4xi64>",
        np.array([0, 1, 1, 7], np.int64),
    ),
    "count_leading_zeros": (
        "%r = stablehlo.count_leading_zeros %a : tensor<2x2xi64>",
        [np.array([[0, 1], [128, -1]], np.int64)],
        "tensor<2x2xi64>",
        np.array([[64, 63], [56, 0]], np.int64),
    ),
    "round_nearest_afz": (
        "%r = stablehlo.round_nearest_afz %a : tensor<5xf64>",
        [np.array([-2.5, 0.4, 0.5, 0.6, 2.5])],
        "tensor<5xf64>",
        np.array([-3.0, 0.0, 1.0, 1.0, 3.0]),
    ),
    "cbrt": (
        "%r = stablehlo.cbrt %a : tensor<4xf64>",
        [np.array([0.0, 1.0, 8.0, 27.0])],
        "tensor<4xf64>",
        np.array([0.0, 1.0, 2.0, 3.0]),
    ),
    "tan": (  # values known in closed form (the specification's example rounds pi / 2 in print)
        "%r = stablehlo.tan %a : tensor<2x2xf64>",
        [np.array([[0.0, np.pi / 4], [-np.pi / 4, np.pi / 3]])],
        "tensor<2x2xf64>",
        np.array([[0.0, 1.0], [-1.0, np.sqrt(3.0)]]),
    ),
    "bitcast_convert": (
        "%r = stablehlo.bitcast_convert %a : (tensor<f64>) -> tensor<4xf16>",
        [np.array(0x0123456789ABCDEF, np.uint64).view(np.float64)],
        "tensor<4xf16>",
        np.array([0xCDEF, 0x89AB, 0x4567, 0x0123], np.uint16).view(np.float16),
    ),
    "map": (
        '%r = "stablehlo.map"(%a, %b) ({\n'
        "  ^bb0(%x: tensor<i64>, %y: tensor<i64>):\n"
        "    %m = stablehlo.multiply %x, %y : tensor<i64>\n"
        "    stablehlo.return %m : tensor<i64>\n"
        "  }) {dimensions = array<i64: 0, 1>} : (tensor<2x2xi64>, tensor<2x2xi64>) -> tensor<2x2xi64>",
        [np.array([[0, 1], [2, 3]], np.int64), np.array([[4, 5], [6, 7]], np.int64)],
        "tensor<2x2xi64>",
        np.array([[0, 5], [12, 21]], np.int64),
    ),
    "triangular_solve": (
        '%r = "stablehlo.triangular_solve"(%a, %b) {left_side = true, lower = true, unit_diagonal = false,\n'
        "    transpose_a = #stablehlo<transpose NO_TRANSPOSE>}\n"
        "    : (tensor<3x3xf32>, tensor<3x3xf32>) -> tensor<3x3xf32>",
        [
            np.array([[1, 0, 0], [2, 4, 0], [3, 5, 6]], np.float32),
            np.array([[2, 0, 0], [4, 8, 0], [6, 10, 12]], np.float32),
        ],
        "tensor<3x3xf32>",
        np.array([[2, 0, 0], [0, 2, 0], [0, 0, 2]], np.float32),
    ),
    "sort": (
        '%s:2 = "stablehlo.sort"(%a, %b) ({\n'
        "  ^bb0(%x: tensor<i64>, %y: tensor<i64>, %z: tensor<i64>, %w: tensor<i64>):\n"
        "    %p = stablehlo.compare GT, %x, %y, SIGNED : (tensor<i64>, tensor<i64>) -> tensor<i1>\n"
        "    stablehlo.return %p : tensor<i1>\n"
        "  }) {dimension = 0 : i64, is_stable = true}\n"
        "    : (tensor<2x3xi64>, tensor<2x3xi64>) -> (tensor<2x3xi64>, tensor<2x3xi64>)\n"
        "  %r = stablehlo.concatenate %s#0, %s#1, dim = 0\n"
        "    : (tensor<2x3xi64>, tensor<2x3xi64>) -> tensor<4x3xi64>",
        [np.array([[1, 2, 3], [3, 2, 1]], np.int64), np.array([[3, 2, 1], [1, 2, 3]], np.int64)],
        "tensor<4x3xi64>",
        np.array([[3, 2, 3], [1, 2, 1], [1, 2, 1], [3, 2, 3]], np.int64),
    ),
    "case": (
        '%r = "stablehlo.case"(%a) ({\n'
        "    %c = stablehlo.constant dense<0> : tensor<2xi64>\n"
        "    stablehlo.return %c : tensor<2xi64>\n"
        "  }, {\n"
        "    %c = stablehlo.constant dense<1> : tensor<2xi64>\n"
        "    stablehlo.return %c : tensor<2xi64>\n"
        "  }) : (tensor<i32>) -> tensor<2xi64>",
        [np.array(-1, np.int32)],  # out of range: the last branch
        "tensor<2xi64>",
        np.array([1, 1], np.int64),
    ),
}


def _spec_module(body, inputs, result_type):
    names = "abcd"
    args = ", ".join(
        f"%{names[i]}: tensor<{'x'.join(map(str, a.shape)) + 'x' if a.ndim else ''}{_MLIR[a.dtype]}>"
        for i, a in enumerate(inputs)
    )
    return f"func.func @main({args}) -> {result_type} {{\n  {body}\n  return %r : {result_type}\n}}"


_MLIR = {
    np.dtype(np.int64): "i64",
    np.dtype(np.float64): "f64",
    np.dtype(np.float32): "f32",
    np.dtype(np.int32): "i32",
}


@pytest.mark.parametrize("op", sorted(_SPEC))
def test_specification_example(op):
    body, inputs, result_type, expected = _SPEC[op]
    _, (got,) = _run(_spec_module(body, inputs, result_type), *inputs)
    assert got.dtype == expected.dtype
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- chlo.scan


_CHLO_SCAN = """
func.func @main(%x: tensor<5xf32>, %h: tensor<f32>) -> (tensor<5xf32>, tensor<f32>) {
  %0:2 = chlo.scan(%x) inits(%h) dimension=0 {
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %m = stablehlo.maximum %a, %b : tensor<f32>
    stablehlo.return %m, %m : tensor<f32>, tensor<f32>
  } : (tensor<5xf32>, tensor<f32>) -> (tensor<5xf32>, tensor<f32>)
  return %0#0, %0#1 : tensor<5xf32>, tensor<f32>
}
"""


def test_chlo_scan_through_its_legalisation():
    """Legalised into a while loop over ``get_dimension_size``, ``broadcast`` and
    ``real_dynamic_slice`` of static shapes, which import as constants, ``broadcast_in_dim``
    and ``dynamic_slice``."""
    x = np.array([1.0, -2.0, 3.0, 0.5, 4.0], np.float32)
    _, (running, last) = _run(_CHLO_SCAN, x, np.float32(0.0))
    np.testing.assert_array_equal(running, np.maximum.accumulate(np.maximum(x, 0.0)))
    assert float(last) == 4.0
    reverse = _CHLO_SCAN.replace("dimension=0 {", "dimension=0 attributes {is_reverse = true} {")
    with pytest.raises(StableHLOImportError, match="chlo.scan at .*is_reverse is not supported"):
        kn.ir.from_stablehlo(reverse)


# ----------------------------------------------------------------- booleans: add is OR, multiply AND


@pytest.mark.parametrize(("op", "oracle"), [("add", np.logical_or), ("multiply", np.logical_and)])
def test_boolean_add_and_multiply_of_constants_are_or_and_and(op, oracle):
    """Compiled without our folding pass, so XLA sees two boolean constants (its constant folder
    computed their add as XOR) and, separately, two runtime operands."""
    a = np.array([False, False, True, True])
    b = np.array([False, True, False, True])
    lit = lambda v: ", ".join("true" if x else "false" for x in v)  # noqa: E731
    module = f"""module @m {{
  func.func public @main(%x: tensor<4xi1>, %y: tensor<4xi1>) -> (tensor<4xi1>, tensor<4xi1>) {{
    %a = stablehlo.constant dense<[{lit(a)}]> : tensor<4xi1>
    %b = stablehlo.constant dense<[{lit(b)}]> : tensor<4xi1>
    %c = stablehlo.{op} %a, %b : tensor<4xi1>
    %d = stablehlo.{op} %x, %y : tensor<4xi1>
    return %c, %d : tensor<4xi1>, tensor<4xi1>
  }}
}}"""
    graph = kn.ir.from_stablehlo(module)
    folded, runtime = (np.asarray(r) for r in kn.runtime.compile(graph)(a, b))
    np.testing.assert_array_equal(folded, oracle(a, b))
    np.testing.assert_array_equal(runtime, oracle(a, b))
