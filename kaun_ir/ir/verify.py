"""``graph.verify()``: every type re-derived from the op table, SSA order, outputs defined."""

from __future__ import annotations

from kaun_ir.errors import IRError
from kaun_ir.ir import optable
from kaun_ir.ir.core import Graph


def verify(graph: Graph, _outer: str = "") -> None:
    """Check the graph's invariants (SSA order, operand types as the op table infers them,
    regions, outputs); raises ``IRError`` naming the first node that breaks one."""
    ops = optable.table()

    where = f"{_outer}@{graph.name}"
    defined: set[int] = set()
    for i, value in enumerate(graph.inputs):
        if value.node is not None or value.index != i:
            raise IRError(f"{where}: input {i} is not argument {i} of the graph")
        defined.add(id(value))
    for position, node in enumerate(graph.nodes):
        label = f"{where}: node {position} ({node.op}{' at ' + node.path if node.path else ''})"
        opdef = ops.get(node.op)
        if opdef is None:
            raise IRError(f"{label}: unknown op {node.op!r}")
        for k, value in enumerate(node.inputs):
            if id(value) not in defined:
                raise IRError(
                    f"{label}: operand {k} ({value!r}) is used before it is defined "
                    "or comes from outside the graph"
                )
        try:
            attrs = opdef.check_attrs(node.attr_dict)
            expected = opdef.infer_types([v.type for v in node.inputs], attrs, node.regions)
        except Exception as err:  # any complaint of a type rule is a broken graph, reported at the node
            raise IRError(f"{label}: type rule rejects the operands: {err}") from None
        if tuple(expected) != node.types:
            got = ", ".join(map(str, node.types))
            want = ", ".join(map(str, expected))
            raise IRError(f"{label}: result type(s) {got} differ from the type rule's {want}")
        for region in node.regions:
            verify(region, f"{label} region ")
        for out in node.outputs:
            if out.node is not node:
                raise IRError(f"{label}: output does not point back at its node")
            if id(out) in defined:
                raise IRError(
                    f"{label}: result {out.index} is defined twice (the node is listed more than once)"
                )
            defined.add(id(out))
    for i, value in enumerate(graph.outputs):
        if id(value) not in defined:
            raise IRError(f"{where}: output {i} ({value!r}) is not defined in the graph")
