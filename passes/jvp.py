"""The ``jvp`` pass: forward mode (``kaun_ir.forward.jvp_graph``) as a pipeline step."""

from kaun_ir.forward import jvp_graph
from kaun_ir.ir.core import Graph

from .registry import register


@register("jvp")
def jvp(graph: Graph) -> Graph:
    """Forward mode: one tangent input per floating-point input, one tangent output per output."""
    return jvp_graph(graph)
