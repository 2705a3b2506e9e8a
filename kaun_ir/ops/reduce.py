"""Reduction primitives: ``reduce`` (sum/max/min/prod/and/or over axes) and ``argmax``/``argmin``.

Both lower to ``stablehlo.reduce`` with a scalar region. The init value is never an operand:
it is implied by the kind and the dtype (0 for sum, -inf / the dtype's minimum for max, ...), so
a reduction over a size-0 axis yields exactly that identity.
"""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample, per_input_element
from kaun_ir.ops.batching import unary_leading
from kaun_ir.ops.emit import dense_literal, i64_array
from kaun_ir.ops.rules import apply, astype, compare, full_like, where

# kind -> (StableHLO op of the region, dtype kinds it accepts: f float, i/u integers, b bool)
_KINDS = {
    "sum": ("stablehlo.add", "fiu"),
    "prod": ("stablehlo.multiply", "fiu"),
    "max": ("stablehlo.maximum", "fiub"),
    "min": ("stablehlo.minimum", "fiub"),
    "and": ("stablehlo.and", "iub"),
    "or": ("stablehlo.or", "iub"),
}


def _kind_of(dt: np.dtype) -> str:
    if dtypes.is_float(dt):
        return "f"
    if dtypes.is_bool(dt):
        return "b"
    return "u" if dtypes.is_unsigned(dt) else "i"


def _lowest(dt: np.dtype):
    """The smallest value of ``dt``: -inf for floats, the minimum for integers, False for bool."""
    if dtypes.is_float(dt):
        return -np.inf
    if dtypes.is_bool(dt):
        return False
    return np.iinfo(dt).min


def _highest(dt: np.dtype):
    if dtypes.is_float(dt):
        return np.inf
    if dtypes.is_bool(dt):
        return True
    return np.iinfo(dt).max


def init_value(kind: str, dtype) -> np.ndarray:
    """The identity of reduction ``kind`` as a 0-d array of ``dtype``."""
    dt = np.dtype(dtype)
    if kind == "sum" or kind == "or":
        value = 0
    elif kind == "prod":
        value = 1
    elif kind == "max":
        value = _lowest(dt)
    elif kind == "min":
        value = _highest(dt)
    elif kind == "and":  # all bits set
        value = True if dtypes.is_bool(dt) else (np.iinfo(dt).max if dtypes.is_unsigned(dt) else -1)
    else:
        raise ValueError(f"unknown reduction kind {kind!r}")
    return np.asarray(value, dtype=dt)


def _check_axes(x: TensorType, dims, what: str = "dimensions") -> tuple[int, ...]:
    dims = tuple(dims)
    if len(set(dims)) != len(dims) or any(not 0 <= d < x.ndim for d in dims):
        raise ShapeError(f"{what} {list(dims)} must be distinct axes of a rank-{x.ndim} operand")
    return dims


# reduce -------------------------------------------------------------------------------------


def _reduce_infer(x: TensorType, kind, dimensions) -> TensorType:
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {', '.join(_KINDS)}, got {kind!r}")
    if _kind_of(x.dtype) not in _KINDS[kind][1]:
        raise TypeError(f"reduce kind {kind!r} does not take {dtypes.short_name(x.dtype)} operands")
    dims = _check_axes(x, dimensions)
    return TensorType(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in dims))


_UFUNCS = {
    "sum": np.add,
    "prod": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
    "and": np.bitwise_and,
    "or": np.bitwise_or,
}


def _reduce_reference(x, kind, dimensions):
    dims = tuple(dimensions)
    init = init_value(kind, x.dtype)
    if dtypes.is_float(x.dtype) and kind in ("sum", "prod"):
        # accumulate in float64 so the reference is more exact than what it checks
        wide = _UFUNCS[kind].reduce(x.astype(np.float64), axis=dims, initial=float(init))
        return np.asarray(wide).astype(x.dtype)
    if dtypes.is_bool(x.dtype):
        ufunc = {"max": np.logical_or, "or": np.logical_or, "min": np.logical_and, "and": np.logical_and}[
            kind
        ]
        return np.asarray(ufunc.reduce(x, axis=dims, initial=bool(init)), dtype=x.dtype)
    with np.errstate(over="ignore"):  # integer sums and products wrap around like XLA's
        out = _UFUNCS[kind].reduce(x, axis=dims, initial=init[()], dtype=x.dtype)
    return np.asarray(out, dtype=x.dtype)


