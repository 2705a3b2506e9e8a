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

from kaun_ir import dtypes
from kaun_ir.errors import StableHLOImportError
from kaun_ir.ops import BUILTIN, TABLE
from kaun_ir.passes.fold import DEFAULT_MAX_SPLAT_ELEMENTS as SPLAT_INLINE_ELEMENTS
from kaun_ir.runtime.interop.stablehlo_attrs import dense_array, enum
from kaun_ir.runtime.interop.stablehlo_attrs import integer as _int
from kaun_ir.runtime.interop.stablehlo_attrs import ints as _ints
from kaun_ir.runtime.interop.stablehlo_attrs import result_type as _result_type
from kaun_ir.runtime.interop.stablehlo_control import case as _case
from kaun_ir.runtime.interop.stablehlo_control import if_ as _if
from kaun_ir.runtime.interop.stablehlo_control import map_ as _map
from kaun_ir.runtime.interop.stablehlo_control import while_loop as _while
from kaun_ir.runtime.interop.stablehlo_indexing import gather as _gather
from kaun_ir.runtime.interop.stablehlo_indexing import scatter as _scatter
from kaun_ir.runtime.interop.stablehlo_linalg import LAPACK_TRSM
from kaun_ir.runtime.interop.stablehlo_linalg import convolution as _convolution
from kaun_ir.runtime.interop.stablehlo_linalg import dot as _dot
from kaun_ir.runtime.interop.stablehlo_linalg import dot_general as _dot_general
from kaun_ir.runtime.interop.stablehlo_linalg import lapack_trsm as _lapack_trsm
from kaun_ir.runtime.interop.stablehlo_linalg import triangular_solve as _triangular_solve
from kaun_ir.runtime.interop.stablehlo_reduce import reduce as _reduce
from kaun_ir.runtime.interop.stablehlo_reduce import reduce_window as _reduce_window
from kaun_ir.runtime.interop.stablehlo_reduce import select_and_scatter as _select_and_scatter
from kaun_ir.runtime.interop.stablehlo_sort import sort as _sort

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


def _total_order_key(imp, x):
    """The float ``x``'s bits as a signed integer that orders like IEEE totalOrder
    (-NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN): negative floats have their magnitude bits
    flipped."""
    word = np.dtype(f"i{x.dtype.itemsize}")
    bits = imp.add1("bitcast_convert", x, dtype=word)
    shape = tuple(x.type.shape)

    def full(value):
        return imp.add1(
            "broadcast_in_dim", imp.constant(np.asarray(value, word)), shape=shape, broadcast_dimensions=()
        )

    negative = imp.add1("compare", bits, full(0), direction="LT")
    flipped = imp.add1("xor", bits, full(np.iinfo(word).max))
    return imp.add1("select", negative, flipped, bits)


def _compare(imp, op, xs, env):
    direction = enum(op, "comparison_direction")
    if (
        "compare_type" in op.attributes
        and enum(op, "compare_type") == "TOTALORDER"
        and dtypes.is_float(xs[0].dtype)
    ):
        xs = [_total_order_key(imp, x) for x in xs]
    return imp.add("compare", *xs, direction=direction)


def _convert(name):
    return lambda imp, op, xs, env: imp.add(name, *xs, dtype=_result_type(op).dtype)


def _bitcast(imp, op, xs, env):
    """``stablehlo.bitcast_convert``; to or from ``i1`` (one bit per element) it is rewritten with
    shifts: ``T[...] -> i1[..., bits(T)]`` and back, bit 0 (the least significant) first."""
    (x,) = xs
    out = _result_type(op).dtype
    if out != dtypes.bool_ and x.dtype != dtypes.bool_:
        return imp.add("bitcast_convert", x, dtype=out)
    if out == x.dtype:
        return [x]
    if x.dtype == dtypes.bool_:  # i1[..., n] -> T[...]
        n = x.type.shape[-1] if x.type.shape else 0
        if 8 * out.itemsize != n:
            raise imp.error(op, f"i1 -> {dtypes.short_name(out)} needs a trailing axis of {8 * out.itemsize}")
        word = np.dtype(f"u{out.itemsize}")
        shape = x.type.shape
        bits = imp.add1("convert", x, dtype=word)
        places = imp.add1("iota", dtype=word, shape=shape, dimension=len(shape) - 1)
        shifted = imp.add1("shift_left", bits, places)
        packed = imp.add1("reduce", shifted, kind="sum", dimensions=(len(shape) - 1,))
        return [packed] if word == out else imp.add("bitcast_convert", packed, dtype=out)
    word = np.dtype(f"u{x.dtype.itemsize}")  # T[...] -> i1[..., n]
    n = 8 * x.dtype.itemsize
    u = x if x.dtype == word else imp.add1("bitcast_convert", x, dtype=word)
    shape = tuple(x.type.shape) + (n,)
    wide = imp.add1("broadcast_in_dim", u, shape=shape, broadcast_dimensions=tuple(range(len(shape) - 1)))
    places = imp.add1("iota", dtype=word, shape=shape, dimension=len(shape) - 1)
    one = imp.add1("broadcast_in_dim", imp.constant(np.ones((), word)), shape=shape, broadcast_dimensions=())
    bit = imp.add1("and", imp.add1("shift_right_logical", wide, places), one)
    return imp.add("convert", bit, dtype=dtypes.bool_)


