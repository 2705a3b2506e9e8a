"""Reverse mode through ``scan``: a residual-saving forward scan and a reversed backward scan.

The body ``(consts, carry, x) -> (carry', y)`` is differentiated once, as a graph, with
:func:`~kaun_ir.transforms.autodiff.gradient_graph`. Its nodes fall into three groups:

- *backward* nodes, which read a cotangent;
- *varying* forward nodes, which depend on the carry or on ``x`` (a new value every iteration);
- *invariant* forward nodes, which depend on the consts only.

The backward part reads some forward values. Varying ones become *residuals*: the forward scan
(the op's ``vjp_forward``) returns them as extra outputs, stacked per iteration like ``ys``;
carry values the backward part reads are residuals too, and ``x`` slices are read again from
``xs``. Invariant ones are recomputed inside the backward body (XLA hoists them out of the loop).
A residual that a few element-wise ops compute from the other residuals (an LSTM's ``tanh(c')``
from its gates and carried ``c``, the derivative factors ``1 - s`` of its sigmoids) is not saved
but recomputed in the backward body: fewer stacked buffers to fill and read, the same ops on the
same inputs.
The backward scan walks the iterations in the opposite order, carrying the cotangent of the
carry and stacking the cotangents of ``xs``.

A const's cotangent is a sum over the iterations. Its terms that are contractions of two
per-iteration values, ``dot_general(a_t, b_t)`` — the weight gradient ``h_t^T @ dgates_t`` of a
recurrent matmul — are *hoisted*: the backward scan stacks ``a`` and ``b`` (most often they are
stacked already: a residual, an ``xs`` operand or the cotangent of one) and one
``dot_general`` after the loop contracts the iteration axis too, a single large matmul instead
of one rank-``batch`` update of a carried accumulator per iteration. A ``sum`` reduction of a
value that is stacked anyway is hoisted alike (a bias gradient). A term is hoisted when the
per-iteration values it newly stacks are no larger than its result (what the loop would read
and write each iteration); the rest are summed in the loop as the consts' carried cotangents.
Hoisting reorders a float sum (one contraction over ``iterations x batch`` instead of
iteration-by-iteration accumulation): results agree to rounding, not bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kaun_ir import dtypes
from kaun_ir.ir import optable
from kaun_ir.ir.builder import Builder
from kaun_ir.ir.core import Graph, Node, TensorType, Value
from kaun_ir.ops.rules import apply, gradient_graph, zeros


@dataclass
class _Term:
    """A hoisted term of a const's cotangent: ``op`` (``dot_general`` or a ``sum`` ``reduce``)
    of stacked operands, the iteration axis prepended to each and contracted / reduced."""

    op: str
    attrs: dict
    sources: list[tuple[str, int]]  # ("residual" | "x" | "ct_x" | "y", index) per operand


@dataclass
class _Plan:
    """How one scan body is differentiated (see the module docstring)."""

    forward: Graph  # body plus the residual outputs
    # (consts, [ct carry, const sums], [xs, residuals, ct ys]) -> ([ct carry, sums], [ct xs, extra ys])
    backward: Graph
    float_carry: list[int]  # carry positions with cotangents
    diff_consts: list[int]  # const positions differentiated
    diff_xs: list[int]  # x positions (within xs) differentiated
    float_ys: list[int]  # y positions (within ys) with cotangents
    residual_types: list[TensorType]
    loop_consts: list[int]  # const positions whose cotangent (or part of it) is summed in the loop
    hoisted: dict[int, list[_Term]]  # const position -> terms computed after the backward scan


def _terms(value: Value) -> list[Value]:
    """The summands of ``value`` through its ``add`` nodes."""
    node = value.node
    if node is not None and node.op == "add":
        return _terms(node.inputs[0]) + _terms(node.inputs[1])
    return [value]


def _size(t: TensorType) -> int:
    n = 1
    for d in t.shape:
        n *= d
    return n


def _shifted(axes) -> tuple[int, ...]:
    return tuple(int(a) + 1 for a in axes)


#: how many ops (declared "cheap": element-wise work and the broadcasts of its operands) the
#: backward body may recompute for one residual instead of loading it
_CHEAP_NODES = 8


def _cheap(op: str) -> bool:
    """Whether the backward body may recompute ``op`` instead of loading a saved residual."""
    opdef = optable.table().get(op)
    return opdef is not None and opdef.has("cheap")


def _recomputable(grad: Graph, residual_ids: set, varying_ids: set, pinned: set, carry_idx: set) -> set:
    """Ids of the residuals (and the varying values between them) that the backward body
    recomputes with a few element-wise ops from the residuals it keeps: ``1 - sigmoid(z)``,
    ``tanh(c)`` from the gates and the carried ``c``. Later residuals go first, so values
    derived from others are dropped in favour of their sources."""
    kept = set(residual_ids)
    recompute: set[int] = set()

    def chain(value: Value, found: list, budget: list) -> bool:
        if id(value) in kept or id(value) in recompute:
            return True
        if value.node is None:
            return value.index not in carry_idx  # a const or an x slice; a carry not kept is not
        if id(value) not in varying_ids:
            return True  # loop-invariant: the backward body recomputes those anyway
        if not _cheap(value.node.op) or budget[0] == 0:
            return False
        budget[0] -= 1
        found.append(id(value))
        return all(chain(v, found, budget) for v in value.node.inputs)

    for node in reversed(grad.nodes):
        for out in node.outputs:
            if id(out) not in kept or id(out) in pinned or not _cheap(node.op):
                continue
            kept.discard(id(out))
            found: list[int] = []
            budget = [_CHEAP_NODES]
            if all(chain(v, found, budget) for v in node.inputs):
                recompute.add(id(out))
                recompute.update(found)
            else:
                kept.add(id(out))
    return recompute


def _is_float(t: TensorType) -> bool:
    return dtypes.is_float(t.dtype)


def _plan(body: Graph, num_consts: int, num_carry: int, wrt: tuple[bool, ...]) -> _Plan:
    from kaun_ir.ops import TABLE  # the table is assembled from this family's module, so not at import time

    n_in, n_out = len(body.inputs), len(body.outputs)
    types = body.input_types
    c_idx = range(num_consts)
    h_idx = range(num_consts, num_consts + num_carry)
    x_idx = range(num_consts + num_carry, n_in)
    float_h = [i for i in h_idx if _is_float(types[i])]
    diff_c = [i for i in c_idx if wrt[i] and _is_float(types[i])]
    diff_x = [i for i in x_idx if wrt[i] and _is_float(types[i])]
    of_y = [k for k in range(num_carry, n_out) if _is_float(body.outputs[k].type)]
    of = [k - num_consts for k in float_h] + of_y
    grad = gradient_graph(body, wrt=diff_c + float_h + diff_x, of=of, seed_inputs=True, keep_outputs=True)

    backward_ids = {id(v) for v in grad.inputs[n_in:]}
    varying_ids = {id(grad.inputs[i]) for i in list(h_idx) + list(x_idx)}
    for node in grad.nodes:
        ins = [id(v) for v in node.inputs]
        if any(i in backward_ids for i in ins):
            backward_ids.update(id(o) for o in node.outputs)
        elif any(i in varying_ids for i in ins):
            varying_ids.update(id(o) for o in node.outputs)

    # walk back from the gradients: what the backward body computes, and what it must be given
    selected: set[int] = set()
    residual_ids: set[int] = set()
    seen: set[int] = set()

    recompute: set[int] = set()  # varying values the backward body recomputes instead
    roots: list[Value] = []

    def walk(values) -> None:
        stack: list[Value] = list(values)
        roots.extend(stack)
        while stack:
            value = stack.pop()
            if id(value) in seen:
                continue
            seen.add(id(value))
            if value.node is None:
                if value.index in h_idx:
                    residual_ids.add(id(value))
                continue
            if id(value) in varying_ids and id(value) not in recompute:
                residual_ids.add(id(value))
                continue
            if id(value.node) not in selected:
                selected.add(id(value.node))
                stack.extend(value.node.inputs)

    n_dc = len(diff_c)
    walk(grad.outputs[n_out + n_dc :])  # the carry's and the xs' cotangents
    g_x_out = list(grad.outputs[n_out + n_dc + len(float_h) :])
    ct_x_at = {id(v): j for j, v in enumerate(g_x_out)}
    x_at = {id(grad.inputs[i]): i - x_idx.start for i in x_idx}
    extra_ys: list[Value] = []
    y_at: dict[int, int] = {}

    def source(value: Value):
        """Where the stacked ``value`` comes from, and how many elements per iteration hoisting
        newly stacks for it; None for a loop-invariant value."""
        if id(value) in x_at:
            return ("x", x_at[id(value)]), 0
        if id(value) in ct_x_at:
            return ("ct_x", ct_x_at[id(value)]), 0
        if id(value) in backward_ids:
            fresh = 0 if id(value) in y_at else _size(value.type)
            return ("y", value), fresh
        if id(value) in varying_ids or (value.node is None and value.index in h_idx):
            # a residual either way: the loop's own accumulation would read it as well
            return ("residual", value), 0
        return None

    loop_terms: dict[int, list[Value]] = {}
    hoisted_raw: dict[int, list[tuple[str, dict, list]]] = {}
    for k, g in zip(diff_c, grad.outputs[n_out : n_out + n_dc]):
        for term in _terms(g):
            node = term.node
            kind = None if node is None else node.op
            if kind == "reduce" and node.attr("kind") != "sum":
                kind = None
            srcs = [source(v) for v in node.inputs] if kind in ("dot_general", "reduce") else [None]
            if None in srcs or sum(f for _, f in srcs) > _size(term.type):
                loop_terms.setdefault(k, []).append(term)
                continue
            for (where, ref), _ in srcs:
                if where == "y" and id(ref) not in y_at:
                    y_at[id(ref)] = len(extra_ys)
                    extra_ys.append(ref)
            walk([ref for (where, ref), _ in srcs if where in ("y", "residual")])
            hoisted_raw.setdefault(k, []).append((kind, node.attr_dict, [s for s, _ in srcs]))
    walk([t for terms in loop_terms.values() for t in terms])
    pinned = {id(ref) for terms in hoisted_raw.values() for _, _, srcs in terms for where, ref in srcs}
    recompute.update(_recomputable(grad, residual_ids, varying_ids, pinned, set(h_idx)))
    if recompute:  # walk again: the recomputed values' nodes join the backward body
        selected.clear()
        residual_ids.clear()
        seen.clear()
        again, roots[:] = list(roots), []
        walk(again)
    residuals = [grad.inputs[i] for i in h_idx if id(grad.inputs[i]) in residual_ids]
    residuals += [o for node in grad.nodes for o in node.outputs if id(o) in residual_ids]
    residual_at = {id(r): j for j, r in enumerate(residuals)}

    def resolved(where: str, ref) -> tuple[str, int]:
        if where == "y":
            return where, y_at[id(ref)]
        if where == "residual":
            return where, residual_at[id(ref)]
        return where, ref

    hoisted = {
        k: [_Term(op, attrs, [resolved(*s) for s in srcs]) for op, attrs, srcs in terms]
        for k, terms in hoisted_raw.items()
    }
    loop_c = [k for k in diff_c if k in loop_terms]

    forward = Graph.from_outputs(grad.inputs[:n_in], list(grad.outputs[:n_out]) + residuals, name="body")

    with Builder(record_source=False) as builder:
        c_in = [builder.add_input(types[i]) for i in c_idx]
        ct_h = [builder.add_input(types[i]) for i in float_h]
        sums = [builder.add_input(types[i]) for i in loop_c]
        x_in = [builder.add_input(types[i]) for i in x_idx]
        r_in = [builder.add_input(r.type) for r in residuals]
        ct_y = [builder.add_input(body.outputs[k].type) for k in of_y]
        env: dict[int, Value] = {}
        for i, v in zip(c_idx, c_in):
            env[id(grad.inputs[i])] = v
        for i, v in zip(x_idx, x_in):
            env[id(grad.inputs[i])] = v
        for r, v in zip(residuals, r_in):
            env[id(r)] = v
        for seed, v in zip(grad.inputs[n_in:], ct_h + ct_y):
            env[id(seed)] = v
        for node in grad.nodes:
            if id(node) not in selected:
                continue
            new = Node(
                node.op,
                [env[id(v)] for v in node.inputs],
                node.attrs,
                node.types,
                node.regions,
                path=node.path,
                source=node.source,
            )
            builder.nodes.append(new)
            for old, fresh in zip(node.outputs, new.outputs):
                env[id(old)] = fresh
        grads = [env[id(v)] for v in grad.outputs[n_out + n_dc :]]
        g_h, g_x = grads[: len(float_h)], grads[len(float_h) :]
        add = TABLE["add"]
        new_sums = []
        for k, total in zip(loop_c, sums):
            for term in loop_terms[k]:
                total = builder.add(add, [total, env[id(term)]], {})[0]
            new_sums.append(total)
        extras = [env[id(v)] for v in extra_ys]
    backward = builder.finish(g_h + new_sums + g_x + extras, name="body_vjp")
    return _Plan(
        forward,
        backward,
        [i - num_consts for i in float_h],
        diff_c,
        [i - num_consts - num_carry for i in diff_x],
        [k - num_carry for k in of_y],
        [r.type for r in residuals],
        loop_c,
        hoisted,
    )


@dataclass
class _Saved:
    plan: _Plan
    residuals: list  # Tensors of the forward scan


def _as_list(x) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def scan_forward(*inputs, wrt, regions, num_consts, num_carry, length, reverse=False, unroll=1):
    """The forward scan of reverse mode: the op's outputs plus the stacked residuals."""
    (body,) = regions
    plan = _plan(body, num_consts, num_carry, tuple(wrt))
    outs = _as_list(
        apply(
            "scan",
            *inputs,
            regions=(plan.forward,),
            num_consts=num_consts,
            num_carry=num_carry,
            length=length,
            reverse=reverse,
            unroll=unroll,
        )
    )
    n_primal = len(body.outputs)
    return outs[:n_primal], _Saved(plan, outs[n_primal:])


