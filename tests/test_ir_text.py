"""The textual IR: print -> parse -> print is the identity, and bad text is reported precisely.

The oracle for values is NumPy (the graphs are also run with ``kn.ir.interpret`` and compared
with the same computation written in NumPy); the oracle for the text is the printer itself:
``kn.ir.parse(g.text()).text() == g.text()`` for every graph (docs/ir.md).
"""

from __future__ import annotations

import inspect
import re

import ml_dtypes
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import dtypes, passes
from kaun_ir.ir.core import Graph, Node, TensorType
from kaun_ir.ops import TABLE
from kaun_ir.ops.base import OpDef

F32 = np.float32
ALL_DTYPES = [np.dtype(d) for d in dtypes.ALL]


def roundtrip(graph: Graph) -> Graph:
    """Assert the round-trip guarantee (plain and debug text); returns the parsed graph."""
    text = graph.text()
    parsed = kn.ir.parse(text)
    assert parsed.text() == text
    debug = graph.text(debug=True)
    assert kn.ir.parse(debug).text(debug=True) == debug
    return parsed


def sample_array(dtype: np.dtype, shape, rng) -> np.ndarray:
    """Values that exercise a dtype: negatives for signed types, non-integers for floats."""
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind == "u":
        return rng.integers(0, np.iinfo(dtype).max, size=shape, dtype=dtype, endpoint=True)
    if dtype.kind == "i":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return (rng.standard_normal(shape) * 100).astype(dtype)


# ------------------------------------------------------------------------- traced graphs


def small_model(x, params):
    """A few layers of elementwise math, shape ops and a comparison, under layer paths."""
    with kn.ir.scope("0.linear"):
        h = x * params["w"] + params["b"]
    with kn.ir.scope("1.act"):
        h = kn.where(h > 0.0, kn.tanh(h), 0.1 * h)
    flipped = h[::-1, 1:]
    joined = kn.concatenate([flipped, kn.exp(flipped)], axis=1)
    return {"out": joined.T.reshape(-1), "count": kn.arange(3) + 1}


def small_model_numpy(x, params):
    h = x * params["w"] + params["b"]
    h = np.where(h > 0, np.tanh(h), F32(0.1) * h)
    flipped = h[::-1, 1:]
    joined = np.concatenate([flipped, np.exp(flipped)], axis=1)
    return {"out": joined.T.reshape(-1), "count": np.arange(3, dtype=np.int32) + 1}


def test_roundtrip_of_a_traced_model_and_same_values():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3)).astype(F32)
    params = {"w": rng.standard_normal(3).astype(F32), "b": rng.standard_normal((4, 1)).astype(F32)}
    graph = kn.trace(small_model, x, params)
    parsed = roundtrip(graph)
    ops = graph.op_counts()
    for op in (
        "multiply",
        "add",
        "compare",
        "tanh",
        "select",
        "slice",
        "reverse",
        "concatenate",
        "exponential",
        "transpose",
        "reshape",
        "iota",
        "constant",
        "broadcast_in_dim",
    ):
        assert ops.get(op, 0) >= 1, f"expected the model to use {op}: {ops}"
    want = small_model_numpy(x, params)
    # inputs in flatten order (x, then the params dict by sorted key); outputs sorted by key
    assert graph.input_names == ("0", "1.b", "1.w")
    for graph_ in (graph, parsed):
        count, out = kn.ir.interpret(graph_, x, params["b"], params["w"])
        np.testing.assert_array_equal(count, want["count"])
        np.testing.assert_allclose(out, want["out"], rtol=1e-6)


def test_input_names_follow_the_argument_tree_and_survive_parsing():
    def f(params, xs, *, scale):
        return params["w"] * xs[0] + xs[1] * scale

    v = np.ones(2, F32)
    graph = kn.trace(f, {"w": v}, [v, v], scale=v)
    assert graph.input_names == ("0.w", "1.0", "1.1", "scale")
    header = 'graph @f(%0: f32[2] "0.w", %1: f32[2] "1.0", %2: f32[2] "1.1", %3: f32[2] "scale")'
    assert graph.text().startswith(header)
    assert roundtrip(graph).input_names == graph.input_names


def test_unnamed_inputs_print_without_labels_and_stay_unnamed():
    (a,) = Graph.arguments([TensorType(F32, (2,))])
    node = Node("negate", [a], {}, [a.type])
    graph = Graph([a], node.outputs, [node], name="neg")
    assert graph.text().splitlines()[0] == "graph @neg(%0: f32[2]) -> (f32[2]) {"
    assert roundtrip(graph).input_names is None


