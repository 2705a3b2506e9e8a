"""``dot-operand-order``: swap a ``dot_general``'s operands when that makes XLA copy less.

XLA's CPU backend runs every ``dot_general`` as a matrix product ``[batch, M, K] x [batch, K, N]``:
the left operand laid out as batch axes, free axes, contracting axes, the right one as batch axes,
contracting axes, free axes (each group in the order the dimension numbers give). An operand
stored in another axis order is first copied into that order by a transposing loop. Reverse mode
produces exactly such products: the weight gradient of ``x @ w`` over activations ``[B, T, F]`` is
``dot_general(x, dy)`` contracting ``(0, 1)`` with ``(0, 1)``, so XLA transposes the whole
activation ``x`` (``[F, B*T]``), and when ``x`` is the output of an element-wise chain (the
transformer's GELU) the copy is fused with it into a loop that walks the input with a stride of
one row and runs far below memory speed (6-7 ms of CPU time per block at the ``transformer``
workload's sizes, a quarter of the step's; docs/performance-results.md, "Third round: the step per
XLA kernel").

The same product is ``transpose(dot_general(dy, x))``: then XLA transposes ``dy`` instead, and
the (small) result. This pass counts, for each ``dot_general``, the elements XLA would copy in
both orders (an operand already in its role's order costs nothing; a swapped product adds its
result's size, since the result is transposed back) and swaps the operands when that copies at
more than ``min_ratio`` times fewer elements. The product sums the same terms, but XLA's
kernel may add them in another order with the operands' roles changed, so results agree to
rounding (the tests compare with a float64 product).

Size-1 axes are ignored when deciding whether an operand is in order (a copy of them is a
bitcast). Option ``min_ratio`` (float, default 2.0). Statistic: ``dot products swapped``.

**Materialised operands** (option ``materialize``, default on). Whichever operand is left out
of order, XLA fuses its copy with the element-wise ops that compute it, and duplicates those
ops into every consumer: in a transformer's backward pass the residual stream's gradient is a
chain of additions over every later block, recomputed by each of its consumers (the transposing
copy of the weight gradient reading each of a dozen inputs with a stride of one row), and a
layer norm's output is recomputed by the transposing copy of the next weight gradient.
``optimization_barrier`` does not stop this on XLA CPU (it becomes control dependencies before
fusion). A product is the one op XLA keeps whole, so an operand read out of order that is the
result of an ``add``, ``subtract`` or ``multiply`` is replaced, for all its uses, by its product
with the identity matrix over its last axis: XLA computes the sum once, the copy reads it
contiguously, and later sums start from it. Made only where the identity product has at most
half as many multiply-adds as the largest product reading the value out of order, where XLA
would recompute the value from at least ``min_inputs`` (int, default 2) values of its size, and
where that product contracts at least ``min_rows`` (int, default 512) elements: the length of
the copy's strided walk. Over 256 rows (the ``transformer12`` workload) the walk stays in cache
and the identity products cost more than they save (docs/performance-results.md). The identity matrix
is a constant of the program, so a last axis over 2048 (``MAX_IDENTITY_ELEMENTS``) is left
alone. Exact for
finite values (every other term is an exact zero; ``-0.0`` becomes ``+0.0``); an infinity or a
NaN turns every other element of its row into NaN (``inf * 0``), for every use of the value, not
only the product's. Top-level graph only. Statistic: ``operands materialised``.

**Merged contracting axes** (option ``merge_contracting``, default ``all``). A weight gradient
``x^T dy`` over ``[B, T, F]`` activations contracts two leading axes of each operand; XLA CPU
brings such a product into its canonical form by a transposing copy of one operand (of ``dy``
once swapped, then folds the transpose back into the product, which leaves YNNPACK for XLA's
generic kernel reading both operands transposed: a copy and the slow kernel). Reshaping both
operands to ``[B*T, F]`` first (a bitcast: the contracting axes lead) gives a product XLA reads
in place, with no copy. ``all`` rewrites every product with no batch axes whose operands
contract the same two or more leading axes and keep one free axis each; ``swapped`` only those
the pass would swap; ``none`` none. Same terms in the same order of axes: tested against a
float64 product. Statistic: ``contracting axes merged``.
"""

from __future__ import annotations

import math

import numpy as np

from kaun_ir.ir.clone import copy_node
from kaun_ir.ir.core import Graph, Node, Value
from kaun_ir.ops import get as get_op
from kaun_ir.passes.registry import Option, register, statistic
from kaun_ir.passes.rewrite import Rewriter, RuleTable, apply_rules


def _in_order(value: Value, axes: tuple[int, ...]) -> bool:
    """Whether reading ``value`` with its axes in the order ``axes`` needs no copy."""
    kept = [a for a in axes if value.shape[a] != 1]
    return kept == sorted(kept)


