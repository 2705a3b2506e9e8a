"""Element-wise binary arithmetic and bitwise logic: ``add`` ... ``atan2``, ``and`` / ``or`` /
``xor`` and the shifts, one declaration each through :func:`_binary`."""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample, per_output_element
from kaun_ir.ops.batching import elementwise
from kaun_ir.ops.elementwise_common import (
    BITWISE,
    ELEMENTWISE_TRAITS,
    FLOATS,
    SAMPLE_SHAPES,
    random_array,
    require_kinds,
    same_dtype,
    same_shape,
)
from kaun_ir.ops.rules import apply, binary, compare, full_like, where


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
    """An elementwise two-operand op of one shape and dtype (arguments as for ``unary._unary``;
    ``domain`` is where the second operand's samples come from; ``commutative``: the operands
    may be swapped)."""

    def infer(a: TensorType, b: TensorType) -> TensorType:
        same_shape(a, b)
        same_dtype(a, b)
        require_kinds(a, kinds, name)
        return a

    def samples(rng):
        chosen = list(FLOATS) if "f" in kinds else []
        chosen += [dtypes.int32] if "i" in kinds else []
        chosen += [dtypes.uint32] if "u" in kinds else []
        chosen += [dtypes.bool_] if "b" in kinds else []
        for dt in chosen:
            for shape in SAMPLE_SHAPES:
                first = random_array(rng, shape, dt, -3 if name != "power" else 0.1, 3)
                if dt in dtypes.INTEGERS and name in (
                    "shift_left",
                    "shift_right_logical",
                    "shift_right_arithmetic",
                ):
                    first = random_array(rng, shape, dt, -1000, 1000)
                yield Sample((first, random_array(rng, shape, dt, *domain)))

    return OpDef(
        name=name,
        arity=2,
        infer=infer,
        reference=lambda a, b: ref(a, b),
        emit=_emitter(mlir),
        samples=samples,
        doc=f"Elementwise {name} of two operands of one shape and dtype ({mlir}).",
        vjp=vjp,
        nondiff=nondiff,
        batch=elementwise(name),
        traits=ELEMENTWISE_TRAITS | {"commutative"} if commutative else ELEMENTWISE_TRAITS,
        stablehlo=mlir,
        flops=per_output_element,
    )


# On booleans StableHLO's add is OR and its multiply AND, but XLA's constant folder computes an
# add of two boolean constants as XOR: these two are emitted as the logical ops they mean.
_ON_BOOLEANS = {"stablehlo.add": "stablehlo.or", "stablehlo.multiply": "stablehlo.and"}


def _emitter(mlir: str):
    logical = _ON_BOOLEANS.get(mlir)
    if logical is None:
        return lambda em, node, a, b: em.simple(mlir, node, a, b)
    return lambda em, node, a, b: em.simple(
        logical if node.types[0].dtype == dtypes.bool_ else mlir, node, a, b
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
    _binary("and", "stablehlo.and", np.bitwise_and, "iub", (-3, 3), nondiff=BITWISE, commutative=True),
    _binary("or", "stablehlo.or", np.bitwise_or, "iub", (-3, 3), nondiff=BITWISE, commutative=True),
    _binary("xor", "stablehlo.xor", np.bitwise_xor, "iub", (-3, 3), nondiff=BITWISE, commutative=True),
    _binary("shift_left", "stablehlo.shift_left", _shift_left, "iu", (0, 40), nondiff=BITWISE),
    _binary(
        "shift_right_logical",
        "stablehlo.shift_right_logical",
        _shift_right_logical,
        "iu",
        (0, 40),
        nondiff=BITWISE,
    ),
    _binary(
        "shift_right_arithmetic",
        "stablehlo.shift_right_arithmetic",
        _shift_right_arithmetic,
        "iu",
        (0, 40),
        nondiff=BITWISE,
    ),
]


OPS: list[OpDef] = _BINARY_OPS