def test_layer_paths_are_printed_as_loc_and_parsed_back():
    def f(x):
        with kn.ir.scope("encoder"):
            with kn.ir.scope("0.attn"):
                y = kn.exp(x)
            z = y + y
        return kn.sin(z)

    graph = kn.trace(f, np.ones(3, F32))
    lines = graph.text().splitlines()
    assert lines[1] == '  %1 = exponential %0 : f32[3] loc("encoder.0.attn")'
    assert lines[2] == '  %2 = add %1, %1 : f32[3] loc("encoder")'
    assert lines[3] == "  %3 = sine %2 : f32[3]"  # no scope: no loc
    parsed = roundtrip(graph)
    assert [n.path for n in parsed.nodes] == ["encoder.0.attn", "encoder", ""]


def test_layer_paths_with_quotes_and_unicode_roundtrip():
    def f(x):
        with kn.ir.scope('dé"cod\\eur'):
            return -x

    graph = kn.trace(f, np.ones(2, F32))
    assert roundtrip(graph).nodes[0].path == 'dé"cod\\eur'


def test_debug_text_carries_source_lines():
    here = "test_ir_text.py"

    def f(x):
        with kn.ir.scope("blk"):
            y, line_exp = kn.exp(x), inspect.currentframe().f_lineno
        z, line_mul = y * 2.0, inspect.currentframe().f_lineno
        lines.extend([line_exp, line_mul])
        return z

    lines: list[int] = []
    graph = kn.trace(f, np.ones(2, F32))
    line_exp, line_mul = lines
    plain, debug = graph.text(), graph.text(debug=True)
    assert " at " not in plain
    assert f'exponential %0 : f32[2] loc("blk" at "{here}:{line_exp}")' in debug
    # a node outside every scope still gets its source in debug mode, with an empty path
    assert f'multiply %1, %3 : f32[2] loc("" at "{here}:{line_mul}")' in debug
    parsed = kn.ir.parse(debug)
    assert parsed.nodes[0].source == f"{here}:{line_exp}"
    assert parsed.text(debug=True) == debug
    assert parsed.text() == plain  # sources are shown only in debug mode
    assert kn.ir.parse(plain).nodes[0].source == ""


def test_debug_text_carries_provenance_and_parses_it_back():
    def loss(x):
        with kn.ir.scope("blk"):
            return kn.sum(kn.sqrt(x))

    graph = passes.run(kn.trace(loss, np.ones(3, F32)), "autodiff")
    plain, debug = graph.text(), graph.text(debug=True)
    assert " from " not in plain  # like source lines, only debug text shows provenance
    assert 'loc("" from seed)' in debug
    backward = [line for line in debug.splitlines() if 'from backward "sqrt"' in line]
    assert backward and all('loc("blk" at "test_ir_text.py:' in line for line in backward)
    parsed = kn.ir.parse(debug)
    assert parsed.text(debug=True) == debug
    assert [n.provenance for n in parsed.nodes] == [n.provenance for n in graph.nodes]
    assert {n.provenance for n in kn.ir.parse(plain).nodes} == {None}


@pytest.mark.parametrize(
    "loc, fragment",
    [
        ('loc("" from sideways)', "expected a provenance kind (backward, seed, recompute)"),
        ('loc("" from "backward")', "expected a provenance kind"),
    ],
)
def test_malformed_provenance_is_a_parse_error(loc, fragment):
    text = f"graph @main(%0: f32[2]) -> (f32[2]) {{\n  %1 = negate %0 : f32[2] {loc}\n  return %1\n}}\n"
    with pytest.raises(kn.ParseError, match=re.escape(fragment)):
        kn.ir.parse(text)


def test_multi_output_node_with_regions_roundtrips():
    def f(x, n):
        with kn.ir.scope("loop"):
            i, y = kn.while_loop(lambda s: s[0] < n, lambda s: (s[0] + 1, s[1] * 0.5 + x), (np.int32(0), x))
        return y, i

    x = np.arange(3, dtype=F32)
    graph = kn.trace(f, x, np.int32(4))
    text = graph.text()
    loop_line = '%3, %4, %5, %6 = while %2, %0, %1, %0 : i32[], f32[3], i32[], f32[3] loc("loop") regions {'
    assert loop_line in text
    assert "    graph @cond(" in text and "    graph @body(" in text
    parsed = roundtrip(graph)
    assert [len(r.nodes) for r in parsed.nodes[1].regions] == [len(r.nodes) for r in graph.nodes[1].regions]
    expected_y = x.copy()
    for _ in range(4):
        expected_y = expected_y * F32(0.5) + x
    y, i = kn.ir.interpret(parsed, x, np.int32(4))
    assert int(i) == 4
    np.testing.assert_allclose(y, expected_y, rtol=1e-6)


