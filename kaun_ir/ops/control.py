"""Control flow: ``while`` (a region-carrying op lowered to ``stablehlo.while``)."""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ir.interp import interpret
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.rules import apply, batch_graph, inline, trace


def _while_infer(*carried: TensorType, regions) -> tuple[TensorType, ...]:
    cond, body = regions
    if tuple(cond.input_types) != carried or tuple(body.input_types) != carried:
        raise ShapeError(
            f"cond and body must take exactly the loop-carried types ({', '.join(map(str, carried))})"
        )
    if tuple(cond.output_types) != (TensorType(dtypes.bool_, ()),):
        got = ", ".join(map(str, cond.output_types))
        raise ShapeError(f"cond must return one bool[] scalar, returns ({got})")
    if tuple(body.output_types) != carried:
        got = ", ".join(map(str, body.output_types))
        raise ShapeError(f"body returns ({got}) but the loop carries ({', '.join(map(str, carried))})")
    return carried


def _while_reference(*values, regions):
    cond, body = regions
    state = list(values)
    while bool(interpret(cond, *state)[0]):
        state = interpret(body, *state)
    return tuple(state)


def _while_emit(em, node, *operands):
    cond, body = node.regions
    types = list(node.types)
    cond_region = em.region(
        types, lambda inner, args: inner.emit_graph(cond, args), [TensorType(dtypes.bool_, ())]
    )
    body_region = em.region(types, lambda inner, args: inner.emit_graph(body, args), types)
    return em.op("stablehlo.while", operands, types, types, None, [cond_region, body_region])


def _while_samples(rng):
    # count to 5 while doubling a vector
    x = rng.standard_normal(3).astype(np.float32)
    types = [TensorType(np.dtype(np.int32), ()), TensorType(x.dtype, x.shape)]
    cond = trace(lambda i, v: i < 5, types, "cond", record_source=False)
    body = trace(lambda i, v: (i + 1, v * 2.0), types, "body", record_source=False)
    yield Sample((np.asarray(np.int32(0)), x), regions=(cond, body))
    # a loop that does not run
    types = [TensorType(np.dtype(np.float32), ())]
    cond = trace(lambda s: s > 10.0, types, "cond", record_source=False)
    body = trace(lambda s: s - 1.0, types, "body", record_source=False)
    yield Sample((np.asarray(np.float32(3.0)),), regions=(cond, body))


# Batching rule ---------------------------------------------------------------------------------


def _while_batch(batched, size, *carried, regions):
    """The loop over the whole batch. A carried value is batched when it starts batched or the
    body makes it so (found by iterating to a fixed point). When the condition differs per
    example, the loop runs while any example's condition holds and an example whose condition
    is false keeps its values (a select per carried value), as ``jax.vmap`` does."""
    cond, body = regions
    flags = list(batched)
    while True:
        _, out_flags = batch_graph(body, flags, size)
        grown = [a or b for a, b in zip(flags, out_flags)]
        if grown == flags:
            break
        flags = grown
    cond_b, (pred_batched,) = batch_graph(cond, flags, size)
    if pred_batched:
        flags = [True] * len(flags)
        cond_b, _ = batch_graph(cond, flags, size)
    body_b, _ = batch_graph(body, flags, size, force=flags)
    operands = [
        x
        if b or not f
        else apply(
            "broadcast_in_dim",
            x,
            shape=(size,) + tuple(x.shape),
            broadcast_dimensions=tuple(range(1, x.ndim + 1)),
        )
        for x, b, f in zip(carried, batched, flags)
    ]
    if pred_batched:
        types = [x.type for x in operands]

        def any_example(*args):
            (pred,) = inline(cond_b, args)
            return apply("reduce", pred, kind="or", dimensions=(0,))

        def masked(*args):
            (pred,) = inline(cond_b, args)
            new = inline(body_b, args)
            kept = []
            for old, fresh in zip(args, new):
                mask = apply("broadcast_in_dim", pred, shape=fresh.shape, broadcast_dimensions=(0,))
                kept.append(apply("select", mask, fresh, old))
            return kept

        any_cond = trace(any_example, types, "cond", record_source=False)
        masked_body = trace(masked, types, "body", record_source=False)
        cond_b, body_b = any_cond, masked_body
    outs = apply("while", *operands, regions=(cond_b, body_b))
    outs = outs if isinstance(outs, tuple) else (outs,)
    return tuple(
        o
        if f
        else apply(
            "broadcast_in_dim",
            o,
            shape=(size,) + tuple(o.shape),
            broadcast_dimensions=tuple(range(1, o.ndim + 1)),
        )
        for o, f in zip(outs, flags)
    )


OPS = [
    OpDef(
        name="while",
        traits=(),
        arity=None,
        regions=2,
        batch=_while_batch,
        infer=_while_infer,
        reference=_while_reference,
        emit=_while_emit,
        samples=_while_samples,
        nondiff=(
            "reverse mode through a while loop needs its trip count when the program is built, "
            "which a while_loop does not have; use kn.scan, or kn.fori_loop with Python-integer "
            "bounds"
        ),
        doc="Loop: carries its operands through ``body`` while ``cond`` returns true.",
    ),
]