def scan_vjp(
    cts,
    outs,
    *inputs,
    regions,
    num_consts,
    num_carry,
    length,
    reverse=False,
    unroll=1,
    residuals: _Saved | None = None,
):
    """Cotangents of a scan's operands: one backward scan over the saved residuals."""
    if residuals is None:  # called outside gradient_graph: recompute the residuals
        _, residuals = scan_forward(
            *inputs,
            wrt=(True,) * len(inputs),
            regions=regions,
            num_consts=num_consts,
            num_carry=num_carry,
            length=length,
            reverse=reverse,
            unroll=unroll,
        )
    plan = residuals.plan
    outs, cts = _as_list(outs), _as_list(cts)
    cts = [c if c is not None else zeros(o.type) for c, o in zip(cts, outs)]
    consts = list(inputs[:num_consts])
    xs = list(inputs[num_consts + num_carry :])
    carry_init = [cts[k] for k in plan.float_carry] + [zeros(inputs[i].type) for i in plan.loop_consts]
    ct_ys = [cts[num_carry + k] for k in plan.float_ys]
    result = _as_list(
        apply(
            "scan",
            *consts,
            *carry_init,
            *xs,
            *residuals.residuals,
            *ct_ys,
            regions=(plan.backward,),
            num_consts=num_consts,
            num_carry=len(carry_init),
            length=length,
            reverse=not reverse,
            unroll=unroll,
        )
    )
    n_h, n_c, n_x = len(plan.float_carry), len(plan.loop_consts), len(plan.diff_xs)
    ct_xs = result[n_h + n_c : n_h + n_c + n_x]
    stacked = {
        "residual": residuals.residuals,
        "x": xs,
        "ct_x": ct_xs,
        "y": result[n_h + n_c + n_x :],
    }
    in_cts: list[Any] = [None] * len(inputs)
    for k, ct in zip(plan.float_carry, result[:n_h]):
        in_cts[num_consts + k] = ct
    for i, ct in zip(plan.loop_consts, result[n_h : n_h + n_c]):
        in_cts[i] = ct
    for i, terms in plan.hoisted.items():
        for term in terms:
            ct = _hoisted_term(term, [stacked[where][j] for where, j in term.sources])
            in_cts[i] = ct if in_cts[i] is None else apply("add", in_cts[i], ct)
    for k, ct in zip(plan.diff_xs, ct_xs):
        in_cts[num_consts + num_carry + k] = ct
    return in_cts


def _hoisted_term(term: _Term, operands: list) -> Any:
    """A hoisted const-cotangent term over the stacked operands: the iteration axis (0) is
    contracted (``dot_general``) or reduced (``sum``) along with the term's own axes."""
    attrs = dict(term.attrs)
    if term.op == "dot_general":
        for side in ("lhs", "rhs"):
            attrs[f"{side}_batch"] = _shifted(attrs[f"{side}_batch"])
            attrs[f"{side}_contracting"] = (0, *_shifted(attrs[f"{side}_contracting"]))
    else:
        attrs["dimensions"] = (0, *_shifted(attrs["dimensions"]))
    return apply(term.op, *operands, **attrs)
