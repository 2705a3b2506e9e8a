"""``scan``: a loop over the leading axis of stacked inputs, lowered to one ``stablehlo.while``.

Operands are ``consts`` (``num_consts`` loop-invariant values), the initial ``carry``
(``num_carry`` values) and the stacked ``xs`` (the rest; leading axis ``length``). The one
region, ``body``, maps ``(consts, carry, x slices) -> (carry', y slices)``; the op returns the
final carry followed by the ``ys`` stacked along a new leading axis of ``length``. With
``reverse`` the iterations visit ``length-1 .. 0`` (``ys[t]`` is still the output of step ``t``).
``unroll`` copies the body that many times per trip of the while loop. For a small body the
lowering runs the first iteration before the loop and starts each stacked output as that
step's value broadcast along the steps (see ``_PEEL_MAX_OPS``).

Reverse mode saves the body's residuals stacked per iteration (see ``scan_vjp.py``).
"""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ir.interp import interpret
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.emit import i64_array, scalar_literal, tensor_type
from kaun_ir.ops.rules import apply, batch_graph, trace
from kaun_ir.ops.scan_vjp import scan_forward, scan_vjp

_I32 = TensorType(dtypes.int32, ())

#: the largest body (in ops) whose first iteration the lowering runs before the loop: the body is
#: emitted twice, which a small recurrent cell pays for in fewer and write-only buffer fills,
#: and a large one (a rolled stack of blocks) would pay for in compile time
_PEEL_MAX_OPS = 64


def split_operands(operands, num_consts: int, num_carry: int):
    """``(consts, carry, xs)`` of a scan's operand list."""
    return (
        operands[:num_consts],
        operands[num_consts : num_consts + num_carry],
        operands[num_consts + num_carry :],
    )


def _scan_infer(*types: TensorType, regions, num_consts, num_carry, length, reverse=False, unroll=1):
    (body,) = regions
    if num_consts < 0 or num_carry < 0 or num_consts + num_carry > len(types):
        raise ShapeError(
            f"num_consts={num_consts} and num_carry={num_carry} do not fit {len(types)} operands"
        )
    if length < 0:
        raise ShapeError(f"length must be >= 0, got {length}")
    if unroll < 1:
        raise ShapeError(f"unroll must be >= 1, got {unroll}")
    consts, carry, xs = split_operands(types, num_consts, num_carry)
    for k, x in enumerate(xs):
        if not x.shape or x.shape[0] != length:
            raise ShapeError(f"scanned operand {k} of type {x} needs a leading axis of length {length}")
    expected = tuple(consts) + tuple(carry) + tuple(TensorType(x.dtype, x.shape[1:]) for x in xs)
    if tuple(body.input_types) != expected:
        raise ShapeError(
            f"body takes ({', '.join(map(str, body.input_types))}) but the scan passes "
            f"({', '.join(map(str, expected))})"
        )
    outs = tuple(body.output_types)
    if outs[:num_carry] != tuple(carry):
        raise ShapeError(
            f"body returns the carry as ({', '.join(map(str, outs[:num_carry]))}) but it "
            f"enters as ({', '.join(map(str, carry))}): the carry must keep its types"
        )
    ys = tuple(TensorType(y.dtype, (length,) + y.shape) for y in outs[num_carry:])
    return tuple(carry) + ys


def _scan_reference(*values, regions, num_consts, num_carry, length, reverse=False, unroll=1):
    (body,) = regions
    consts, carry, xs = split_operands(list(values), num_consts, num_carry)
    y_types = body.output_types[num_carry:]
    ys = [np.zeros((length,) + t.shape, t.dtype) for t in y_types]
    steps = range(length - 1, -1, -1) if reverse else range(length)
    for t in steps:
        outs = interpret(body, *consts, *carry, *[x[t] for x in xs])
        carry = outs[:num_carry]
        for buffer, y in zip(ys, outs[num_carry:]):
            buffer[t] = y
    return tuple(carry) + tuple(ys)


def _constant(em, value, dtype) -> str:
    t = TensorType(dtype, ())
    return em.op(
        "stablehlo.constant",
        [],
        [],
        [t],
        {"value": f"dense<{scalar_literal(value, dtype)}> : {tensor_type(t)}"},
    )[0]


