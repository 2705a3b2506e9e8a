"""A pass of your own, registered from outside kaun_ir (the worked example of docs/passes.md).

Run it with:  kaun-ir opt --load tests/example_pass.py -p 'double-negation,dce' tests/example_pass.kir
"""

from kaun_ir import passes
from kaun_ir.ir import Graph, Node


@passes.register(
    "double-negation",
    options={
        "limit": (int, -1, "remove at most this many pairs (-1: all); handy for bisecting"),
    },
)
def double_negation(graph: Graph, limit: int) -> Graph:
    """Replace negate(negate(x)) by x."""
    replacement = {}  # id(old value) -> the value that now stands for it
    nodes = []
    removed = 0
    for node in graph.nodes:
        inputs = [replacement.get(id(v), v) for v in node.inputs]
        inner = inputs[0].node if node.op == "negate" else None
        if inner is not None and inner.op == "negate" and (limit < 0 or removed < limit):
            replacement[id(node.outputs[0])] = inner.inputs[0]  # -(-x) is x
            removed += 1
            continue
        # passes never modify their input: a node whose operands changed is rebuilt
        fresh = Node(node.op, inputs, node.attrs, node.types, node.regions, node.path, node.source)
        replacement.update({id(old): new for old, new in zip(node.outputs, fresh.outputs)})
        nodes.append(fresh)
    passes.statistic("double negations removed", removed)
    outputs = [replacement.get(id(v), v) for v in graph.outputs]
    # the inner negations may now be dead: leave them to dce
    return Graph(graph.inputs, outputs, nodes, graph.name, graph.input_names)
