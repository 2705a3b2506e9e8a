"""How each StableHLO (and func / CHLO / Shardy) op is imported: ``HANDLERS[op name](importer, op,
operands, env) -> [Value]``.

Most ops map one-to-one onto the op table. The others are rewritten: ops with a combiner region
(reduce, reduce_window, scatter, select_and_scatter) are recognised by the one op their region
applies; JAX's argmax/argmin (a two-operand reduce over an iota) becomes ``argmax``/``argmin``;
gather/scatter batching dimensions become explicit index components; calls and composites are
inlined; sharding constraints and optimisation barriers pass their operands through.
"""

from __future__ import annotations

import re

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import StableHLOImportError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops import BUILTIN, TABLE
from kaun_ir.ops.reduce import init_value
from kaun_ir.runtime.interop.stablehlo_import import tensor_type

#: ops imported one to one, without attributes or regions: StableHLO (or CHLO) name -> op name,
#: read off the built-in ops' ``stablehlo`` names (the others have handlers of their own below)
_SAME_NAME = {
    TABLE[name].stablehlo: name
    for name in sorted(BUILTIN)
    if TABLE[name].stablehlo and not (TABLE[name].attrs or TABLE[name].optional or TABLE[name].regions)
}
# the op a combiner region applies -> reduce kind
_REDUCE_KINDS = {
    "stablehlo.add": "sum",
    "stablehlo.multiply": "prod",
    "stablehlo.maximum": "max",
    "stablehlo.minimum": "min",
    "stablehlo.and": "and",
    "stablehlo.or": "or",
}
_SCATTER_KINDS = {
    "stablehlo.add": "add",
    "stablehlo.multiply": "multiply",
    "stablehlo.maximum": "max",
    "stablehlo.minimum": "min",
}


# --------------------------------------------------------------------------- attribute reading


def _ints(op, name: str, default=None) -> tuple[int, ...]:
    """A DenseI64ArrayAttr / dense integer elements attribute as a tuple (``default`` if absent)."""
    if name not in op.attributes:
        if default is None:
            raise StableHLOImportError(f"{op.name}: missing attribute {name}")
        return tuple(default)
    attr = op.attributes[name]
    try:
        return tuple(int(v) for v in attr)
    except TypeError:
        return tuple(int(v) for v in np.asarray(attr).reshape(-1))


def _int(op, name: str, default: int | None = None) -> int:
    if name not in op.attributes:
        if default is None:
            raise StableHLOImportError(f"{op.name}: missing attribute {name}")
        return default
    from jaxlib.mlir import ir

    return int(ir.IntegerAttr(op.attributes[name]).value)


def _bool_attr(op, name: str) -> bool:
    if name not in op.attributes:
        return False
    from jaxlib.mlir import ir

    return bool(ir.BoolAttr(op.attributes[name]).value)


def _pairs(op, name: str, rank: int) -> tuple[tuple[int, int], ...]:
    if name not in op.attributes:
        return ((0, 0),) * rank
    flat = np.asarray(op.attributes[name]).reshape(-1, 2)
    return tuple((int(lo), int(hi)) for lo, hi in flat)


def _enum(op, name: str) -> str:
    """``#stablehlo<comparison_direction LT>`` -> ``"LT"``."""
    match = re.search(r"(\w+)>\s*$", str(op.attributes[name]))
    return match.group(1) if match else str(op.attributes[name])


def _result_type(op, index: int = 0) -> TensorType:
    return tensor_type(op.results[index].type)


