"""Data-movement primitives that cut, join or reorder along axes: slice, concatenate, pad, reverse."""

from __future__ import annotations

import numpy as np

from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.batching import materialize, unary_leading
from kaun_ir.ops.emit import i64_array
from kaun_ir.ops.rules import apply
from kaun_ir.ops.shape import random_array, zero_scalar


def _slice_vjp(ct, y, x, start_indices, limit_indices, strides):
    low, high, interior = [], [], []
    for size, lo, stride, n in zip(x.shape, start_indices, strides, ct.shape):
        if n == 0:
            low.append(size), high.append(0), interior.append(0)
        else:
            low.append(lo), interior.append(stride - 1)
            high.append(size - (lo + (n - 1) * stride + 1))
    return (apply("pad", ct, zero_scalar(ct), low=tuple(low), high=tuple(high), interior=tuple(interior)),)


def _concat_vjp(ct, y, *xs, dimension):
    out, offset = [], 0
    for x in xs:
        start = [0] * ct.ndim
        limit = list(ct.shape)
        start[dimension], limit[dimension] = offset, offset + x.shape[dimension]
        offset += x.shape[dimension]
        out.append(
            apply("slice", ct, start_indices=tuple(start), limit_indices=tuple(limit), strides=(1,) * ct.ndim)
        )
    return tuple(out)


def _pad_vjp(ct, y, x, value, low, high, interior):
    # undo the edge padding (negative padding crops), then pick every (interior+1)-th element
    unpadded = apply(
        "pad",
        ct,
        zero_scalar(ct),
        low=tuple(-v for v in low),
        high=tuple(-v for v in high),
        interior=(0,) * ct.ndim,
    )
    ct_x = apply(
        "slice",
        unpadded,
        start_indices=(0,) * ct.ndim,
        limit_indices=unpadded.shape,
        strides=tuple(m + 1 for m in interior),
    )
    every = tuple(range(ct.ndim))
    total = apply("reduce", ct, kind="sum", dimensions=every) if ct.ndim else ct
    inner = apply("reduce", ct_x, kind="sum", dimensions=every) if ct.ndim else ct_x
    return ct_x, apply("subtract", total, inner)


def _slice_batch(batched, size, x, start_indices, limit_indices, strides):
    return apply(
        "slice",
        x,
        start_indices=(0,) + tuple(start_indices),
        limit_indices=(size,) + tuple(limit_indices),
        strides=(1,) + tuple(strides),
    )


def _concat_batch(batched, size, *xs, dimension):
    return apply("concatenate", *materialize(xs, batched, size), dimension=dimension + 1)


def _pad_batch(batched, size, x, value, low, high, interior):
    x = materialize([x], [batched[0]], size)[0]
    attrs = dict(low=(0,) + tuple(low), high=(0,) + tuple(high), interior=(0,) + tuple(interior))
    if not batched[1]:
        return apply("pad", x, value, **attrs)
    # a padding value per example: pad with zero, then put each example's value where the
    # padding went (a mask of the padded positions, from padding a block of True with False)
    padded = apply("pad", x, zero_scalar(x), **attrs)
    true = apply("constant", value=np.ones((), bool))
    inside = apply("broadcast_in_dim", true, shape=x.shape, broadcast_dimensions=())
    mask = apply("pad", inside, apply("constant", value=np.zeros((), bool)), **attrs)
    fill = apply("broadcast_in_dim", value, shape=padded.shape, broadcast_dimensions=(0,))
    return apply("select", mask, padded, fill)


