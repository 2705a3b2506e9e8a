"""Importing StableHLO's reductions: ``reduce`` (and JAX's argmax/argmin pattern of it),
``reduce_window`` and ``select_and_scatter``, each recognised by the one op its region applies.
A reduction's init value becomes one more combination when it is not the kind's identity."""

from __future__ import annotations

import numpy as np

from kaun_ir.errors import StableHLOImportError
from kaun_ir.ops.reduce import init_value
from kaun_ir.runtime.interop.stablehlo_attrs import combiner, enum, ints, pairs, region_block

# the op a combiner region applies -> reduce kind
_REDUCE_KINDS = {
    "stablehlo.add": "sum",
    "stablehlo.multiply": "prod",
    "stablehlo.maximum": "max",
    "stablehlo.minimum": "min",
    "stablehlo.and": "and",
    "stablehlo.or": "or",
}


def _constant_node_value(value):
    node = value.node
    if node is None or node.op != "constant":
        return None
    return np.asarray(node.attr("value").array)


def _is_identity(value, kind: str) -> bool:
    array = _constant_node_value(value)
    if array is None or array.shape != ():
        return False
    expected = init_value(kind, value.dtype)
    return array.tobytes() == np.asarray(expected, value.dtype).tobytes()


def _combine_init(imp, reduced, init, kind: str):
    """``reduced`` combined once with a scalar ``init`` that is not the kind's identity."""
    if _is_identity(init, kind):
        return reduced
    op = {"sum": "add", "prod": "multiply", "max": "maximum", "min": "minimum", "and": "and", "or": "or"}[
        kind
    ]
    if reduced.type.shape:
        init = imp.add1("broadcast_in_dim", init, shape=reduced.type.shape, broadcast_dimensions=())
    return imp.add1(op, reduced, init)


def reduce(imp, op, xs, env):
    """``stablehlo.reduce`` of one operand with an add/multiply/max/min/and/or region, or of two
    operands as JAX's argmax/argmin."""
    half = len(xs) // 2
    operands, inits = xs[:half], xs[half:]
    dims = ints(op, "dimensions")
    if half == 2:
        return _argminmax(imp, op, operands, inits, dims)
    if half != 1:
        raise StableHLOImportError(f"reduce of {half} operands at once is not supported")
    kind = _REDUCE_KINDS.get(combiner(op))
    if kind is None:
        raise StableHLOImportError("reduce whose region is not one of add/multiply/maximum/minimum/and/or")
    reduced = imp.add1("reduce", operands[0], kind=kind, dimensions=dims)
    return [_combine_init(imp, reduced, inits[0], kind)]


def _argminmax(imp, op, operands, inits, dims):
    """JAX's argmax/argmin: reduce (values, iota along the axis) with a compare-and-select region."""
    values, index = operands
    region_ops = [o.operation for o in region_block(op, 0).operations]
    directions = [enum(o, "comparison_direction") for o in region_ops if o.name == "stablehlo.compare"]
    largest = "GT" in directions[:1]
    smallest = "LT" in directions[:1]
    iota = index.node
    if (
        len(dims) != 1
        or not (largest or smallest)
        or iota is None
        or iota.op != "iota"
        or iota.attr("dimension") != dims[0]
        or not _is_identity(inits[0], "max" if largest else "min")
        or _constant_node_value(inits[1]) is None
        or int(_constant_node_value(inits[1])) != 0
    ):
        raise StableHLOImportError("reduce of two operands is supported only as JAX's argmax/argmin pattern")
    kind = "max" if largest else "min"
    best = imp.add1("reduce", values, kind=kind, dimensions=dims)
    position = imp.add1("argmax" if largest else "argmin", values, axis=dims[0], index_dtype=index.dtype)
    return [best, position]


def reduce_window(imp, op, xs, env):
    """``stablehlo.reduce_window`` of one operand with an add/maximum/minimum region (pooling)."""
    if len(xs) != 2:
        raise StableHLOImportError("reduce_window of several operands at once is not supported")
    kind = _REDUCE_KINDS.get(combiner(op))
    if kind not in ("sum", "max", "min"):
        raise StableHLOImportError("reduce_window whose region is not add/maximum/minimum")
    rank = xs[0].type.ndim
    ones = (1,) * rank
    return imp.add(
        "reduce_window",
        *xs,
        kind=kind,
        window_dimensions=ints(op, "window_dimensions"),
        window_strides=ints(op, "window_strides", ones),
        base_dilations=ints(op, "base_dilations", ones),
        window_dilations=ints(op, "window_dilations", ones),
        padding=pairs(op, "padding", rank),
    )


def select_and_scatter(imp, op, xs, env):
    """``stablehlo.select_and_scatter`` with a GE select and an add scatter: the gradient of max
    pooling, ``select_and_scatter_add`` in the op table."""
    select = [o.operation for o in region_block(op, 0).operations]
    if (
        len(select) != 2
        or select[0].name != "stablehlo.compare"
        or enum(select[0], "comparison_direction") != "GE"
        or combiner(op, 1) != "stablehlo.add"
    ):
        raise StableHLOImportError(
            "select_and_scatter is supported with a GE select and an add scatter (max pooling's gradient)"
        )
    rank = xs[0].type.ndim
    return imp.add(
        "select_and_scatter_add",
        *xs,
        window_dimensions=ints(op, "window_dimensions"),
        window_strides=ints(op, "window_strides", (1,) * rank),
        padding=pairs(op, "padding", rank),
    )