def dense_array(attr, t: TensorType) -> np.ndarray:
    """The value of a dense elements attribute as a NumPy array of ``t``."""
    if t.dtype not in (dtypes.bfloat16, dtypes.float16):
        try:
            array = np.array(attr)
            return np.broadcast_to(array.astype(t.dtype), t.shape).copy()
        except (TypeError, ValueError, RuntimeError):
            pass
    text = str(attr)
    hex_match = re.search(r'dense<"0x([0-9A-Fa-f]*)">', text)
    if hex_match:
        raw = np.frombuffer(bytes.fromhex(hex_match.group(1)), dtype=t.dtype.newbyteorder("<"))
        return np.broadcast_to(raw.astype(t.dtype), t.shape).copy()
    # dense<[1.0, 2.5]> / dense<1.0> / dense<0x7FC0>: the numbers between "dense<" and the last ">"
    body = text[text.index("dense<") + len("dense<") : text.rindex(">", 0, text.rindex(":"))]
    words = [w for w in re.split(r"[\s,\[\]]+", body) if w]
    if any(w.startswith("0x") for w in words):
        array = np.array([int(w, 16) for w in words], dtype=f"u{t.dtype.itemsize}").view(t.dtype)
    else:
        array = np.array([float(w) for w in words], dtype=np.float64).astype(t.dtype)
    if array.size not in (1, t.size):
        raise StableHLOImportError(f"cannot read the constant {text[:80]}")
    return np.broadcast_to(
        array.reshape(t.shape) if array.size == t.size else array.reshape(()), t.shape
    ).copy()


# --------------------------------------------------------------------------- region patterns


def _region_block(op, index: int):
    return op.regions[index].blocks[0]


def _combiner(op, index: int = 0) -> str | None:
    """The op a two-argument combiner region applies to its arguments (``"stablehlo.add"``), or
    ``"set"`` when it returns its second argument; None for anything else."""
    block = _region_block(op, index)
    body = [o.operation for o in block.operations]
    args = list(block.arguments)
    if len(args) != 2:
        return None
    if len(body) == 1 and body[0].name == "stablehlo.return" and list(body[0].operands) == [args[1]]:
        return "set"
    if len(body) != 2 or body[1].name != "stablehlo.return":
        return None
    inner, ret = body
    if (
        list(ret.operands) != [inner.results[0]]
        or set(inner.operands) != set(args)
        or len(inner.operands) != 2
    ):
        return None
    return inner.name


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


# --------------------------------------------------------------------------- handlers


def _same(name):
    return lambda imp, op, xs, env: imp.add(name, *xs)


def _constant(imp, op, xs, env):
    t = _result_type(op)
    return [imp.constant(dense_array(op.attributes["value"], t))]


def _compare(imp, op, xs, env):
    if "compare_type" in op.attributes and _enum(op, "compare_type") == "TOTALORDER":
        raise StableHLOImportError("compare with TOTALORDER is not supported (NaN ordering differs)")
    return imp.add("compare", *xs, direction=_enum(op, "comparison_direction"))


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


def _dot_general(imp, op, xs, env):
    from jaxlib.mlir.dialects import stablehlo

    dims = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    out = _result_type(op).dtype
    return imp.add(
        "dot_general",
        *xs,
        lhs_batch=tuple(dims.lhs_batching_dimensions),
        rhs_batch=tuple(dims.rhs_batching_dimensions),
        lhs_contracting=tuple(dims.lhs_contracting_dimensions),
        rhs_contracting=tuple(dims.rhs_contracting_dimensions),
        preferred_dtype=None if out == xs[0].dtype else out,
    )


def _dot(imp, op, xs, env):
    lhs, rhs = xs
    out = _result_type(op).dtype
    return imp.add(
        "dot_general",
        lhs,
        rhs,
        lhs_batch=(),
        rhs_batch=(),
        lhs_contracting=(lhs.type.ndim - 1,),
        rhs_contracting=(0,),
        preferred_dtype=None if out == lhs.dtype else out,
    )


def _convolution(imp, op, xs, env):
    from jaxlib.mlir.dialects import stablehlo

    if "window_reversal" in op.attributes and any(bool(v) for v in op.attributes["window_reversal"]):
        raise StableHLOImportError("convolution with window_reversal is not supported")
    d = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    spatial = len(d.input_spatial_dimensions)
    ones = (1,) * spatial
    return imp.add(
        "convolution",
        *xs,
        window_strides=_ints(op, "window_strides", ones),
        padding=_pairs(op, "padding", spatial),
        lhs_dilation=_ints(op, "lhs_dilation", ones),
        rhs_dilation=_ints(op, "rhs_dilation", ones),
        lhs_spec=(d.input_batch_dimension, d.input_feature_dimension, *d.input_spatial_dimensions),
        rhs_spec=(
            d.kernel_output_feature_dimension,
            d.kernel_input_feature_dimension,
            *d.kernel_spatial_dimensions,
        ),
        out_spec=(d.output_batch_dimension, d.output_feature_dimension, *d.output_spatial_dimensions),
        feature_group_count=_int(op, "feature_group_count", 1),
        batch_group_count=_int(op, "batch_group_count", 1),
    )


