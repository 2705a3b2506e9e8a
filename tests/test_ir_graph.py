"""Graph invariants (``verify``), the networkx view, the interpreter, ``from_outputs`` and the
``cse`` / ``dce`` passes. Broken graphs are built by hand with ``kaun_ir.ir.core``."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.ir.core import Graph, Node, TensorType

F32 = np.float32
T23 = TensorType(F32, (2, 3))


def two_args():
    return Graph.arguments([T23, T23])


# ---------------------------------------------------------------------------------- verify


def test_verify_accepts_a_good_graph_and_returns_it():
    a, b = two_args()
    add = Node("add", [a, b], {}, [T23])
    exp = Node("exponential", add.outputs, {}, [T23])
    graph = Graph([a, b], exp.outputs, [add, exp])
    assert graph.verify() is graph


def test_verify_catches_a_wrong_result_type_and_names_the_node():
    a, b = two_args()
    bad = Node("add", [a, b], {}, [TensorType(F32, (3, 2))], path="enc.0")
    with pytest.raises(kn.IRError) as info:
        Graph([a, b], bad.outputs, [bad], name="net").verify()
    assert str(info.value) == (
        "@net: node 0 (add at enc.0): result type(s) f32[3,2] differ from the type rule's f32[2,3]"
    )


def test_verify_catches_a_wrong_result_dtype():
    a, b = two_args()
    bad = Node("add", [a, b], {}, [TensorType(np.float64, (2, 3))])
    with pytest.raises(kn.IRError, match=r"node 0 \(add\): result type\(s\) f64\[2,3\] differ"):
        Graph([a, b], bad.outputs, [bad]).verify()


def test_verify_catches_use_before_definition():
    a, b = two_args()
    add = Node("add", [a, b], {}, [T23])
    exp = Node("exponential", add.outputs, {}, [T23])
    pattern = r"node 0 \(exponential\): operand 0 .*add#0.* is used before it is defined"
    with pytest.raises(kn.IRError, match=pattern):
        Graph([a, b], exp.outputs, [exp, add]).verify()


def test_verify_catches_an_argument_of_another_graph():
    a, b = two_args()
    (stranger,) = Graph.arguments([T23])
    add = Node("add", [a, stranger], {}, [T23])
    with pytest.raises(kn.IRError, match=r"node 0 \(add\): operand 1 .*comes from outside the graph"):
        Graph([a, b], add.outputs, [add]).verify()


def test_verify_catches_a_value_computed_in_another_graph():
    a, b = two_args()
    elsewhere = Node("negate", [a], {}, [T23])
    Graph([a, b], elsewhere.outputs, [elsewhere]).verify()  # fine in its own graph
    add = Node("add", [a, elsewhere.outputs[0]], {}, [T23], path="head")
    with pytest.raises(kn.IRError, match=r"node 0 \(add at head\): operand 1 \(Value\(negate#0"):
        Graph([a, b], add.outputs, [add]).verify()


def test_verify_catches_an_unknown_op():
    a, b = two_args()
    node = Node("frobnicate", [a], {}, [T23])
    with pytest.raises(kn.IRError, match=r"^@main: node 0 \(frobnicate\): unknown op 'frobnicate'$"):
        Graph([a, b], node.outputs, [node]).verify()


def test_verify_catches_an_undefined_output():
    a, b = two_args()
    add = Node("add", [a, b], {}, [T23])
    dangling = Node("negate", [a], {}, [T23])
    pattern = r"^@main: output 1 \(Value\(negate#0: f32\[2,3\]\)\) is not defined"
    with pytest.raises(kn.IRError, match=pattern):
        Graph([a, b], [add.outputs[0], dangling.outputs[0]], [add]).verify()


def test_verify_catches_inputs_out_of_order():
    a, b = two_args()
    with pytest.raises(kn.IRError, match="input 0 is not argument 0"):
        Graph([b, a], [a], []).verify()


def test_verify_catches_bad_attributes_and_arity():
    a, b = two_args()
    missing = Node("reshape", [a], {}, [TensorType(F32, (6,))])
    with pytest.raises(kn.IRError, match="missing attribute"):
        Graph([a, b], missing.outputs, [missing]).verify()
    wrong = Node("reshape", [a], {"shape": (7,)}, [TensorType(F32, (7,))])
    with pytest.raises(kn.IRError, match=r"node 0 \(reshape\): type rule rejects the operands: .*7"):
        Graph([a, b], wrong.outputs, [wrong]).verify()
    unary = Node("add", [a], {}, [T23])
    with pytest.raises(kn.IRError, match="add takes 2 operand"):
        Graph([a, b], unary.outputs, [unary]).verify()


def test_verify_checks_regions_and_names_them():
    def f(x):
        return kn.while_loop(lambda v: v[0] < 3.0, lambda v: v * 2.0, x)

    graph = kn.trace(f, np.ones(2, F32)).verify()
    loop = graph.nodes[-1]
    assert loop.op == "while"
    cond, body = loop.regions
    # a body node whose recorded type disagrees with its rule; the body's signature is intact,
    # so only the region's own verification can notice
    const = body.nodes[0]
    assert const.op == "constant"
    broken = Node("constant", [], const.attrs, [TensorType(np.float64, ())])
    broken_body = Graph(body.inputs, body.outputs, (broken,) + body.nodes[1:], "body")
    node = Node("while", loop.inputs, loop.attrs, loop.types, (cond, broken_body))
    with pytest.raises(
        kn.IRError,
        match=r"^@f: node 0 \(while\) region @body: node 0 \(constant\): "
        r"result type\(s\) f64\[\] differ",
    ):
        Graph(graph.inputs, node.outputs, [node], "f").verify()


def test_verify_catches_a_value_defined_twice():
    a, b = two_args()
    add = Node("add", [a, b], {}, [T23])
    with pytest.raises(kn.IRError, match="defined twice"):
        Graph([a, b], add.outputs, [add, add]).verify()


def test_verify_reports_any_type_rule_failure_as_ir_error():
    node = Node("constant", [], {"value": 1.0}, [TensorType(F32, ())])
    with pytest.raises(kn.IRError, match=r"node 0 \(constant\)"):
        Graph([], node.outputs, [node]).verify()


# ------------------------------------------------------------------------------- networkx


def edge_data(dg, source, target) -> list[dict]:
    """Attributes of the edges ``source -> target`` (works for DiGraph and MultiDiGraph)."""
    data = dg.get_edge_data(source, target)
    return list(data.values()) if dg.is_multigraph() else [data]


def layered(x, y):
    with kn.ir.scope("enc"):
        with kn.ir.scope("0.attn"):
            z = x + y
        w = kn.reshape(z, (3, 2))
    return kn.exp(w), z


def test_to_networkx_structure_and_attributes():
    x = np.ones((2, 3), F32)
    graph = kn.trace(layered, x, x)
    dg = graph.to_networkx()
    assert isinstance(dg, nx.MultiDiGraph)  # one edge per operand (docs/ir.md)
    n_ops = len(graph.nodes)
    assert [n.op for n in graph.nodes] == ["add", "reshape", "exponential"]
    assert dg.number_of_nodes() == 2 + n_ops + 2
    # edges: 2 into add, 1 into reshape, 1 into exponential, 2 into the outputs
    assert dg.number_of_edges() == 6
    assert nx.is_directed_acyclic_graph(dg)
    assert dg.graph["name"] == "layered"
    assert dg.nodes["arg0"] == {
        "op": "input",
        "types": ["f32[2,3]"],
        "attrs": {"index": 0, "name": "0"},
        "path": "",
        "source": "",
    }
    add, reshape, exp = dg.nodes["n0"], dg.nodes["n1"], dg.nodes["n2"]
    assert (add["op"], add["path"], add["types"]) == ("add", "enc.0.attn", ["f32[2,3]"])
    assert (reshape["op"], reshape["path"], reshape["attrs"]) == ("reshape", "enc", {"shape": (3, 2)})
    assert (exp["op"], exp["path"], exp["types"]) == ("exponential", "", ["f32[3,2]"])
    assert add["source"].startswith("test_ir_graph.py:")
    assert edge_data(dg, "arg1", "n0") == [{"type": "f32[2,3]", "index": 1, "result": 1}]
    assert edge_data(dg, "n1", "n2") == [{"type": "f32[3,2]", "index": 0, "result": 0}]
    assert set(dg.predecessors("out0")) == {"n2"} and set(dg.predecessors("out1")) == {"n0"}
    assert dg.nodes["out1"]["op"] == "output" and dg.nodes["out1"]["types"] == ["f32[2,3]"]


def test_to_networkx_groups_by_layer_path():
    x = np.ones((2, 3), F32)
    dg = kn.trace(layered, x, x).to_networkx()
    by_path: dict[str, list[str]] = {}
    for _, data in dg.nodes(data=True):
        if data["op"] not in ("input", "output"):
            by_path.setdefault(data["path"], []).append(data["op"])
    assert by_path == {"enc.0.attn": ["add"], "enc": ["reshape"], "": ["exponential"]}


def test_to_networkx_keeps_every_operand_edge():
    graph = kn.trace(lambda x: x * x, np.ones(2, F32))
    dg = graph.to_networkx()
    operand_uses = sum(len(n.inputs) for n in graph.nodes) + len(graph.outputs)
    assert dg.number_of_edges() == operand_uses
    assert sorted(d["index"] for d in edge_data(dg, "arg0", "n0")) == [0, 1]


# ---------------------------------------------------------------------------- interpreter


def test_interpret_matches_numpy():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3)).astype(F32)
    y = rng.standard_normal((2, 3)).astype(F32)
    exp_w, z = kn.ir.interpret(kn.trace(layered, x, y), x, y)
    np.testing.assert_allclose(z, x + y, rtol=1e-6)
    np.testing.assert_allclose(exp_w, np.exp((x + y).reshape(3, 2)), rtol=1e-6)
    assert exp_w.dtype == F32


def test_interpret_integer_and_bool_ops_exactly():
    def f(a, b):
        return kn.where(a > b, a - b, b * 3), a // b, a % b

    a = np.array([7, -7, 5, 0, 9], np.int32)
    b = np.array([2, 2, -3, 4, 9], np.int32)
    sel, div, mod = kn.ir.interpret(kn.trace(f, a, b), a, b)
    np.testing.assert_array_equal(sel, np.where(a > b, a - b, b * 3))
    np.testing.assert_array_equal(div, a // b)
    np.testing.assert_array_equal(mod, a % b)


def test_interpret_checks_its_arguments():
    graph = kn.trace(layered, np.ones((2, 3), F32), np.ones((2, 3), F32))
    with pytest.raises(TypeError, match="takes 2 input"):
        kn.ir.interpret(graph, np.ones((2, 3), F32))
    with pytest.raises(TypeError, match=r"input 1: expected f32\[2,3\], got shape \(3,\)"):
        kn.ir.interpret(graph, np.ones((2, 3), F32), np.ones(3, F32))


# ---------------------------------------------------------------------- Graph.from_outputs


def assert_topological(graph: Graph):
    defined = {id(v) for v in graph.inputs}
    for node in graph.nodes:
        assert all(id(v) in defined for v in node.inputs), node
        defined.update(id(v) for v in node.outputs)


def diamond():
    (a,) = Graph.arguments([T23])
    top = Node("negate", [a], {}, [T23])
    left = Node("exponential", top.outputs, {}, [T23])
    right = Node("sine", top.outputs, {}, [T23])
    join = Node("add", [left.outputs[0], right.outputs[0]], {}, [T23])
    dead = Node("cosine", [a], {}, [T23])
    return a, top, left, right, join, dead


def test_from_outputs_keeps_exactly_the_needed_nodes_in_a_topological_order():
    a, top, left, right, join, dead = diamond()
    graph = Graph.from_outputs([a], join.outputs)
    assert graph.nodes == (top, left, right, join)  # depth-first from the first operand
    assert dead not in graph.nodes
    assert_topological(graph)
    graph.verify()


def test_from_outputs_with_several_outputs_shared_nodes_and_inputs_as_outputs():
    a, top, left, right, join, dead = diamond()
    graph = Graph.from_outputs([a], [right.outputs[0], a, join.outputs[0], right.outputs[0]])
    assert graph.nodes == (top, right, left, join)
    assert len(set(map(id, graph.nodes))) == len(graph.nodes)
    assert graph.outputs[1] is a
    assert_topological(graph)
    graph.verify()
    assert Graph.from_outputs([a], [a]).nodes == ()


def test_from_outputs_on_a_long_chain_does_not_recurse():
    (a,) = Graph.arguments([T23])
    value = a
    for _ in range(5000):  # deeper than Python's recursion limit
        value = Node("negate", [value], {}, [T23]).outputs[0]
    graph = Graph.from_outputs([a], [value])
    assert len(graph.nodes) == 5000
    assert_topological(graph)


# --------------------------------------------------------------------------------- passes


def redundant(x, y):
    a = kn.exp(x) * y
    b = kn.exp(x) * y  # the same computation again
    unused = kn.sin(a)  # noqa: F841 - dead
    c = kn.exp(y)
    return a + b + c, a


def test_cse_merges_identical_nodes_and_dce_removes_dead_ones():
    x = np.ones(3, F32)
    graph = kn.trace(redundant, x, x)
    assert graph.op_counts() == {"exponential": 3, "multiply": 2, "sine": 1, "add": 2}
    after_cse = kn.passes.run(graph, "cse")
    assert after_cse.op_counts() == {"exponential": 2, "multiply": 1, "sine": 1, "add": 2}
    after_both = kn.passes.run(graph, "cse,dce")
    assert after_both.op_counts() == {"exponential": 2, "multiply": 1, "add": 2}
    after_dce = kn.passes.run(graph, "dce")
    assert after_dce.op_counts() == {"exponential": 3, "multiply": 2, "add": 2}
    for result in (after_cse, after_both, after_dce):
        result.verify()
        assert result.input_names == graph.input_names and result.name == graph.name
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(3).astype(F32) for _ in range(2)]
    want = kn.ir.interpret(graph, *xs)
    for result in (after_cse, after_both, after_dce):
        for got, expected in zip(kn.ir.interpret(result, *xs), want):
            np.testing.assert_array_equal(got, expected)


def test_cse_merges_equal_constants_but_not_different_ones():
    def f(x):
        return (x + np.float32(0.0)) * (x + np.float32(0.0)) + (x + np.float32(-0.0)) + (x > 0.0) * 1.0

    graph = kn.trace(f, np.ones(2, F32))
    optimised = kn.passes.run(graph, "cse,dce")
    constants = [n.attr("value").array for n in optimised.nodes if n.op == "constant"]
    # 0.0 and -0.0 differ bitwise and must stay separate; equal constants are merged
    assert sorted(c.tobytes() for c in constants) == sorted({c.tobytes() for c in constants})
    assert any(np.signbit(c) for c in constants if c.dtype == F32 and c == 0)
    x = np.array([-1.0, 2.0], F32)
    np.testing.assert_array_equal(kn.ir.interpret(optimised, x)[0], kn.ir.interpret(graph, x)[0])


def test_cse_keeps_nodes_that_differ_in_attributes():
    def f(x, y):
        return x < y, x > y, x < y

    graph = kn.trace(f, np.ones(2, F32), np.ones(2, F32))
    optimised = kn.passes.run(graph, "cse")
    assert optimised.op_counts() == {"compare": 2}
    assert optimised.outputs[0] is optimised.outputs[2]
    assert optimised.outputs[0] is not optimised.outputs[1]


def test_cse_merges_identical_loops():
    def f(x):
        def loop(v):
            return kn.while_loop(lambda s: s[0] < 10.0, lambda s: s + 1.0, v)

        return loop(x) + loop(x)

    graph = kn.trace(f, np.zeros(2, F32))
    assert graph.op_counts()["while"] == 2
    assert kn.passes.run(graph, "cse,dce").op_counts()["while"] == 1


def test_passes_never_mutate_their_input_graph():
    x = np.ones(3, F32)
    graph = kn.trace(redundant, x, x)
    text, debug = graph.text(), graph.text(debug=True)
    nodes, outputs, inputs = graph.nodes, graph.outputs, graph.inputs
    node_inputs = [n.inputs for n in graph.nodes]
    for pipeline in ("cse", "dce", "cse,dce", "dce,cse,dce"):
        result = kn.passes.run(graph, pipeline)
        assert result is not graph
    assert graph.text() == text and graph.text(debug=True) == debug
    assert graph.nodes is nodes and graph.outputs is outputs and graph.inputs is inputs
    assert [n.inputs for n in graph.nodes] == node_inputs
    graph.verify()


def test_pass_pipeline_errors_and_registry():
    assert {"cse", "dce"} <= set(kn.passes.available())
    assert kn.passes.parse_pipeline(" cse , dce ") == ["cse", "dce"]
    with pytest.raises(ValueError, match="unknown pass 'nope'; available: .*cse"):
        kn.passes.run(kn.trace(lambda x: -x, np.ones(1, F32)), "cse,nope")
    with pytest.raises(ValueError, match="kebab-case"):
        kn.passes.register("Bad_Name")


def test_dce_without_dead_code_leaves_the_text_unchanged():
    def f(x):
        a = kn.exp(x)
        b = kn.sin(x)
        return b, a

    graph = kn.trace(f, np.ones(3, F32))
    assert kn.passes.run(graph, "dce").text() == graph.text()


def test_builder_location_and_at_set_path_source_and_provenance():
    from kaun_ir.ir.builder import Builder, at, is_active, location
    from kaun_ir.ir.provenance import Provenance, backward_of
    from kaun_ir.surface.tensor import Tensor, apply

    t = TensorType(np.float32, (2,))
    with Builder(record_source=False) as builder:
        x = builder.add_input(t)
        with kn.ir.scope("outer"), location(path="blk", source="m.py:3", provenance=backward_of("exp")):
            with kn.ir.scope("inner"):  # a scope still nests under the given path
                y = apply("negate", Tensor(x, builder))
        model = y.value.node
        with kn.ir.scope("elsewhere"), at(model):
            z = apply("abs", y)
        with at(model, provenance=None):
            w = apply("abs", z)
        assert is_active(builder)
    assert not is_active(builder)
    assert (model.path, model.source, model.provenance) == (
        "blk.inner",
        "m.py:3",
        Provenance("backward", "exp"),
    )
    assert (z.value.node.path, z.value.node.source) == ("blk.inner", "m.py:3")
    assert z.value.node.provenance == model.provenance
    assert w.value.node.provenance is None
    with pytest.raises(ValueError, match="provenance kind"):
        Provenance("sideways")
