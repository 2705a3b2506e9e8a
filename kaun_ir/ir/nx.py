"""The networkx view of a graph (for analyses and the visualisation tools)."""

from __future__ import annotations

import networkx as nx

from kaun_ir.ir.core import Graph
from kaun_ir.ir.provenance import describe


def to_networkx(graph: Graph):
    """A ``networkx.MultiDiGraph`` with one node per graph input, op and output, and one edge
    per operand (``x * x`` gives two edges between the same nodes, keyed 0 and 1).

    Node ids: ``"arg<i>"``, ``"n<k>"`` (k = position in ``graph.nodes``), ``"out<i>"``. Op nodes
    carry ``op``, ``types`` (text), ``attrs`` (dict), ``path`` (layer path) and ``source`` (with
    the provenance of transformation-made nodes, :func:`kaun_ir.ir.provenance.describe`);
    edges carry ``type``, ``index`` (the operand position at the target) and ``result`` (the
    result index at the source).
    """
    dg = nx.MultiDiGraph(name=graph.name)  # one edge per operand, even x * x
    ids: dict[int, str] = {}
    for i, value in enumerate(graph.inputs):
        nid = f"arg{i}"
        name = graph.input_names[i] if graph.input_names else ""
        dg.add_node(
            nid, op="input", types=[str(value.type)], attrs={"index": i, "name": name}, path="", source=""
        )
        ids[id(value)] = nid
    for k, node in enumerate(graph.nodes):
        nid = f"n{k}"
        dg.add_node(
            nid,
            op=node.op,
            types=[str(t) for t in node.types],
            attrs=node.attr_dict,
            path=node.path,
            source=describe(node),  # with the provenance: "model.py:12 (backward of sqrt)"
        )
        for operand_index, value in enumerate(node.inputs):
            dg.add_edge(
                ids[id(value)],
                nid,
                key=operand_index,
                type=str(value.type),
                index=operand_index,
                result=value.index,
            )
        for out in node.outputs:
            ids[id(out)] = nid
    for i, value in enumerate(graph.outputs):
        nid = f"out{i}"
        dg.add_node(nid, op="output", types=[str(value.type)], attrs={"index": i}, path="", source="")
        dg.add_edge(ids[id(value)], nid, type=str(value.type), index=0, result=value.index)
    return dg
