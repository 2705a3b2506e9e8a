"""The ``fold`` pass: constant folding with the NumPy references, bit-identical to XLA.

The central test folds every sample of every op in the fold allow-list (the op table's own
samples, as constants) and compares the folded constant with what XLA computes for the same op
on the same data (run eagerly through the runtime), bit for bit. The rest checks the size
limits, the splat handling, the guards that refuse inexact cases, and that transcendental ops
and ops with regions are never folded.
"""

from __future__ import annotations

import numpy as np
import pytest
from passutil import assert_bit_identical, const, random_inputs, same_snapshot, snapshot, splat

import kaun_ir as kn
from kaun_ir import dtypes
from kaun_ir.ir import Builder, TensorType, interpret, scope
from kaun_ir.ir.core import Graph
from kaun_ir.ops import TABLE, with_trait
from kaun_ir.passes import canonicalize as _canonicalize  # noqa: F401  (registers the pass)
from kaun_ir.passes.fold import ELEMENTWISE, ELEMENTWISE_NOT_FOLDED, FOLDABLE, NOT_FOLDED, fold
from kaun_ir.passes.rewrite import last_statistics
from kaun_ir.surface.tensor import Tensor, apply

F32, F64, I32, BOOL = np.float32, np.float64, np.int32, np.bool_
S = kn.ShapeDtype


def constant_graph(op: str, inputs, attrs, regions=()) -> Graph:
    """A graph computing ``op`` of constant operands (no graph inputs)."""
    with Builder(record_source=False) as b:
        values = [apply("constant", value=np.asarray(x)) for x in inputs]
        out = apply(op, *values, regions=regions, **attrs)
        outs = out if isinstance(out, tuple) else (out,)
        return b.finish([t.value for t in outs])


def folded_arrays(graph: Graph) -> list[np.ndarray] | None:
    """The output arrays if every output is now a constant (or a broadcast of one), else None."""
    producers = {n.op for n in graph.nodes}
    if not producers <= {"constant", "broadcast_in_dim"}:
        return None
    return interpret(graph)


# ------------------------------------------------------------------------------ the allow-list


def test_every_op_is_classified_once():
    assert set(FOLDABLE) | set(NOT_FOLDED) == set(TABLE), set(TABLE) ^ (set(FOLDABLE) | set(NOT_FOLDED))
    assert not set(FOLDABLE) & set(NOT_FOLDED)
    assert all(TABLE[op].regions == 0 for op in FOLDABLE)  # never an op with regions
    for op in ("exponential", "log", "tanh", "erf", "logistic", "sine", "cosine", "sqrt", "rsqrt", "atan2"):
        assert op in NOT_FOLDED
    assert ELEMENTWISE <= set(FOLDABLE)


def test_the_elementwise_ops_folded_are_the_trait_minus_the_exclusions():
    """The splat-folded ops come from the op table's trait, not from a list of their own."""
    elementwise = with_trait("elementwise")
    assert ELEMENTWISE == elementwise - set(ELEMENTWISE_NOT_FOLDED)
    assert set(ELEMENTWISE_NOT_FOLDED) <= elementwise  # an exclusion names an elementwise op
    assert all(NOT_FOLDED[op] == reason for op, reason in ELEMENTWISE_NOT_FOLDED.items())


@pytest.mark.parametrize("op", sorted(FOLDABLE))
def test_folding_matches_xla_bit_for_bit(op):
    """Each sample of ``op`` with constant operands: folded constant == XLA's result, bitwise."""
    folded = 0
    for i, sample in enumerate(TABLE[op].samples(np.random.default_rng(7))):
        graph = constant_graph(op, sample.inputs, sample.attrs)
        out = fold(graph).verify()
        arrays = folded_arrays(out)
        if arrays is None:
            continue  # a guard refused (e.g. a float sum): checked separately below
        folded += 1
        xla = apply(op, *sample.inputs, **sample.attrs)
        xla = xla if isinstance(xla, tuple) else (xla,)
        for k, (got, want) in enumerate(zip(arrays, xla)):
            assert_bit_identical(got, np.asarray(want), f"{op} sample {i} output {k}")
    must_fold = {"convolution", "select_and_scatter_add", "reduce_window", "scatter_add", "power"}
    if op not in must_fold:  # those fold for integers only; their samples may all be floats
        assert folded, f"no sample of {op} was folded"