def _reduce_emit(em, node, x):
    kind = node.attr("kind")
    in_type = node.inputs[0].type
    scalar = TensorType(in_type.dtype, ())
    init = em.op(
        "stablehlo.constant", [], [], [scalar], {"value": dense_literal(init_value(kind, in_type.dtype))}
    )[0]
    combine = _KINDS[kind][0]
    region = em.region(
        [scalar, scalar], lambda inner, args: inner.op(combine, args, [scalar, scalar], [scalar])
    )
    return em.op(
        "stablehlo.reduce",
        [x, init],
        [in_type, scalar],
        node.types,
        {"dimensions": i64_array(sorted(node.attr("dimensions")))},
        [region],
    )


def _spread(ct, x, dimensions):
    """Broadcast a cotangent of the reduced shape back over the reduced axes of ``x``."""
    kept = tuple(i for i in range(len(x.shape)) if i not in set(dimensions))
    return apply("broadcast_in_dim", ct, shape=tuple(x.shape), broadcast_dimensions=kept)


def _reduce_vjp(ct, y, x, *, kind, dimensions):
    """VJP rules, written with other ops so they can be differentiated again.

    sum: the cotangent spread over the reduced axes. max/min: it goes to the elements equal to
    the result, split evenly between ties (as jax; NaN where the result is NaN). prod: the
    product of the other elements, computed without dividing by zero: with no zero it is
    y / x; with exactly one zero only that element gets the product of the rest; with two or
    more zeros everything is 0.
    """
    if kind in ("and", "or") or not dtypes.is_float(x.dtype):
        return (None,)
    if kind == "sum":
        return (_spread(ct, x, dimensions),)
    if kind in ("max", "min"):
        hit = compare("EQ", x, _spread(y, x, dimensions))
        counts = apply("reduce", astype(hit, x.dtype), kind="sum", dimensions=dimensions)
        # where the result is NaN no element equals it (counts == 0): the cotangent is NaN, as in jax
        nan, zero = np.asarray(np.nan, x.dtype), np.asarray(0, x.dtype)
        missed = _spread(where(compare("EQ", counts, 0.0), nan, zero), x, dimensions)
        return (where(hit, _spread(ct / counts, x, dimensions), missed),)
    # prod
    zero = compare("EQ", x, 0.0)
    zeros = apply("reduce", astype(zero, x.dtype), kind="sum", dimensions=dimensions)
    others = apply("reduce", where(zero, full_like(x, 1), x), kind="prod", dimensions=dimensions)
    safe = where(zero, full_like(x, 1), x)
    none_zero = _spread(ct * others, x, dimensions) / safe
    one_zero = _spread(where(compare("EQ", zeros, 1.0), ct * others, full_like(ct, 0)), x, dimensions)
    spread_zeros = _spread(zeros, x, dimensions)
    grad = where(compare("EQ", spread_zeros, 0.0), none_zero, where(zero, one_zero, full_like(one_zero, 0)))
    return (grad,)


def _reduce_samples(rng):
    def floats(shape, dt=np.float32):
        return rng.uniform(-2, 2, size=shape).astype(dt)

    for kind in ("sum", "prod", "max", "min"):
        yield Sample((floats((3, 4)),), {"kind": kind, "dimensions": (0,)})
        yield Sample((floats((2, 3, 4)),), {"kind": kind, "dimensions": (0, 2)})
        yield Sample((floats((2, 3, 4)),), {"kind": kind, "dimensions": (2, 0, 1)})
        yield Sample((floats((5,), np.float64),), {"kind": kind, "dimensions": (0,)})
        yield Sample((floats((0, 3)),), {"kind": kind, "dimensions": (0,)})  # result: the init value
        yield Sample((floats((2, 0)),), {"kind": kind, "dimensions": (0,)})  # empty result
        yield Sample((floats((2, 3)),), {"kind": kind, "dimensions": ()})
        yield Sample((rng.integers(-5, 6, size=(4, 3)).astype(np.int32),), {"kind": kind, "dimensions": (1,)})
        yield Sample((np.zeros((0,), np.int32),), {"kind": kind, "dimensions": (0,)})
    yield Sample((rng.integers(0, 9, size=(3, 5)).astype(np.uint32),), {"kind": "max", "dimensions": (1,)})
    yield Sample(
        (floats((4, 6), dtypes.bfloat16),), {"kind": "sum", "dimensions": (1,)}, rtol=5e-2, atol=5e-2
    )
    nan = floats((3, 4))
    nan[1, 2] = np.nan
    yield Sample((nan,), {"kind": "max", "dimensions": (1,)})  # NaN propagates
    yield Sample((nan,), {"kind": "min", "dimensions": (0,)})
    for kind in ("and", "or", "max", "min"):
        yield Sample((rng.random((3, 4)) < 0.5,), {"kind": kind, "dimensions": (1,)})
        yield Sample((np.ones((2, 3), bool),), {"kind": kind, "dimensions": (0, 1)})
        yield Sample((np.zeros((0, 2), bool),), {"kind": kind, "dimensions": (0,)})
    for kind in ("and", "or"):
        ints = rng.integers(-50, 50, size=(3, 4)).astype(np.int32)
        yield Sample((ints,), {"kind": kind, "dimensions": (0,)})


