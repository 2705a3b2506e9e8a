"""Control flow: ``while`` and ``case``, region-carrying ops lowered to ``stablehlo.while`` and
``stablehlo.case`` (StableHLO's ``if`` is imported as a two-branch ``case``)."""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ir.interp import interpret
from kaun_ir.ops.base import VARIADIC, OpDef, Sample
from kaun_ir.ops.emit import Emitter
from kaun_ir.ops.rules import apply, batch_graph, gradient_graph, inline, trace


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


# case -----------------------------------------------------------------------------------------


def _case_infer(index: TensorType, *operands: TensorType, regions) -> tuple[TensorType, ...]:
    if index.shape != () or index.dtype != dtypes.int32:
        raise ShapeError(f"the branch index must be an i32[] scalar, got {index}")
    outputs = None
    for k, branch in enumerate(regions):
        if tuple(branch.input_types) != operands:
            got = ", ".join(map(str, branch.input_types))
            raise ShapeError(
                f"branch {k} takes ({got}) but the case passes ({', '.join(map(str, operands))})"
            )
        if outputs is None:
            outputs = tuple(branch.output_types)
        elif tuple(branch.output_types) != outputs:
            got = ", ".join(map(str, branch.output_types))
            raise ShapeError(
                f"branch {k} returns ({got}) but branch 0 returns ({', '.join(map(str, outputs))})"
            )
    return outputs


def _branch(index, count: int) -> int:
    """The branch an index selects: an index out of range selects the last branch."""
    k = int(index)
    return k if 0 <= k < count else count - 1


def _case_reference(index, *operands, regions):
    return tuple(interpret(regions[_branch(index, len(regions))], *operands))


def _case_emit(em, node, index, *operands):
    """``stablehlo.case``: its branches read the operands from the enclosing scope."""
    regions = []
    for branch in node.regions:
        inner = Emitter(indent=em.indent + 2, parent=em)
        results = inner.emit_graph(branch, list(operands))
        inner.op("stablehlo.return", results, list(branch.output_types), [])
        regions.append("{\n" + "\n".join(inner.lines) + "\n" + " " * em.indent + "}")
    return em.op("stablehlo.case", [index], [node.inputs[0].type], list(node.types), None, regions)


def _case_samples(rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    y = rng.standard_normal(3).astype(np.float32)
    types = [TensorType(x.dtype, x.shape), TensorType(y.dtype, y.shape)]
    branches = (
        trace(
            lambda a, b: (a * 2.0 + b, apply("reduce", a, kind="sum", dimensions=(0,))),
            types,
            "branch0",
            record_source=False,
        ),
        trace(lambda a, b: (apply("sine", a), b * b), types, "branch1", record_source=False),
        trace(lambda a, b: (a - a, b), types, "branch2", record_source=False),
    )
    for k in (0, 1, 2, -1, 7):  # out of range: the last branch
        yield Sample((np.asarray(np.int32(k)), x, y), regions=branches)
    # one branch, no operands but the index
    (only,) = [
        trace(
            lambda: apply("constant", value=np.arange(3, dtype=np.float32)),
            [],
            "branch0",
            record_source=False,
        )
    ]
    yield Sample((np.asarray(np.int32(0)),), regions=(only,))


def _case_vjp(cts, outs, index, *operands, regions):
    """Each branch's own reverse pass, chosen by the same index: a ``case`` over the branches'
    gradient graphs, which take the operands and the float outputs' cotangents."""
    if len(regions[0].outputs) == 1:
        cts, outs = [cts], [outs]
    wrt = [k for k, x in enumerate(operands) if dtypes.is_float(x.dtype)]
    of = [k for k, o in enumerate(outs) if dtypes.is_float(o.dtype)]
    if not wrt or not of:
        return (None,) * (1 + len(operands))
    graphs = tuple(
        gradient_graph(branch, wrt=wrt, of=of, seed_inputs=True, keep_outputs=False) for branch in regions
    )
    grads = apply("case", index, *operands, *[cts[k] for k in of], regions=graphs)
    grads = grads if isinstance(grads, tuple) else (grads,)
    result = [None] * (1 + len(operands))
    for k, g in zip(wrt, grads):
        result[1 + k] = g
    return tuple(result)


def _case_batch(batched, size, index, *operands, regions):
    """Index not batched: one ``case`` over the batched branches. Index batched: every branch
    runs on the whole batch and each example takes its own branch's results (a select), as
    ``jax.vmap`` of ``lax.switch`` does."""
    flags = list(batched[1:])
    branches = [batch_graph(branch, flags, size, force=True)[0] for branch in regions]
    if not batched[0]:
        outs = apply("case", index, *operands, regions=tuple(branches))
        return outs
    results = [inline(branch, operands) for branch in branches]
    chosen = list(results[-1])
    for k in range(len(regions) - 2, -1, -1):
        hit = apply(
            "compare",
            index,
            apply(
                "broadcast_in_dim",
                apply("constant", value=np.asarray(k, np.int32)),
                shape=(size,),
                broadcast_dimensions=(),
            ),
            direction="EQ",
        )
        for j, value in enumerate(results[k]):
            mask = apply("broadcast_in_dim", hit, shape=tuple(value.shape), broadcast_dimensions=(0,))
            chosen[j] = apply("select", mask, value, chosen[j])
    return tuple(chosen)


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
    OpDef(
        name="case",
        traits=(),
        arity=None,
        regions=VARIADIC,
        infer=_case_infer,
        reference=_case_reference,
        emit=_case_emit,
        samples=_case_samples,
        vjp=_case_vjp,
        batch=_case_batch,
        doc=(
            "Branch: runs region ``index`` (an i32 scalar, the first operand; out of range selects the "
            "last branch) on the other operands and returns its results. Every branch takes the "
            "operands' types and returns the same types. Reverse mode: the same choice over the "
            "branches' reverse passes."
        ),
    ),
]
