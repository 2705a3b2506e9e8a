"""``merge-dots``: several small products as one larger ``dot_general``.

Matrix-multiply kernels run small products far below their peak: on XLA CPU a
``[1024, 128] x [128, 128]`` product (an attention projection of the ``transformer`` workload)
runs at about a third of the speed of a 1024-cube. Attention computes three such products from
one input, and reverse mode adds two more triples. Two rewrites turn each triple into one
product three times larger:

- **siblings**: ``dot_general(x, w_i)`` for several ``w_i`` with the same shape and the same
  dimension numbers (or the mirror image, a shared right operand) become one product with the
  ``w_i`` concatenated along their last free axis, and slices of its result. That is the
  forward ``q, k, v = x @ wq, x @ wk, x @ wv`` and the weight gradients ``x^T dq, x^T dk, x^T dv``.
  The merged product is placed after the last of its operands is defined; the rewrite is made
  only when that is before the first use of any of the products it replaces, so the graph's
  order stays valid without moving anything else.
- **sums**: ``dot_general(a1, b1) + dot_general(a2, b2)`` with the same dimension numbers, each
  product used only by the sum, becomes one product over the operands concatenated along their
  last contracting axis: the input gradient ``dq wq^T + dk wk^T + dv wv^T``. Chains of sums
  merge pairwise.

The two rewrites agree on the order of the operands they concatenate: reverse mode sums the
input gradient's terms in the reverse of the forward order (``dv wv^T + dk wk^T + dq wq^T``),
so a sibling group whose operands are the terms of such a sum (the forward weights
``wq, wk, wv``) is concatenated in the sum's order, and a chain of sums is one flat
concatenation. The forward product and the input gradient then read one concatenation of the
weights (common-subexpression elimination merges the two) instead of two in opposite orders.

Exact up to summation order: every element sums the same terms, but a wider product may be
blocked differently by the kernel, and the sum rewrite adds the partial products inside one
contraction instead of after it, so results agree to rounding (the tests compare with a float64
product). Both rewrites are made only where the copy into the concatenation holds at most 1/16
as many elements as the merged product has multiply-adds: merging matrix-vector products (one
token at a time) would only add a copy of the weights.

Statistics: ``sibling products merged`` (products replaced), ``summed products merged``.
"""

from __future__ import annotations

import math

from kaun_ir.ir.clone import copy_node
from kaun_ir.ir.core import Graph, Node, Value
from kaun_ir.passes.registry import register, statistic
from kaun_ir.passes.rewrite import Rewriter

_DIMS = ("lhs_batch", "rhs_batch", "lhs_contracting", "rhs_contracting")


def _free_axes(value: Value, batch, contracting) -> list[int]:
    return [a for a in range(len(value.shape)) if a not in batch and a not in contracting]


def _dims_key(node: Node) -> tuple:
    return tuple(tuple(node.attr(k)) for k in _DIMS) + (node.attr_dict.get("preferred_dtype"),)


def _slice(rw: Rewriter, x: Value, axis: int, start: int, stop: int) -> Value:
    begin, limit = [0] * len(x.shape), list(x.shape)
    begin[axis], limit[axis] = start, stop
    return rw.emit(
        "slice", x, start_indices=tuple(begin), limit_indices=tuple(limit), strides=(1,) * len(x.shape)
    )


# ----------------------------------------------------------------------------- siblings


def _use_counts(graph: Graph) -> dict[int, int]:
    """How many times each value (by id) is read: by a node's inputs or as a graph output."""
    uses: dict[int, int] = {}
    for node in graph.nodes:
        for v in node.inputs:
            uses[id(v)] = uses.get(id(v), 0) + 1
    for v in graph.outputs:
        uses[id(v)] = uses.get(id(v), 0) + 1
    return uses


def _sum_orders(graph: Graph) -> dict[frozenset, list[int]]:
    """For each sum of single-use products (``add`` trees, as the sums rewrite merges them), the
    ids of each operand side's values in the order of the flat concatenation the rewrite builds,
    keyed by the set of those ids."""
    uses = _use_counts(graph)

    # the products each add sums (in the order of the flat concatenation), in graph order
    terms: dict[int, list[Node] | None] = {}
    orders: dict[frozenset, list[int]] = {}
    for node in graph.nodes:
        if node.op == "dot_general":
            terms[id(node.outputs[0])] = [node]
            continue
        if node.op != "add":
            continue
        found: list[Node] | None = []
        for v in node.inputs:
            part = terms.get(id(v)) if uses.get(id(v), 0) == 1 else None
            if part is None:
                found = None
                break
            found = found + part
        terms[id(node.outputs[0])] = found
        if not found or len({_dims_key(n) for n in found}) != 1:
            continue
        for pos in (0, 1):
            ids = [id(n.inputs[pos]) for n in found]
            if len(set(ids)) == len(ids):
                orders[frozenset(ids)] = ids
    return orders