# argmax / argmin ----------------------------------------------------------------------------


def _arg_infer(x: TensorType, axis, index_dtype) -> TensorType:
    if not isinstance(axis, int) or not 0 <= axis < x.ndim:
        raise ShapeError(f"axis {axis} is out of range for a rank-{x.ndim} operand")
    idx = dtypes.canonical(index_dtype)
    if not dtypes.is_integer(idx):
        raise TypeError(f"index_dtype must be an integer dtype, got {dtypes.short_name(idx)}")
    return TensorType(idx, tuple(d for i, d in enumerate(x.shape) if i != axis))


def _arg_reference(x, axis, index_dtype, largest: bool):
    out_shape = tuple(d for i, d in enumerate(x.shape) if i != axis)
    if x.shape[axis] == 0:  # nothing to pick: the init index
        return np.zeros(out_shape, index_dtype)
    # float64 keeps order, infinities and NaN; np.argmax/argmin pick the first NaN, then the
    # first of equal values
    values = x.astype(np.float64) if dtypes.is_float(x.dtype) else x
    pick = np.argmax if largest else np.argmin
    return np.asarray(pick(values, axis=axis)).astype(index_dtype)


def _arg_emit(largest: bool):
    """Variadic reduce over (values, iota): keeps the best value and its smallest index.

    The comparator is the lexicographic maximum of (is NaN, value, -index) (for argmin: NaN first,
    then the smaller value), which is associative and commutative, so XLA may combine in any order
    and still return the first NaN / the first of tied values, as NumPy does.
    """

    def emit(em, node, x):
        in_type = node.inputs[0].type
        axis = node.attr("axis")
        idx_dt = node.types[0].dtype
        val_t, idx_t = TensorType(in_type.dtype, ()), TensorType(idx_dt, ())
        pred_t = TensorType(dtypes.bool_, ())
        iota = em.op(
            "stablehlo.iota", [], [], [TensorType(idx_dt, in_type.shape)], {"iota_dimension": f"{axis} : i64"}
        )[0]
        init = _lowest(in_type.dtype) if largest else _highest(in_type.dtype)
        init_v = em.op(
            "stablehlo.constant", [], [], [val_t], {"value": dense_literal(np.asarray(init, in_type.dtype))}
        )[0]
        init_i = em.op(
            "stablehlo.constant", [], [], [idx_t], {"value": dense_literal(np.asarray(0, idx_dt))}
        )[0]

        def body(inner, args):
            a, a_idx, b, b_idx = args

            def logic(op, *xs):
                return inner.op(op, list(xs), [pred_t] * len(xs), [pred_t])[0]

            better = inner.compare(a, b, val_t, "GT" if largest else "LT")
            same = inner.compare(a, b, val_t, "EQ")
            if dtypes.is_float(in_type.dtype):
                a_nan = inner.compare(a, a, val_t, "NE")
                b_nan = inner.compare(b, b, val_t, "NE")
                # a NaN beats any number; comparisons with NaN are false, so this is exclusive
                only_a_nan = logic("stablehlo.and", a_nan, logic("stablehlo.not", b_nan))
                better = logic("stablehlo.or", better, only_a_nan)
                same = logic("stablehlo.or", same, logic("stablehlo.and", a_nan, b_nan))
            first = inner.compare(a_idx, b_idx, idx_t, "LT")
            take_a = logic("stablehlo.or", better, logic("stablehlo.and", same, first))
            value = inner.op("stablehlo.select", [take_a, a, b], [pred_t, val_t, val_t], [val_t])[0]
            index = inner.op("stablehlo.select", [take_a, a_idx, b_idx], [pred_t, idx_t, idx_t], [idx_t])[0]
            return [value, index]

        region = em.region([val_t, idx_t, val_t, idx_t], body, result_types=[val_t, idx_t])
        out_shape = node.types[0].shape
        results = em.op(
            "stablehlo.reduce",
            [x, iota, init_v, init_i],
            [in_type, TensorType(idx_dt, in_type.shape), val_t, idx_t],
            [TensorType(in_type.dtype, out_shape), node.types[0]],
            {"dimensions": i64_array([axis])},
            [region],
        )
        return [results[1]]

    return emit


