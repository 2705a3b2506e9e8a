"""The ``flatten=true`` rules of the ``layout`` pass: a convolution chain's layout moved from the
activation a dot flattens onto the dense weight.

``FLATTEN`` is phase 2 with ``flatten=true``: ``SINK`` plus the two rules here. The layout a
convolution chain ends in is moved from the activation it flattens onto the (smaller) dense
weight. ``reshape(transpose(x, p))`` that merges the permuted axes into one is
``reshape(x)`` with that axis' entries permuted, so
a dot contracting the merged axis reads ``reshape(x)`` and a weight with its rows permuted the
same way; a dot keeping it as a free axis permutes its (smaller) result instead. The backward
image, ``transpose(reshape(dot(g, w)))`` splitting a free axis of the dot, becomes
``reshape(dot(g, w'))``. Exactness: the dot of the gradients (contracting other axes) computes
the same products, summed in the same order, at other positions; a dot contracting the
merged axis sums the same products in another order (the permuted one).
"""

from __future__ import annotations

from kaun_ir.ir.core import Node, Value
from kaun_ir.passes.layout_rules import SINK, USES, inverse, transpose_of
from kaun_ir.passes.rewrite import Rewriter, RuleTable

#: phase 2 with ``flatten=true``: SINK plus the rules below
FLATTEN = RuleTable()
for _rule in SINK.rules():
    FLATTEN.add(_rule)


def _run(perm) -> tuple[int, int] | None:
    """The smallest ``[lo, hi)`` outside which ``perm`` leaves every axis in place (None: identity)."""
    moved = [i for i, p in enumerate(perm) if p != i]
    return (moved[0], moved[-1] + 1) if moved else None


def _merged(short, long, perm):
    """``(a, m)``: ``short`` is ``long`` with axes ``[a, a+m)`` merged into one, a run holding
    every axis ``perm`` moves; or None."""
    run = _run(perm)
    m = len(long) - len(short) + 1
    if run is None or m < 2:
        return None
    lo, hi = run
    for a in range(max(0, hi - m), lo + 1):
        merged = long[a : a + m]
        if tuple(short) == tuple(long[:a]) + (_prod(merged),) + tuple(long[a + m :]):
            return a, m
    return None


def _prod(sizes) -> int:
    out = 1
    for n in sizes:
        out *= n
    return out


def _permute_axis(rw: Rewriter, v: Value, axis: int, sizes, perm) -> Value:
    """``v`` with ``axis`` split into ``sizes``, those axes transposed by ``perm``, merged back."""
    m = len(sizes)
    split = tuple(v.shape[:axis]) + tuple(sizes) + tuple(v.shape[axis + 1 :])
    full = list(range(axis)) + [axis + p for p in perm] + list(range(axis + m, len(split)))
    s = rw.emit("reshape", v, shape=split)
    t = rw.emit("transpose", s, permutation=tuple(full))
    return rw.emit("reshape", t, shape=tuple(v.shape))


def _free(attrs: dict, side: str, rank: int) -> list[int]:
    taken = set(attrs[f"{side}_batch"]) | set(attrs[f"{side}_contracting"])
    return [a for a in range(rank) if a not in taken]


def _flatten_of(value: Value):
    """``(x, a, m, pi)`` for ``value = reshape(transpose(x, p))`` merging the moved run
    ``[a, a+m)`` (``pi``: the run's permutation), or None."""
    r = value.node
    if r is None or r.op != "reshape":
        return None
    t = transpose_of(r.inputs[0])
    if t is None or not USES.single(r.inputs[0]):
        return None
    p = t.attr("permutation")
    found = _merged(value.shape, r.inputs[0].shape, p)
    if found is None:
        return None
    a, m = found
    return t.inputs[0], a, m, tuple(p[a + j] - a for j in range(m))


