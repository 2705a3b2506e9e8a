"""Element-wise arithmetic, comparisons and math functions (``kn.add``, ``kn.exp``, ``kn.where`` ...).

Every function takes Tensors while tracing and concrete arrays (NumPy, jax.Array, Python
scalars) outside a trace. Operands broadcast and promote as in ``kaun_ir.surface.promotion``.
"""

from __future__ import annotations

import builtins
from typing import Any

from kaun_ir import dtypes
from kaun_ir.surface.creation import ones_like
from kaun_ir.surface.function import op_function
from kaun_ir.surface.promotion import (
    astype,
    broadcast_shapes,
    broadcast_to,
    dtype_of,
    is_weak,
    promote,
    shape_of,
)
from kaun_ir.surface.tensor import apply

__all__ = [
    "abs",
    "add",
    "arctan2",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "ceil",
    "clip",
    "cos",
    "divide",
    "equal",
    "erf",
    "exp",
    "expm1",
    "floor",
    "floor_divide",
    "greater",
    "greater_equal",
    "invert",
    "left_shift",
    "less",
    "less_equal",
    "log",
    "log1p",
    "logical_not",
    "maximum",
    "minimum",
    "mod",
    "multiply",
    "negative",
    "not_equal",
    "power",
    "reciprocal",
    "remainder",
    "right_shift",
    "round",
    "rsqrt",
    "sigmoid",
    "sign",
    "sin",
    "sqrt",
    "square",
    "stop_gradient",
    "subtract",
    "tanh",
    "true_divide",
    "where",
]


def _unary_float(op: str, x: Any) -> Any:
    x = x if dtypes.is_float(dtype_of(x)) else astype(x, dtypes.float32)
    return apply(op, x)


# ------------------------------------------------------------------------- elementwise


def _binary(prim: str, name: str, to_float: bool = False):
    def fn(a, b):
        a, b = promote(a, b, op=name, to_float=to_float)
        return apply(prim, a, b)

    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}`` with NumPy broadcasting and dtype promotion."
    return op_function(fn)


add = _binary("add", "add")
subtract = _binary("subtract", "subtract")
multiply = _binary("multiply", "multiply")
divide = _binary("divide", "divide", to_float=True)
true_divide = divide
maximum = _binary("maximum", "maximum")
minimum = _binary("minimum", "minimum")
bitwise_and = _binary("and", "bitwise_and")
bitwise_or = _binary("or", "bitwise_or")
bitwise_xor = _binary("xor", "bitwise_xor")
left_shift = _binary("shift_left", "left_shift")
arctan2 = _binary("atan2", "arctan2", to_float=True)


@op_function
def right_shift(a, b):
    """Arithmetic shift for signed integers, logical for unsigned (like NumPy)."""
    a, b = promote(a, b, op="right_shift")
    prim = "shift_right_logical" if dtypes.is_unsigned(dtype_of(a)) else "shift_right_arithmetic"
    return apply(prim, a, b)


@op_function
def power(a, b):
    """``a ** b`` elementwise. A small integer exponent (|b| <= 4) becomes multiplications,
    which is exact and gives a leaner derivative than the general ``power`` op."""
    if isinstance(b, int) and not isinstance(b, bool) and -4 <= b <= 4 and not is_weak(a):
        if b == 0:
            return ones_like(a)
        result = a
        for _ in range(builtins.abs(b) - 1):
            result = multiply(result, a)
        return reciprocal(result) if b < 0 else result
    a, b = promote(a, b, op="power")
    return apply("power", a, b)


@op_function
def floor_divide(a, b):
    """``a // b``: floor of the quotient (Python semantics for integers too)."""
    a, b = promote(a, b, op="floor_divide")
    if dtypes.is_float(dtype_of(a)):
        return _float_floor_divide(a, b)
    if dtypes.is_unsigned(dtype_of(a)):
        return apply("divide", a, b)
    quotient = apply("divide", a, b)
    remainder = apply("remainder", a, b)
    zero = astype(0, dtype_of(a))
    adjust = (remainder != zero) & ((remainder < zero) != (b < zero))
    return where(adjust, quotient - astype(1, dtype_of(a)), quotient)


