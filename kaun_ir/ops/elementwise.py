"""Elementwise primitives: unary math, binary arithmetic/logic, compare, select, clamp, convert."""

from __future__ import annotations

import math

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample, per_output_element
from kaun_ir.ops.batching import elementwise
from kaun_ir.ops.rules import apply, astype, binary, compare, full_like, sum_all, where

_F = (dtypes.float32, dtypes.float64)
_SHAPES = ((), (5,), (2, 3), (0, 4), (1, 3, 1))


def _same_shape(*types: TensorType) -> None:
    shapes = {t.shape for t in types}
    if len(shapes) != 1:
        raise ShapeError("operands must have the same shape (broadcast explicitly first)")


def _same_dtype(*types: TensorType) -> None:
    if len({t.dtype for t in types}) != 1:
        raise TypeError("operands must have the same dtype (convert explicitly first)")


def _require(t: TensorType, kinds: str, op: str) -> None:
    ok = (
        ("f" in kinds and dtypes.is_float(t.dtype))
        or ("i" in kinds and dtypes.is_integer(t.dtype) and not dtypes.is_unsigned(t.dtype))
        or ("u" in kinds and dtypes.is_unsigned(t.dtype))
        or ("b" in kinds and dtypes.is_bool(t.dtype))
    )
    if not ok:
        names = {"f": "floating", "i": "signed integer", "u": "unsigned integer", "b": "bool"}
        allowed = " or ".join(names[k] for k in kinds)
        raise TypeError(f"{op} needs {allowed} operands, got {dtypes.short_name(t.dtype)}")


def _rand(rng: np.random.Generator, shape, dtype, low=-3.0, high=3.0) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt == dtypes.bool_:
        return rng.random(shape) < 0.5
    if dt in dtypes.INTEGERS:
        lo = max(int(low), 0) if dtypes.is_unsigned(dt) else int(low)
        return rng.integers(lo, int(high) + 1, size=shape).astype(dt)
    return rng.uniform(low, high, size=shape).astype(dt)


def _erf(x: np.ndarray) -> np.ndarray:
    return (
        np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64)) if x.size else x.astype(np.float64)
    )


# VJP rules: ``vjp(ct, out, *inputs, **attrs) -> one cotangent (or None) per input``, written
# with other ops (through ``rules``) so they can be differentiated again. None means zero.


def _zero_vjp(ct, y, x):
    """Piecewise constant: the derivative is zero wherever it exists."""
    return (None,)


def _max_vjp(direction: str):
    def vjp(ct, y, a, b):
        # ties split the cotangent evenly, like jax
        win_a = where(compare(direction, a, b), ct, 0.0)
        tie = where(compare("EQ", a, b), ct * 0.5, 0.0)
        return win_a + tie, ct - win_a - tie

    return vjp


def _power_vjp(ct, y, a, b):
    da = ct * b * binary("power", a, b - 1.0)
    safe = where(compare("EQ", a, 0.0), full_like(a, 1), a)
    db = ct * y * apply("log", safe)
    return da, db


def _remainder_vjp(ct, y, a, b):
    quotient = a / b
    return ct, -ct * apply("sign", quotient) * apply("floor", apply("abs", quotient))


def _atan2_vjp(ct, y, a, b):
    denom = a * a + b * b
    return ct * b / denom, -ct * a / denom


def _sum_to_shape(x, shape):
    """Sum a cotangent down to the (scalar) shape of a broadcast operand."""
    if x.shape == tuple(shape):
        return x
    total = sum_all(x)
    return total if total.shape == tuple(shape) else apply("reshape", total, shape=tuple(shape))


def _select_vjp(ct, y, pred, on_true, on_false):
    zero = full_like(ct, 0)
    return None, where(pred, ct, zero), where(pred, zero, ct)


def _clamp_vjp(ct, y, lo, x, hi):
    zero = full_like(ct, 0)
    inside = binary("and", compare("GT", x, lo), compare("LT", x, hi))
    below = binary("and", compare("GT", lo, x), compare("LT", lo, hi))
    above = compare("LT", hi, x)
    return (
        _sum_to_shape(where(below, ct, zero), lo.shape),
        where(inside, ct, zero),
        _sum_to_shape(where(above, ct, zero), hi.shape),
    )