def _arg_samples(largest: bool):
    def samples(rng):
        x = rng.standard_normal((4, 5)).astype(np.float32)
        yield Sample((x,), {"axis": 0})
        yield Sample((x,), {"axis": 1})
        yield Sample((x.astype(np.float64),), {"axis": 1, "index_dtype": np.dtype(np.int64)})
        ties = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [-1, -5, -5, 7]], np.float32)
        yield Sample((ties,), {"axis": 1})
        yield Sample((ties.T.copy(),), {"axis": 0})
        nan = np.array(
            [[1, np.nan, 3, np.nan], [np.inf, 2, -np.inf, 0], [-np.inf] * 4, [np.nan] * 4], np.float32
        )
        yield Sample((nan,), {"axis": 1})  # the first NaN wins, like NumPy
        yield Sample((rng.integers(-3, 4, size=(3, 6)).astype(np.int32),), {"axis": 1})
        yield Sample(
            (np.full((2, 5), np.iinfo(np.int32).min if largest else np.iinfo(np.int32).max, np.int32),),
            {"axis": 1},
        )  # every value equals the init value
        yield Sample(
            (rng.integers(0, 3, size=(5, 2)).astype(np.uint32),),
            {"axis": 0, "index_dtype": np.dtype(np.uint32)},
        )
        yield Sample((rng.random((3, 4)) < 0.5,), {"axis": 1})
        yield Sample((rng.standard_normal((2, 3, 4)).astype(np.float32),), {"axis": 1})
        yield Sample((rng.standard_normal((3,)).astype(np.float32),), {"axis": 0})
        yield Sample((np.zeros((0, 3), np.float32),), {"axis": 1})
        yield Sample((np.zeros((3, 0), np.float32),), {"axis": 1})  # empty axis: index 0

    return samples


def _argop(name: str, largest: bool) -> OpDef:
    return OpDef(
        name=name,
        traits=(),
        stablehlo=None,  # a two-operand stablehlo.reduce over an iota
        flops=per_input_element,
        arity=1,
        attrs=("axis",),
        batch=unary_leading(name, ("axis",)),
        optional={"index_dtype": dtypes.int32},
        infer=_arg_infer,
        reference=lambda x, axis, index_dtype: _arg_reference(x, axis, index_dtype, largest),
        emit=_arg_emit(largest),
        samples=_arg_samples(largest),
        doc=(
            f"Index of the {'largest' if largest else 'smallest'} element along ``axis`` "
            f"(x: [..., n, ...] -> index_dtype[..., ...]); ties give the first index and NaN counts "
            f"as the {'largest' if largest else 'smallest'} value (the first NaN wins), like NumPy. "
            f"An empty axis gives 0."
        ),
        nondiff="an index has no derivative",
    )


OPS: list[OpDef] = [
    OpDef(
        name="reduce",
        traits=(),
        flops=per_input_element,
        arity=1,
        batch=unary_leading("reduce", ("dimensions",)),
        attrs=("kind", "dimensions"),
        infer=_reduce_infer,
        reference=_reduce_reference,
        emit=_reduce_emit,
        samples=_reduce_samples,
        vjp=_reduce_vjp,
        doc=(
            "Reduce ``x`` over the axes ``dimensions`` (removed from the shape) with ``kind`` in "
            "sum/prod/max/min/and/or. The init value is the kind's identity for the dtype "
            "(0, 1, -inf or the minimum, +inf or the maximum, all bits set, 0), which is the "
            "result over a size-0 axis. max/min propagate NaN; and/or are bitwise on integers."
        ),
    ),
    _argop("argmax", largest=True),
    _argop("argmin", largest=False),
]