def _sibling_groups(graph: Graph) -> list[tuple[int, list[Node]]]:
    """``(shared operand position, products)`` for each set of mergeable siblings, 2 or more;
    ordered as a sum of products over the same operands concatenates them, where there is one."""
    groups: dict[tuple, list[Node]] = {}
    for node in graph.nodes:
        if node.op != "dot_general":
            continue
        for shared in (0, 1):
            other = node.inputs[1 - shared]
            side = ("rhs", "lhs")[shared]
            if not _free_axes(other, node.attr(f"{side}_batch"), node.attr(f"{side}_contracting")):
                continue
            key = (id(node.inputs[shared]), shared, _dims_key(node), other.type)
            groups.setdefault(key, []).append(node)
    found, taken = [], set()
    orders = _sum_orders(graph) if groups else {}
    for (_, shared, _, _), nodes in groups.items():
        nodes = [n for n in nodes if id(n) not in taken]
        others = {id(n.inputs[1 - shared]) for n in nodes}
        order = orders.get(frozenset(others))
        if order is not None:
            nodes.sort(key=lambda n: order.index(id(n.inputs[1 - shared])))
        if len(nodes) >= 2 and len(others) == len(nodes) and _worth_copying(nodes, shared):
            found.append((shared, nodes))  # (equal products are CSE's business)
            taken.update(id(n) for n in nodes)
    return found


def _worth_copying(nodes: list[Node], shared: int) -> bool:
    """Whether the copy into the concatenation is small next to the merged product: at most
    1/16 as many elements as it has multiply-adds (a matrix-vector product over three large
    weights, as in decoding one token, would only add a copy of the weights)."""
    first = nodes[0]
    contracted = math.prod(first.inputs[0].shape[a] for a in first.attr("lhs_contracting"))
    multiply_adds = len(nodes) * first.outputs[0].type.size * contracted
    copied = len(nodes) * first.inputs[1 - shared].type.size
    return copied * 16 <= multiply_adds


def _merge_siblings(graph: Graph) -> Graph:
    groups = _sibling_groups(graph)
    if not groups:
        return graph
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    first_use: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            first_use.setdefault(id(v), i)
    placed: dict[int, list[tuple[int, list[Node]]]] = {}  # after node index -> groups
    members = {id(n) for _, nodes in groups for n in nodes}
    for shared, nodes in groups:
        operands = [nodes[0].inputs[shared]] + [n.inputs[1 - shared] for n in nodes]
        if any(v.node is not None and id(v.node) in members for v in operands):
            continue  # reads another group's product, which moves: left for a later run
        ready = max((index[id(v.node)] for v in operands if v.node is not None), default=-1)
        used = min((first_use.get(id(n.outputs[0]), len(graph.nodes)) for n in nodes), default=0)
        if ready < used:
            placed.setdefault(ready, []).append((shared, nodes))
    if not placed:
        return graph
    env: dict[int, Value] = {}
    merged_ids = {id(n) for groups_at in placed.values() for _, ns in groups_at for n in ns}
    out: list[Node] = []

    def emit_groups(at: int) -> None:
        for shared, nodes in placed.get(at, ()):
            out.extend(_build_siblings(shared, nodes, env))

    emit_groups(-1)
    for i, node in enumerate(graph.nodes):
        if id(node) not in merged_ids:
            out.append(copy_node(node, env))
        emit_groups(i)
    outputs = [env.get(id(v), v) for v in graph.outputs]
    return Graph(graph.inputs, outputs, out, graph.name, graph.input_names)


def _build_siblings(shared: int, nodes: list[Node], env: dict[int, Value]) -> list[Node]:
    """The concatenation, merged product and slices replacing ``nodes``; fills ``env``."""
    first = nodes[0]
    a = first.attr_dict
    side = ("rhs", "lhs")[shared]
    others = [env.get(id(n.inputs[1 - shared]), n.inputs[1 - shared]) for n in nodes]
    axis = _free_axes(others[0], a[f"{side}_batch"], a[f"{side}_contracting"])[-1]
    rw = Rewriter(first)
    joined = rw.emit("concatenate", *others, dimension=axis)
    common = env.get(id(first.inputs[shared]), first.inputs[shared])
    product = rw.emit("dot_general", *((common, joined) if shared == 0 else (joined, common)), **a)
    # the concatenated axis's place among the result's axes: batch, lhs free, rhs free
    nb = len(a["lhs_batch"])
    lhs_free = _free_axes(first.inputs[0], a["lhs_batch"], a["lhs_contracting"])
    if shared == 0:
        rhs_free = _free_axes(first.inputs[1], a["rhs_batch"], a["rhs_contracting"])
        out_axis = nb + len(lhs_free) + rhs_free.index(axis)
    else:
        out_axis = nb + lhs_free.index(axis)
    width = others[0].shape[axis]
    for k, node in enumerate(nodes):
        env[id(node.outputs[0])] = _slice(rw, product, out_axis, k * width, (k + 1) * width)
    statistic("sibling products merged", len(nodes))
    return rw.staged