FLOAT_EDGES = [
    0.0,
    -0.0,
    np.nan,
    np.inf,
    -np.inf,
    1.0,
    -1.0,
    2.5,
    -2.5,
    0.5,
    -0.5,
    3e38,
    -3e38,
    1.5e-38,
    7.0,
    1e-45,
    4.0e9,
    -2.2e9,
]
INT_EDGES = [0, 1, -1, 2, -7, 31, 32, 33, 64, np.iinfo(np.int32).min, np.iinfo(np.int32).max]


def _compare_cases(dt, vals, pairs):
    for direction in ("EQ", "NE", "LT", "LE", "GT", "GE"):
        yield pairs, {"direction": direction}


def _convert_cases(dt, vals, pairs):
    for dst in (F32, F64, np.float16, dtypes.bfloat16, I32, np.uint32, np.int8, BOOL):
        yield (vals,), {"dtype": np.dtype(dst)}


def _bitcast_convert_cases(dt, vals, pairs):
    if dt is not BOOL:
        yield (vals,), {"dtype": np.dtype(f"u{np.dtype(dt).itemsize}")}


def _reduce_precision_cases(dt, vals, pairs):
    if np.dtype(dt).kind == "f":
        for e, m in ((5, 10), (8, 7), (4, 3), (2, 0)):
            yield (vals,), {"exponent_bits": e, "mantissa_bits": m}


def _select_cases(dt, vals, pairs):
    yield (np.arange(len(vals) ** 2) % 3 == 0,) + pairs, {}


def _clamp_cases(dt, vals, pairs):
    for lo, hi in ((vals[0], vals[1]), (vals[1], vals[0]), (vals[2 % len(vals)], vals[3 % len(vals)])):
        yield (np.asarray(lo), vals, np.asarray(hi)), {}


# ops whose operands or attributes need cases of their own
_SPECIAL_CASES = {
    "compare": _compare_cases,
    "convert": _convert_cases,
    "bitcast_convert": _bitcast_convert_cases,
    "reduce_precision": _reduce_precision_cases,
    "select": _select_cases,
    "clamp": _clamp_cases,
}


def edge_cases(op):
    """Operands built from edge values (every pair, for binary ops) in each dtype the op takes."""
    opdef = TABLE[op]
    for dt in (F32, F64, I32, np.uint32, BOOL):
        base = np.array(FLOAT_EDGES if np.dtype(dt).kind == "f" else INT_EDGES if dt is not BOOL else [0, 1])
        with np.errstate(all="ignore"):
            vals = base.astype(dt)
        pairs = (np.repeat(vals, len(vals)), np.tile(vals, len(vals)))
        if op in _SPECIAL_CASES:
            yield from _SPECIAL_CASES[op](dt, vals, pairs)
            continue
        t = TensorType(dt, (len(vals),))
        t2 = TensorType(dt, (len(vals) ** 2,))
        try:
            opdef.infer_types([t] if opdef.arity == 1 else [t2, t2], {})
        except (TypeError, ValueError):
            continue
        yield ((vals,) if opdef.arity == 1 else pairs), {}
        if op == "power" and np.dtype(dt).kind in "iu":  # exponents the guard accepts
            with np.errstate(all="ignore"):
                yield (pairs[0], np.abs(pairs[1]) % 64), {}


@pytest.mark.parametrize("op", sorted(ELEMENTWISE))
def test_elementwise_edge_values_fold_as_xla_computes(op):
    """-0.0, NaN, infinities, subnormals, overflow, integer extremes: folded == XLA or not folded."""
    folded = refused = 0
    for inputs, attrs in edge_cases(op):
        try:
            graph = constant_graph(op, inputs, attrs)
        except (TypeError, ValueError):
            continue  # a dtype the op does not take
        arrays = folded_arrays(fold(graph))
        if arrays is None:
            refused += 1
            continue
        folded += 1
        want = np.asarray(apply(op, *inputs, **attrs))
        assert_bit_identical(arrays[0], want, f"{op} {attrs} of {[x.dtype for x in inputs]}")
    assert folded, f"no edge case of {op} folded ({refused} refused)"