def _convert_vjp(ct, y, x, dtype):
    return (astype(ct, x.dtype) if dtypes.is_float(x.dtype) else None,)


_BITWISE = "a bitwise / logical op on integers or bools"

#: the traits of every op of this family (``commutative`` is added where it holds)
_ELEMENTWISE = frozenset({"elementwise", "cheap"})


def _in_float64(fn):
    """NumPy reference evaluated in float64, cast back to the operand dtype."""
    return lambda x: np.asarray(fn(np.asarray(x, np.float64))).astype(x.dtype)


def _unary(name: str, mlir: str, ref, kinds: str, domain, vjp=None, nondiff=None) -> OpDef:
    """An elementwise one-operand op: StableHLO op ``mlir``, NumPy reference ``ref``, operand
    dtype ``kinds`` (f: float, i: signed, u: unsigned, b: bool), samples drawn from ``domain``."""

    def infer(x: TensorType) -> TensorType:
        _require(x, kinds, name)
        return x

    def samples(rng):
        kinds_dtypes = [d for d in (_F if "f" in kinds else ())]
        if "i" in kinds:
            kinds_dtypes.append(dtypes.int32)
        if "u" in kinds:
            kinds_dtypes.append(dtypes.uint32)
        if "b" in kinds:
            kinds_dtypes.append(dtypes.bool_)
        for dt in kinds_dtypes:
            for shape in _SHAPES:
                yield Sample((_rand(rng, shape, dt, *domain),))
        if "f" in kinds:  # low precision: looser tolerance
            yield Sample((_rand(rng, (4, 3), dtypes.bfloat16, *domain),), rtol=2e-2, atol=2e-2)

    return OpDef(
        name=name,
        arity=1,
        infer=infer,
        reference=lambda x: ref(x),
        emit=lambda em, node, x: em.simple(mlir, node, x),
        samples=samples,
        doc=f"Elementwise {name} ({mlir}).",
        vjp=vjp,
        nondiff=nondiff,
        batch=elementwise(name),
        traits=_ELEMENTWISE,
        stablehlo=mlir,
        flops=per_output_element,
    )


