"""Control flow: ``while`` (a region-carrying op lowered to ``stablehlo.while``)."""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..errors import ShapeError
from ..ir.core import TensorType
from .base import OpDef, Sample


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
    from ..ir.interp import interpret

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
    from ..control import trace_loop_regions

    # count to 5 while doubling a vector
    x = rng.standard_normal(3).astype(np.float32)
    cond, body = trace_loop_regions(lambda s: s[0] < 5, lambda s: (s[0] + 1, s[1] * 2.0), (np.int32(0), x))
    yield Sample((np.asarray(np.int32(0)), x), regions=(cond, body))
    # a loop that does not run
    cond, body = trace_loop_regions(lambda s: s > 10.0, lambda s: s - 1.0, np.float32(3.0))
    yield Sample((np.asarray(np.float32(3.0)),), regions=(cond, body))


# Batching rule ---------------------------------------------------------------------------------


def _while_batch(batched, size, *carried, regions):
    """The loop over the whole batch. A carried value is batched when it starts batched or the
    body makes it so (found by iterating to a fixed point). When the condition differs per
    example, the loop runs while any example's condition holds and an example whose condition
    is false keeps its values (a select per carried value), as ``jax.vmap`` does."""
    from ..batching import batch_graph
    from ..ir.builder import Builder
    from ..ir.clone import copy_nodes
    from ..tensor import Tensor, apply

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

        def inline(graph, builder, args):
            env = {id(old): new.value for old, new in zip(graph.inputs, args)}
            return [Tensor(v, builder) for v in copy_nodes(graph, env, builder.nodes)]

        with Builder(record_source=False) as builder:
            args = [Tensor(builder.add_input(t), builder) for t in types]
            (pred,) = inline(cond_b, builder, args)
            anyone = apply("reduce", pred, kind="or", dimensions=(0,))
        any_cond = builder.finish([anyone.value], name="cond")
        with Builder(record_source=False) as builder:
            args = [Tensor(builder.add_input(t), builder) for t in types]
            (pred,) = inline(cond_b, builder, args)
            new = inline(body_b, builder, args)
            kept = []
            for old, fresh in zip(args, new):
                mask = apply("broadcast_in_dim", pred, shape=fresh.shape, broadcast_dimensions=(0,))
                kept.append(apply("select", mask, fresh, old).value)
        masked_body = builder.finish(kept, name="body")
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