def _emit_step(em, node, index: str, consts, carry, xs, ys):
    """One iteration at run-time step ``index`` (an i32 scalar): returns (carry, ys)."""
    num_consts, num_carry = node.attr("num_consts"), node.attr("num_carry")
    (body,) = node.regions
    x_types = [v.type for v in node.inputs[num_consts + num_carry :]]
    zero = _constant(em, 0, dtypes.int32) if any(t.ndim > 1 for t in x_types + list(node.types)) else None
    slices = []
    for x, t in zip(xs, x_types):
        starts = [index] + [zero] * (t.ndim - 1)
        block = TensorType(t.dtype, (1,) + t.shape[1:])
        piece = em.op(
            "stablehlo.dynamic_slice",
            [x, *starts],
            [t] + [_I32] * t.ndim,
            [block],
            {"slice_sizes": "array<i64: " + ", ".join(map(str, block.shape)) + ">"},
        )[0]
        sliced = TensorType(t.dtype, t.shape[1:])
        slices.append(em.op("stablehlo.reshape", [piece], [block], [sliced])[0])
    outs = em.emit_graph(body, list(consts) + list(carry) + slices)
    if ys is None:
        return outs[:num_carry], outs[num_carry:]
    new_ys = []
    for buffer, y, t in zip(ys, outs[num_carry:], node.types[num_carry:]):
        block = TensorType(t.dtype, (1,) + t.shape[1:])
        piece = em.op("stablehlo.reshape", [y], [TensorType(t.dtype, t.shape[1:])], [block])[0]
        starts = [index] + [zero] * (t.ndim - 1)
        new_ys.append(
            em.op(
                "stablehlo.dynamic_update_slice", [buffer, piece, *starts], [t, block] + [_I32] * t.ndim, [t]
            )[0]
        )
    return outs[:num_carry], new_ys


def _step_index(em, counter: str, offset: int, length: int, reverse: bool) -> str:
    """``counter + offset``, or ``length - 1 - (counter + offset)`` for a reversed scan."""
    step = counter
    if offset:
        step = em.op("stablehlo.add", [counter, _constant(em, offset, dtypes.int32)], [_I32, _I32], [_I32])[0]
    if reverse:
        last = _constant(em, length - 1, dtypes.int32)
        step = em.op("stablehlo.subtract", [last, step], [_I32, _I32], [_I32])[0]
    return step


def _scan_emit(em, node, *operands):
    num_consts, num_carry = node.attr("num_consts"), node.attr("num_carry")
    length, reverse, unroll = node.attr("length"), node.attr("reverse"), node.attr("unroll")
    unroll = max(1, min(unroll, length)) if length else 1
    consts, carry, xs = split_operands(list(operands), num_consts, num_carry)
    in_types = [v.type for v in node.inputs]
    c_types, h_types, x_types = split_operands(in_types, num_consts, num_carry)
    y_types = list(node.types[num_carry:])
    start = 1 if length and y_types and len(node.regions[0].nodes) <= _PEEL_MAX_OPS else 0
    carry, ys = _initial_outputs(em, node, start, consts, carry, xs, y_types)
    trips = (length - start) // unroll
    sizes = (len(c_types), len(h_types), len(x_types))
    state = [_constant(em, start, dtypes.int32), *consts, *carry, *xs, *ys]
    if trips:
        state_types = [_I32] + c_types + h_types + x_types + y_types
        state = _emit_loop(em, node, state, state_types, sizes, start, trips, unroll)
    _, c, h, x, y = _unpack(list(state), sizes)
    for t in range(start + trips * unroll, length):  # left over by unrolling, straight-line
        index = _constant(em, length - 1 - t if reverse else t, dtypes.int32)
        h, y = _emit_step(em, node, index, c, h, x, y)
    return list(h) + list(y)


def _initial_outputs(em, node, start, consts, carry, xs, y_types):
    """``(carry, ys)`` before the loop: with ``start == 1`` the first iteration runs here, and each
    stacked output starts as its first step's value broadcast along the steps (every other row
    is written again by the loop): XLA fills each buffer once, where zero-filled ones share one
    constant that every loop buffer copies, and the step's temporary memory shrinks. Otherwise
    the stacked outputs start as zeros."""
    if not start:
        zeros = [
            em.op(
                "stablehlo.constant",
                [],
                [],
                [t],
                {"value": f"dense<{scalar_literal(0, t.dtype)}> : {tensor_type(t)}"},
            )[0]
            for t in y_types
        ]
        return carry, zeros
    length, reverse = node.attr("length"), node.attr("reverse")
    index = _constant(em, length - 1 if reverse else 0, dtypes.int32)
    carry, firsts = _emit_step(em, node, index, consts, carry, xs, None)
    ys = [
        em.op(
            "stablehlo.broadcast_in_dim",
            [y],
            [TensorType(t.dtype, t.shape[1:])],
            [t],
            {"broadcast_dimensions": i64_array(range(1, t.ndim))},
        )[0]
        for y, t in zip(firsts, y_types)
    ]
    return carry, ys


def _unpack(values, sizes):
    """The loop state ``[i, consts, carry, xs, ys]`` as its five groups (``sizes``: how many
    consts, carries and xs)."""
    n_c, n_h, n_x = sizes
    rest = values[1:]
    return (
        values[0],
        rest[:n_c],
        rest[n_c : n_c + n_h],
        rest[n_c + n_h : n_c + n_h + n_x],
        rest[n_c + n_h + n_x :],
    )