_UNARY_OPS = [
    _unary("negate", "stablehlo.negate", np.negative, "fiu", (-3, 3), vjp=lambda ct, y, x: (-ct,)),
    _unary("abs", "stablehlo.abs", np.abs, "fi", (-3, 3), vjp=lambda ct, y, x: (ct * apply("sign", x),)),
    _unary("sign", "stablehlo.sign", np.sign, "fi", (-3, 3), vjp=_zero_vjp),
    _unary(
        "exponential",
        "stablehlo.exponential",
        _in_float64(np.exp),
        "f",
        (-3, 3),
        vjp=lambda ct, y, x: (ct * y,),
    ),
    _unary(
        "exponential_minus_one",
        "stablehlo.exponential_minus_one",
        _in_float64(np.expm1),
        "f",
        (-3, 3),
        vjp=lambda ct, y, x: (ct * (y + 1.0),),
    ),
    _unary("log", "stablehlo.log", _in_float64(np.log), "f", (0.1, 5), vjp=lambda ct, y, x: (ct / x,)),
    _unary(
        "log_plus_one",
        "stablehlo.log_plus_one",
        _in_float64(np.log1p),
        "f",
        (-0.9, 5),
        vjp=lambda ct, y, x: (ct / (x + 1.0),),
    ),
    _unary(
        "sqrt", "stablehlo.sqrt", _in_float64(np.sqrt), "f", (0.0, 5), vjp=lambda ct, y, x: (ct * 0.5 / y,)
    ),
    _unary(
        "rsqrt",
        "stablehlo.rsqrt",
        _in_float64(lambda x: 1.0 / np.sqrt(x)),
        "f",
        (0.1, 5),
        vjp=lambda ct, y, x: (ct * -0.5 * y / x,),
    ),
    _unary(
        "tanh",
        "stablehlo.tanh",
        _in_float64(np.tanh),
        "f",
        (-3, 3),
        vjp=lambda ct, y, x: (ct * (1.0 - y * y),),
    ),
    _unary(
        "logistic",
        "stablehlo.logistic",
        _in_float64(lambda x: 1.0 / (1.0 + np.exp(-x))),
        "f",
        (-5, 5),
        vjp=lambda ct, y, x: (ct * y * (1.0 - y),),
    ),
    _unary(
        "sine",
        "stablehlo.sine",
        _in_float64(np.sin),
        "f",
        (-3, 3),
        vjp=lambda ct, y, x: (ct * apply("cosine", x),),
    ),
    _unary(
        "cosine",
        "stablehlo.cosine",
        _in_float64(np.cos),
        "f",
        (-3, 3),
        vjp=lambda ct, y, x: (-ct * apply("sine", x),),
    ),
    _unary("floor", "stablehlo.floor", np.floor, "f", (-3, 3), vjp=_zero_vjp),
    _unary("ceil", "stablehlo.ceil", np.ceil, "f", (-3, 3), vjp=_zero_vjp),
    _unary("round_nearest_even", "stablehlo.round_nearest_even", np.round, "f", (-3, 3), vjp=_zero_vjp),
    _unary(
        "erf",
        "chlo.erf",
        _in_float64(_erf),
        "f",
        (-2, 2),
        # d/dx erf(x) = 2 / sqrt(pi) * exp(-x^2)
        vjp=lambda ct, y, x: (ct * (2.0 / math.sqrt(math.pi)) * apply("exponential", -(x * x)),),
    ),
    _unary(
        "not",
        "stablehlo.not",
        lambda x: np.logical_not(x) if x.dtype == bool else np.invert(x),
        "iub",
        (-3, 3),
        nondiff=_BITWISE,
    ),
]


def _int_divide(a, b):
    if a.dtype.kind == "f":
        return a / b
    quotient = np.abs(a.astype(np.int64)) // np.abs(b.astype(np.int64))
    return (quotient * np.sign(a) * np.sign(b)).astype(a.dtype)


def _power(a, b):
    if a.dtype.kind == "f":
        return np.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)
    return np.power(a, b)


def _shift_left(a, b):
    bits = 8 * a.dtype.itemsize
    out = np.left_shift(a, np.minimum(b, bits - 1).astype(a.dtype))
    return np.where(b.astype(np.int64) >= bits, np.zeros_like(a), out)


def _shift_right_logical(a, b):
    bits = 8 * a.dtype.itemsize
    unsigned = a.view(f"u{a.dtype.itemsize}")
    out = np.right_shift(unsigned, np.minimum(b, bits - 1).astype(unsigned.dtype)).view(a.dtype)
    return np.where(b.astype(np.int64) >= bits, np.zeros_like(a), out)


def _shift_right_arithmetic(a, b):
    bits = 8 * a.dtype.itemsize
    signed = a.view(f"i{a.dtype.itemsize}")
    out = np.right_shift(signed, np.minimum(b, bits - 1).astype(signed.dtype)).view(a.dtype)
    return out


def _binary(
    name: str, mlir: str, ref, kinds: str, domain, vjp=None, nondiff=None, commutative=False
) -> OpDef:
    """An elementwise two-operand op of one shape and dtype (arguments as for :func:`_unary`;
    ``domain`` is where the second operand's samples come from; ``commutative``: the operands
    may be swapped)."""

    def infer(a: TensorType, b: TensorType) -> TensorType:
        _same_shape(a, b)
        _same_dtype(a, b)
        _require(a, kinds, name)
        return a

    def samples(rng):
        chosen = list(_F) if "f" in kinds else []
        chosen += [dtypes.int32] if "i" in kinds else []
        chosen += [dtypes.uint32] if "u" in kinds else []
        chosen += [dtypes.bool_] if "b" in kinds else []
        for dt in chosen:
            for shape in _SHAPES:
                first = _rand(rng, shape, dt, -3 if name != "power" else 0.1, 3)
                if dt in dtypes.INTEGERS and name in (
                    "shift_left",
                    "shift_right_logical",
                    "shift_right_arithmetic",
                ):
                    first = _rand(rng, shape, dt, -1000, 1000)
                yield Sample((first, _rand(rng, shape, dt, *domain)))

    return OpDef(
        name=name,
        arity=2,
        infer=infer,
        reference=lambda a, b: ref(a, b),
        emit=lambda em, node, a, b: em.simple(mlir, node, a, b),
        samples=samples,
        doc=f"Elementwise {name} of two operands of one shape and dtype ({mlir}).",
        vjp=vjp,
        nondiff=nondiff,
        batch=elementwise(name),
        traits=_ELEMENTWISE | {"commutative"} if commutative else _ELEMENTWISE,
        stablehlo=mlir,
        flops=per_output_element,
    )


