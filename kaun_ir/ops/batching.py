"""Helpers for batching rules (``OpDef.batch``, used by ``kn.vmap``).

A batching rule sees the batch axis at axis 0 of every batched operand and returns every output
with the batch axis at axis 0 (see ``base.OpDef``). The helpers here are the shared pieces:
giving an unbatched operand the batch axis, the rule of elementwise ops, axis shifting, and
:func:`by_loop`, the rule that runs the op once per example inside one ``while`` loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kaun_ir.ir import optable
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.rules import apply, trace


def bcast(x, size: int):
    """``x`` (an unbatched operand) repeated along a new leading batch axis of ``size``."""
    return apply(
        "broadcast_in_dim",
        x,
        shape=(size,) + tuple(x.shape),
        broadcast_dimensions=tuple(range(1, x.ndim + 1)),
    )


def materialize(args: Sequence, batched: Sequence[bool], size: int) -> list:
    """Every operand with the batch axis at axis 0 (unbatched ones broadcast)."""
    return [x if b else bcast(x, size) for x, b in zip(args, batched)]


def example_type(x, batched: bool) -> TensorType:
    """The per-example type of an operand."""
    return TensorType(x.dtype, tuple(x.shape[1:]) if batched else tuple(x.shape))


def shift(axes: Sequence[int], by: int = 1) -> tuple[int, ...]:
    """Axis numbers moved past ``by`` new leading axes."""
    return tuple(int(a) + by for a in axes)


def move_axis(x, source: int, destination: int):
    """``x`` with axis ``source`` moved to ``destination`` (nothing emitted when they agree)."""
    if source == destination:
        return x
    order = [a for a in range(x.ndim) if a != source]
    order.insert(destination, source)
    return apply("transpose", x, permutation=tuple(order))


def elementwise(name: str):
    """The rule of an elementwise op: operands that are per-example scalars where others are not
    (``select``'s predicate, ``clamp``'s bounds) are broadcast to the full shape first, so every
    operand ends up with the shape ``(size, *example_shape)``."""

    def rule(batched, size, *args, **attrs):
        shapes = [example_type(x, b).shape for x, b in zip(args, batched)]
        target = max(shapes, key=len)
        full = (size,) + tuple(target)
        operands = []
        for x, b, shape in zip(args, batched, shapes):
            if tuple(shape) == tuple(target):
                operands.append(x if b else bcast(x, size))
            else:  # a per-example scalar
                dims = (0,) if b else ()
                operands.append(apply("broadcast_in_dim", x, shape=full, broadcast_dimensions=dims))
        return apply(name, *operands, **attrs)

    rule.__doc__ = f"Batching rule of {name}: elementwise over the batch axis."
    return rule


def unary_leading(name: str, axes_attrs: Sequence[str] = ()):
    """The rule of a one-operand op whose attributes name operand axes: the axes move past the
    batch axis (``reverse``'s dimensions, ``reduce``'s dimensions ...)."""

    def rule(batched, size, x, **attrs):
        for key in axes_attrs:
            value = attrs[key]
            attrs[key] = value + 1 if isinstance(value, int) else shift(value)
        return apply(name, x, **attrs)

    rule.__doc__ = f"Batching rule of {name}: the op applied with its axes moved past the batch axis."
    return rule


def example(x, index):
    """Example ``index`` (an int32 scalar tensor) of a batched operand, without the batch axis."""
    zero = apply("constant", value=np.zeros((), np.int32))
    block = apply("dynamic_slice", x, index, *([zero] * (x.ndim - 1)), slice_sizes=(1,) + tuple(x.shape[1:]))
    return apply("reshape", block, shape=tuple(x.shape[1:]))


def by_loop(name: str):
    """A rule that applies the op to one example at a time inside a single loop (a ``scan`` over
    the examples, as ``kn.fori_loop`` with static bounds builds it).

    Exact for any op and constant in IR size, but sequential: used where a vectorised rule would
    need a form of the op that StableHLO lacks (e.g. ``reduce_window`` with a different init
    value per example).
    """

    def rule(batched, size, *args, regions=(), **attrs):
        opdef = optable.table()[name]
        types = [example_type(x, b) for x, b in zip(args, batched)]
        out_types = opdef.infer_types(types, opdef.check_attrs(dict(attrs)), regions)
        accumulators = []
        for t in out_types:
            zero = apply("constant", value=np.zeros((), t.dtype))
            accumulators.append(
                apply("broadcast_in_dim", zero, shape=(size,) + t.shape, broadcast_dimensions=())
            )
        # the loop body reads the operands as loop-invariant operands (batched ones first)
        consts = [x for x, b in zip(args, batched) if b] + [x for x, b in zip(args, batched) if not b]
        position = [k for k, b in enumerate(batched) if b] + [k for k, b in enumerate(batched) if not b]

        def body(*inputs):
            by_arg = dict(zip(position, inputs[: len(consts)]))
            i, accs = inputs[len(consts)], inputs[len(consts) + 1 :]
            following = i + np.int32(1)
            operands = [example(by_arg[k], i) if b else by_arg[k] for k, b in enumerate(batched)]
            outs = apply(name, *operands, regions=tuple(regions), **attrs)
            outs = outs if isinstance(outs, tuple) else (outs,)
            zero = apply("constant", value=np.zeros((), np.int32))
            updated = []
            for acc, out in zip(accs, outs):
                block = apply("reshape", out, shape=(1,) + tuple(out.shape))
                updated.append(apply("dynamic_update_slice", acc, block, i, *([zero] * out.ndim)))
            return [following, *updated]

        counter = TensorType(np.dtype(np.int32), ())
        loop = trace(body, [x.type for x in consts] + [counter] + [a.type for a in accumulators], "body")
        outs = apply(
            "scan",
            *consts,
            np.int32(0),
            *accumulators,
            regions=(loop,),
            num_consts=len(consts),
            num_carry=1 + len(accumulators),
            length=size,
            reverse=False,
            unroll=1,
        )
        result = outs[1:]
        return result if len(result) > 1 else result[0]

    rule.__doc__ = f"Batching rule of {name}: one example at a time in a loop."
    rule.by_loop = True  # the coverage report counts these separately
    return rule
