"""What the element-wise op families share: operand checks, sample shapes and data, their traits
and the VJP helpers more than one family uses."""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.rules import apply, sum_all

FLOATS = (dtypes.float32, dtypes.float64)


SAMPLE_SHAPES = ((), (5,), (2, 3), (0, 4), (1, 3, 1))


def same_shape(*types: TensorType) -> None:
    """ShapeError unless all ``types`` have one shape (no implicit broadcasting)."""
    shapes = {t.shape for t in types}
    if len(shapes) != 1:
        raise ShapeError("operands must have the same shape (broadcast explicitly first)")


def same_dtype(*types: TensorType) -> None:
    """TypeError unless all ``types`` have one dtype (no implicit promotion)."""
    if len({t.dtype for t in types}) != 1:
        raise TypeError("operands must have the same dtype (convert explicitly first)")


def require_kinds(t: TensorType, kinds: str, op: str) -> None:
    """TypeError unless ``t``'s dtype is of ``kinds`` (f: float, i: signed, u: unsigned, b: bool)."""
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


def random_array(rng: np.random.Generator, shape, dtype, low=-3.0, high=3.0) -> np.ndarray:
    """Sample data of ``shape`` drawn from ``[low, high]`` (coin flips for bool)."""
    dt = np.dtype(dtype)
    if dt == dtypes.bool_:
        return rng.random(shape) < 0.5
    if dt in dtypes.INTEGERS:
        lo = max(int(low), 0) if dtypes.is_unsigned(dt) else int(low)
        return rng.integers(lo, int(high) + 1, size=shape).astype(dt)
    return rng.uniform(low, high, size=shape).astype(dt)


#: the traits of every op of this family (``commutative`` is added where it holds)
ELEMENTWISE_TRAITS = frozenset({"elementwise", "cheap"})


def in_float64(fn):
    """NumPy reference evaluated in float64, cast back to the operand dtype."""
    return lambda x: np.asarray(fn(np.asarray(x, np.float64))).astype(x.dtype)


# VJP rules: ``vjp(ct, out, *inputs, **attrs) -> one cotangent (or None) per input``, written
# with other ops (through ``rules``) so they can be differentiated again. None means zero.


def zero_vjp(ct, y, x):
    """Piecewise constant: the derivative is zero wherever it exists."""
    return (None,)


def sum_to_shape(x, shape):
    """Sum a cotangent down to the (scalar) shape of a broadcast operand."""
    if x.shape == tuple(shape):
        return x
    total = sum_all(x)
    return total if total.shape == tuple(shape) else apply("reshape", total, shape=tuple(shape))


BITWISE = "a bitwise / logical op on integers or bools"
