"""A deliberately simple cost model of IR nodes: FLOPs and bytes per node (``kaun-ir dump
--stats``, the viewer's overlays, ``kn.layer.summary``)."""

from __future__ import annotations

# ops applied element by element, one FLOP per output element (the layout pass moves them too)
ELEMENTWISE = frozenset(
    {
        "negate",
        "abs",
        "sign",
        "exponential",
        "exponential_minus_one",
        "log",
        "log_plus_one",
        "sqrt",
        "rsqrt",
        "tanh",
        "logistic",
        "sine",
        "cosine",
        "floor",
        "ceil",
        "round_nearest_even",
        "erf",
        "not",
        "add",
        "subtract",
        "multiply",
        "divide",
        "power",
        "maximum",
        "minimum",
        "remainder",
        "atan2",
        "and",
        "or",
        "xor",
        "shift_left",
        "shift_right_logical",
        "shift_right_arithmetic",
        "compare",
        "select",
        "clamp",
        "convert",
    }
)
# ops with one FLOP per *input* element (reductions)
_REDUCTIONS = {"reduce", "argmax", "argmin"}


def node_cost(node) -> tuple[int, int]:
    """``(flops, bytes)`` of one node, a deliberately simple model.

    FLOPs: ``dot_general`` 2 * output elements * contracted size (2*M*N*K for a matmul);
    ``convolution`` 2 * output elements * kernel window * input channels per group;
    element-wise ops 1 per output element; reductions 1 per input element; ``reduce_window``
    and ``select_and_scatter_add`` 1 per output (source) element and window position;
    ``scatter_add`` 1 per update element; data movement (reshape, transpose, broadcast,
    slices, gather, constants, conversions of bits) 0. A ``while`` counts its regions once
    (the trip count is not known statically).
    Bytes: every input and output of the node, as if nothing were fused (an upper bound on
    what XLA's fused code moves).
    """
    op = node.op
    out_elems = sum(t.size for t in node.types)
    nbytes = sum(v.type.nbytes for v in node.inputs) + sum(t.nbytes for t in node.types)
    if op == "dot_general":
        lhs = node.inputs[0].type.shape
        k = 1
        for axis in node.attr("lhs_contracting", ()):
            k *= lhs[axis]
        flops = 2 * out_elems * k
    elif op == "convolution":
        rhs = node.inputs[1].type.shape
        spec = node.attr("rhs_spec")  # (output feature, input feature, spatial...)
        window = 1
        for axis in spec[2:]:
            window *= rhs[axis]
        flops = 2 * out_elems * window * rhs[spec[1]]  # the kernel's input dim is C_in / groups
    elif op in ELEMENTWISE:
        flops = out_elems
    elif op in _REDUCTIONS:
        flops = node.inputs[0].type.size
    elif op in ("reduce_window", "select_and_scatter_add"):
        window = 1
        for d in node.attr("window_dimensions", ()):
            window *= d
        source = node.types[0] if op == "reduce_window" else node.inputs[1].type
        flops = source.size * window
    elif op == "scatter_add":
        flops = node.inputs[-1].type.size
    else:
        flops = 0
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