@pytest.mark.parametrize("dt", [F32, I32])
def test_reductions_of_edge_values_fold_as_xla_computes(dt):
    # float edges without subnormals and -0.0 (the guards refuse those; checked elsewhere)
    floats = [v for v in FLOAT_EDGES if not (0 < abs(v) < 1e-37 or (v == 0 and np.signbit(v)))]
    base = np.array(
        floats + [4.0, 5.0, 6.0] if dt is F32 else INT_EDGES[:9] + [INT_EDGES[-1], 5, -5, 6, 8, 9, 10, 11, 12]
    )
    with np.errstate(all="ignore"):
        x = base.astype(dt).reshape(3, 6)
    x = np.concatenate([x, x[:, ::-1], np.where(np.isnan(x), 1, x).astype(dt)])  # with and without NaN
    cases = [
        ("argmax", {"axis": 1}),
        ("argmin", {"axis": 0}),
        ("reduce", {"kind": "max", "dimensions": (1,)}),
        ("reduce", {"kind": "min", "dimensions": (0, 1)}),
    ]
    if dt is I32:
        cases += [("reduce", {"kind": k, "dimensions": (1,)}) for k in ("sum", "prod", "and", "or")]
    folded = 0
    for op, attrs in cases:
        arrays = folded_arrays(fold(constant_graph(op, [x], attrs)))
        if arrays is None:
            continue
        folded += 1
        assert_bit_identical(arrays[0], np.asarray(apply(op, x, **attrs)), f"{op} {attrs}")
    assert folded >= 2


def test_integer_ops_with_float_samples_fold_exactly():
    # the ops whose float samples are refused: integer versions fold, equal to XLA
    rng = np.random.default_rng(3)
    x = rng.integers(-4, 5, size=(2, 3, 5, 5)).astype(I32)
    w = rng.integers(-2, 3, size=(4, 3, 3, 3)).astype(I32)
    cases = [
        (
            "convolution",
            (x, w),
            dict(
                window_strides=(1, 1),
                padding=((1, 1), (0, 0)),
                lhs_dilation=(1, 1),
                rhs_dilation=(1, 1),
                lhs_spec=(0, 1, 2, 3),
                rhs_spec=(0, 1, 2, 3),
                out_spec=(0, 1, 2, 3),
            ),
        ),
        ("reduce", (x,), dict(kind="sum", dimensions=(1, 3))),
        ("reduce", (x,), dict(kind="prod", dimensions=(0,))),
        (
            "dot_general",
            (x[0, 0], w[0, 0, :, :].repeat(2, axis=1)[:3, :5].T.copy()),
            dict(lhs_batch=(), rhs_batch=(), lhs_contracting=(1,), rhs_contracting=(0,)),
        ),
        ("power", (np.array([2, -3, 5, 0], I32), np.array([3, 3, 0, 2], I32)), {}),
        (
            "reduce_window",
            (x[0, 0], np.array(0, I32)),
            dict(
                kind="sum",
                window_dimensions=(2, 2),
                window_strides=(1, 2),
                base_dilations=(1, 1),
                window_dilations=(1, 1),
                padding=((0, 0), (1, 0)),
            ),
        ),
    ]
    for op, inputs, attrs in cases:
        try:
            TABLE[op].check_attrs(attrs)
            xla = apply(op, *inputs, **attrs)
        except (TypeError, ValueError) as err:  # a case the op's attribute spelling rejects
            pytest.fail(f"bad test case for {op}: {err}")
        arrays = folded_arrays(fold(constant_graph(op, inputs, attrs)))
        assert arrays is not None, f"integer {op} was not folded"
        assert_bit_identical(arrays[0], np.asarray(xla), op)


# ------------------------------------------------------------------------------ never folded


@pytest.mark.parametrize(
    "op",
    [
        "exponential",
        "log",
        "tanh",
        "logistic",
        "erf",
        "sine",
        "sqrt",
        "rsqrt",
        "exponential_minus_one",
        "log_plus_one",
        "cosine",
    ],
)
def test_transcendental_ops_are_not_folded(op):
    graph = constant_graph(op, [np.array([0.5, 1.5], F32)], {})
    assert fold(graph).op_counts() == {"constant": 1, op: 1}


def test_float_power_atan2_and_float_sums_are_not_folded():
    a, b = np.array([1.5, 2.0], F32), np.array([0.5, 3.0], F32)
    for op, inputs, attrs in [
        ("power", (a, b), {}),
        ("atan2", (a, b), {}),
        ("reduce", (a,), {"kind": "sum", "dimensions": (0,)}),
        ("reduce", (a,), {"kind": "prod", "dimensions": (0,)}),
        ("dot_general", (a, b), dict(lhs_batch=(), rhs_batch=(), lhs_contracting=(0,), rhs_contracting=(0,))),
    ]:
        graph = constant_graph(op, inputs, attrs)
        assert op in fold(graph).op_counts(), op


