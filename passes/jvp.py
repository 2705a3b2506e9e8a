"""The ``jvp`` pass: forward mode (``kaun_ir.transforms.jvp.jvp_graph``) as a pipeline step."""

from kaun_ir.ir.core import Graph
from kaun_ir.passes.registry import register
from kaun_ir.transforms.jvp import jvp_graph


@register("jvp")
def jvp(graph: Graph) -> Graph:
    """Forward mode: one tangent input per floating-point input, one tangent output per output."""
    return jvp_graph(graph)
