"""A deliberately simple cost model of IR nodes: FLOPs and bytes per node (``kaun-ir dump
--stats``, the viewer's overlays, ``kn.layer.summary``).

The FLOPs of an op are its declaration's FLOP rule (``OpDef.flops``). The IR sits below the op
table, so the declarations are read from the installed table (:mod:`kaun_ir.ir.optable`).
"""

from __future__ import annotations

from kaun_ir.ir import optable


def node_cost(node) -> tuple[int, int]:
    """``(flops, bytes)`` of one node, a deliberately simple model.

    FLOPs: what the op's FLOP rule says (``dot_general`` 2 * output elements * contracted size,
    2*M*N*K for a matmul; ``convolution`` 2 * output elements * kernel window * input channels
    per group; element-wise arithmetic 1 per output element; reductions 1 per input element;
    ``reduce_window`` and ``select_and_scatter_add`` 1 per output (source) element and window
    position; scatters that combine 1 per update element); 0 for data movement (reshape,
    transpose, broadcast, slices, gather, constants, bit casts) and for ops unknown to the table.
    A ``while`` counts its regions once (the trip count is not known statically).
    Bytes: every input and output of the node, as if nothing were fused (an upper bound on
    what XLA's fused code moves).
    """
    nbytes = sum(v.type.nbytes for v in node.inputs) + sum(t.nbytes for t in node.types)
    opdef = optable.table().get(node.op)
    flops = 0
    if opdef is not None:
        flops = opdef.count_flops([v.type for v in node.inputs], node.types, dict(node.attrs))
    for region in node.regions:
        f, b = graph_cost(region)
        flops, nbytes = flops + f, nbytes + b
    return flops, nbytes


def graph_cost(graph) -> tuple[int, int]:
    """Total ``(flops, bytes)`` of a graph under :func:`node_cost`."""
    flops = nbytes = 0
    for node in graph.nodes:
        f, b = node_cost(node)
        flops, nbytes = flops + f, nbytes + b
    return flops, nbytes