def _float_floor_divide(a, b):
    """NumPy's float ``a // b`` computed as jax.numpy (and CPython's float divmod) do: from the
    exact remainder, so that ``-1 // inf`` is ``-1`` and ``1 // 0`` is ``inf``, which
    ``floor(a / b)`` gets wrong."""
    remainder = apply("remainder", a, b)
    zero = astype(0, dtype_of(a))
    quotient = apply("divide", where(b == zero, a, a - remainder), b)
    adjust = (remainder != zero) & (apply("sign", b) != apply("sign", remainder))
    quotient = where(adjust, quotient - astype(1, dtype_of(a)), quotient)
    return apply("round_nearest_even", quotient)


@op_function
def mod(a, b):
    """``a % b`` with the sign of ``b`` (Python / NumPy semantics)."""
    a, b = promote(a, b, op="mod")
    remainder = apply("remainder", a, b)
    if dtypes.is_unsigned(dtype_of(a)):
        return remainder
    zero = astype(0, dtype_of(a))
    adjust = (remainder != zero) & ((remainder < zero) != (b < zero))
    return where(adjust, remainder + b, remainder)


remainder = mod


def _compare(direction: str, name: str):
    def fn(a, b):
        a, b = promote(a, b, op=name)
        return apply("compare", a, b, direction=direction)

    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}`` (bool result) with broadcasting."
    return op_function(fn)


equal = _compare("EQ", "equal")
not_equal = _compare("NE", "not_equal")
less = _compare("LT", "less")
less_equal = _compare("LE", "less_equal")
greater = _compare("GT", "greater")
greater_equal = _compare("GE", "greater_equal")


def _unary(prim: str, name: str, float_only: bool = True):
    def fn(x):
        return _unary_float(prim, x) if float_only else apply(prim, x)

    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}``" + (" (integers are converted to float32)." if float_only else ".")
    return op_function(fn)


exp = _unary("exponential", "exp")
expm1 = _unary("exponential_minus_one", "expm1")
log = _unary("log", "log")
log1p = _unary("log_plus_one", "log1p")
sqrt = _unary("sqrt", "sqrt")
rsqrt = _unary("rsqrt", "rsqrt")
sin = _unary("sine", "sin")
cos = _unary("cosine", "cos")
tanh = _unary("tanh", "tanh")
sigmoid = _unary("logistic", "sigmoid")
erf = _unary("erf", "erf")
negative = _unary("negate", "negative", float_only=False)
sign = _unary("sign", "sign", float_only=False)


@op_function
def abs(x):  # noqa: A001 - NumPy's name
    """Elementwise absolute value (identity on unsigned integers)."""
    return x if dtypes.is_unsigned(dtype_of(x)) else apply("abs", x)


@op_function
def floor(x):
    """Elementwise floor (identity on integers)."""
    return x if not dtypes.is_float(dtype_of(x)) else apply("floor", x)


@op_function
def ceil(x):
    """Elementwise ceiling (identity on integers)."""
    return x if not dtypes.is_float(dtype_of(x)) else apply("ceil", x)


@op_function
def round(x):  # noqa: A001 - NumPy's name
    """Round to the nearest integer, ties to even (like ``np.round``)."""
    return x if not dtypes.is_float(dtype_of(x)) else apply("round_nearest_even", x)


@op_function
def invert(x):
    """Bitwise not (logical not on bool)."""
    return apply("not", x)


logical_not = invert


@op_function
def square(x):
    """``x * x``."""
    return multiply(x, x)


@op_function
def reciprocal(x):
    """``1 / x`` (float)."""
    return divide(1.0, x)


@op_function
def where(condition, x, y):
    """``x`` where ``condition`` holds, else ``y`` (all three broadcast together)."""
    x, y = promote(x, y, op="where")
    shape = broadcast_shapes(shape_of(condition), shape_of(x), op="where")
    condition = astype(condition, dtypes.bool_) if dtype_of(condition) != dtypes.bool_ else condition
    return apply("select", broadcast_to(condition, shape), broadcast_to(x, shape), broadcast_to(y, shape))


@op_function
def clip(x, min=None, max=None):  # noqa: A002 - NumPy's names
    """Limit ``x`` to ``[min, max]`` (either bound may be None)."""
    if min is not None:
        x = maximum(x, astype(min, dtype_of(x)) if is_weak(min) else min)
    if max is not None:
        x = minimum(x, astype(max, dtype_of(x)) if is_weak(max) else max)
    return x


def stop_gradient(x):
    """The identity whose derivative is zero (lowered to nothing)."""
    return apply("stop_gradient", x)