_BINARY_OPS = [
    _binary(
        "add", "stablehlo.add", np.add, "fiub", (-3, 3), vjp=lambda ct, y, a, b: (ct, ct), commutative=True
    ),
    _binary("subtract", "stablehlo.subtract", np.subtract, "fiu", (-3, 3), vjp=lambda ct, y, a, b: (ct, -ct)),
    _binary(
        "multiply",
        "stablehlo.multiply",
        np.multiply,
        "fiub",
        (-3, 3),
        vjp=lambda ct, y, a, b: (ct * b, ct * a),
        commutative=True,
    ),
    _binary(
        "divide",
        "stablehlo.divide",
        _int_divide,
        "fiu",
        (1, 4),
        vjp=lambda ct, y, a, b: (ct / b, -ct * y / b),
    ),
    _binary("power", "stablehlo.power", _power, "fiu", (0, 3), vjp=_power_vjp),
    _binary(
        "maximum", "stablehlo.maximum", np.maximum, "fiub", (-3, 3), vjp=_max_vjp("GT"), commutative=True
    ),
    _binary(
        "minimum", "stablehlo.minimum", np.minimum, "fiub", (-3, 3), vjp=_max_vjp("LT"), commutative=True
    ),
    _binary("remainder", "stablehlo.remainder", np.fmod, "fiu", (1, 4), vjp=_remainder_vjp),
    _binary(
        "atan2",
        "stablehlo.atan2",
        lambda a, b: np.arctan2(a.astype(np.float64), b).astype(a.dtype),
        "f",
        (-3, 3),
        vjp=_atan2_vjp,
    ),
    _binary("and", "stablehlo.and", np.bitwise_and, "iub", (-3, 3), nondiff=_BITWISE, commutative=True),
    _binary("or", "stablehlo.or", np.bitwise_or, "iub", (-3, 3), nondiff=_BITWISE, commutative=True),
    _binary("xor", "stablehlo.xor", np.bitwise_xor, "iub", (-3, 3), nondiff=_BITWISE, commutative=True),
    _binary("shift_left", "stablehlo.shift_left", _shift_left, "iu", (0, 40), nondiff=_BITWISE),
    _binary(
        "shift_right_logical",
        "stablehlo.shift_right_logical",
        _shift_right_logical,
        "iu",
        (0, 40),
        nondiff=_BITWISE,
    ),
    _binary(
        "shift_right_arithmetic",
        "stablehlo.shift_right_arithmetic",
        _shift_right_arithmetic,
        "iu",
        (0, 40),
        nondiff=_BITWISE,
    ),
]


_DIRECTIONS = {
    "EQ": np.equal,
    "NE": np.not_equal,
    "LT": np.less,
    "LE": np.less_equal,
    "GT": np.greater,
    "GE": np.greater_equal,
}


def _compare_infer(a: TensorType, b: TensorType, direction: str) -> TensorType:
    _same_shape(a, b)
    _same_dtype(a, b)
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(_DIRECTIONS)}, got {direction!r}")
    return TensorType(dtypes.bool_, a.shape)