def _roles(value: Value, batch, contracting, lhs: bool) -> tuple[int, ...]:
    free = tuple(a for a in range(len(value.shape)) if a not in batch and a not in contracting)
    return tuple(batch) + (free + tuple(contracting) if lhs else tuple(contracting) + free)


def copied_elements(lhs: Value, rhs: Value, attrs: dict) -> int:
    """Elements XLA CPU copies to bring ``dot_general(lhs, rhs, **attrs)``'s operands into the
    ``[batch, M, K] x [batch, K, N]`` order."""
    total = 0
    if not _in_order(lhs, _roles(lhs, attrs["lhs_batch"], attrs["lhs_contracting"], True)):
        total += lhs.type.size
    if not _in_order(rhs, _roles(rhs, attrs["rhs_batch"], attrs["rhs_contracting"], False)):
        total += rhs.type.size
    return total


def _leading_contraction(node: Node) -> bool:
    """Whether ``node`` is a weight gradient's product: no batch axes, both operands contracting
    over the same number (two or more) of their leading axes, in order, and one free axis each."""
    a = node.attr_dict
    lhs, rhs = node.inputs
    k = len(a["lhs_contracting"])
    lead = tuple(range(k))
    return (
        not a["lhs_batch"]
        and k >= 2
        and tuple(a["lhs_contracting"]) == lead
        and tuple(a["rhs_contracting"]) == lead
        and len(lhs.shape) == len(rhs.shape) == k + 1
    )


def _merged(node: Node, rw: Rewriter) -> Value:
    """``node`` (see :func:`_leading_contraction`) over its operands with the contracting axes
    merged into one: a product XLA CPU reads both operands of in place."""
    a = node.attr_dict
    lhs, rhs = node.inputs
    rows = math.prod(lhs.shape[:-1])
    lhs2 = rw.emit("reshape", lhs, shape=(rows, lhs.shape[-1]))
    rhs2 = rw.emit("reshape", rhs, shape=(rows, rhs.shape[-1]))
    statistic("contracting axes merged")
    return rw.emit("dot_general", lhs2, rhs2, **dict(a, lhs_contracting=(0,), rhs_contracting=(0,)))


def _swap(node: Node, rw: Rewriter, min_ratio: float, merge: str = "none"):
    a = node.attr_dict
    lhs, rhs = node.inputs
    out = node.outputs[0]
    if merge == "all" and _leading_contraction(node):
        return _merged(node, rw)
    now = copied_elements(lhs, rhs, a)
    if now == 0:
        return None
    swapped_attrs = dict(
        a,
        lhs_batch=a["rhs_batch"],
        rhs_batch=a["lhs_batch"],
        lhs_contracting=a["rhs_contracting"],
        rhs_contracting=a["lhs_contracting"],
    )
    # the swapped result is [batch, rhs free, lhs free]; transposing it back costs its size
    # unless the transpose only moves size-1 axes
    nb = len(a["lhs_batch"])
    n_lhs_free = len(lhs.shape) - nb - len(a["lhs_contracting"])
    n_rhs_free = len(rhs.shape) - nb - len(a["rhs_contracting"])
    back = (
        tuple(range(nb))
        + tuple(range(nb + n_rhs_free, nb + n_rhs_free + n_lhs_free))
        + tuple(range(nb, nb + n_rhs_free))
    )
    cost = copied_elements(rhs, lhs, swapped_attrs)
    if not _back_is_bitcast(out.shape, back):
        cost += out.type.size
    if cost * min_ratio >= now:  # a strict gain: equal costs would swap back and forth
        return None
    if merge == "swapped" and _leading_contraction(node):
        return _merged(node, rw)
    product = rw.emit("dot_general", rhs, lhs, **swapped_attrs)
    statistic("dot products swapped")
    if back == tuple(range(len(back))):
        return product
    return rw.emit("transpose", product, permutation=back)


def _back_is_bitcast(shape: tuple[int, ...], perm: tuple[int, ...]) -> bool:
    """Whether the transpose by ``perm`` whose result has ``shape`` only moves size-1 axes."""
    kept = [p for p, size in zip(perm, shape) if size != 1]
    return kept == sorted(kept)


_MATERIALIZED_OPS = ("add", "subtract", "multiply")
#: the largest identity matrix (elements) the pass embeds as a constant: 2048 x 2048 (16 MiB of
#: float32); a wider last axis is left as it is rather than putting a huge literal in the program
MAX_IDENTITY_ELEMENTS = 1 << 22
_SEE_THROUGH = ("broadcast_in_dim", "reshape")


