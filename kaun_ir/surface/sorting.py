"""Sorting: ``kn.sort``, ``kn.argsort`` and ``kn.top_k`` (one ``sort`` primitive underneath,
lowered to ``stablehlo.sort``; differentiable with respect to the values). Bool arrays sort too,
``False`` before ``True``, as in NumPy."""

from __future__ import annotations

from typing import Any

import numpy as np

from kaun_ir.errors import ShapeError
from kaun_ir.surface.function import op_function
from kaun_ir.surface.promotion import shape_of
from kaun_ir.surface.tensor import Tensor, apply

__all__ = ["sort", "argsort", "top_k"]


def _axis(x: Any, axis: int, what: str) -> int:
    """``axis`` normalised to ``[0, ndim)``; like every axis of the project, a non-integer axis is
    a ``TypeError`` and one out of range (or any axis of a scalar) a ``ShapeError``."""
    ndim = len(shape_of(x))
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"kn.{what}: axis must be an integer, got {axis!r}")
    axis = int(axis)
    if ndim == 0:
        raise ShapeError(f"kn.{what}: the operand must have at least one axis, got a scalar")
    if not -ndim <= axis < ndim:
        raise ShapeError(f"kn.{what}: axis {axis} is out of range for a rank-{ndim} operand")
    return axis % ndim


def _as_array(x: Any) -> Any:
    if isinstance(x, (list, tuple, int, float)):
        return np.asarray(x)
    return x if isinstance(x, Tensor) or hasattr(x, "dtype") else np.asarray(x)


@op_function
def sort(x: Any, axis: int = -1, descending: bool = False) -> Any:
    """``x`` sorted along ``axis`` (``jnp.sort``): ascending by default, NaN last; with
    ``descending=True`` largest first, NaN first. Same shape and dtype as ``x``.

    Ascending is stable. Descending is the ascending result reversed, exactly as ``jnp.sort``
    does it: entries that compare equal (``0.0`` and ``-0.0``, two NaNs) come out in the reverse
    of their input order (``kn.argsort(descending=True)`` keeps them in input order, like
    ``jnp.argsort``)."""
    x = _as_array(x)
    axis = _axis(x, axis, "sort")
    values = apply("sort", x, axis=axis, descending=False)[0]
    return apply("reverse", values, dimensions=(axis,)) if descending else values


@op_function
def argsort(x: Any, axis: int = -1, descending: bool = False) -> Any:
    """The indices that sort ``x`` along ``axis`` (``jnp.argsort(stable=True)``): int32, ``x``'s
    shape; equal values keep their order."""
    x = _as_array(x)
    return apply("sort", x, axis=_axis(x, axis, "argsort"), descending=bool(descending))[1]


@op_function
def top_k(x: Any, k: int) -> tuple[Any, Any]:
    """The ``k`` largest entries along the last axis, largest first, and their indices
    (``jax.lax.top_k``): ``x: [..., n] -> (values [..., k], int32 indices [..., k])``. Of equal
    values the one with the lower index comes first; NaN counts as the largest."""
    x = _as_array(x)
    shape = shape_of(x)
    axis = _axis(x, -1, "top_k")
    n = shape[axis]
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= n:
        raise ValueError(f"kn.top_k: k must be an int in [0, {n}] (the size of the last axis), got {k!r}")
    values, indices = apply("sort", x, axis=axis, descending=True)
    start = (0,) * len(shape)
    limit = tuple(shape[:-1]) + (k,)
    strides = (1,) * len(shape)
    return (
        apply("slice", values, start_indices=start, limit_indices=limit, strides=strides),
        apply("slice", indices, start_indices=start, limit_indices=limit, strides=strides),
    )