def test_iota_and_while_stay():
    def fn(x):
        i = apply("iota", dtype=np.dtype(I32), shape=(4,), dimension=0)
        return (
            kn.while_loop(
                lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] * 2.0), (np.int32(0), np.float32(1.0))
            ),
            i + 1,
            x,
        )

    graph = kn.trace(fn, S((), F32))
    out = fold(graph).verify()
    counts = out.op_counts()
    assert counts["while"] == 1 and counts["iota"] == 1 and counts["add"] >= 1


def test_folds_inside_while_bodies():
    def fn(x):
        two = const(1.0) + const(1.0)
        return kn.while_loop(lambda s: s < 10.0, lambda s: s * (const(1.0) + const(1.0)), x * two)

    graph = kn.trace(fn, S((), F32))
    out = fold(graph).verify()
    (loop,) = [n for n in out.nodes if n.op == "while"]
    assert "add" not in loop.regions[1].op_counts() and "add" not in out.op_counts()
    assert last_statistics() == {"fold-add": 2}
    for x in (0.5, 3.0):
        assert_bit_identical(interpret(out, np.float32(x))[0], interpret(graph, np.float32(x))[0])


# ------------------------------------------------------------------------------ guards


@pytest.mark.parametrize(
    "op, inputs, attrs",
    [
        ("multiply", (np.array([1e-39, 2.0], F32), np.array([1.0, 1.0], F32)), {}),  # subnormal operand
        ("multiply", (np.array([1e-20], F32), np.array([1e-20], F32)), {}),  # subnormal result
        ("compare", (np.array([1e-40], F32), np.array([0.0], F32)), {"direction": "EQ"}),
        ("convert", (np.array([1e-40], F32),), {"dtype": np.dtype(BOOL)}),
        ("maximum", (np.array([-0.0, 1.0], F32), np.array([0.0, 2.0], F32)), {}),
        ("minimum", (np.array([0.0], F32), np.array([-0.0], F32)), {}),
        ("reduce", (np.array([0.0, -0.0], F32),), {"kind": "max", "dimensions": (0,)}),
        ("clamp", (np.array(-0.0, F32), np.array([0.0, 3.0], F32), np.array(1.0, F32)), {}),
        ("divide", (np.array([4, 5], I32), np.array([2, 0], I32)), {}),
        ("remainder", (np.array([4, 5], I32), np.array([0, 2], I32)), {}),
        ("divide", (np.array([np.iinfo(I32).min], I32), np.array([-1], I32)), {}),
        ("power", (np.array([2, 2], I32), np.array([-1, 2], I32)), {}),
        ("shift_left", (np.array([1, 2], I32), np.array([-1, 2], I32)), {}),
        ("convert", (np.array([1.5, np.nan], F32),), {"dtype": np.dtype(I32)}),
        ("convert", (np.array([3e9], F32),), {"dtype": np.dtype(I32)}),
        ("convert", (np.array([1.0], F64),), {"dtype": dtypes.bfloat16}),
        ("convert", (np.array([1000001], I32),), {"dtype": np.dtype(np.float16)}),
    ],
)
def test_guards_refuse_inexact_cases(op, inputs, attrs):
    graph = constant_graph(op, inputs, attrs)
    assert op in fold(graph).op_counts()


def test_the_guards_are_needed_xla_differs_from_numpy_there():
    # the subnormal and signed-zero guards exist because XLA:CPU really computes something else
    tiny = np.array([1e-39], F32)
    assert np.asarray(apply("multiply", tiny, np.array([1.0], F32)))[0] == 0.0 != (tiny * 1.0)[0]
    pos, neg = np.float32(0.0), np.float32(-0.0)
    assert np.signbit(np.maximum(pos, neg)) != np.signbit(np.asarray(apply("maximum", pos, neg)))


def test_data_movement_keeps_subnormals_and_folds():
    tiny = np.array([1e-39, -0.0, 2.0], F32)
    graph = constant_graph("reverse", [tiny], {"dimensions": (0,)})
    (got,) = folded_arrays(fold(graph))
    assert_bit_identical(got, tiny[::-1].copy())
    assert_bit_identical(got, np.asarray(apply("reverse", tiny, dimensions=(0,))))


# ------------------------------------------------------------------------------ sizes and splats