# ------------------------------------------------------------------------------ constants


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (2, 3), (0, 3), (5, 9)], ids=["scalar", "inline", "empty", "hex"])
def test_constants_of_every_dtype_roundtrip_exactly(dtype, shape):
    rng = np.random.default_rng([ord(c) for c in dtype.str] + list(shape))  # fixed per case
    value = sample_array(dtype, shape, rng)
    graph = kn.trace(lambda: value)  # a closed-over array becomes a constant node
    assert [n.op for n in graph.nodes] == ["constant"]
    text = graph.text()
    head = f"dense<{dtypes.short_name(dtype)}[{','.join(map(str, shape))}]>"
    if value.size > 32:
        assert head + '"0x' in text  # large constants are printed as hex bytes
    else:
        assert head + "[" in text
    parsed = roundtrip(graph)
    got = parsed.nodes[0].attr("value").array
    assert got.dtype == dtype and got.shape == value.shape
    assert got.tobytes() == value.tobytes()
    np.testing.assert_array_equal(kn.ir.interpret(parsed)[0], value)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64], ids=str)
@pytest.mark.parametrize("size", [7, 70], ids=["inline", "hex"])
def test_inf_nan_and_negative_zero_survive(dtype, size):
    special = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, 1.5, -2.25], dtype)
    value = np.resize(special, size).astype(dtype)
    graph = kn.trace(lambda: value)
    if size == 7:
        assert "[inf, -inf, nan, -0.0, 0.0, 1.5, -2.25]" in graph.text()
    got = roundtrip(graph).nodes[0].attr("value").array
    assert got.dtype == np.dtype(dtype)
    assert got.tobytes() == value.tobytes()  # bit-exact, including the sign of -0.0
    assert np.signbit(got[3]) and not np.signbit(got[4])


def test_hex_constants_are_little_endian_raw_bytes():
    value = np.arange(40, dtype=np.int32)
    text = kn.trace(lambda: value).text()
    assert 'dense<i32[40]>"0x0000000001000000020000000300000004000000' in text
    value16 = np.full(33, 1.0, np.float16)
    assert 'dense<f16[33]>"0x003c003c' in kn.trace(lambda: value16).text()


def test_extreme_values_of_64_bit_and_small_types():
    cases = [
        np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max], np.int64),
        np.array([0, np.iinfo(np.uint64).max], np.uint64),
        np.array([np.finfo(np.float64).tiny / 4, np.finfo(np.float64).max, 1e-300], np.float64),
        np.array([np.finfo(np.float16).max, 6e-8], np.float16),
        np.array([-128, 127], np.int8),
        np.array([True, False]),
    ]
    for value in cases:
        got = roundtrip(kn.trace(lambda: value)).nodes[0].attr("value").array  # noqa: B023 - traced at once
        assert got.tobytes() == value.tobytes(), value


# ----------------------------------------------------------------------------- attributes

PAYLOADS = [
    0,
    -7,
    2**62,
    2**64 - 1,
    1.0,
    -0.0,
    1e-300,
    2.5e16,
    float("inf"),
    float("-inf"),
    True,
    False,
    None,
    "",
    "text",
    'quote " and \\ backslash',
    "line\nbreak",
    "unicode é ∑ 😀",
    "true",
    "[1, 2]",
    np.dtype(np.float32),
    ml_dtypes.bfloat16,
    np.dtype(np.bool_),
    (),
    (1, 2, 3),
    ((1, 2), (3,), ()),
    (np.dtype(np.int8), "a", 1.5, None, True),
    np.arange(3, dtype=np.int16),
    np.zeros((2, 0), np.float32),
    (np.ones(2, np.uint8), (np.array(1.5, F32),)),
]


@pytest.fixture
def payload_op(monkeypatch):
    """A throwaway op (identity type rule) that carries an arbitrary attribute ``payload``."""
    opdef = OpDef(
        name="test_payload",
        arity=1,
        attrs=("payload",),
        infer=lambda x, payload: x,
        reference=lambda x, payload: x,
        emit=None,
        samples=lambda rng: [],
    )
    monkeypatch.setitem(TABLE, "test_payload", opdef)
    return opdef


