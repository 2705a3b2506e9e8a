"""Dtypes of the IR, their short names in the textual IR and in StableHLO, and promotion.

Dtypes are NumPy / ml_dtypes ``np.dtype`` objects; ``kn.float32`` etc. re-export them.
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np

float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint8 = np.dtype(np.uint8)
uint16 = np.dtype(np.uint16)
uint32 = np.dtype(np.uint32)
uint64 = np.dtype(np.uint64)
bool_ = np.dtype(np.bool_)

# name in the textual IR -> (dtype, element type in StableHLO)
_TABLE = {
    "f16": (float16, "f16"),
    "bf16": (bfloat16, "bf16"),
    "f32": (float32, "f32"),
    "f64": (float64, "f64"),
    "i8": (int8, "i8"),
    "i16": (int16, "i16"),
    "i32": (int32, "i32"),
    "i64": (int64, "i64"),
    "u8": (uint8, "ui8"),
    "u16": (uint16, "ui16"),
    "u32": (uint32, "ui32"),
    "u64": (uint64, "ui64"),
    "bool": (bool_, "i1"),
}
_BY_DTYPE = {dt: (short, mlir) for short, (dt, mlir) in _TABLE.items()}

ALL = tuple(dt for dt, _ in _TABLE.values())
FLOATS = (float16, bfloat16, float32, float64)
SIGNED = (int8, int16, int32, int64)
UNSIGNED = (uint8, uint16, uint32, uint64)
INTEGERS = SIGNED + UNSIGNED


def canonical(dtype) -> np.dtype:
    """The ``np.dtype`` for anything NumPy understands as a dtype; TypeError if the IR lacks it."""
    try:
        dt = np.dtype(dtype)
    except TypeError as err:
        raise TypeError(f"not a dtype: {dtype!r}") from err
    if dt not in _BY_DTYPE:
        names = ", ".join(_TABLE)
        raise TypeError(f"dtype {dt} is not supported by kaun_ir (supported: {names})")
    return dt


def short_name(dtype) -> str:
    """``f32``, ``bf16``, ``i32``, ``u32``, ``bool`` ... as written in the textual IR."""
    found = _BY_DTYPE.get(dtype) if type(dtype) is not type else None  # np.dtype: no conversion
    return (found or _BY_DTYPE[canonical(dtype)])[0]


def mlir_name(dtype) -> str:
    """The StableHLO element type (``f32``, ``ui32``, ``i1`` ...)."""
    found = _BY_DTYPE.get(dtype) if type(dtype) is not type else None
    return (found or _BY_DTYPE[canonical(dtype)])[1]


def from_short_name(name: str) -> np.dtype:
    """Inverse of :func:`short_name`; KeyError for an unknown name."""
    return _TABLE[name][0]


def is_float(dtype) -> bool:
    """Whether ``dtype`` is one of the floating-point dtypes (float16, bfloat16, float32, float64)."""
    return np.dtype(dtype) in FLOATS


def is_integer(dtype) -> bool:
    """Whether ``dtype`` is a signed or unsigned integer dtype (not bool)."""
    return np.dtype(dtype) in INTEGERS


def is_unsigned(dtype) -> bool:
    """Whether ``dtype`` is an unsigned integer dtype."""
    return np.dtype(dtype) in UNSIGNED


def is_bool(dtype) -> bool:
    """Whether ``dtype`` is bool."""
    return np.dtype(dtype) == bool_


def _rank(dtype: np.dtype) -> tuple[int, int]:
    kind = 0 if dtype == bool_ else 1 if dtype in INTEGERS else 2
    return kind, dtype.itemsize


def result_type(*dtypes) -> np.dtype:
    """Promotion for the NumPy-style surface: bool < integers < floats, wider wins inside a kind.

    Mixing signed and unsigned integers of the same width promotes to the next signed width
    (capped at int64), as NumPy does. bfloat16 with float16 gives float32.
    """
    dts = [canonical(d) for d in dtypes]
    best = dts[0]
    for dt in dts[1:]:
        if dt == best:
            continue
        if {dt, best} == {bfloat16, float16}:
            best = float32
            continue
        if dt in INTEGERS and best in INTEGERS and is_unsigned(dt) != is_unsigned(best):
            width = max(
                dt.itemsize * (2 if is_unsigned(dt) else 1), best.itemsize * (2 if is_unsigned(best) else 1)
            )
            best = np.dtype(f"int{min(8 * width, 64)}")
            continue
        if _rank(dt) > _rank(best):
            best = dt
    return best


def is_weak(x) -> bool:
    """Whether ``x`` is a Python scalar (bool, int, float): *weakly* typed, its dtype adapts to
    the arrays it meets. NumPy scalars (``np.float16(1)``) have a dtype of their own."""
    return isinstance(x, (bool, int, float)) and not isinstance(x, np.generic)


def weak_result_type(strong: Sequence, weak: Sequence) -> np.dtype:
    """The dtype a NumPy-style operation brings its operands to: ``strong`` are the dtypes of its
    arrays, ``weak`` its Python scalars (see :func:`is_weak`).

    The arrays decide (:func:`result_type`) and a scalar only lifts the kind: a float next to
    integers or bools gives float32, an int next to bools int32 (``x_f16 * 2.0`` stays float16,
    ``x_i8 + 1`` stays int8). Scalars alone promote by their default dtypes.
    """
    if not strong:
        return result_type(*[dtype_of_scalar(w) for w in weak])
    dtype = result_type(*strong)
    if any(isinstance(w, float) for w in weak) and not is_float(dtype):
        return float32
    if any(isinstance(w, int) and not isinstance(w, bool) for w in weak) and is_bool(dtype):
        return int32
    return dtype


def default_float() -> np.dtype:
    """The dtype of floating-point values that have none of their own (float32)."""
    return float32


def dtype_of_scalar(value) -> np.dtype:
    """Dtype a Python scalar gets when it stands alone (weakly typed next to a tensor)."""
    if isinstance(value, (bool, np.bool_)):
        return bool_
    if isinstance(value, (int, np.integer)):
        return int32 if not isinstance(value, np.integer) else canonical(np.asarray(value).dtype)
    if isinstance(value, (float, np.floating)):
        return float32 if not isinstance(value, np.floating) else canonical(np.asarray(value).dtype)
    raise TypeError(f"not a scalar: {value!r}")
