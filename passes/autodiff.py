"""The ``autodiff`` pass: append the reverse-mode gradient of output 0 w.r.t. every float input."""

from kaun_ir.ir.core import Graph
from kaun_ir.passes.registry import register
from kaun_ir.transforms.autodiff import gradient_graph


@register("autodiff")
def autodiff(graph: Graph) -> Graph:
    """Reverse mode: add gradients of the scalar output 0 w.r.t. every floating-point input."""
    return gradient_graph(graph)