def _compare_emit(em, node, a, b):
    dt = node.inputs[0].dtype
    kind = (
        "FLOAT"
        if dtypes.is_float(dt)
        else "UNSIGNED"
        if dtypes.is_unsigned(dt) or dtypes.is_bool(dt)
        else "SIGNED"
    )
    direction = node.attr("direction")
    return em.simple(
        "stablehlo.compare",
        node,
        a,
        b,
        attrs={
            "comparison_direction": f"#stablehlo<comparison_direction {direction}>",
            "compare_type": f"#stablehlo<comparison_type {kind}>",
        },
    )


def _compare_samples(rng):
    for direction in _DIRECTIONS:
        for dt in (dtypes.float32, dtypes.int32, dtypes.uint32, dtypes.bool_):
            a = _rand(rng, (3, 4), dt, -2, 2)
            b = _rand(rng, (3, 4), dt, -2, 2)
            b[0] = a[0]  # some ties
            yield Sample((a, b), {"direction": direction})
    yield Sample((np.zeros((0, 2), np.float32),) * 2, {"direction": "LT"})


def _select_infer(pred: TensorType, on_true: TensorType, on_false: TensorType) -> TensorType:
    if pred.dtype != dtypes.bool_:
        raise TypeError(f"predicate must be bool, got {dtypes.short_name(pred.dtype)}")
    _same_shape(on_true, on_false)
    _same_dtype(on_true, on_false)
    if pred.shape not in ((), on_true.shape):
        raise ShapeError("predicate must be a scalar or have the shape of the branches")
    return on_true


def _select_samples(rng):
    for dt in (dtypes.float32, dtypes.int32):
        for shape in ((), (4,), (2, 3)):
            yield Sample((rng.random(shape) < 0.5, _rand(rng, shape, dt), _rand(rng, shape, dt)))
    yield Sample((np.array(True), _rand(rng, (2, 3), np.float32), _rand(rng, (2, 3), np.float32)))


def _clamp_infer(lo: TensorType, x: TensorType, hi: TensorType) -> TensorType:
    _same_dtype(lo, x, hi)
    for bound in (lo, hi):
        if bound.shape not in ((), x.shape):
            raise ShapeError("bounds must be scalars or have the operand's shape")
    return x


def _clamp_samples(rng):
    for dt in (dtypes.float32, dtypes.int32):
        x = _rand(rng, (3, 4), dt, -5, 5)
        yield Sample((np.array(-1, dt), x, np.array(2, dt)))
        yield Sample((_rand(rng, (3, 4), dt, -3, -1), x, _rand(rng, (3, 4), dt, 1, 3)))


def _convert_infer(x: TensorType, dtype) -> TensorType:
    return TensorType(dtypes.canonical(dtype), x.shape)


def _convert_reference(x, dtype):
    dt = np.dtype(dtype)
    if dt == dtypes.bool_:
        return x != 0
    if dt in dtypes.INTEGERS and x.dtype.kind == "f":
        return np.trunc(x.astype(np.float64)).astype(dt)
    return x.astype(dt)


def _convert_samples(rng):
    pairs = [
        (np.float32, np.float64),
        (np.float64, np.float32),
        (np.float32, np.int32),
        (np.int32, np.float32),
        (np.float32, dtypes.bfloat16),
        (dtypes.bfloat16, np.float32),
        (np.float32, np.float16),
        (np.bool_, np.float32),
        (np.int32, np.bool_),
        (np.float32, np.bool_),
        (np.int32, np.uint32),
        (np.uint32, np.int64),
        (np.int32, np.int32),
    ]
    for src, dst in pairs:
        yield Sample((_rand(rng, (3, 4), src, -20, 20),), {"dtype": np.dtype(dst)}, rtol=1e-2, atol=1e-2)


def _bitcast_infer(x: TensorType, dtype) -> TensorType:
    dt = dtypes.canonical(dtype)
    if dt.itemsize != x.dtype.itemsize or dt == dtypes.bool_ or x.dtype == dtypes.bool_:
        raise TypeError(
            f"bitcast_convert needs dtypes of one bit width, got "
            f"{dtypes.short_name(x.dtype)} -> {dtypes.short_name(dt)}"
        )
    return TensorType(dt, x.shape)