def test_max_elements_limits_what_is_materialised():
    a = np.arange(100, dtype=F32).reshape(10, 10)
    graph = constant_graph("add", [a, a], {})
    assert "add" in fold(graph, max_elements=99).op_counts()
    out = fold(graph, max_elements=100)
    assert out.op_counts() == {"constant": 1}
    assert_bit_identical(interpret(out)[0], a + a)
    assert "add" in kn.passes.run(graph, "fold{max_elements=50}").op_counts()
    assert kn.passes.run(graph, "fold").op_counts() == {"constant": 1}


def test_fold_option_is_declared():
    info = kn.passes.REGISTRY["fold"]
    assert info.options["max_elements"].default == 1 << 16 and info.options["max_elements"].type is int
    with pytest.raises(ValueError, match="max_elements must be non-negative"):
        fold(constant_graph("negate", [np.ones(2, F32)], {}), max_elements=-1)


def test_small_broadcast_of_a_scalar_folds_large_one_stays():
    small = kn.trace(lambda: splat(2.0, (2, 3)))
    assert fold(small).op_counts() == {"constant": 1}, fold(small).text()
    assert fold(small, max_splat_elements=8).op_counts() == {"constant": 1}
    large = kn.trace(lambda: splat(2.0, (100, 100)))
    assert fold(large).op_counts() == large.op_counts() == {"constant": 1, "broadcast_in_dim": 1}
    assert fold(small, max_splat_elements=4).op_counts() == {"constant": 1, "broadcast_in_dim": 1}


def test_elementwise_ops_of_large_splats_fold_to_a_broadcast():
    def fn(x):
        ones = splat(1.0, (300, 300))
        return x + (ones + ones) * splat(3.0, (300, 300))

    graph = kn.trace(fn, S((300, 300), F32))
    out = fold(graph).verify()
    assert out.op_counts() == {"constant": 1, "broadcast_in_dim": 1, "add": 1}
    (c,) = [n for n in out.nodes if n.op == "constant"]
    assert c.attr("value").array.shape == () and float(c.attr("value").array) == 6.0
    assert last_statistics() == {"fold-add-splat": 1, "fold-multiply-splat": 1}


def test_splat_folding_keeps_the_operand_order():
    def fn():
        three, two = splat(3.0, (50, 50)), splat(2.0, (50, 50))
        return apply("divide", apply("subtract", two, three), splat(4.0, (50, 50))), apply(
            "compare", three, two, direction="LT"
        )

    graph = kn.trace(fn)
    out = fold(graph).verify()
    assert (
        "subtract" not in out.op_counts()
        and "divide" not in out.op_counts()
        and "compare" not in out.op_counts()
    )
    quotient, less = interpret(out)
    assert np.all(quotient == -0.25) and not np.any(less)
    assert_bit_identical(quotient, interpret(graph)[0])


def test_non_splat_large_result_is_not_folded():
    a = np.arange(20000, dtype=I32).reshape(200, 100)
    graph = constant_graph("transpose", [a], {"permutation": (1, 0)})
    assert "transpose" in fold(graph, max_elements=10000).op_counts()
    assert fold(graph).op_counts() == {"constant": 1}


def test_broadcast_operands_are_materialised_for_evaluation():
    def fn():
        return apply("reduce", splat(2, (3, 4), I32), kind="sum", dimensions=(0, 1)) + const([5, 6, 7], I32)[
            0:1
        ].reshape(())

    graph = kn.trace(fn)
    out = fold(graph)
    assert out.op_counts() == {"constant": 1}
    assert interpret(out)[0] == 29


# ------------------------------------------------------------------------------ the pass as a whole


def test_fold_keeps_path_and_source_and_does_not_mutate():
    with Builder() as b:
        x = Tensor(b.add_input(TensorType(F32, (3,))), b)
        with scope("block.1"):
            y = x * (const([1.0, 2.0, 3.0]) + const([1.0, 1.0, 1.0]))
        graph = b.finish([y.value])
    before = snapshot(graph)
    out = fold(graph).verify()
    assert same_snapshot(graph, before)
    (c,) = [n for n in out.nodes if n.op == "constant"]
    add = [n for n in graph.nodes if n.op == "add"][0]
    assert c.path == "block.1" and c.source == add.source and c.source
    assert np.array_equal(c.attr("value").array, [2.0, 3.0, 4.0])


