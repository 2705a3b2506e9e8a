"""Element-wise unary math: ``negate``, ``abs``, ``exponential``, ``log``, ``tanh``, ``erf`` ... and
``not``, one declaration each through :func:`_unary`."""

from __future__ import annotations

import math

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
    in_float64,
    random_array,
    require_kinds,
    zero_vjp,
)
from kaun_ir.ops.rules import apply


def _erf(x: np.ndarray) -> np.ndarray:
    return (
        np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64)) if x.size else x.astype(np.float64)
    )


def _round_afz(x: np.ndarray) -> np.ndarray:
    """Round half away from zero (``stablehlo.round_nearest_afz``): 2.5 -> 3, -2.5 -> -3."""
    wide = x.astype(np.float64)
    return np.copysign(np.floor(np.abs(wide) + 0.5), wide).astype(x.dtype)


def _unary(name: str, mlir: str, ref, kinds: str, domain, vjp=None, nondiff=None) -> OpDef:
    """An elementwise one-operand op: StableHLO op ``mlir``, NumPy reference ``ref``, operand
    dtype ``kinds`` (f: float, i: signed, u: unsigned, b: bool), samples drawn from ``domain``."""

    def infer(x: TensorType) -> TensorType:
        require_kinds(x, kinds, name)
        return x

    def samples(rng):
        kinds_dtypes = [d for d in (FLOATS if "f" in kinds else ())]
        if "i" in kinds:
            kinds_dtypes.append(dtypes.int32)
        if "u" in kinds:
            kinds_dtypes.append(dtypes.uint32)
        if "b" in kinds:
            kinds_dtypes.append(dtypes.bool_)
        for dt in kinds_dtypes:
            for shape in SAMPLE_SHAPES:
                yield Sample((random_array(rng, shape, dt, *domain),))
        if "f" in kinds:  # low precision: looser tolerance
            yield Sample((random_array(rng, (4, 3), dtypes.bfloat16, *domain),), rtol=2e-2, atol=2e-2)

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
        traits=ELEMENTWISE_TRAITS,
        stablehlo=mlir,
        flops=per_output_element,
    )


_UNARY_OPS = [
    _unary("negate", "stablehlo.negate", np.negative, "fiu", (-3, 3), vjp=lambda ct, y, x: (-ct,)),
    _unary("abs", "stablehlo.abs", np.abs, "fi", (-3, 3), vjp=lambda ct, y, x: (ct * apply("sign", x),)),
    _unary("sign", "stablehlo.sign", np.sign, "fi", (-3, 3), vjp=zero_vjp),
    _unary(
        "exponential",
        "stablehlo.exponential",
        in_float64(np.exp),
        "f",
        (-3, 3),
        vjp=lambda ct, y, x: (ct * y,),
    ),
    _unary(
        "exponential_minus_one",
        "stablehlo.exponential_minus_one",
        in_float64(np.expm1),
        "f",
        (-3, 3),
        vjp=lambda ct, y, x: (ct * (y + 1.0),),
    ),
    _unary("log", "stablehlo.log", in_float64(np.log), "f", (0.1, 5), vjp=lambda ct, y, x: (ct / x,)),
    _unary(
        "log_plus_one",
        "stablehlo.log_plus_one",
        in_float64(np.log1p),
        "f",
        (-0.9, 5),
        vjp=lambda ct, y, x: (ct / (x + 1.0),),
    ),
    _unary(
        "sqrt", "stablehlo.sqrt", in_float64(np.sqrt), "f", (0.0, 5), vjp=lambda ct, y, x: (ct * 0.5 / y,)
    ),
    _unary(
        "rsqrt",
        "stablehlo.rsqrt",
        in_float64(lambda x: 1.0 / np.sqrt(x)),
        "f",
        (0.1, 5),
        vjp=lambda ct, y, x: (ct * -0.5 * y / x,),
    ),
    _unary(
        "tanh",
        "stablehlo.tanh",
        in_float64(np.tanh),
        "f",
        (-3, 3),
        vjp=lambda ct, y, x: (ct * (1.0 - y * y),),
    ),
    _unary(
        "logistic",
        "stablehlo.logistic",
        in_float64(lambda x: 1.0 / (1.0 + np.exp(-x))),
        "f",
        (-5, 5),
        vjp=lambda ct, y, x: (ct * y * (1.0 - y),),
    ),
    _unary(
        "sine",
        "stablehlo.sine",
        in_float64(np.sin),
        "f",
        (-3, 3),
        vjp=lambda ct, y, x: (ct * apply("cosine", x),),
    ),
    _unary(
        "cosine",
        "stablehlo.cosine",
        in_float64(np.cos),
        "f",
        (-3, 3),
        vjp=lambda ct, y, x: (-ct * apply("sine", x),),
    ),
    _unary("floor", "stablehlo.floor", np.floor, "f", (-3, 3), vjp=zero_vjp),
    _unary("ceil", "stablehlo.ceil", np.ceil, "f", (-3, 3), vjp=zero_vjp),
    _unary("round_nearest_even", "stablehlo.round_nearest_even", np.round, "f", (-3, 3), vjp=zero_vjp),
    _unary("round_nearest_afz", "stablehlo.round_nearest_afz", _round_afz, "f", (-3, 3), vjp=zero_vjp),
    _unary(
        "cbrt",
        "stablehlo.cbrt",
        in_float64(np.cbrt),
        "f",
        (0.2, 3),
        # d/dx x^(1/3) = 1 / (3 y^2)
        vjp=lambda ct, y, x: (ct / (3.0 * y * y),),
    ),
    _unary(
        "tan",
        "stablehlo.tan",
        in_float64(np.tan),
        "f",
        (-1.2, 1.2),
        vjp=lambda ct, y, x: (ct * (1.0 + y * y),),
    ),
    _unary(
        "erf",
        "chlo.erf",
        in_float64(_erf),
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
        nondiff=BITWISE,
    ),
]


OPS: list[OpDef] = _UNARY_OPS
