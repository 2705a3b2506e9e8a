"""Shape manipulation: ``kn.reshape``, ``kn.transpose``, ``kn.expand_dims``, ``kn.squeeze``,
``kn.concatenate`` and ``kn.stack``, plus the axis check they share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.builder import current_path
from kaun_ir.surface.function import op_function
from kaun_ir.surface.promotion import astype, dtype_of, shape_of
from kaun_ir.surface.tensor import apply, type_of

__all__ = ["concatenate", "expand_dims", "reshape", "squeeze", "stack", "transpose"]


def _normalize_shape(shape: Sequence[int], size: int) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
    if shape.count(-1) > 1:
        raise ShapeError(f"more than one -1 in {list(shape)}")
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
        if known == 0 or size % known:
            raise ShapeError(f"cannot infer -1 in {list(shape)} for {size} elements")
        shape = tuple(size // known if d == -1 else d for d in shape)
    return shape


@op_function
def reshape(x, shape):
    """Row-major reshape; one entry of ``shape`` may be -1."""
    t = type_of(x)
    where_ = f"{current_path()}: " if current_path() else ""
    try:
        shape = _normalize_shape(shape, t.size)
    except ShapeError as err:
        raise ShapeError(f"{where_}reshape of {t}: {err}") from None
    if int(np.prod(shape, dtype=np.int64)) != t.size:
        raise ShapeError(f"{where_}reshape of {t}: cannot reshape {t.size} elements into {list(shape)}")
    return x if shape == t.shape else apply("reshape", x, shape=shape)


def normalize_axis(axis: Any, ndim: int, name: str) -> int:
    """``axis`` in ``[-ndim, ndim)`` as a non-negative int; anything else is an error naming
    ``name``: a ``TypeError`` for a non-integer (bools included), a ``ShapeError`` when out of
    range. Axes never wrap around."""
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(
            f"{current_path() + ': ' if current_path() else ''}{name}: axis must be an int, got {axis!r}"
        )
    if not -ndim <= axis < ndim:
        raise ShapeError(
            f"{current_path() + ': ' if current_path() else ''}{name}: axis {int(axis)} is out "
            f"of range for a tensor of rank {ndim}"
        )
    return int(axis) % ndim


@op_function
def transpose(x, axes=None):
    """Permute axes (default: reverse them); ``axes`` must be a permutation of ``range(ndim)``
    (negative entries count from the end)."""
    ndim = len(shape_of(x))
    if axes is None:
        axes = tuple(reversed(range(ndim)))
    else:
        axes = tuple(normalize_axis(a, ndim, "transpose") for a in axes)
        if sorted(axes) != list(range(ndim)):
            raise ShapeError(f"transpose: axes {list(axes)} are not a permutation of {ndim} axes")
    return x if axes == tuple(range(ndim)) else apply("transpose", x, permutation=axes)


@op_function
def expand_dims(x, axis):
    """Insert a size-1 axis at ``axis`` (in ``[-ndim-1, ndim]``, like ``jnp.expand_dims``)."""
    shape = list(shape_of(x))
    shape.insert(normalize_axis(axis, len(shape) + 1, "expand_dims"), 1)
    return reshape(x, shape)


@op_function
def squeeze(x, axis=None):
    """Remove size-1 axes (all of them, or the ones in ``axis``)."""
    shape = shape_of(x)
    if axis is None:
        axes = {i for i, d in enumerate(shape) if d == 1}
    else:
        items = axis if isinstance(axis, (tuple, list)) else (axis,)
        axes = {normalize_axis(a, len(shape), "squeeze") for a in items}
        if any(shape[a] != 1 for a in axes):
            raise ShapeError(f"squeeze: axis {sorted(axes)} of shape {list(shape)} is not of size 1")
    return reshape(x, [d for i, d in enumerate(shape) if i not in axes])


@op_function
def concatenate(xs, axis=0):
    """Join a sequence of arrays along ``axis`` (dtypes promote)."""
    xs = list(xs)
    if not xs:
        raise ValueError("concatenate needs at least one array")
    dtype = dtypes.result_type(*[dtype_of(x) for x in xs])
    ndim = len(shape_of(xs[0]))
    if ndim == 0:
        raise ShapeError("concatenate: zero-dimensional arrays cannot be concatenated (use stack)")
    axis = normalize_axis(axis, ndim, "concatenate")
    return apply("concatenate", *[astype(x, dtype) for x in xs], dimension=axis)


@op_function
def stack(xs, axis=0):
    """Join arrays of one shape along a new axis."""
    xs = list(xs)
    if not xs:
        raise ValueError("stack needs at least one array")
    shapes = [tuple(shape_of(x)) for x in xs]
    if any(s != shapes[0] for s in shapes):
        raise ShapeError(f"stack: arrays must have one shape, got {', '.join(str(list(s)) for s in shapes)}")
    axis = normalize_axis(axis, len(shape_of(xs[0])) + 1, "stack")
    return concatenate([expand_dims(x, axis) for x in xs], axis=axis)
