"""How each StableHLO (and func / CHLO / Shardy) op is imported: ``HANDLERS[op name](importer, op,
operands, env) -> [Value]``.

Most ops map one-to-one onto the op table. The others are rewritten: ops with a combiner region
(reduce, reduce_window, scatter, select_and_scatter) are recognised by the one op their region
applies; JAX's argmax/argmin (a two-operand reduce over an iota) becomes ``argmax``/``argmin``;
gather/scatter batching dimensions become explicit index components; calls and composites are
inlined; sharding constraints and optimisation barriers pass their operands through.
"""

from __future__ import annotations

# Each op family's handlers live in a module of their own (stablehlo_linalg, _indexing, _reduce,
# _control); they and the attribute readers are imported under the short names the map below uses.
import numpy as np

from kaun_ir.errors import StableHLOImportError
from kaun_ir.ops import BUILTIN, TABLE
from kaun_ir.passes.fold import DEFAULT_MAX_SPLAT_ELEMENTS as SPLAT_INLINE_ELEMENTS
from kaun_ir.runtime.interop.stablehlo_attrs import dense_array, enum
from kaun_ir.runtime.interop.stablehlo_attrs import integer as _int
from kaun_ir.runtime.interop.stablehlo_attrs import ints as _ints
from kaun_ir.runtime.interop.stablehlo_attrs import result_type as _result_type
from kaun_ir.runtime.interop.stablehlo_control import while_loop as _while
from kaun_ir.runtime.interop.stablehlo_indexing import gather as _gather
from kaun_ir.runtime.interop.stablehlo_indexing import scatter as _scatter
from kaun_ir.runtime.interop.stablehlo_linalg import convolution as _convolution
from kaun_ir.runtime.interop.stablehlo_linalg import dot as _dot
from kaun_ir.runtime.interop.stablehlo_linalg import dot_general as _dot_general
from kaun_ir.runtime.interop.stablehlo_reduce import reduce as _reduce
from kaun_ir.runtime.interop.stablehlo_reduce import reduce_window as _reduce_window
from kaun_ir.runtime.interop.stablehlo_reduce import select_and_scatter as _select_and_scatter

#: ops imported one to one, without attributes or regions: StableHLO (or CHLO) name -> op name,
#: read off the built-in ops' ``stablehlo`` names (the others have handlers of their own below)
_SAME_NAME = {
    TABLE[name].stablehlo: name
    for name in sorted(BUILTIN)
    if TABLE[name].stablehlo and not (TABLE[name].attrs or TABLE[name].optional or TABLE[name].regions)
}


# --------------------------------------------------------------------------- one-to-one handlers


def _same(name):
    return lambda imp, op, xs, env: imp.add(name, *xs)


def _constant(imp, op, xs, env):
    t = _result_type(op)
    array = dense_array(op.attributes["value"], t)
    if array.shape == t.shape:
        return [imp.constant(array)]
    if t.size <= SPLAT_INLINE_ELEMENTS:  # a small splat: its elements, as the fold pass keeps them
        return [imp.constant(np.broadcast_to(array, t.shape).copy())]
    # a splat stays one scalar and a broadcast, whatever the constant's size
    return [imp.add1("broadcast_in_dim", imp.constant(array), shape=t.shape, broadcast_dimensions=())]


def _compare(imp, op, xs, env):
    if "compare_type" in op.attributes and enum(op, "compare_type") == "TOTALORDER":
        raise StableHLOImportError("compare with TOTALORDER is not supported (NaN ordering differs)")
    return imp.add("compare", *xs, direction=enum(op, "comparison_direction"))


def _convert(name):
    return lambda imp, op, xs, env: imp.add(name, *xs, dtype=_result_type(op).dtype)


def _iota(imp, op, xs, env):
    t = _result_type(op)
    return imp.add("iota", dtype=t.dtype, shape=t.shape, dimension=_int(op, "iota_dimension"))


def _broadcast_in_dim(imp, op, xs, env):
    return imp.add(
        "broadcast_in_dim",
        *xs,
        shape=_result_type(op).shape,
        broadcast_dimensions=_ints(op, "broadcast_dimensions"),
    )


def _slice(imp, op, xs, env):
    rank = xs[0].type.ndim
    return imp.add(
        "slice",
        *xs,
        start_indices=_ints(op, "start_indices"),
        limit_indices=_ints(op, "limit_indices"),
        strides=_ints(op, "strides", (1,) * rank),
    )


def _pad(imp, op, xs, env):
    return imp.add(
        "pad",
        *xs,
        low=_ints(op, "edge_padding_low"),
        high=_ints(op, "edge_padding_high"),
        interior=_ints(op, "interior_padding"),
    )


# --------------------------------------------------------------------------- calls and annotations


def _call(imp, op, xs, env):
    callee = str(op.attributes["callee"]).lstrip("@")
    return imp.call(callee, xs, op)


def _composite(imp, op, xs, env):
    callee = str(op.attributes["decomposition"]).lstrip("@")
    return imp.call(callee, xs, op)


def _identity(imp, op, xs, env):
    return xs


def _custom_call(imp, op, xs, env):
    target = str(op.attributes["call_target_name"]).strip('"')
    if target == "Sharding" and len(xs) == 1:
        return xs  # a sharding annotation: the value itself
    raise StableHLOImportError(f"custom_call @{target} is not supported (its semantics are opaque)")


HANDLERS = {mlir_name: _same(name) for mlir_name, name in _SAME_NAME.items()}
HANDLERS.update(
    {
        "stablehlo.constant": _constant,
        "stablehlo.compare": _compare,
        "stablehlo.convert": _convert("convert"),
        "stablehlo.bitcast_convert": _convert("bitcast_convert"),
        "stablehlo.iota": _iota,
        "stablehlo.broadcast_in_dim": _broadcast_in_dim,
        "stablehlo.reshape": lambda imp, op, xs, env: imp.add("reshape", *xs, shape=_result_type(op).shape),
        "stablehlo.transpose": lambda imp, op, xs, env: imp.add(
            "transpose", *xs, permutation=_ints(op, "permutation")
        ),
        "stablehlo.slice": _slice,
        "stablehlo.concatenate": lambda imp, op, xs, env: imp.add(
            "concatenate", *xs, dimension=_int(op, "dimension")
        ),
        "stablehlo.pad": _pad,
        "stablehlo.reverse": lambda imp, op, xs, env: imp.add(
            "reverse", *xs, dimensions=_ints(op, "dimensions")
        ),
        "stablehlo.dynamic_slice": lambda imp, op, xs, env: imp.add(
            "dynamic_slice", *xs, slice_sizes=_ints(op, "slice_sizes")
        ),
        "stablehlo.gather": _gather,
        "stablehlo.scatter": _scatter,
        "stablehlo.dot_general": _dot_general,
        "stablehlo.dot": _dot,
        "stablehlo.convolution": _convolution,
        "stablehlo.reduce": _reduce,
        "stablehlo.reduce_window": _reduce_window,
        "stablehlo.select_and_scatter": _select_and_scatter,
        "stablehlo.while": _while,
        "stablehlo.optimization_barrier": _identity,
        "stablehlo.custom_call": _custom_call,
        "stablehlo.composite": _composite,
        "sdy.sharding_constraint": _identity,
        "func.call": _call,
    }
)