def _emit_loop(em, node, state, state_types, sizes, start, trips, unroll):
    """The ``stablehlo.while`` that runs ``trips`` times ``unroll`` steps from step ``start``."""
    length, reverse = node.attr("length"), node.attr("reverse")

    def cond(inner, args):
        bound = _constant(inner, start + trips * unroll, dtypes.int32)
        return [inner.compare(args[0], bound, _I32, "LT")]

    def body(inner, args):
        i, c, h, x, y = _unpack(args, sizes)
        for k in range(unroll):
            index = _step_index(inner, i, k, length, reverse)
            h, y = _emit_step(inner, node, index, c, h, x, y)
        step = _constant(inner, unroll, dtypes.int32)
        i = inner.op("stablehlo.add", [i, step], [_I32, _I32], [_I32])[0]
        return [i, *c, *h, *x, *y]

    regions = [
        em.region(state_types, cond, [TensorType(dtypes.bool_, ())]),
        em.region(state_types, body, state_types),
    ]
    return em.op("stablehlo.while", state, state_types, state_types, None, regions)


def _scan_samples(rng):
    def f64(*shape):
        return rng.standard_normal(shape).astype(np.float64)

    def typed(*shapes, dtype=np.float64):
        return [TensorType(np.dtype(dtype), shape) for shape in shapes]

    # a running tanh recurrence with a weight matrix closed over (a const) and per-step outputs
    w = f64(3, 3)
    f64(3), f64(4, 3)  # drawn for the body's types once; kept so that the samples stay the same
    body = trace(lambda w, h, x: _tanh_step(h, x, w), typed((3, 3), (3,), (3,)), "body")
    yield Sample(
        (w, f64(3), f64(4, 3)), {"num_consts": 1, "num_carry": 1, "length": 4}, regions=(body,), name="rnn"
    )
    yield Sample(
        (w, f64(3), f64(4, 3)),
        {"num_consts": 1, "num_carry": 1, "length": 4, "reverse": True, "unroll": 3},
        regions=(body,),
        name="rnn-reverse-unroll",
    )
    # an integer counter in the carry, a cumulative product, no scanned inputs
    f64(2)
    types = typed((), dtype=np.int32) + typed((2,))
    body = trace(lambda count, prod: (count + 1, prod * 1.5, prod), types, "body")
    yield Sample(
        (np.asarray(np.int32(0)), f64(2)),
        {"num_consts": 0, "num_carry": 2, "length": 3},
        regions=(body,),
        name="counter",
    )
    # float32, zero-length
    body = trace(lambda h, x: (h + x, h * x), typed((), (), dtype=np.float32), "body")
    yield Sample(
        (np.asarray(np.float32(1)), np.zeros((0,), np.float32)),
        {"num_consts": 0, "num_carry": 1, "length": 0},
        regions=(body,),
        name="empty",
    )


def _tanh_step(h, x, w):
    h = apply("tanh", h @ w + x)
    return h, h * 2.0


def _scan_batch(batched, size, *operands, regions, num_consts, num_carry, length, reverse=False, unroll=1):
    """The scan over the whole batch: the body is batched (a carry is batched when it starts
    batched or the body makes it so, found by iterating to a fixed point); scanned operands move
    their batch axis behind the loop axis, and stacked outputs move it back to axis 0."""
    (body,) = regions
    n_h = num_carry
    flags = list(batched)
    carry_flags = flags[num_consts : num_consts + n_h]
    while True:
        _, out_flags = batch_graph(body, flags, size)
        grown = [a or b for a, b in zip(carry_flags, out_flags[:n_h])]
        if grown == carry_flags:
            break
        carry_flags = grown
        flags[num_consts : num_consts + n_h] = grown
    _, out_flags = batch_graph(body, flags, size)
    y_flags = out_flags[n_h:]
    body_b, _ = batch_graph(body, flags, size, force=carry_flags + y_flags)

    def bcast(x):
        return apply(
            "broadcast_in_dim",
            x,
            shape=(size,) + tuple(x.shape),
            broadcast_dimensions=tuple(range(1, x.ndim + 1)),
        )

    def swap01(x):
        return apply("transpose", x, permutation=(1, 0) + tuple(range(2, x.ndim)))

    consts, carry, xs = split_operands(list(operands), num_consts, num_carry)
    _, carry_b, xs_b = split_operands(list(batched), num_consts, num_carry)
    carry = [bcast(x) if f and not b else x for x, b, f in zip(carry, carry_b, carry_flags)]
    xs = [swap01(x) if b else x for x, b in zip(xs, xs_b)]
    outs = apply(
        "scan",
        *consts,
        *carry,
        *xs,
        regions=(body_b,),
        num_consts=num_consts,
        num_carry=num_carry,
        length=length,
        reverse=reverse,
        unroll=unroll,
    )
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    result = [o if f else bcast(o) for o, f in zip(outs[:n_h], carry_flags)]
    result += [swap01(o) if f else bcast(o) for o, f in zip(outs[n_h:], y_flags)]
    return tuple(result)


OPS = [
    OpDef(
        name="scan",
        traits=(),
        stablehlo=None,  # lowered to a stablehlo.while
        arity=None,
        regions=1,
        attrs=("num_consts", "num_carry", "length"),
        optional={"reverse": False, "unroll": 1},
        infer=_scan_infer,
        reference=_scan_reference,
        emit=_scan_emit,
        samples=_scan_samples,
        vjp=scan_vjp,
        vjp_forward=scan_forward,
        batch=_scan_batch,
        doc="Loop over the leading axis of stacked operands (lowered to one ``stablehlo.while``).",
    ),
]
