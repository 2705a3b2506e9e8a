"""Deliberately broken passes for the pass-manager tests (loaded with ``kaun-ir opt --load``).

- ``break-types`` returns a graph whose ``exponential`` results claim a wrong shape: invalid IR
  that only ``--verify-each`` (or lowering) notices.
- ``crash`` raises ZeroDivisionError (a bug, not a diagnostic): the manager writes a reproducer.
"""

from kaun_ir import passes
from kaun_ir.ir import Graph, Node, TensorType


@passes.register("break-types")
def break_types(graph: Graph) -> Graph:
    """Give every exponential a wrong result shape (for testing --verify-each)."""
    replacement, nodes = {}, []
    for node in graph.nodes:
        inputs = [replacement.get(id(v), v) for v in node.inputs]
        types = node.types
        if node.op == "exponential":
            types = [TensorType(t.dtype, t.shape + (1,)) for t in types]
        fresh = Node(node.op, inputs, node.attrs, types, node.regions, node.path, node.source)
        replacement.update({id(old): new for old, new in zip(node.outputs, fresh.outputs)})
        nodes.append(fresh)
    outputs = [replacement.get(id(v), v) for v in graph.outputs]
    return Graph(graph.inputs, outputs, nodes, graph.name, graph.input_names)


@passes.register("crash", options={"divisor": (int, 0, "what to divide by (0 crashes)")})
def crash(graph: Graph, divisor: int) -> Graph:
    """Divide by ``divisor``: crashes with the default (for testing crash reproducers)."""
    passes.statistic("divisions", 1)
    _ = len(graph.nodes) // divisor
    return graph
