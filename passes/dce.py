"""Dead-code elimination: keep exactly the nodes the outputs depend on."""

from kaun_ir.ir.core import Graph

from .registry import register


@register("dce")
def dce(graph: Graph) -> Graph:
    """Remove nodes whose results no output depends on."""
    return Graph.from_outputs(graph.inputs, graph.outputs, graph.name, graph.input_names)