def _explicit_index_vector(imp, indices, index_vector_dim: int, batching: tuple[int, ...]):
    """``indices`` with its index vector as the last axis (added when implicit); returns the new
    indices and the positions of ``batching`` indices axes after the move."""
    if index_vector_dim == indices.type.ndim:
        indices = imp.add1("reshape", indices, shape=(*indices.type.shape, 1))
    elif index_vector_dim != indices.type.ndim - 1:
        perm = [d for d in range(indices.type.ndim) if d != index_vector_dim] + [index_vector_dim]
        indices = imp.add1("transpose", indices, permutation=tuple(perm))
    moved = tuple(b - (1 if b > index_vector_dim else 0) for b in batching)
    return indices, moved


def _add_batch_components(imp, indices, batch_axes: tuple[int, ...]):
    """Append, for each indices batch axis, an index component equal to the position along it."""
    shape = indices.type.shape
    parts = [indices]
    for axis in batch_axes:
        parts.append(imp.add1("iota", dtype=indices.dtype, shape=(*shape[:-1], 1), dimension=axis))
    return imp.add1("concatenate", *parts, dimension=len(shape) - 1) if len(parts) > 1 else indices


def _gather(imp, op, xs, env):
    from jaxlib.mlir.dialects import stablehlo

    operand, indices = xs
    d = stablehlo.GatherDimensionNumbers(op.attributes["dimension_numbers"])
    collapsed, start_map, ivd = list(d.collapsed_slice_dims), list(d.start_index_map), d.index_vector_dim
    if d.operand_batching_dims:
        # a batched gather is a plain one whose index vectors also name the batch position
        indices, moved = _explicit_index_vector(imp, indices, ivd, tuple(d.start_indices_batching_dims))
        indices = _add_batch_components(imp, indices, moved)
        collapsed = sorted(collapsed + list(d.operand_batching_dims))
        start_map = start_map + list(d.operand_batching_dims)
        ivd = indices.type.ndim - 1
    return imp.add(
        "gather",
        operand,
        indices,
        offset_dims=tuple(d.offset_dims),
        collapsed_slice_dims=tuple(collapsed),
        start_index_map=tuple(start_map),
        index_vector_dim=ivd,
        slice_sizes=_ints(op, "slice_sizes"),
        indices_are_sorted=_bool_attr(op, "indices_are_sorted"),
    )


def _scatter(imp, op, xs, env):
    from jaxlib.mlir.dialects import stablehlo

    if len(xs) != 3:
        raise StableHLOImportError("scatter of several operands at once is not supported")
    operand, indices, updates = xs
    combiner = _combiner(op)
    kind = "set" if combiner == "set" else _SCATTER_KINDS.get(combiner)
    if kind is None:
        raise StableHLOImportError("scatter whose update computation is not set/add/multiply/min/max")
    d = stablehlo.ScatterDimensionNumbers(op.attributes["scatter_dimension_numbers"])
    inserted, to_operand, ivd = (
        list(d.inserted_window_dims),
        list(d.scattered_dims_to_operand_dims),
        d.index_vector_dim,
    )
    if d.input_batching_dims:
        indices, moved = _explicit_index_vector(imp, indices, ivd, tuple(d.scatter_indices_batching_dims))
        indices = _add_batch_components(imp, indices, moved)
        inserted = sorted(inserted + list(d.input_batching_dims))
        to_operand = to_operand + list(d.input_batching_dims)
        ivd = indices.type.ndim - 1
    dims = dict(
        update_window_dims=tuple(d.update_window_dims),
        inserted_window_dims=tuple(inserted),
        scatter_dims_to_operand_dims=tuple(to_operand),
        index_vector_dim=ivd,
        indices_are_sorted=_bool_attr(op, "indices_are_sorted"),
        unique_indices=_bool_attr(op, "unique_indices"),
    )
    if kind == "add":
        return imp.add("scatter_add", operand, indices, updates, **dims)
    return imp.add("scatter", operand, indices, updates, kind=kind, **dims)


