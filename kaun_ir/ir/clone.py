"""Copying graphs with substituted values: the building block of inlining and re-indexing."""

from __future__ import annotations

from collections.abc import Sequence

from kaun_ir.ir.core import Graph, Node, Value


def with_inputs(node: Node, inputs: Sequence[Value], regions: Sequence[Graph] | None = None) -> Node:
    """``node`` over ``inputs`` (and ``regions`` if given), keeping its op, attributes, types,
    layer path, source line and provenance: ``node`` itself when nothing changed, else a copy."""
    inputs = tuple(inputs)
    regions = node.regions if regions is None else tuple(regions)
    if all(a is b for a, b in zip(inputs, node.inputs)) and all(
        a is b for a, b in zip(regions, node.regions)
    ):
        return node
    return Node(
        node.op,
        inputs,
        node.attrs,
        node.types,
        regions,
        path=node.path,
        source=node.source,
        provenance=node.provenance,
    )


def copy_node(node: Node, env: dict[int, Value], regions: Sequence[Graph] | None = None) -> Node:
    """``node`` reading its inputs through ``env`` (``id(old value) -> new value``; values not in
    it stay) and with ``regions`` if given: ``node`` itself when nothing changed, else a copy
    whose results are added to ``env``."""
    new = with_inputs(node, [env.get(id(v), v) for v in node.inputs], regions)
    if new is not node:
        for old, fresh in zip(node.outputs, new.outputs):
            env[id(old)] = fresh
    return new


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
            provenance=node.provenance,
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
