"""Reverse mode through ``scan``: a residual-saving forward scan and a reversed backward scan.

The body ``(consts, carry, x) -> (carry', y)`` is differentiated once, as a graph, with
:func:`~kaun_ir.autodiff.gradient_graph`. Its nodes fall into three groups:

- *backward* nodes, which read a cotangent;
- *varying* forward nodes, which depend on the carry or on ``x`` (a new value every iteration);
- *invariant* forward nodes, which depend on the consts only.

The backward part reads some forward values. Varying ones become *residuals*: the forward scan
(the op's ``vjp_forward``) returns them as extra outputs, stacked per iteration like ``ys``;
carry values the backward part reads are residuals too, and ``x`` slices are read again from
``xs``. Invariant ones are recomputed inside the backward body (XLA hoists them out of the loop).
The backward scan walks the iterations in the opposite order, carrying the cotangent of the
carry and the sum of the consts' cotangents, and stacks the cotangents of ``xs``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import dtypes
from ..ir.builder import Builder
from ..ir.core import Graph, Node, TensorType, Value
from .rules import apply, gradient_graph, zeros


@dataclass
class _Plan:
    """How one scan body is differentiated (see the module docstring)."""

    forward: Graph  # body plus the residual outputs
    backward: Graph  # (consts, [ct carry, const sums], [xs, residuals, ct ys]) -> ([ct carry, sums], ct xs)
    float_carry: list[int]  # carry positions with cotangents
    diff_consts: list[int]  # const positions differentiated
    diff_xs: list[int]  # x positions (within xs) differentiated
    float_ys: list[int]  # y positions (within ys) with cotangents
    residual_types: list[TensorType]


def _is_float(t: TensorType) -> bool:
    return dtypes.is_float(t.dtype)


def _plan(body: Graph, num_consts: int, num_carry: int, wrt: tuple[bool, ...]) -> _Plan:
    from . import TABLE  # the table is assembled from this family's module, so not at import time

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
    stack: list[Value] = list(grad.outputs[n_out:])
    while stack:
        value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if value.node is None:
            if value.index in h_idx:
                residual_ids.add(id(value))
            continue
        if id(value) in varying_ids:
            residual_ids.add(id(value))
            continue
        if id(value.node) not in selected:
            selected.add(id(value.node))
            stack.extend(value.node.inputs)
    residuals = [grad.inputs[i] for i in h_idx if id(grad.inputs[i]) in residual_ids]
    residuals += [o for node in grad.nodes for o in node.outputs if id(o) in residual_ids]

    forward = Graph.from_outputs(grad.inputs[:n_in], list(grad.outputs[:n_out]) + residuals, name="body")

    with Builder(record_source=False) as builder:
        c_in = [builder.add_input(types[i]) for i in c_idx]
        ct_h = [builder.add_input(types[i]) for i in float_h]
        sums = [builder.add_input(types[i]) for i in diff_c]
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
        grads = [env[id(v)] for v in grad.outputs[n_out:]]
        g_c, g_h, g_x = (
            grads[: len(diff_c)],
            grads[len(diff_c) : len(diff_c) + len(float_h)],
            grads[len(diff_c) + len(float_h) :],
        )
        add = TABLE["add"]
        new_sums = [builder.add(add, [s, g], {})[0] for s, g in zip(sums, g_c)]
    backward = builder.finish(g_h + new_sums + g_x, name="body_vjp")
    return _Plan(
        forward,
        backward,
        [i - num_consts for i in float_h],
        diff_c,
        [i - num_consts - num_carry for i in diff_x],
        [k - num_carry for k in of_y],
        [r.type for r in residuals],
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
    carry_init = [cts[k] for k in plan.float_carry] + [zeros(inputs[i].type) for i in plan.diff_consts]
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
    n_h = len(plan.float_carry)
    in_cts: list[Any] = [None] * len(inputs)
    for k, ct in zip(plan.float_carry, result[:n_h]):
        in_cts[num_consts + k] = ct
    for i, ct in zip(plan.diff_consts, result[n_h : n_h + len(plan.diff_consts)]):
        in_cts[i] = ct
    for k, ct in zip(plan.diff_xs, result[n_h + len(plan.diff_consts) :]):
        in_cts[num_consts + num_carry + k] = ct
    return in_cts