# ----------------------------------------------------------------------------- sums


def _merge_sum(
    node: Node, x: Value, y: Value, uses: dict[int, int], joined: set[int]
) -> tuple[Node, list[Node]] | None:
    """The product replacing ``add(x, y)`` of two single-use products, and the nodes it needs.
    A concatenation an earlier merge of the chain built (``joined``) is extended, not nested."""
    dx, dy = x.node, y.node
    if dx is None or dy is None or dx.op != "dot_general" or dy.op != "dot_general" or dx is dy:
        return None
    if _dims_key(dx) != _dims_key(dy) or uses.get(id(x), 0) != 1 or uses.get(id(y), 0) != 1:
        return None
    a = dx.attr_dict
    rw = Rewriter(node)
    operands = []
    for pos, side in ((0, "lhs"), (1, "rhs")):
        p, q = dx.inputs[pos], dy.inputs[pos]
        if not a[f"{side}_contracting"] or p.dtype != q.dtype or len(p.shape) != len(q.shape):
            return None
        axis = a[f"{side}_contracting"][-1]
        if any(s != t for i, (s, t) in enumerate(zip(p.shape, q.shape)) if i != axis):
            return None
        parts = [
            part
            for v in (p, q)
            for part in (
                v.node.inputs
                if v.node is not None and id(v.node) in joined and v.node.attr("dimension") == axis
                else (v,)
            )
        ]
        operands.append(rw.emit("concatenate", *parts, dimension=axis))
        joined.add(id(operands[-1].node))
    copied = sum(v.type.size for v in (*dx.inputs, *dy.inputs))
    contracted = math.prod(operands[0].shape[ax] for ax in a["lhs_contracting"])
    if copied * 16 > node.outputs[0].type.size * contracted:
        return None  # the copy into the concatenations would cost about as much as the products
    rw.emit("dot_general", *operands, **a)
    return rw.staged[-1], rw.staged


def _merge_sums(graph: Graph) -> Graph:
    """One walk: a merged product inherits the sum's use count, so chains merge on the way."""
    uses = _use_counts(graph)
    env: dict[int, Value] = {}
    out: list[Node] = []
    merged = 0
    joined: set[int] = set()
    for node in graph.nodes:
        inputs = tuple(env.get(id(v), v) for v in node.inputs)
        made = _merge_sum(node, *inputs, uses, joined) if node.op == "add" else None
        if made is not None:
            product, nodes = made
            out.extend(nodes)
            env[id(node.outputs[0])] = product.outputs[0]
            uses[id(product.outputs[0])] = uses.get(id(node.outputs[0]), 0)
            merged += 1
            continue
        fresh = copy_node(node, env)
        for old, new in zip(node.outputs, fresh.outputs):
            uses[id(new)] = uses.get(id(old), 0)  # a rebuilt product keeps its count
        out.append(fresh)
    if not merged:
        return graph
    statistic("summed products merged", merged)
    outputs = [env.get(id(v), v) for v in graph.outputs]
    live = {id(n) for n in Graph.from_outputs(graph.inputs, outputs).nodes}
    return Graph(graph.inputs, outputs, [n for n in out if id(n) in live], graph.name, graph.input_names)


def _in_regions(graph: Graph) -> Graph:
    """``graph`` with the bodies of its loops (``scan``, ``while``) merged the same way."""
    if not any(node.regions for node in graph.nodes):
        return graph
    env: dict[int, Value] = {}
    out: list[Node] = []
    for node in graph.nodes:
        out.append(copy_node(node, env, [_merge(r) for r in node.regions]))
    outputs = [env.get(id(v), v) for v in graph.outputs]
    return Graph(graph.inputs, outputs, out, graph.name, graph.input_names)


def _merge(graph: Graph) -> Graph:
    graph = _in_regions(graph)
    if not any(node.op == "dot_general" for node in graph.nodes):
        return graph
    return _merge_sums(_merge_siblings(graph))


@register("merge-dots")
def merge_dots(graph: Graph) -> Graph:
    """Sibling products sharing an operand, and sums of products, as one larger dot_general
    (loop bodies included)."""
    return _merge(graph)