def _same_attr(a, b) -> bool:
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(map(_same_attr, a, b))
    if isinstance(a, float):
        return isinstance(b, float) and (a == b or (a != a and b != b)) and np.signbit(a) == np.signbit(b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("payload", PAYLOADS, ids=[f"p{i}" for i in range(len(PAYLOADS))])
def test_attribute_values_roundtrip(payload_op, payload):
    (x,) = Graph.arguments([TensorType(F32, (2,))])
    node = Node("test_payload", [x], {"payload": payload}, [x.type])
    graph = Graph([x], node.outputs, [node], name="attrs").verify()
    parsed = roundtrip(graph)
    assert _same_attr(parsed.nodes[0].attr("payload"), graph.nodes[0].attr("payload"))


def test_attribute_printing_forms(payload_op):
    (x,) = Graph.arguments([TensorType(F32, (2,))])
    forms = [
        ((1, 2), "[1, 2]"),
        (1.0, "1.0"),
        (3, "3"),
        (True, "true"),
        (None, "none"),
        ("s", '"s"'),
        (np.dtype(np.uint32), "u32"),
        (ml_dtypes.bfloat16, "bf16"),
        (np.array([1.0, 2.0], F32), "dense<f32[2]>[1.0, 2.0]"),
        (np.array([[1, 2]], np.int8), "dense<i8[1,2]>[1, 2]"),
    ]
    for value, printed in forms:
        node = Node("test_payload", [x], {"payload": value}, [x.type])
        text = Graph([x], node.outputs, [node]).text()
        assert f"{{payload = {printed}}}" in text, text


def test_random_graphs_roundtrip_and_evaluate_the_same():
    """A seeded property test: random chains of ops over random dtypes and constants."""
    unary = {
        "f": [kn.exp, kn.tanh, kn.negative, kn.abs, kn.floor],
        "i": [kn.negative, kn.abs],
        "b": [kn.invert],
    }
    binary = {
        "f": [kn.add, kn.multiply, kn.maximum, kn.subtract],
        "i": [kn.add, kn.minimum, kn.multiply],
        "b": [kn.bitwise_and, kn.bitwise_or],
    }
    rng = np.random.default_rng(1234)
    for case in range(25):
        dtype = ALL_DTYPES[rng.integers(len(ALL_DTYPES))]
        kind = "b" if dtype == np.bool_ else ("f" if dtype.kind == "f" else "i")
        if dtype.kind == "u":
            unary_ops = [kn.floor]  # identity on integers: keeps the test free of overflow rules
        else:
            unary_ops = unary[kind]
        # every fourth case is large enough for the constant to be printed in hex form
        small = tuple(int(d) for d in rng.integers(1, 4, size=rng.integers(0, 3)))
        shape = (5, 8) if case % 4 == 0 else small
        const = sample_array(dtype, shape, rng)
        steps = [(rng.integers(2), rng.integers(8)) for _ in range(rng.integers(1, 6))]

        def f(x, steps=steps, const=const, unary_ops=unary_ops, kind=kind):
            y = x
            for is_binary, pick in steps:
                if is_binary:
                    y = binary[kind][pick % len(binary[kind])](y, const)
                else:
                    y = unary_ops[pick % len(unary_ops)](y)
            return y

        x = sample_array(dtype, shape, rng)
        graph = kn.trace(f, x)
        parsed = roundtrip(graph)
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(
                kn.ir.interpret(parsed, x)[0],
                kn.ir.interpret(graph, x)[0],
                err_msg=f"case {case}: {graph.text()}",
            )


# ------------------------------------------------------------------- hand-written text

HAND_WRITTEN = """\
// a comment line
graph @main(%x: f32[2, 3] "x", %bias: f32[3]) -> (f32[2,3]) {
  %b = broadcast_in_dim %bias {shape = [2, 3], broadcast_dimensions = [1]} : f32[2,3]  // trailing comment
  %sum = add %x, %b : f32[2,3] loc("1.linear")
  return %sum
}
"""

CANONICAL = """\
graph @main(%0: f32[2,3] "x", %1: f32[3]) -> (f32[2,3]) {
  %2 = broadcast_in_dim %1 {broadcast_dimensions = [1], shape = [2, 3]} : f32[2,3]
  %3 = add %0, %2 : f32[2,3] loc("1.linear")
  return %3
}
"""


def test_parser_accepts_any_names_comments_and_spacing_and_printer_canonicalises():
    graph = kn.ir.parse(HAND_WRITTEN)
    assert graph.text() == CANONICAL
    assert graph.input_names == ("x", "")
    x = np.arange(6, dtype=F32).reshape(2, 3)
    bias = np.array([1, 2, 3], F32)
    np.testing.assert_array_equal(kn.ir.interpret(graph, x, bias)[0], x + bias)


# ------------------------------------------------------------------------- parse errors

BAD_TEXT = [
    # (name, replace this, with this, line, column, message fragment)
    ("bad token", "%3 = add %0", "%3 = add ? %0", 3, 12, "unexpected character '?'"),
    ("unknown op", "= add", "= addd", 3, 8, "unknown op 'addd'"),
    ("undefined value", "add %0, %2", "add %0, %9", 3, 16, "use of undefined value %9"),
    (
        "duplicate definition",
        '%3 = add %0, %2 : f32[2,3] loc("1.linear")\n  return %3',
        '%2 = add %0, %2 : f32[2,3] loc("1.linear")\n  return %2',
        3,
        3,
        "value %2 defined twice",
    ),
    ("duplicate argument", "%1: f32[3]", "%0: f32[3]", 1, 31, "argument %0 defined twice"),
    ("too many result names", "%3 = add", "%3, %4 = add", 3, 3, "2 result name(s) but 1 result type(s)"),
    (
        "too many result types",
        "f32[2,3] loc",
        "f32[2,3], f32[2,3] loc",
        3,
        3,
        "1 result name(s) but 2 result type(s)",
    ),
    ("unknown dtype", "%1: f32[3]", "%1: f31[3]", 1, 35, "expected a tensor type such as f32[2,3]"),
    ("missing colon", "%2 : f32[2,3] loc", "%2 f32[2,3] loc", 3, 19, "expected ':'"),
    (
        "bad attribute value",
        "broadcast_dimensions = [1]",
        "broadcast_dimensions = [@x]",
        2,
        53,
        "expected an attribute value",
    ),
    (
        "unknown attribute word",
        "broadcast_dimensions = [1]",
        "broadcast_dimensions = [foo]",
        2,
        53,
        "expected an attribute value",
    ),
    (
        "return count",
        "-> (f32[2,3])",
        "-> (f32[2,3], f32[2,3])",
        6,
        1,
        "graph returns 1 value(s) but the signature lists 2",
    ),
    (
        "return type",
        "-> (f32[2,3])",
        "-> (f32[3,2])",
        6,
        1,
        "output 0 has type f32[2,3] but the signature says f32[3,2]",
    ),
    (
        "trailing input",
        "return %3\n}\n",
        "return %3\n}\ngarbage",
        6,
        1,
        "expected end of input after the graph",
    ),
    ("end of input", "return %3\n}\n", "return %3\n", 5, 1, "expected '}', found end of input"),
    (
        "dense element count",
        "%2 = broadcast_in_dim %1 {broadcast_dimensions = [1], shape = [2, 3]}",
        "%2 = constant {value = dense<f32[2,3]>[1.0, 2.0]}",
        2,
        41,
        "expected a flat list of 6 elements for f32[2,3]",
    ),
    (
        "dense hex length",
        "%2 = broadcast_in_dim %1 {broadcast_dimensions = [1], shape = [2, 3]}",
        '%2 = constant {value = dense<f32[2,3]>"0x0000"}',
        2,
        41,
        "expected 24 bytes for f32[2,3], got 2",
    ),
    (
        "dense hex prefix",
        "%2 = broadcast_in_dim %1 {broadcast_dimensions = [1], shape = [2, 3]}",
        '%2 = constant {value = dense<f32[2,3]>"00"}',
        2,
        41,
        'expected hex bytes "0x..."',
    ),
]


@pytest.mark.parametrize("name,old,new,line,column,fragment", BAD_TEXT, ids=[c[0] for c in BAD_TEXT])
def test_parse_errors_name_line_column_and_what_was_expected(name, old, new, line, column, fragment):
    assert old in CANONICAL, name
    with pytest.raises(kn.ParseError) as info:
        kn.ir.parse(CANONICAL.replace(old, new, 1))
    err = info.value
    assert (err.line, err.column) == (line, column), str(err)
    assert fragment in err.reason
    message = str(err)
    assert message.startswith(f"line {line}, column {column}: ")
    # the offending source line is quoted with a caret under the column
    source_line = CANONICAL.replace(old, new, 1).split("\n")[line - 1]
    if source_line:
        assert f"\n  {source_line}\n  {' ' * (column - 1)}^" in message


def test_parse_error_is_a_value_error_and_a_kaun_error():
    with pytest.raises(ValueError):
        kn.ir.parse("graph main")
    with pytest.raises(kn.KaunError):
        kn.ir.parse("")


VERIFY_FAILURES = [
    (
        "result type",
        "%3 = add %0, %2 : f32[2,3]",
        "%3 = add %0, %2 : f32[3,2]",
        "node 1 (add at 1.linear): result type(s) f32[3,2] differ from the type rule's f32[2,3]",
    ),
    (
        "missing attribute",
        "{broadcast_dimensions = [1], shape = [2, 3]}",
        "{shape = [2, 3]}",
        "node 0 (broadcast_in_dim): type rule rejects the operands: broadcast_in_dim: missing attribute(s) "
        "broadcast_dimensions",
    ),
    ("unknown attribute", "shape = [2, 3]}", "shape = [2, 3], colour = 1}", "unknown attribute(s) colour"),
    ("operand count", "add %0, %2", "add %0", "add takes 2 operand(s), got 1"),
    ("operand types", "add %0, %2", "add %0, %1", "node 1 (add at 1.linear): type rule rejects the operands"),
]


@pytest.mark.parametrize("name,old,new,fragment", VERIFY_FAILURES, ids=[c[0] for c in VERIFY_FAILURES])
def test_well_formed_text_with_wrong_types_is_rejected_by_verify(name, old, new, fragment):
    text = CANONICAL.replace(old, new, 1)
    if name == "result type":
        text = text.replace("-> (f32[2,3])", "-> (f32[3,2])")
    with pytest.raises(kn.IRError) as info:
        kn.ir.parse(text)
    assert fragment in str(info.value)
    assert str(info.value).startswith("@main: ")


# ------------------------------------------------------------------- regressions


def test_graph_without_outputs_roundtrips():
    graph = kn.trace(lambda x: None, np.ones(2, F32))
    assert graph.outputs == ()
    assert kn.ir.parse(graph.text()).text() == graph.text()


MALFORMED_LITERALS = [
    ("non-hex digits", 'dense<f32[1]>"0xzz112233"', "f32[1]"),
    ("empty dimension", "dense<f32[2,,1]>[1.0, 2.0]", "f32[2]"),
    ("out of range integer", "dense<u8[1]>[300]", "u8[1]"),
    ("string element", 'dense<f32[1]>["a"]', "f32[1]"),
]


@pytest.mark.parametrize("name,literal,rtype", MALFORMED_LITERALS, ids=[c[0] for c in MALFORMED_LITERALS])
def test_malformed_literals_raise_parse_error_with_position(name, literal, rtype):
    text = (
        f"graph @main() -> ({rtype}) {{\n  %0 = constant {{value = {literal}}} : {rtype}\n  return %0\n}}\n"
    )
    with pytest.raises(kn.ParseError) as info:
        kn.ir.parse(text)
    assert info.value.line == 2


def test_bad_string_escape_raises_parse_error():
    with pytest.raises(kn.ParseError) as info:
        kn.ir.parse(CANONICAL.replace('"x"', r'"\q"'))
    assert (info.value.line, info.value.column) == (1, 26)


# ------------------------------------------------------------------------ docs/ir.md


def _doc_graphs() -> list[str]:
    import pathlib
    import re

    doc = pathlib.Path(__file__).resolve().parent.parent / "docs" / "ir.md"
    blocks = re.findall(r"```text\n(.*?)```", doc.read_text(), flags=re.S)
    return [b for b in blocks if b.startswith("graph @")]


def test_docs_examples_are_canonical_text():
    examples = _doc_graphs()
    assert len(examples) >= 2
    for text in examples:
        assert kn.ir.parse(text).text() == text


def test_docs_annotated_example_is_what_trace_prints():
    weights = np.array([0.5, -1.0, 2.0], np.float32)

    def block(x, params):
        with kn.ir.scope("0.linear"):
            h = x * params["scale"] + weights
        with kn.ir.scope("1.relu"):
            h = kn.where(h > 0.0, h, 0.0)
        return {"y": h, "positive": h > 0.0}

    graph = kn.trace(block, np.ones((2, 3), np.float32), {"scale": np.ones(3, np.float32)})
    assert graph.text() in _doc_graphs()

    def count(x):
        return kn.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] * 2.0), (np.int32(0), x))[1]

    assert kn.trace(count, np.ones(2, np.float32)).text() in _doc_graphs()
