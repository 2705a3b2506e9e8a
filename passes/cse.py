"""Common-subexpression elimination over structurally identical nodes."""

from kaun_ir.ir.clone import copy_node
from kaun_ir.ir.core import Graph, Node
from kaun_ir.passes.registry import register


@register("cse")
def cse(graph: Graph) -> Graph:
    """Merge nodes with the same op, attributes, regions and operands (all ops are pure)."""
    replacement: dict[int, object] = {}  # id(old value) -> new value
    seen: dict[tuple, Node] = {}
    nodes: list[Node] = []
    for node in graph.nodes:
        fresh = copy_node(node, replacement)  # its key must name the merged operands
        twin = seen.get(fresh.key)
        if twin is None:
            seen[fresh.key] = fresh
            nodes.append(fresh)
            twin = fresh
        for old, new in zip(node.outputs, twin.outputs):
            replacement[id(old)] = new
    outputs = [replacement.get(id(v), v) for v in graph.outputs]
    return Graph(graph.inputs, outputs, nodes, graph.name, graph.input_names)