def _flatten_plan(node: Node, value: Value, a: int):
    """For a dot ``node`` reading ``value`` (the flatten) once: (role, index/axis, added size), or None."""
    positions = [i for i, v in enumerate(node.inputs) if v is value]
    if len(positions) != 1:
        return None
    pos = positions[0]
    attrs = node.attr_dict
    side = "lhs" if pos == 0 else "rhs"
    if a in attrs[f"{side}_batch"]:
        return None
    if a in attrs[f"{side}_contracting"]:
        k = list(attrs[f"{side}_contracting"]).index(a)
        other = "rhs" if pos == 0 else "lhs"
        return pos, "contracting", attrs[f"{other}_contracting"][k], node.inputs[1 - pos].type.size
    nb = len(attrs["lhs_batch"])
    free = _free(attrs, side, len(value.shape))
    offset = nb if pos == 0 else nb + len(_free(attrs, "lhs", len(node.inputs[0].shape)))
    return pos, "free", offset + free.index(a), node.outputs[0].type.size


@FLATTEN.rule("dot-absorb-flatten-transpose", "dot_general")
def _dot_flatten(node: Node, rw: Rewriter):
    """dot_general(reshape(transpose(x, p)), w) -> dot_general(reshape(x), w') (w's rows permuted).

    The reshape merges the axes ``p`` moves into one. Every user of the reshape must be a dot
    that can be rewritten so (the transpose then goes away), and the weights or results permuted
    instead must hold fewer elements than the transpose.
    """
    for pos, value in enumerate(node.inputs):
        flat = _flatten_of(value)
        if flat is None or not USES.all_users_in(value, {"dot_general"}):
            continue
        x, a, m, pi = flat
        plans = [_flatten_plan(user, value, a) for user in USES.user_nodes(value)]
        if any(plan is None for plan in plans) or sum(plan[3] for plan in plans) >= x.type.size:
            continue
        plan = _flatten_plan(node, value, a)
        if plan is None:
            continue
        _, role, axis, _ = plan
        operands = list(node.inputs)
        operands[pos] = rw.emit("reshape", x, shape=tuple(value.shape))
        t_sizes = tuple(value.node.inputs[0].shape[a : a + m])
        if role == "contracting":
            operands[1 - pos] = _permute_axis(rw, operands[1 - pos], axis, t_sizes, inverse(pi))
            return rw.emit("dot_general", *operands, **node.attr_dict)
        out = rw.emit("dot_general", *operands, **node.attr_dict)
        return _permute_axis(rw, out, axis, tuple(x.shape[a : a + m]), pi)
    return None


@FLATTEN.rule("dot-absorb-flatten-transpose", "transpose")
def _unflatten_dot(node: Node, rw: Rewriter):
    """transpose(reshape(dot_general(g, w)), q) -> reshape(dot_general(g, w')) (w permuted).

    The reshape splits one free axis of the dot (from ``w``) into the axes ``q`` moves; neither
    the dot nor the reshape has other users, and ``w`` is smaller than the transpose.
    """
    s = node.inputs[0].node
    if s is None or s.op != "reshape" or not USES.single(node.inputs[0]):
        return None
    d = s.inputs[0].node
    if d is None or d.op != "dot_general" or len(d.outputs) != 1 or not USES.single(s.inputs[0]):
        return None
    q = node.attr("permutation")
    found = _merged(s.inputs[0].shape, s.outputs[0].shape, q)
    if found is None:
        return None
    a, m = found
    attrs = d.attr_dict
    nb = len(attrs["lhs_batch"])
    lhs_free = _free(attrs, "lhs", len(d.inputs[0].shape))
    if a < nb:
        return None
    pos, axis = (0, lhs_free[a - nb]) if a < nb + len(lhs_free) else (1, None)
    if pos == 1:
        axis = _free(attrs, "rhs", len(d.inputs[1].shape))[a - nb - len(lhs_free)]
    w = d.inputs[pos]
    if w.type.size >= node.outputs[0].type.size:
        return None
    sigma = tuple(q[a + j] - a for j in range(m))
    operands = list(d.inputs)
    operands[pos] = _permute_axis(rw, w, axis, tuple(s.outputs[0].shape[a : a + m]), sigma)
    out = rw.emit("dot_general", *operands, **attrs)
    return rw.emit("reshape", out, shape=tuple(node.outputs[0].shape))
