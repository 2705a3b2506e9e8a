"""Dtype promotion and broadcasting: how the operands of a NumPy-style function are brought to one
dtype and one shape (``kn.promote``, ``kn.astype``, ``kn.broadcast_to`` ...).

Dtypes promote along bool < int < float, and Python scalars are *weak*: they take the dtype of
the other operand (``x_f16 * 2.0`` stays float16), except that a float scalar next to an integer
tensor gives float32. The rule has one home, ``dtypes.weak_result_type``, which the op rules'
``promote`` (``kaun_ir.ops.rules``) follows too.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.dtypes import is_weak
from kaun_ir.errors import ShapeError
from kaun_ir.ir.builder import current_path
from kaun_ir.surface.tensor import Tensor, apply, type_of

__all__ = ["astype", "broadcast_shapes", "broadcast_to", "dtype_of", "promote", "shape_of"]


def shape_of(x: Any) -> tuple[int, ...]:
    """The shape of a Tensor, jax.Array, NumPy array or Python scalar, as a tuple of ints."""
    return type_of(x).shape


def dtype_of(x: Any) -> np.dtype:
    """The dtype of a Tensor, jax.Array, NumPy array or Python scalar."""
    return type_of(x).dtype


def broadcast_shapes(*shapes: Sequence[int], op: str = "broadcast") -> tuple[int, ...]:
    """NumPy's broadcasting rule; ShapeError naming the shapes when they do not broadcast."""
    ndim = builtins.max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(ndim):
        sizes = {s[axis - ndim + len(s)] for s in shapes if axis - ndim + len(s) >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            where = f"{current_path()}: " if current_path() else ""
            listed = " and ".join(f"[{','.join(map(str, s))}]" for s in shapes)
            raise ShapeError(f"{where}{op}: shapes {listed} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def astype(x: Any, dtype) -> Any:
    """``x`` converted to ``dtype`` (no-op when it already has it)."""
    dtype = dtypes.canonical(dtype)
    if isinstance(x, Tensor):
        return x if x.dtype == dtype else apply("convert", x, dtype=dtype)
    if is_weak(x) or isinstance(x, (np.ndarray, np.generic)):
        return np.asarray(x, dtype=dtype)
    return apply("convert", x, dtype=dtype) if dtype_of(x) != dtype else x


def broadcast_to(x: Any, shape: Sequence[int]) -> Any:
    """Broadcast ``x`` to ``shape`` with NumPy's rules."""
    shape = tuple(int(d) for d in shape)
    src = shape_of(x)
    if src == shape:
        return x
    if len(src) > len(shape):
        raise ShapeError(
            f"broadcast_to: cannot broadcast [{','.join(map(str, src))}] to "
            f"[{','.join(map(str, shape))}] of lower rank"
        )
    broadcast_shapes(src, shape, op="broadcast_to")
    if broadcast_shapes(src, shape) != shape:
        raise ShapeError(
            f"broadcast_to: cannot broadcast [{','.join(map(str, src))}] to [{','.join(map(str, shape))}]"
        )
    offset = len(shape) - len(src)
    return apply("broadcast_in_dim", x, shape=shape, broadcast_dimensions=tuple(range(offset, len(shape))))


def _short_repr(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


def promote(*xs: Any, op: str = "op", to_float: bool = False) -> list:
    """Operands converted to one dtype and broadcast to one shape (weak scalars adapt)."""
    try:
        strong = [dtype_of(x) for x in xs if not is_weak(x)]
    except TypeError:  # a str, None or object where an array goes: name the op and the operand
        for i, x in enumerate(xs):
            if not is_weak(x) and not isinstance(x, Tensor) and not hasattr(x, "dtype"):
                try:
                    dtype_of(x)
                except TypeError:
                    raise TypeError(
                        f"{op}: operand {i} is {type(x).__name__} {_short_repr(x)}, not an array or a number"
                    ) from None
        raise
    dtype = dtypes.weak_result_type(strong, [x for x in xs if is_weak(x)])
    if to_float and not dtypes.is_float(dtype):
        dtype = dtypes.float32
    shape = broadcast_shapes(*[shape_of(x) for x in xs], op=op)
    out = []
    for x in xs:
        x = astype(x, dtype)
        out.append(broadcast_to(x, shape))
    return out