def _fused_inputs(value: Value, limit: int) -> int:
    """How many values at least as large as ``value`` XLA would read to recompute it, fusing the
    element-wise ops (and broadcasts) that compute it into a consumer; counted up to ``limit``."""
    seen: set[int] = set()
    leaves: set[int] = set()
    stack = [value]
    while stack and len(leaves) < limit:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        node = v.node
        if node is not None and (node.op in _SEE_THROUGH or "elementwise" in (get_op(node.op).traits or ())):
            stack.extend(node.inputs)
        elif v.type.size >= value.type.size:
            leaves.add(id(v))
    return len(leaves)


def _out_of_order_sums(graph: Graph, min_rows: int) -> dict[int, int]:
    """``id(value) -> multiply-adds of the largest product reading it out of order``, for the
    floating-point results of ``_MATERIALIZED_OPS`` that a ``dot_general`` reads out of order
    contracting at least ``min_rows`` elements (the length of the strided walk of its copy)."""
    found: dict[int, int] = {}
    for node in graph.nodes:
        if node.op != "dot_general":
            continue
        a = node.attr_dict
        contracted = math.prod(node.inputs[0].shape[ax] for ax in a["lhs_contracting"])
        multiply_adds = node.outputs[0].type.size * contracted
        for pos, side in ((0, "lhs"), (1, "rhs")):
            v = node.inputs[pos]
            if v.node is None or v.node.op not in _MATERIALIZED_OPS or not v.shape:
                continue
            if not np.issubdtype(v.dtype, np.floating) or np.dtype(v.dtype).itemsize < 4:
                continue
            rows = math.prod(v.shape[ax] for ax in a[f"{side}_contracting"])
            if rows < min_rows:
                continue
            if not _in_order(v, _roles(v, a[f"{side}_batch"], a[f"{side}_contracting"], pos == 0)):
                found[id(v)] = max(found.get(id(v), 0), multiply_adds)
    return found


def _materialize(graph: Graph, min_inputs: int, min_rows: int) -> Graph:
    """Each sum a product reads out of order replaced, for all its uses, by its product with the
    identity matrix over its last axis (see the module docstring)."""
    found = _out_of_order_sums(graph, min_rows)
    values = {id(v): v for node in graph.nodes for v in node.outputs if id(v) in found}
    found = {k: n for k, n in found.items() if _fused_inputs(values[k], min_inputs) >= min_inputs}
    env: dict[int, Value] = {}
    out: list[Node] = []
    made = 0
    for node in graph.nodes:
        fresh = copy_node(node, env)
        out.append(fresh)
        for old, new in zip(node.outputs, fresh.outputs):
            n = new.shape[-1] if new.shape else 0
            if id(old) not in found or n * n > MAX_IDENTITY_ELEMENTS:
                continue
            if 2 * new.type.size * n > found[id(old)]:
                continue
            rw = Rewriter(node)
            eye = rw.constant(np.eye(n, dtype=new.dtype))
            last = len(new.shape) - 1
            dims = {"lhs_batch": (), "rhs_batch": (), "lhs_contracting": (last,), "rhs_contracting": (0,)}
            env[id(old)] = rw.emit("dot_general", new, eye, **dims)
            out.extend(rw.staged)
            made += 1
    if not made:
        return graph
    statistic("operands materialised", made)
    outputs = [env.get(id(v), v) for v in graph.outputs]
    return Graph(graph.inputs, outputs, out, graph.name, graph.input_names)


@register(
    "dot-operand-order",
    options={
        "min_ratio": Option(
            float, 2.0, "swap only when the swapped product copies this many times fewer elements", min=1.0
        ),
        "materialize": (bool, True, "compute a sum read out of order once, as a product with the identity"),
        "min_inputs": Option(
            int, 2, "materialise only sums that XLA would recompute from this many large inputs", min=1
        ),
        "min_rows": Option(
            int, 512, "materialise only where the out-of-order product contracts this many rows", min=0
        ),
        "merge_contracting": Option(
            str,
            "all",
            "weight-gradient products over merged contracting axes: none, swapped or all",
            choices=("none", "swapped", "all"),
        ),
    },
)
def dot_operand_order(
    graph: Graph, min_ratio: float, materialize: bool, min_inputs: int, min_rows: int, merge_contracting: str
) -> Graph:
    """Swap dot_general operands (and transpose the result back) where XLA CPU then copies less;
    materialise the sums a product still reads out of order."""
    if not any(node.op == "dot_general" for node in graph.walk()):
        return graph
    table = RuleTable()
    table.rule("dot-operand-order", "dot_general")(
        lambda node, rw: _swap(node, rw, min_ratio, merge_contracting)
    )
    graph = apply_rules(graph, table, label="dot-operand-order").graph
    return _materialize(graph, min_inputs, min_rows) if materialize else graph
