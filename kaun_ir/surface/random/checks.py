"""The argument checks every ``kn.random`` function shares: the key, the requested shape, and
bounds that must broadcast to it."""

from __future__ import annotations

from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.surface.promotion import broadcast_shapes
from kaun_ir.surface.tensor import type_of


def check_key(key, name: str) -> None:
    """A TypeError naming ``kn.random.NAME`` unless ``key`` is a key (uint32[2])."""
    t = type_of(key)
    if t.dtype != dtypes.uint32 or t.shape != (2,):
        raise TypeError(
            f"kn.random.{name}: expected a key (u32[2], from kn.random.key / split / fold_in), got {t}"
        )


def check_shape(shape: Any, name: str) -> tuple[int, ...]:
    """``kn.random.NAME``'s ``shape`` argument (an int or a sequence of ints) as a tuple."""
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        shape = tuple(int(d) for d in shape)
    except TypeError:
        raise TypeError(f"kn.random.{name}: shape must be an int or a tuple of ints, got {shape!r}") from None
    if any(d < 0 for d in shape):
        raise ShapeError(f"kn.random.{name}: negative dimension in shape {list(shape)}")
    return shape


def check_broadcast(name: str, what: str, value_shape, shape) -> None:
    """A ShapeError unless an argument of ``value_shape`` broadcasts to the requested ``shape``."""
    if broadcast_shapes(value_shape, shape, op=f"kn.random.{name}") != tuple(shape):
        raise ShapeError(
            f"kn.random.{name}: {what} of shape {list(value_shape)} does not broadcast to the "
            f"requested shape {list(shape)}"
        )
