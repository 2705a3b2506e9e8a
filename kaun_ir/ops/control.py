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
        raise ShapeError("cond and body must take exactly the loop-carried types "
                         f"({', '.join(map(str, carried))})")
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
    cond_region = em.region(types, lambda inner, args: inner.emit_graph(cond, args),
                            [TensorType(dtypes.bool_, ())])
    body_region = em.region(types, lambda inner, args: inner.emit_graph(body, args), types)
    return em.op("stablehlo.while", operands, types, types, None, [cond_region, body_region])


def _while_samples(rng):
    from ..control import trace_loop_regions

    # count to 5 while doubling a vector
    x = rng.standard_normal(3).astype(np.float32)
    cond, body = trace_loop_regions(lambda s: s[0] < 5, lambda s: (s[0] + 1, s[1] * 2.0),
                                    (np.int32(0), x))
    yield Sample((np.asarray(np.int32(0)), x), regions=(cond, body))
    # a loop that does not run
    cond, body = trace_loop_regions(lambda s: s > 10.0, lambda s: s - 1.0, np.float32(3.0))
    yield Sample((np.asarray(np.float32(3.0)),), regions=(cond, body))


OPS = [
    OpDef(
        name="while", arity=None, regions=2, infer=_while_infer, reference=_while_reference,
        emit=_while_emit, samples=_while_samples,
        nondiff="reverse mode through a while loop needs a bounded trip count (not supported yet)",
        doc="Loop: carries its operands through ``body`` while ``cond`` returns true.",
    ),
]
