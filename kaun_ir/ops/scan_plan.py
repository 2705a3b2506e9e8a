"""How a scan body is differentiated: which of its values the backward body computes, which
the forward scan saves as residuals, which it recomputes, and which const-cotangent terms are
hoisted out of the loop (see ``scan_vjp`` for the scheme as a whole).

The body ``(consts, carry, x) -> (carry', y)`` is differentiated once, as a graph, with
:func:`~kaun_ir.transforms.autodiff.gradient_graph`. Its nodes fall into three groups:

- *backward* nodes, which read a cotangent;
- *varying* forward nodes, which depend on the carry or on ``x`` (a new value every iteration);
- *invariant* forward nodes, which depend on the consts only.

The plan is made in named steps: find the differentiated positions
(:func:`~kaun_ir.ops.scan_residuals.positions`), sort the gradient graph's values into the groups
(:func:`~kaun_ir.ops.scan_residuals.groups`), walk back from the cotangents to select the
backward body and its residuals (:class:`~kaun_ir.ops.scan_residuals.Selection`), split each
const's cotangent into loop and hoisted terms (:func:`_split_const_cotangents`), let cheap
residuals be recomputed (:meth:`~kaun_ir.ops.scan_residuals.Selection.recompute_cheap`), and
build the backward body (:func:`_backward_body`). The residual steps are in
``scan_residuals``; the hoisting of const cotangents and the backward body are here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kaun_ir.ir import optable
from kaun_ir.ir.builder import Builder
from kaun_ir.ir.clone import with_inputs
from kaun_ir.ir.core import Graph, TensorType, Value
from kaun_ir.ops.rules import gradient_graph
from kaun_ir.ops.scan_residuals import (
    Positions,
    Selection,
    groups,
    positions,
    shifted_carries,
    stacked_anyway,
)


@dataclass
class Term:
    """A hoisted term of a const's cotangent: ``op`` (``dot_general`` or a ``sum`` ``reduce``)
    of stacked operands, the iteration axis prepended to each and contracted / reduced."""

    op: str
    attrs: dict
    sources: list[tuple[str, int]]  # ("residual" | "x" | "ct_x" | "y", index) per operand


@dataclass
class Plan:
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
    hoisted: dict[int, list[Term]]  # const position -> terms computed after the backward scan
    # residual index -> (carry position or None, y position): a residual that is a ``y`` (None)
    # or a carry entering each iteration whose new value is a ``y``: read from the y's stack
    shifted: dict[int, tuple[int | None, int]] = field(default_factory=dict)


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


@dataclass
class _ConstCotangents:
    """Step 4: each differentiated const's cotangent as terms summed in the loop
    (``loop_terms``) and terms hoisted after it (``hoisted``: op, attributes and the stacked
    source of each operand, not yet numbered), plus the backward values the backward scan
    stacks for them (``extra_ys``)."""

    loop_terms: dict[int, list[Value]] = field(default_factory=dict)
    hoisted: dict[int, list[tuple[str, dict, list]]] = field(default_factory=dict)
    extra_ys: list[Value] = field(default_factory=list)
    y_at: dict[int, int] = field(default_factory=dict)

    def pinned(self) -> set[int]:
        """Ids of the values hoisted terms read stacked: they must stay residuals."""
        return {id(ref) for terms in self.hoisted.values() for _, _, srcs in terms for _, ref in srcs}

    def resolved(self, residuals: list[Value]) -> dict[int, list[Term]]:
        """The hoisted terms with their sources numbered (``residuals`` in their final order)."""
        residual_at = {id(r): j for j, r in enumerate(residuals)}

        def number(where: str, ref) -> tuple[str, int]:
            if where == "y":
                return where, self.y_at[id(ref)]
            if where == "residual":
                return where, residual_at[id(ref)]
            return where, ref

        return {
            k: [Term(op, attrs, [number(*s) for s in srcs]) for op, attrs, srcs in terms]
            for k, terms in self.hoisted.items()
        }


def _split_const_cotangents(
    grad: Graph, pos: Positions, backward_ids: set[int], selection: Selection
) -> _ConstCotangents:
    """Step 4: hoist the ``dot_general`` and ``sum`` terms of the consts' cotangents whose
    operands are stacked anyway (or would newly stack no more than the term's size); the rest
    are summed in the loop. Selects what either kind needs."""
    n_dc = len(pos.diff_consts)
    ct_xs = grad.outputs[pos.n_out + n_dc + len(pos.float_carry) :]
    ct_x_at = {id(v): j for j, v in enumerate(ct_xs)}
    x_at = {id(grad.inputs[i]): i - pos.xs.start for i in pos.xs}
    split = _ConstCotangents()

    def source(value: Value):
        """Where the stacked ``value`` comes from, and how many elements per iteration hoisting
        newly stacks for it; None for a loop-invariant value."""
        if id(value) in x_at:
            return ("x", x_at[id(value)]), 0
        if id(value) in ct_x_at:
            return ("ct_x", ct_x_at[id(value)]), 0
        if id(value) in backward_ids:
            fresh = 0 if id(value) in split.y_at else _size(value.type)
            return ("y", value), fresh
        if id(value) in selection.varying_ids or (value.node is None and value.index in pos.carry):
            # a residual either way: the loop's own accumulation would read it as well
            return ("residual", value), 0
        return None

    for k, g in zip(pos.diff_consts, grad.outputs[pos.n_out : pos.n_out + n_dc]):
        for term in _terms(g):
            node = term.node
            kind = None if node is None else node.op
            if kind == "reduce" and node.attr("kind") != "sum":
                kind = None
            srcs = [source(v) for v in node.inputs] if kind in ("dot_general", "reduce") else [None]
            if None in srcs or sum(f for _, f in srcs) > _size(term.type):
                split.loop_terms.setdefault(k, []).append(term)
                continue
            for (where, ref), _ in srcs:
                if where == "y" and id(ref) not in split.y_at:
                    split.y_at[id(ref)] = len(split.extra_ys)
                    split.extra_ys.append(ref)
            selection.walk([ref for (where, ref), _ in srcs if where in ("y", "residual")])
            split.hoisted.setdefault(k, []).append((kind, node.attr_dict, [s for s, _ in srcs]))
    selection.walk([t for terms in split.loop_terms.values() for t in terms])
    return split


def _backward_body(
    body: Graph,
    grad: Graph,
    pos: Positions,
    selection: Selection,
    residuals: list[Value],
    split: _ConstCotangents,
    loop_consts: list[int],
) -> Graph:
    """Step 6: the backward body, ``(consts, [ct carry, const sums], [xs, residuals, ct ys]) ->
    ([ct carry, sums], [ct xs, extra ys])``: the selected nodes of ``grad`` over these inputs."""
    types = body.input_types
    with Builder(record_source=False) as builder:
        c_in = [builder.add_input(types[i]) for i in pos.consts]
        ct_h = [builder.add_input(types[i]) for i in pos.float_carry]
        sums = [builder.add_input(types[i]) for i in loop_consts]
        x_in = [builder.add_input(types[i]) for i in pos.xs]
        r_in = [builder.add_input(r.type) for r in residuals]
        ct_y = [builder.add_input(body.outputs[k].type) for k in pos.float_ys]
        env: dict[int, Value] = {}
        for i, v in zip(pos.consts, c_in):
            env[id(grad.inputs[i])] = v
        for i, v in zip(pos.xs, x_in):
            env[id(grad.inputs[i])] = v
        for r, v in zip(residuals, r_in):
            env[id(r)] = v
        for seed, v in zip(grad.inputs[pos.n_in :], ct_h + ct_y):
            env[id(seed)] = v
        for node in grad.nodes:
            if id(node) not in selection.nodes:
                continue
            copied = builder.append(with_inputs(node, [env[id(v)] for v in node.inputs]))
            for old, fresh in zip(node.outputs, copied):
                env[id(old)] = fresh
        grads = [env[id(v)] for v in grad.outputs[pos.n_out + len(pos.diff_consts) :]]
        n_h = len(pos.float_carry)
        add = optable.table()["add"]
        new_sums = []
        for k, total in zip(loop_consts, sums):
            for term in split.loop_terms[k]:
                total = builder.add(add, [total, env[id(term)]], {})[0]
            new_sums.append(total)
        extras = [env[id(v)] for v in split.extra_ys]
    return builder.finish(grads[:n_h] + new_sums + grads[n_h:] + extras, name="body_vjp")


def plan_body(body: Graph, num_consts: int, num_carry: int, wrt: tuple[bool, ...]) -> Plan:
    """How to differentiate the scan ``body`` with respect to the operands flagged in ``wrt``."""
    pos = positions(body, num_consts, num_carry, wrt)
    of = [k - num_consts for k in pos.float_carry] + pos.float_ys
    grad = gradient_graph(
        body, wrt=pos.diff_consts + pos.float_carry + pos.diff_xs, of=of, seed_inputs=True, keep_outputs=True
    )
    backward_ids, varying_ids = groups(grad, pos)
    selection = Selection(varying_ids, pos.carry)
    # walk back from the carry's and the xs' cotangents first, then from the consts' terms
    selection.walk(grad.outputs[pos.n_out + len(pos.diff_consts) :])
    split = _split_const_cotangents(grad, pos, backward_ids, selection)
    selection.recompute_cheap(grad, split.pinned(), stacked_anyway(grad, pos))
    residuals = selection.residual_values(grad)
    loop_consts = [k for k in pos.diff_consts if k in split.loop_terms]
    shifted = shifted_carries(grad, pos, residuals)
    saved = [r for j, r in enumerate(residuals) if j not in shifted]
    forward = Graph.from_outputs(
        grad.inputs[: pos.n_in], list(grad.outputs[: pos.n_out]) + saved, name="body"
    )
    return Plan(
        forward,
        _backward_body(body, grad, pos, selection, residuals, split, loop_consts),
        [i - num_consts for i in pos.float_carry],
        pos.diff_consts,
        [i - num_consts - num_carry for i in pos.diff_xs],
        [k - num_carry for k in pos.float_ys],
        [r.type for r in residuals],
        loop_consts,
        split.resolved(residuals),
        shifted,
    )