def _slice_infer(x: TensorType, start_indices, limit_indices, strides) -> TensorType:
    start, limit, strides = tuple(start_indices), tuple(limit_indices), tuple(strides)
    if not len(start) == len(limit) == len(strides) == x.ndim:
        raise ShapeError("start_indices, limit_indices and strides need one entry per axis")
    dims = []
    for axis, (lo, hi, st) in enumerate(zip(start, limit, strides)):
        if st < 1 or not 0 <= lo <= hi <= x.shape[axis]:
            raise ShapeError(f"axis {axis}: slice [{lo}:{hi}:{st}] is out of bounds for size {x.shape[axis]}")
        dims.append(-(-(hi - lo) // st))
    return TensorType(x.dtype, tuple(dims))


def _slice_reference(x, start_indices, limit_indices, strides):
    return x[tuple(slice(lo, hi, st) for lo, hi, st in zip(start_indices, limit_indices, strides))]


def _slice_samples(rng):
    yield Sample(
        (random_array(rng, (5, 6)),), {"start_indices": (1, 0), "limit_indices": (4, 6), "strides": (1, 2)}
    )
    yield Sample((random_array(rng, (7,)),), {"start_indices": (2,), "limit_indices": (2,), "strides": (1,)})
    yield Sample(
        (random_array(rng, (3, 4, 5)),),
        {"start_indices": (0, 1, 2), "limit_indices": (3, 4, 5), "strides": (2, 3, 1)},
    )


def _concat_infer(*xs: TensorType, dimension) -> TensorType:
    if not xs:
        raise ShapeError("concatenate needs at least one operand")
    first = xs[0]
    if not 0 <= dimension < first.ndim:
        raise ShapeError(f"dimension {dimension} out of range for rank {first.ndim}")
    for x in xs[1:]:
        if x.dtype != first.dtype:
            raise TypeError("operands must have the same dtype")
        if x.ndim != first.ndim or any(
            a != b for i, (a, b) in enumerate(zip(x.shape, first.shape)) if i != dimension
        ):
            raise ShapeError(f"operands must agree on every axis but {dimension}")
    total = sum(x.shape[dimension] for x in xs)
    shape = list(first.shape)
    shape[dimension] = total
    return TensorType(first.dtype, tuple(shape))


def _concat_samples(rng):
    yield Sample((random_array(rng, (2, 3)), random_array(rng, (4, 3))), {"dimension": 0})
    yield Sample(
        (random_array(rng, (2, 1)), random_array(rng, (2, 0)), random_array(rng, (2, 3))), {"dimension": 1}
    )
    yield Sample((np.arange(3, dtype=np.int32),), {"dimension": 0})


def _pad_infer(x: TensorType, value: TensorType, low, high, interior) -> TensorType:
    low, high, interior = tuple(low), tuple(high), tuple(interior)
    if value.shape != () or value.dtype != x.dtype:
        raise ShapeError("padding value must be a scalar of the operand's dtype")
    if not len(low) == len(high) == len(interior) == x.ndim:
        raise ShapeError("low, high and interior need one entry per axis")
    dims = []
    for axis, (lo, hi, mid) in enumerate(zip(low, high, interior)):
        if mid < 0:
            raise ShapeError("interior padding must be non-negative")
        size = x.shape[axis] + max(x.shape[axis] - 1, 0) * mid + lo + hi
        if size < 0:
            raise ShapeError(f"axis {axis}: padding gives a negative size")
        dims.append(size)
    return TensorType(x.dtype, tuple(dims))


def _pad_reference(x, value, low, high, interior):
    # interior first (spread the elements out), then edge padding which may be negative (cropping)
    shape = [n + max(n - 1, 0) * m for n, m in zip(x.shape, interior)]
    spread = np.full(shape, value, dtype=x.dtype)
    spread[tuple(slice(None, None, m + 1) for m in interior)] = x
    pads = [(max(lo, 0), max(hi, 0)) for lo, hi in zip(low, high)]
    out = np.pad(spread, pads, constant_values=value) if x.ndim else spread
    crop = tuple(
        slice(-lo if lo < 0 else 0, (out.shape[i] + hi) if hi < 0 else None)
        for i, (lo, hi) in enumerate(zip(low, high))
    )
    return out[crop]


def _pad_samples(rng):
    yield Sample(
        (random_array(rng, (2, 3)), np.float32(0)), {"low": (1, 0), "high": (0, 2), "interior": (0, 0)}
    )
    yield Sample(
        (random_array(rng, (3, 4)), np.float32(-1)), {"low": (0, 1), "high": (1, 0), "interior": (1, 2)}
    )
    yield Sample(
        (random_array(rng, (4, 5)), np.float32(7)), {"low": (-1, 2), "high": (1, -2), "interior": (0, 0)}
    )
    yield Sample((np.arange(4, dtype=np.int32), np.int32(9)), {"low": (2,), "high": (0,), "interior": (1,)})


def _reverse_infer(x: TensorType, dimensions) -> TensorType:
    dims = tuple(dimensions)
    if len(set(dims)) != len(dims) or any(not 0 <= d < x.ndim for d in dims):
        raise ShapeError(f"dimensions {list(dims)} must be distinct axes of rank {x.ndim}")
    return x


def _reverse_samples(rng):
    yield Sample((random_array(rng, (3, 4)),), {"dimensions": (1,)})
    yield Sample((random_array(rng, (2, 3, 4)),), {"dimensions": (0, 2)})
    yield Sample((np.arange(5, dtype=np.int32),), {"dimensions": ()})


OPS = [
    OpDef(
        name="slice",
        traits=(),
        arity=1,
        attrs=("start_indices", "limit_indices", "strides"),
        infer=_slice_infer,
        batch=_slice_batch,
        reference=_slice_reference,
        emit=lambda em, node, x: em.simple(
            "stablehlo.slice",
            node,
            x,
            attrs={
                "start_indices": i64_array(node.attr("start_indices")),
                "limit_indices": i64_array(node.attr("limit_indices")),
                "strides": i64_array(node.attr("strides")),
            },
        ),
        samples=_slice_samples,
        vjp=_slice_vjp,
        doc="Static strided slice [start:limit:stride] on every axis.",
    ),
    OpDef(
        name="concatenate",
        traits=(),
        batch=_concat_batch,
        arity=None,
        attrs=("dimension",),
        infer=_concat_infer,
        reference=lambda *xs, dimension: np.concatenate(xs, axis=dimension),
        emit=lambda em, node, *xs: em.simple(
            "stablehlo.concatenate", node, *xs, attrs={"dimension": f"{node.attr('dimension')} : i64"}
        ),
        samples=_concat_samples,
        vjp=_concat_vjp,
        doc="Join operands along ``dimension``.",
    ),
    OpDef(
        name="pad",
        traits=(),
        batch=_pad_batch,
        arity=2,
        attrs=("low", "high", "interior"),
        infer=_pad_infer,
        reference=_pad_reference,
        emit=lambda em, node, x, v: em.simple(
            "stablehlo.pad",
            node,
            x,
            v,
            attrs={
                "edge_padding_low": i64_array(node.attr("low")),
                "edge_padding_high": i64_array(node.attr("high")),
                "interior_padding": i64_array(node.attr("interior")),
            },
        ),
        samples=_pad_samples,
        vjp=_pad_vjp,
        doc="pad(x, value): edge padding low/high (negative crops) and interior padding.",
    ),
    OpDef(
        name="reverse",
        traits=(),
        arity=1,
        attrs=("dimensions",),
        infer=_reverse_infer,
        batch=unary_leading("reverse", ("dimensions",)),
        reference=lambda x, dimensions: np.flip(x, tuple(dimensions)).copy() if dimensions else x.copy(),
        emit=lambda em, node, x: em.simple(
            "stablehlo.reverse", node, x, attrs={"dimensions": i64_array(node.attr("dimensions"))}
        ),
        samples=_reverse_samples,
        vjp=lambda ct, y, x, dimensions: (apply("reverse", ct, dimensions=dimensions),),
        doc="Reverse the order of elements along ``dimensions``.",
    ),
]
