"""Dead-code elimination: keep exactly the nodes the outputs depend on."""

from kaun_ir.ir.core import Graph
from kaun_ir.passes.registry import register


@register("dce")
def dce(graph: Graph) -> Graph:
    """Remove nodes whose results no output depends on."""
    live = {id(node) for node in Graph.from_outputs(graph.inputs, graph.outputs).nodes}
    nodes = [node for node in graph.nodes if id(node) in live]  # keep the original order
    return Graph(graph.inputs, graph.outputs, nodes, graph.name, graph.input_names)