def test_folded_graph_runs_identically_on_xla():
    def fn(x):
        k = (const(np.arange(6, dtype=F32).reshape(2, 3)) * 0.5 - 1.0).T
        idx = apply("convert", const([2.7, -1.2], F32), dtype=np.dtype(I32))
        return x @ k + kn.exp(const(1.0)), idx * 3, kn.max(k, axis=0)

    graph = kn.trace(fn, S((4, 3), F32))
    out = fold(graph).verify()
    assert "convert" not in out.op_counts() and "transpose" not in out.op_counts()
    assert "exponential" in out.op_counts()
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(F32)
    want = kn.runtime.compile(graph)(x)
    got = kn.runtime.compile(out)(x)
    for g, w in zip(got, want):
        assert_bit_identical(np.asarray(g), np.asarray(w))
    for g, w in zip(interpret(out, x), interpret(graph, x)):
        assert_bit_identical(g, w)


def test_fold_then_canonicalize_on_autodiff_graph():
    def loss(w, x):
        return kn.mean((x @ w - 1.0) ** 2)

    graph = kn.passes.run(kn.trace(loss, np.ones((3, 2), F32), np.ones((4, 3), F32)), "autodiff")
    out = kn.passes.run(graph, "canonicalize,fold,cse,dce").verify()
    assert len(out.nodes) < len(graph.nodes)
    rng = np.random.default_rng(2)
    args = random_inputs(graph, rng, special=False)
    for g, w in zip(interpret(out, *args), interpret(graph, *args)):
        assert_bit_identical(g, w)


# ------------------------------------------------------------------------------ defects found by the
# StableHLO interpreter's suite (tests/stablehlo_interpret_suite.py)


@pytest.mark.parametrize(
    "value, dst",
    [
        (np.int64(-2), np.float64),  # same width: a scalar stays a scalar
        (np.float64(1.5), np.uint32),  # narrower: a scalar becomes a [2] vector
        (np.array([7, 1], np.uint32), np.float64),  # wider: a [2] vector becomes a scalar
        (np.float32(-0.0), np.uint16),
    ],
)
def test_bitcast_convert_of_a_scalar_folds_to_numpys_view(value, dst):
    # NumPy oracle: the same bytes viewed as the new dtype (little-endian, low part first)
    value = np.asarray(value)
    want = value.reshape(-1).view(dst)
    want = want.reshape(value.shape[:-1]) if np.dtype(dst).itemsize > value.dtype.itemsize else want
    want = want.reshape(()) if value.shape == () and want.size == 1 else want
    arrays = folded_arrays(fold(constant_graph("bitcast_convert", [value], {"dtype": np.dtype(dst)})))
    assert arrays is not None, "bitcast_convert of a constant did not fold"
    assert arrays[0].shape == want.shape and arrays[0].dtype == want.dtype
    assert arrays[0].tobytes() == want.tobytes()


@pytest.mark.parametrize("dt", [F32, F64, np.float16])
def test_reduce_precision_without_mantissa_makes_nan_inf(dt):
    # the StableHLO spec: a NaN in a format without mantissa bits is +inf; with mantissa bits it
    # stays NaN. Oracle: NumPy's inf / isnan, element by element.
    x = np.array([np.nan, -np.nan, 1.0, 3.0], dt)
    got = TABLE["reduce_precision"].run_reference([x], {"exponent_bits": 5, "mantissa_bits": 0})[0]
    np.testing.assert_array_equal(got[:2], np.array([np.inf, np.inf], dt))
    # 3 = 1.5 * 2**1 is a tie between 2 and 4: to the even last kept bit (the exponent's), 2
    np.testing.assert_array_equal(got[2:], np.array([1.0, 2.0], dt))
    kept = TABLE["reduce_precision"].run_reference([x], {"exponent_bits": 5, "mantissa_bits": 1})[0]
    assert np.isnan(kept[:2]).all()
    # XLA's CPU kernels keep the NaN, so a constant NaN without mantissa is left to XLA, unfolded
    graph = fold(constant_graph("reduce_precision", [x], {"exponent_bits": 5, "mantissa_bits": 0}))
    assert "reduce_precision" in {n.op for n in graph.nodes}
    finite = fold(constant_graph("reduce_precision", [x[2:]], {"exponent_bits": 5, "mantissa_bits": 0}))
    np.testing.assert_array_equal(folded_arrays(finite)[0], np.array([1.0, 2.0], dt))