def _get_dimension_size(imp, op, xs, env):
    """``stablehlo.get_dimension_size`` of a static shape (every shape kaun_ir imports): a constant."""
    size = xs[0].type.shape[_int(op, "dimension")]
    return [imp.constant(np.asarray(size, _result_type(op).dtype))]


def _real_dynamic_slice(imp, op, xs, env):
    """``stablehlo.real_dynamic_slice`` with a static result (what the CHLO legalisation of
    ``chlo.scan`` writes) and constant unit strides: a ``dynamic_slice`` of the result's size."""
    x, start, _, strides = xs
    node = strides.node
    if node is None or node.op != "constant" or np.any(np.asarray(node.attr_dict["value"].array) != 1):
        raise imp.error(op, "only unit strides known when the program is imported are supported")
    starts = [
        imp.add1(
            "reshape",
            imp.add1("slice", start, start_indices=(d,), limit_indices=(d + 1,), strides=(1,)),
            shape=(),
        )
        for d in range(x.type.ndim)
    ]
    return imp.add("dynamic_slice", x, *starts, slice_sizes=_result_type(op).shape)


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


def _broadcast(imp, op, xs, env):
    """``stablehlo.broadcast``: new leading axes of ``broadcast_sizes`` (a ``broadcast_in_dim``)."""
    shape = _result_type(op).shape
    rank = xs[0].type.ndim
    lead = len(shape) - rank
    return imp.add("broadcast_in_dim", *xs, shape=shape, broadcast_dimensions=tuple(range(lead, lead + rank)))


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
    if target in LAPACK_TRSM and len(xs) == 2:
        return _lapack_trsm(imp, op, xs, env)
    raise StableHLOImportError(f"custom_call @{target} is not supported (its semantics are opaque)")


def _refused(reason: str):
    def handler(imp, op, xs, env):
        raise imp.error(op, reason)

    return handler


_COMPLEX = "complex numbers are not a kaun_ir dtype"
_TOKENS = "tokens and the side effects they order (infeed, outfeed, send, recv) are not supported"
#: ops refused with the reason they stay out (docs/interop.md, "What stays out")
REFUSED = {
    **{f"stablehlo.{name}": _COMPLEX for name in ("real", "imag", "complex", "fft")},
    **{
        f"stablehlo.{name}": _TOKENS
        for name in ("create_token", "after_all", "infeed", "outfeed", "send", "recv")
    },
    **{
        f"stablehlo.{name}": "quantized types are not kaun_ir dtypes"
        for name in ("uniform_quantize", "uniform_dequantize")
    },
    **{
        f"stablehlo.{name}": "dynamic shapes are not supported (export with concrete shapes)"
        for name in (
            "dynamic_broadcast_in_dim",
            "dynamic_reshape",
            "dynamic_iota",
            "dynamic_pad",
            "dynamic_gather",
            "dynamic_conv",
            "set_dimension_size",
        )
    },
}

HANDLERS = {mlir_name: _same(name) for mlir_name, name in _SAME_NAME.items()}
HANDLERS.update({name: _refused(reason) for name, reason in REFUSED.items()})
HANDLERS.update(
    {
        "stablehlo.constant": _constant,
        "stablehlo.compare": _compare,
        "stablehlo.convert": _convert("convert"),
        "stablehlo.bitcast_convert": _bitcast,
        "stablehlo.iota": _iota,
        "stablehlo.get_dimension_size": _get_dimension_size,
        "stablehlo.real_dynamic_slice": _real_dynamic_slice,
        "stablehlo.reduce_precision": lambda imp, op, xs, env: imp.add(
            "reduce_precision",
            *xs,
            exponent_bits=_int(op, "exponent_bits"),
            mantissa_bits=_int(op, "mantissa_bits"),
        ),
        "stablehlo.broadcast_in_dim": _broadcast_in_dim,
        "stablehlo.broadcast": _broadcast,
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
        "stablehlo.triangular_solve": _triangular_solve,
        "stablehlo.reduce": _reduce,
        "stablehlo.reduce_window": _reduce_window,
        "stablehlo.select_and_scatter": _select_and_scatter,
        "stablehlo.while": _while,
        "stablehlo.case": _case,
        "stablehlo.if": _if,
        "stablehlo.map": _map,
        "stablehlo.sort": _sort,
        "stablehlo.optimization_barrier": _identity,
        "stablehlo.custom_call": _custom_call,
        "stablehlo.composite": _composite,
        "sdy.sharding_constraint": _identity,
        "func.call": _call,
    }
)
