"""Copying graphs with substituted values: the building block of inlining and re-indexing."""

from __future__ import annotations

from collections.abc import Sequence

from .core import Graph, Node, Value


def copy_nodes(graph: Graph, env: dict[int, Value], sink: list[Node], path_prefix: str = "") -> list[Value]:
    """Append copies of ``graph``'s nodes to ``sink``, reading inputs through ``env``.

    ``env`` maps ``id(old value) -> new value`` and must cover the graph's inputs; it is
    extended with every copied result. ``path_prefix`` is joined in front of each layer path
    (so a function inlined inside ``kn.ir.scope("enc")`` keeps its structure under ``enc``).
    Returns the new values of the graph's outputs.
    """
    for node in graph.nodes:
        path = ".".join(p for p in (path_prefix, node.path) if p)
        new = Node(
            node.op,
            [env.get(id(v), v) for v in node.inputs],
            node.attrs,
            node.types,
            node.regions,
            path=path,
            source=node.source,
        )
        for old, fresh in zip(node.outputs, new.outputs):
            env[id(old)] = fresh
        sink.append(new)
    return [env[id(v)] for v in graph.outputs]


def rebind(
    graph: Graph, inputs: Sequence[Value], mapping: dict[int, Value], extra_outputs: Sequence[Value] = ()
) -> Graph:
    """A copy of ``graph`` over new argument values ``inputs``.

    ``mapping`` sends ``id(old input) -> new input``; ``extra_outputs`` (values among ``inputs``)
    are appended to the outputs.
    """
    env = dict(mapping)
    nodes: list[Node] = []
    outputs = copy_nodes(graph, env, nodes)
    return Graph(inputs, list(outputs) + list(extra_outputs), nodes, graph.name)
