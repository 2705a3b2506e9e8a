"""Property: printing then parsing a graph is the identity, for random graphs built from the op
table's own samples (every op, its attributes and regions), with random layer paths, source
locations, argument labels and constants holding NaN, infinities and signed zeros."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from optest import samples_of

from kaun_ir import ops
from kaun_ir.ir import parse
from kaun_ir.ir.core import ArrayAttr, Graph, Node, TensorType

CASES = samples_of(ops.TABLE)
SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -1e-45, 3.4e38]
# layer paths and labels: any printable text, quotes, backslashes and non-ASCII included
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


def _constant(value: np.ndarray) -> Node:
    value = np.asarray(value)
    return Node("constant", [], {"value": ArrayAttr(value)}, [TensorType(value.dtype, value.shape)])


@st.composite
def graphs(draw):
    picks = draw(st.lists(st.sampled_from(range(len(CASES))), min_size=1, max_size=6))
    # first decide which operands are graph arguments (so they can be numbered together) ...
    plan, arg_types, labels = [], [], []
    for pick in picks:
        name, _, sample = CASES[pick]
        operands = []
        for array in sample.inputs:
            array = np.asarray(array)
            if draw(st.booleans()):
                if array.dtype.kind == "f" and array.size and draw(st.booleans()):
                    array = array.copy()
                    array.flat[0] = draw(st.sampled_from(SPECIAL))
                operands.append(("constant", array))
            else:
                operands.append(("argument", len(arg_types)))
                arg_types.append(TensorType(array.dtype, array.shape))
                labels.append(draw(TEXT))
        plan.append((name, sample, operands))
    # ... then build the nodes
    args = Graph.arguments(arg_types)
    nodes, outputs = [], []
    for name, sample, operands in plan:
        values = []
        for kind, what in operands:
            if kind == "argument":
                values.append(args[what])
            else:
                nodes.append(_constant(what))
                values.append(nodes[-1].outputs[0])
        opdef = ops.TABLE[name]
        attrs = opdef.check_attrs(dict(sample.attrs))
        out_types = opdef.infer_types([v.type for v in values], attrs, sample.regions)
        node = Node(
            name,
            values,
            attrs,
            out_types,
            sample.regions,
            path=draw(TEXT),
            source=draw(st.sampled_from(["", "model.py:12", "d\u00e9j\u00e0.py:3"])),
        )
        nodes.append(node)
        outputs += list(node.outputs[: draw(st.integers(1, len(node.outputs)))])
    name = draw(st.sampled_from(["main", "g", "step_1"]))
    return Graph(list(args), outputs, nodes, name, labels if any(labels) else None)


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(graphs())
def test_print_then_parse_is_the_identity(graph):
    graph.verify()
    for debug in (False, True):
        text = graph.text(debug=debug)
        again = parse(text)
        assert again.text(debug=debug) == text
    assert parse(graph.text(debug=True)).text() == graph.text()
