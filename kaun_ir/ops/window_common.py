"""What the window ops (``reduce_window``, ``select_and_scatter_add``) share: window checks and
shapes, sample data, and the padding, tap and first-hit helpers of their derivatives."""

from __future__ import annotations

import itertools

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.rules import apply


def random_array(rng, shape, dtype=np.float32):
    """Sample data of ``shape``: small integers, or normal floats."""
    dt = np.dtype(dtype)
    if dt in dtypes.INTEGERS:
        return rng.integers(-9, 10, size=shape).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def check_window(
    x: TensorType, window_dimensions, window_strides, padding, base_dilations=None, window_dilations=None
) -> None:
    """ShapeError unless every window attribute has one entry per axis of ``x`` and a valid value."""
    fields = {
        "window_dimensions": window_dimensions,
        "window_strides": window_strides,
        "padding": padding,
    }
    if base_dilations is not None:
        fields.update(base_dilations=base_dilations, window_dilations=window_dilations)
    for name, values in fields.items():
        if len(values) != x.ndim:
            raise ShapeError(f"{name} needs one entry per axis ({x.ndim}), got {len(values)}")
    if any(len(p) != 2 for p in padding):
        raise ShapeError("padding must be (low, high) pairs")
    for name in ("window_dimensions", "window_strides", "base_dilations", "window_dilations"):
        if name in fields and min(fields[name], default=1) < 1:
            raise ShapeError(f"{name} must be at least 1, got {list(fields[name])}")


def check_init(x: TensorType, init: TensorType, what: str = "init value") -> None:
    """Errors unless ``init`` is a scalar of ``x``'s dtype."""
    if init.shape != ():
        raise ShapeError(f"{what} must be a scalar, got {init}")
    if init.dtype != x.dtype:
        raise TypeError(
            f"{what} must have the operand's dtype {dtypes.short_name(x.dtype)}, "
            f"got {dtypes.short_name(init.dtype)}"
        )


def window_output_shape(
    shape, window_dimensions, window_strides, padding, base_dilations=None, window_dilations=None
) -> tuple[int, ...]:
    """Number of windows along each axis (dilated and padded input, dilated window)."""
    out = []
    for i, size in enumerate(shape):
        base = base_dilations[i] if base_dilations else 1
        wdil = window_dilations[i] if window_dilations else 1
        padded = ((size - 1) * base + 1 if size else 0) + padding[i][0] + padding[i][1]
        window = (window_dimensions[i] - 1) * wdil + 1
        out.append((padded - window) // window_strides[i] + 1 if padded >= window else 0)
    return tuple(out)


def is_constant(value, expected=None) -> bool:
    """Whether IR value ``value`` is produced by a constant node (equal to ``expected`` if given)."""
    node = value.node
    if node is None or node.op != "constant":
        return False
    return expected is None or bool(np.all(node.attr("value").array == expected))


def scalar_constant(value, dtype):
    """A 0-d constant node holding ``value``."""
    return apply("constant", value=np.asarray(value, dtype))


def filled(value, shape, dtype):
    """A tensor of ``shape`` filled with ``value`` (a broadcast constant)."""
    scalar = scalar_constant(value, dtype)
    return apply("broadcast_in_dim", scalar, shape=tuple(shape), broadcast_dimensions=()) if shape else scalar


def _total(x):
    """Sum of all elements (a scalar)."""
    return apply("reduce", x, kind="sum", dimensions=tuple(range(x.ndim))) if x.ndim else x


def pad_and_dilate(x, value, padding, dilations=None):
    """``x`` spread by ``dilations`` and padded with the scalar ``value`` (negative padding crops)."""
    dilations = dilations or (1,) * x.ndim
    if all(d == 1 for d in dilations) and all(lo == 0 and hi == 0 for lo, hi in padding):
        return x
    return apply(
        "pad",
        x,
        scalar_constant(value, x.dtype),
        low=tuple(lo for lo, _ in padding),
        high=tuple(hi for _, hi in padding),
        interior=tuple(d - 1 for d in dilations),
    )


def unpad_cotangent(ct, padding, dilations=None):
    """The cotangent of :func:`pad_and_dilate`'s ``x`` from the cotangent of its result."""
    dilations = dilations or (1,) * ct.ndim
    if any(lo != 0 or hi != 0 for lo, hi in padding):
        ct = apply(
            "pad",
            ct,
            scalar_constant(0, ct.dtype),
            low=tuple(-lo for lo, _ in padding),
            high=tuple(-hi for _, hi in padding),
            interior=(0,) * ct.ndim,
        )
    if any(d != 1 for d in dilations):
        ct = apply(
            "slice", ct, start_indices=(0,) * ct.ndim, limit_indices=ct.shape, strides=tuple(dilations)
        )
    return ct


def window_taps(padded, window_dimensions, window_strides, window_dilations, out_shape):
    """For every offset inside the window (row-major), the element at that offset of every window:
    ``(start, limit, strided slice of padded with out_shape)``."""
    for offset in itertools.product(*(range(w) for w in window_dimensions)):
        start = tuple(k * d for k, d in zip(offset, window_dilations))
        limit = tuple(st + s * (m - 1) + 1 for st, s, m in zip(start, window_strides, out_shape))
        yield (
            start,
            limit,
            apply("slice", padded, start_indices=start, limit_indices=limit, strides=tuple(window_strides)),
        )


def first_hits(taps, target, valid_taps=None):
    """Per tap, the mask of windows whose first element equal to ``target`` is this tap."""
    found = None
    for k, tap in enumerate(taps):
        hit = apply("compare", tap, target, direction="EQ")
        if valid_taps is not None:
            hit = apply("and", hit, valid_taps[k])
        first = hit if found is None else apply("and", hit, apply("not", found))
        found = hit if found is None else apply("or", found, hit)
        yield first


def init_cotangent(init, ct):
    """The init's cotangent, the sum of ``ct``; None when init is a constant (nothing to emit)."""
    return None if is_constant(init.value, None) else _total(ct)


def window_size(attrs) -> int:
    """How many elements one window holds (the product of ``window_dimensions``)."""
    size = 1
    for d in attrs["window_dimensions"]:
        size *= d
    return size
