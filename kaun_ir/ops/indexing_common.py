"""What the indexing ops (``dynamic_slice``, ``gather``, ``scatter`` ...) share: StableHLO's clamping
of start positions, index vectors, axis and dtype checks, the dimension-numbers attribute of the
emission, and the random operands of their samples; and the one ``gather`` that picks along an
axis (``take_along_axis``, a sort's permutation applied to other arrays).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.rules import apply


def random_array(rng, shape, dtype=np.float32):
    """Sample data of ``shape``: small integers, coin flips for bool, normal floats otherwise."""
    dt = np.dtype(dtype)
    if dt == dtypes.bool_:
        return rng.random(shape) < 0.5
    if dt in dtypes.INTEGERS:
        return rng.integers(0 if dtypes.is_unsigned(dt) else -5, 6, size=shape).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def start_index(value, dtype=np.int32) -> np.ndarray:
    """A scalar start index as the 0-d array the ops take."""
    return np.array(value, dtype=dtype)


def zeros_like(like):
    """Zeros of ``like``'s type, for the VJP rules."""
    zero = apply("constant", value=np.zeros((), like.dtype))
    return apply("broadcast_in_dim", zero, shape=like.shape, broadcast_dimensions=()) if like.shape else zero


def along_index_vector(indices, index_vector_dim: int, values: Sequence[int]):
    """A tensor of ``indices``' type holding ``values[k]`` at position k of every index vector."""
    info = np.iinfo(indices.dtype)
    values = np.clip(np.asarray(values, np.int64), info.min, info.max).astype(indices.dtype)
    if index_vector_dim == indices.ndim:  # the implicit vector of length 1
        bound = apply("constant", value=values.reshape(()))
        dims: tuple[int, ...] = ()
    else:
        bound = apply("constant", value=values)
        dims = (index_vector_dim,)
    return apply("broadcast_in_dim", bound, shape=indices.shape, broadcast_dimensions=dims)


def gather_along_axis(
    x: Any, indices: Any, axis: int, x_shape: Sequence[int] | None = None, emit: Callable = apply
) -> Any:
    """``out[..., j, ...] = x[..., indices[..., j, ...], ...]`` (``np.take_along_axis``) as one
    ``gather`` node; also how a sort's permutation reorders other arrays along its axis.

    ``indices``: an integer array of ``x``'s rank, the result's shape; off ``axis`` it matches
    ``x`` or ``x`` has size 1 there (position 0 is read). Positions out of range are clamped, as
    ``gather`` does. ``x_shape`` defaults to ``x.shape``; ``emit(op, *operands, **attrs)`` appends
    one node and returns its output (``apply`` of the active trace unless given: the StableHLO
    importer passes its own).
    """
    shape = tuple(x.shape if x_shape is None else x_shape)
    out_shape, dtype = tuple(indices.shape), np.dtype(indices.dtype)
    # the full coordinate of every result element: ``indices`` on ``axis``, the element's own
    # position on every other axis (0 where ``x`` has size 1 there and broadcasts)
    coords = []
    for d in range(len(shape)):
        if d == axis:
            coords.append(indices)
        elif shape[d] == 1:
            zero = emit("constant", value=np.zeros((), dtype))
            coords.append(emit("broadcast_in_dim", zero, shape=out_shape, broadcast_dimensions=()))
        else:
            coords.append(emit("iota", dtype=dtype, shape=out_shape, dimension=d))
    columns = [emit("reshape", c, shape=out_shape + (1,)) for c in coords]
    points = emit("concatenate", *columns, dimension=len(out_shape))
    every = tuple(range(len(shape)))
    return emit(
        "gather",
        x,
        points,
        offset_dims=(),
        collapsed_slice_dims=every,
        start_index_map=every,
        index_vector_dim=len(out_shape),
        slice_sizes=(1,) * len(shape),
    )


def clamp_start(start: int, size: int, window: int) -> int:
    """StableHLO's rule: move ``start`` so that ``[start, start + window)`` lies in ``[0, size)``."""
    return min(max(int(start), 0), size - window)


def check_axes(axes: Sequence[int], bound: int, what: str, sorted_: bool = True) -> None:
    """ShapeError unless ``axes`` are distinct axes below ``bound`` (and increasing if ``sorted_``)."""
    axes = tuple(axes)
    if len(set(axes)) != len(axes) or any(not 0 <= a < bound for a in axes):
        raise ShapeError(f"{what} {list(axes)} must be distinct axes in [0, {bound})")
    if sorted_ and list(axes) != sorted(axes):
        raise ShapeError(f"{what} {list(axes)} must be increasing")


def require_integer(t: TensorType, what: str) -> None:
    """TypeError unless ``t`` has an integer dtype."""
    if not dtypes.is_integer(t.dtype):
        raise TypeError(f"{what} must have an integer dtype, got {dtypes.short_name(t.dtype)}")


def index_vector_length(indices_shape: Sequence[int], index_vector_dim: int) -> int:
    """How many start positions each index vector holds (1 for the implicit trailing vector)."""
    return indices_shape[index_vector_dim] if index_vector_dim < len(indices_shape) else 1


def batch_shape(indices_shape: Sequence[int], index_vector_dim: int) -> list[int]:
    """The shape of the index batch: ``indices``' shape without the index vector dim."""
    return [n for i, n in enumerate(indices_shape) if i != index_vector_dim]


def index_vector(indices: np.ndarray, batch_index: Sequence[int], index_vector_dim: int) -> list[int]:
    """The start index vector of one batch position (the implicit length-1 vector when
    ``index_vector_dim`` is the rank of ``indices``)."""
    if index_vector_dim == indices.ndim:
        return [int(indices[tuple(batch_index)])]
    where = list(batch_index)
    where.insert(index_vector_dim, slice(None))
    return [int(v) for v in indices[tuple(where)]]


def dims_attr(kind: str, fields: Sequence[tuple[str, Sequence[int] | int]]) -> str:
    """``#stablehlo.gather<...>`` / ``#stablehlo.scatter<...>``; empty lists are left out, as
    StableHLO prints them."""
    parts = []
    for name, value in fields:
        if isinstance(value, int):
            parts.append(f"{name} = {value}")
        elif value:
            parts.append(f"{name} = [{', '.join(str(int(v)) for v in value)}]")
    return f"#stablehlo.{kind}<{', '.join(parts)}>"


def hlo_bool(value: bool) -> str:
    """A bool as StableHLO prints it."""
    return "true" if value else "false"