def _is_finite_infer(x: TensorType) -> TensorType:
    _require(x, "f", "is_finite")
    return TensorType(dtypes.bool_, x.shape)


def _is_finite_samples(rng):
    special = np.array([0.0, -1.5, np.inf, -np.inf, np.nan, 3e38], np.float32)
    yield Sample((special,))
    yield Sample((special.astype(np.float64).reshape(2, 3),))
    yield Sample((special.astype(dtypes.bfloat16),))
    yield Sample((_rand(rng, (), np.float32),))
    yield Sample((_rand(rng, (0, 3), np.float64),))


def _bitcast_samples(rng):
    for src, dst in (
        (np.float32, np.uint32),
        (np.uint32, np.float32),
        (np.int32, np.uint32),
        (np.float64, np.int64),
    ):
        yield Sample((_rand(rng, (2, 5), src, -100, 100),), {"dtype": np.dtype(dst)})


OPS: list[OpDef] = (
    _UNARY_OPS
    + _BINARY_OPS
    + [
        OpDef(
            name="compare",
            traits=_ELEMENTWISE,
            flops=per_output_element,
            batch=elementwise("compare"),
            arity=2,
            attrs=("direction",),
            infer=_compare_infer,
            reference=lambda a, b, direction: _DIRECTIONS[direction](a, b),
            emit=_compare_emit,
            samples=_compare_samples,
            doc="Elementwise comparison with direction EQ/NE/LT/LE/GT/GE; result is bool.",
            nondiff="its result is boolean",
        ),
        OpDef(
            name="is_finite",
            traits=_ELEMENTWISE,
            flops=per_output_element,
            batch=elementwise("is_finite"),
            arity=1,
            infer=_is_finite_infer,
            reference=np.isfinite,
            emit=lambda em, node, x: em.simple("stablehlo.is_finite", node, x),
            samples=_is_finite_samples,
            doc="is_finite(x): elementwise, true where a floating-point x is neither infinite nor NaN.",
            nondiff="its result is boolean",
        ),
        OpDef(
            name="select",
            traits=_ELEMENTWISE,
            flops=per_output_element,
            batch=elementwise("select"),
            arity=3,
            infer=_select_infer,
            reference=lambda p, t, f: np.where(p, t, f),
            emit=lambda em, node, p, t, f: em.simple("stablehlo.select", node, p, t, f),
            samples=_select_samples,
            vjp=_select_vjp,
            doc="select(pred, on_true, on_false): elementwise choice; pred may be a scalar.",
        ),
        OpDef(
            name="clamp",
            traits=_ELEMENTWISE,
            flops=per_output_element,
            batch=elementwise("clamp"),
            arity=3,
            infer=_clamp_infer,
            reference=lambda lo, x, hi: np.minimum(np.maximum(x, lo), hi),
            emit=lambda em, node, lo, x, hi: em.simple("stablehlo.clamp", node, lo, x, hi),
            samples=_clamp_samples,
            vjp=_clamp_vjp,
            doc="clamp(min, x, max); bounds may be scalars.",
        ),
        OpDef(
            name="convert",
            traits=_ELEMENTWISE,
            flops=per_output_element,
            batch=elementwise("convert"),
            arity=1,
            attrs=("dtype",),
            infer=_convert_infer,
            reference=_convert_reference,
            emit=lambda em, node, x: em.simple("stablehlo.convert", node, x),
            samples=_convert_samples,
            vjp=_convert_vjp,
            doc="Convert to another dtype (float -> int truncates toward zero; -> bool is x != 0).",
        ),
        OpDef(
            name="bitcast_convert",
            traits=_ELEMENTWISE,
            arity=1,
            attrs=("dtype",),
            infer=_bitcast_infer,
            batch=elementwise("bitcast_convert"),
            reference=lambda x, dtype: x.view(np.dtype(dtype)),
            emit=lambda em, node, x: em.simple("stablehlo.bitcast_convert", node, x),
            samples=_bitcast_samples,
            doc="Reinterpret the bits as another dtype of the same width.",
            nondiff="bit reinterpretation has no derivative",
        ),
    ]
)
