"""Reverse mode through ``scan``: a residual-saving forward scan and a reversed backward scan.

The body ``(consts, carry, x) -> (carry', y)`` is differentiated once, as a graph;
``scan_plan`` sorts the gradient graph's nodes into *backward* ones (they read a cotangent),
*varying* forward ones (a new value every iteration) and *invariant* forward ones (they depend
on the consts only), and this module runs the two scans the plan describes.

The backward part reads some forward values. Varying ones become *residuals*: the forward scan
(the op's ``vjp_forward``) returns them as extra outputs, stacked per iteration like ``ys``;
carry values the backward part reads are residuals too, and ``x`` slices are read again from
``xs``. Invariant ones are recomputed inside the backward body (XLA hoists them out of the loop).
A residual that a few element-wise ops compute from the other residuals (an LSTM's ``tanh(c')``
from its gates and carried ``c``, the derivative factors ``1 - s`` of its sigmoids) is not saved
but recomputed in the backward body: fewer stacked buffers to fill and read, the same ops on the
same inputs. A residual the forward scan returns anyway is not stacked twice: a ``y`` is read
from the ys, and a carry entering each iteration whose new value is a ``y`` (an RNN's ``h``)
from the ys moved by one iteration, the initial carry first (:func:`_entering`).
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

from kaun_ir.ops.rules import apply, zeros
from kaun_ir.ops.scan_plan import Plan, Term, plan_body


def _shifted(axes) -> tuple[int, ...]:
    return tuple(int(a) + 1 for a in axes)


@dataclass
class _Saved:
    plan: Plan
    residuals: list  # Tensors of the forward scan


def _as_list(x) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def scan_forward(*inputs, wrt, regions, num_consts, num_carry, length, reverse=False, unroll=1):
    """The forward scan of reverse mode: the op's outputs plus the stacked residuals."""
    (body,) = regions
    plan = plan_body(body, num_consts, num_carry, tuple(wrt))
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
    saved = iter(outs[n_primal:])
    residuals = []
    for j in range(len(plan.residual_types)):
        if j in plan.shifted:
            k, y = plan.shifted[j]
            stack = outs[num_carry + y]
            residuals.append(
                stack if k is None else _entering(inputs[num_consts + k], stack, length, reverse)
            )
        else:
            residuals.append(next(saved))
    return outs[:n_primal], _Saved(plan, residuals)


def _entering(init, ys, length: int, reverse: bool):
    """The stack of a carry as it enters each iteration, from its initial value and the stack
    ``ys`` of its value after each iteration: ``[init, ys[0], .., ys[T-2]]``, or ``[ys[1], ..,
    ys[T-1], init]`` for a reversed scan."""
    if length == 0:
        return ys
    first = apply("reshape", init, shape=(1, *init.shape))
    if length == 1:
        return first
    ndim = len(init.shape) + 1
    lo, hi = (1, length) if reverse else (0, length - 1)
    rest = apply(
        "slice",
        ys,
        start_indices=(lo,) + (0,) * (ndim - 1),
        limit_indices=(hi, *init.shape),
        strides=(1,) * ndim,
    )
    return apply("concatenate", *((rest, first) if reverse else (first, rest)), dimension=0)


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


def _hoisted_term(term: Term, operands: list) -> Any:
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
