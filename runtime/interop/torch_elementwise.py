"""The ATen table's elementwise ops: arithmetic, comparisons, logic, and the activations
(relu, gelu, silu ...), each written with kaun_ir's elementwise surface functions."""

from __future__ import annotations

import math
from collections.abc import Callable

from kaun_ir import dtypes
from kaun_ir.runtime.interop.torch_args import registrar
from kaun_ir.surface import elementwise
from kaun_ir.surface.promotion import astype
from kaun_ir.surface.tensor import type_of

#: this family's entries of the ATen table (``torch_ops.ATEN`` merges the families)
ATEN: dict[str, Callable] = {}
_register = registrar(ATEN)


# ------------------------------------------------------------------------------ elementwise

_UNARY = {
    "abs": elementwise.abs,
    "neg": elementwise.negative,
    "exp": elementwise.exp,
    "expm1": elementwise.expm1,
    "log": elementwise.log,
    "log1p": elementwise.log1p,
    "sqrt": elementwise.sqrt,
    "rsqrt": elementwise.rsqrt,
    "sin": elementwise.sin,
    "cos": elementwise.cos,
    "tanh": elementwise.tanh,
    "sigmoid": elementwise.sigmoid,
    "erf": elementwise.erf,
    "floor": elementwise.floor,
    "ceil": elementwise.ceil,
    "round": elementwise.round,
    "sign": elementwise.sign,
    "reciprocal": elementwise.reciprocal,
    "logical_not": elementwise.logical_not,
    "bitwise_not": elementwise.invert,
}
for _name, _fn in _UNARY.items():
    ATEN[f"aten.{_name}.default"] = _fn

_BINARY = {
    "mul": elementwise.multiply,
    "eq": elementwise.equal,
    "ne": elementwise.not_equal,
    "lt": elementwise.less,
    "le": elementwise.less_equal,
    "gt": elementwise.greater,
    "ge": elementwise.greater_equal,
    "bitwise_and": elementwise.bitwise_and,
    "bitwise_or": elementwise.bitwise_or,
    "bitwise_xor": elementwise.bitwise_xor,
    "remainder": elementwise.mod,
}
for _name, _fn in _BINARY.items():
    ATEN[f"aten.{_name}.Tensor"] = _fn
    ATEN[f"aten.{_name}.Scalar"] = _fn
ATEN["aten.maximum.default"] = elementwise.maximum
ATEN["aten.minimum.default"] = elementwise.minimum
ATEN["aten.atan2.default"] = elementwise.arctan2


def _logical(fn: Callable) -> Callable:
    def logical(a, b):
        return fn(astype(a, dtypes.bool_), astype(b, dtypes.bool_))

    logical.__doc__ = f"``{fn.__name__}`` of the operands as booleans."
    return logical


ATEN["aten.logical_and.default"] = _logical(elementwise.bitwise_and)
ATEN["aten.logical_or.default"] = _logical(elementwise.bitwise_or)
ATEN["aten.logical_xor.default"] = _logical(elementwise.bitwise_xor)


@_register("aten.add.Tensor", "aten.add.Scalar")
def add(a, b, alpha=1):
    """``a + alpha * b``."""
    return elementwise.add(a, b if alpha == 1 else elementwise.multiply(b, alpha))


@_register("aten.sub.Tensor", "aten.sub.Scalar")
def sub(a, b, alpha=1):
    """``a - alpha * b``."""
    return elementwise.subtract(a, b if alpha == 1 else elementwise.multiply(b, alpha))


@_register("aten.rsub.Scalar", "aten.rsub.Tensor")
def rsub(a, b, alpha=1):
    """``b - alpha * a``."""
    return sub(b, a, alpha)


@_register("aten.div.Tensor", "aten.div.Scalar")
def div(a, b):
    """True division (integers give floats, as in PyTorch)."""
    return elementwise.true_divide(a, b)


@_register("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def div_mode(a, b, rounding_mode=None):
    """Division rounded as ``rounding_mode`` says: ``None``, ``"trunc"`` or ``"floor"``."""
    if rounding_mode is None:
        return div(a, b)
    if rounding_mode == "floor":
        return elementwise.floor_divide(a, b)
    floor = elementwise.floor_divide(a, b)
    if not dtypes.is_float(type_of(floor).dtype):
        # integers stay integers (as in PyTorch): the floor moved up by one where the exact
        # quotient is negative and not whole
        inexact = elementwise.not_equal(elementwise.mod(a, b), 0)
        negative = elementwise.not_equal(elementwise.less(a, 0), elementwise.less(b, 0))
        return elementwise.where(elementwise.bitwise_and(inexact, negative), elementwise.add(floor, 1), floor)
    q = elementwise.true_divide(a, b)
    return elementwise.multiply(elementwise.sign(q), elementwise.floor(elementwise.abs(q)))


@_register("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def pow_(a, b):
    """``a ** b``."""
    return elementwise.power(a, b)


@_register("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def where(condition, a, b):
    """``a`` where ``condition``, else ``b``."""
    return elementwise.where(astype(condition, dtypes.bool_), a, b)


@_register("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def masked_fill(x, mask, value):
    """``value`` where ``mask``, else ``x`` (decomposed: ``where``)."""
    return elementwise.where(astype(mask, dtypes.bool_), astype(value, type_of(x).dtype), x)


@_register("aten.clamp.default", "aten.clamp.Tensor")
def clamp(x, min=None, max=None):  # noqa: A002 - PyTorch's argument names
    """``x`` limited to ``[min, max]`` (either may be None): ``maximum`` then ``minimum``."""
    if min is not None:
        x = elementwise.maximum(x, min)
    if max is not None:
        x = elementwise.minimum(x, max)
    return x


@_register("aten.clamp_min.default", "aten.clamp_min.Tensor")
def clamp_min(x, bound):
    """``maximum(x, bound)``."""
    return elementwise.maximum(x, bound)


@_register("aten.clamp_max.default", "aten.clamp_max.Tensor")
def clamp_max(x, bound):
    """``minimum(x, bound)``."""
    return elementwise.minimum(x, bound)


@_register("aten.hardtanh.default")
def hardtanh(x, min_val=-1.0, max_val=1.0):
    """``clamp(x, min_val, max_val)``."""
    return clamp(x, min_val, max_val)


@_register("aten.relu.default")
def relu(x):
    """``maximum(x, 0)``."""
    return elementwise.maximum(x, 0)


@_register("aten.leaky_relu.default")
def leaky_relu(x, negative_slope=0.01):
    """``where(x > 0, x, slope * x)``."""
    return elementwise.where(elementwise.greater(x, 0), x, elementwise.multiply(x, negative_slope))


@_register("aten.gelu.default")
def gelu(x, approximate="none"):
    """GELU: ``x/2 (1 + erf(x/sqrt 2))``, or its tanh approximation for ``approximate="tanh"``."""
    if approximate == "tanh":
        inner = elementwise.multiply(
            x + elementwise.multiply(elementwise.multiply(elementwise.multiply(x, x), x), 0.044715),
            math.sqrt(2.0 / math.pi),
        )
        return elementwise.multiply(elementwise.multiply(x, 0.5), elementwise.tanh(inner) + 1.0)
    return elementwise.multiply(
        elementwise.multiply(x, 0.5), elementwise.erf(elementwise.multiply(x, 1.0 / math.sqrt(2.0))) + 1.0
    )


@_register("aten.silu.default")
def silu(x):
    """``x * sigmoid(x)``."""
    return elementwise.multiply(x, elementwise.sigmoid(x))