def _reduce(imp, op, xs, env):
    half = len(xs) // 2
    operands, inits = xs[:half], xs[half:]
    dims = _ints(op, "dimensions")
    if half == 2:
        return _argminmax(imp, op, operands, inits, dims)
    if half != 1:
        raise StableHLOImportError(f"reduce of {half} operands at once is not supported")
    kind = _REDUCE_KINDS.get(_combiner(op))
    if kind is None:
        raise StableHLOImportError("reduce whose region is not one of add/multiply/maximum/minimum/and/or")
    reduced = imp.add1("reduce", operands[0], kind=kind, dimensions=dims)
    return [_combine_init(imp, reduced, inits[0], kind)]


def _argminmax(imp, op, operands, inits, dims):
    """JAX's argmax/argmin: reduce (values, iota along the axis) with a compare-and-select region."""
    values, index = operands
    region_ops = [o.operation for o in _region_block(op, 0).operations]
    directions = [_enum(o, "comparison_direction") for o in region_ops if o.name == "stablehlo.compare"]
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


def _reduce_window(imp, op, xs, env):
    if len(xs) != 2:
        raise StableHLOImportError("reduce_window of several operands at once is not supported")
    kind = _REDUCE_KINDS.get(_combiner(op))
    if kind not in ("sum", "max", "min"):
        raise StableHLOImportError("reduce_window whose region is not add/maximum/minimum")
    rank = xs[0].type.ndim
    ones = (1,) * rank
    return imp.add(
        "reduce_window",
        *xs,
        kind=kind,
        window_dimensions=_ints(op, "window_dimensions"),
        window_strides=_ints(op, "window_strides", ones),
        base_dilations=_ints(op, "base_dilations", ones),
        window_dilations=_ints(op, "window_dilations", ones),
        padding=_pairs(op, "padding", rank),
    )


def _select_and_scatter(imp, op, xs, env):
    select = [o.operation for o in _region_block(op, 0).operations]
    if (
        len(select) != 2
        or select[0].name != "stablehlo.compare"
        or _enum(select[0], "comparison_direction") != "GE"
        or _combiner(op, 1) != "stablehlo.add"
    ):
        raise StableHLOImportError(
            "select_and_scatter is supported with a GE select and an add scatter (max pooling's gradient)"
        )
    rank = xs[0].type.ndim
    return imp.add(
        "select_and_scatter_add",
        *xs,
        window_dimensions=_ints(op, "window_dimensions"),
        window_strides=_ints(op, "window_strides", (1,) * rank),
        padding=_pairs(op, "padding", rank),
    )


def _free_values(op) -> list:
    """MLIR values used inside ``op``'s regions but defined outside them, in first-use order."""
    defined, free = set(), {}

    def walk(operation):
        for region in operation.regions:
            for block in region.blocks:
                defined.update(block.arguments)
                for inner in block.operations:
                    inner = inner.operation
                    for v in inner.operands:
                        if v not in defined:
                            free.setdefault(v, None)
                    walk(inner)
                    defined.update(inner.results)

    walk(op)
    return [v for v in free if v not in defined]


def _while(imp, op, xs, env):
    # Values captured from outside become extra loop-carried values that the body passes on.
    captured = _free_values(op)
    extra = [imp.lookup(env, v, op) for v in captured]
    carried = list(xs) + extra
    types = [v.type for v in carried]
    cond = _with_captures(imp, op, 0, types, len(xs), captured, "cond")
    body = _with_captures(imp, op, 1, types, len(xs), captured, "body")
    outs = imp.add("while", *carried, regions=(cond, body))
    return list(outs[: len(xs)])


def _with_captures(imp, op, index, types, n, captured, name):
    """A region graph whose first ``n`` arguments are the block's and the rest the captures."""
    from kaun_ir.ir.builder import Builder

    block = _region_block(op, index)
    saved = imp.builder
    builder = Builder(record_source=False)
    imp.builder = builder
    try:
        args = [builder.add_input(t) for t in types]
        outer = dict(zip(captured, args[n:]))
        outputs = imp.block(block, args[:n], outer)
    finally:
        imp.builder = saved
    if index == 1:
        outputs = list(outputs) + args[n:]
    return builder.finish(outputs, name=name)


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
