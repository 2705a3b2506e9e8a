"""Data-movement primitives that keep every element: broadcast_in_dim, reshape, transpose.

The slicing family (slice, concatenate, pad, reverse) is in ``slicing.py``; both share
:func:`zero_scalar` and :func:`random_array`."""

from __future__ import annotations

import numpy as np

from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.batching import shift
from kaun_ir.ops.emit import i64_array
from kaun_ir.ops.rules import apply


def zero_scalar(like):
    """A scalar zero of ``like``'s dtype, as a traced constant (pad values, cotangent fills)."""
    return apply("constant", value=np.zeros((), like.dtype))


def _bid_vjp(ct, y, x, shape, broadcast_dimensions):
    dims = tuple(broadcast_dimensions)
    summed = {d for d in range(len(shape)) if d not in dims}
    summed |= {d for axis, d in enumerate(dims) if x.shape[axis] == 1 and shape[d] != 1}
    out = apply("reduce", ct, kind="sum", dimensions=tuple(sorted(summed))) if summed else ct
    return (out if out.shape == x.shape else apply("reshape", out, shape=x.shape),)


def _transpose_vjp(ct, y, x, permutation):
    inverse = tuple(int(i) for i in np.argsort(permutation))
    return (apply("transpose", ct, permutation=inverse),)


def _bid_batch(batched, size, x, shape, broadcast_dimensions):
    return apply(
        "broadcast_in_dim",
        x,
        shape=(size,) + tuple(shape),
        broadcast_dimensions=(0,) + shift(broadcast_dimensions),
    )


def _reshape_batch(batched, size, x, shape):
    return apply("reshape", x, shape=(size,) + tuple(shape))


def _transpose_batch(batched, size, x, permutation):
    return apply("transpose", x, permutation=(0,) + shift(permutation))


def random_array(rng, shape, dtype=np.float32):
    """Standard-normal sample data of ``shape`` and ``dtype`` for the ops' generated tests."""
    return rng.standard_normal(shape).astype(dtype)


def _bid_infer(x: TensorType, shape, broadcast_dimensions) -> TensorType:
    shape, dims = tuple(shape), tuple(broadcast_dimensions)
    if len(dims) != x.ndim:
        raise ShapeError(f"broadcast_dimensions {list(dims)} must list one target axis per operand axis")
    if len(set(dims)) != len(dims) or any(not 0 <= d < len(shape) for d in dims):
        raise ShapeError(
            f"broadcast_dimensions {list(dims)} must be distinct axes of the result {list(shape)}"
        )
    if list(dims) != sorted(dims):
        raise ShapeError(f"broadcast_dimensions {list(dims)} must be increasing (transpose first)")
    for axis, d in enumerate(dims):
        if x.shape[axis] not in (1, shape[d]):
            raise ShapeError(f"operand axis {axis} of size {x.shape[axis]} cannot broadcast to {shape[d]}")
    return TensorType(x.dtype, shape)


def _bid_reference(x, shape, broadcast_dimensions):
    shape = tuple(shape)
    expanded = [1] * len(shape)
    for axis, d in enumerate(broadcast_dimensions):
        expanded[d] = x.shape[axis]
    return np.broadcast_to(x.reshape(expanded), shape).copy()


def _bid_samples(rng):
    yield Sample((random_array(rng, ()),), {"shape": (2, 3), "broadcast_dimensions": ()})
    yield Sample((random_array(rng, (3,)),), {"shape": (2, 3), "broadcast_dimensions": (1,)})
    yield Sample((random_array(rng, (2, 1)),), {"shape": (2, 4), "broadcast_dimensions": (0, 1)})
    yield Sample((random_array(rng, (1, 3)),), {"shape": (4, 2, 3), "broadcast_dimensions": (1, 2)})
    yield Sample((np.arange(3, dtype=np.int32),), {"shape": (3, 0), "broadcast_dimensions": (0,)})


def _reshape_infer(x: TensorType, shape) -> TensorType:
    shape = tuple(shape)
    if int(np.prod(shape, dtype=np.int64)) != x.size:
        raise ShapeError(f"cannot reshape {x.size} elements into shape {list(shape)}")
    return TensorType(x.dtype, shape)


def _reshape_samples(rng):
    yield Sample((random_array(rng, (2, 6)),), {"shape": (3, 4)})
    yield Sample((random_array(rng, (2, 3, 4)),), {"shape": (24,)})
    yield Sample((random_array(rng, (1,)),), {"shape": ()})
    yield Sample((random_array(rng, ()),), {"shape": (1, 1)})
    yield Sample((np.zeros((0, 3), np.int32),), {"shape": (3, 0)})


def _transpose_infer(x: TensorType, permutation) -> TensorType:
    perm = tuple(permutation)
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"permutation {list(perm)} is not a permutation of {x.ndim} axes")
    return TensorType(x.dtype, tuple(x.shape[p] for p in perm))


def _transpose_samples(rng):
    yield Sample((random_array(rng, (2, 3)),), {"permutation": (1, 0)})
    yield Sample((random_array(rng, (2, 3, 4)),), {"permutation": (2, 0, 1)})
    yield Sample((random_array(rng, ()),), {"permutation": ()})
    yield Sample((np.zeros((0, 2, 1), np.float32),), {"permutation": (1, 2, 0)})


OPS = [
    OpDef(
        name="broadcast_in_dim",
        traits={"cheap"},
        arity=1,
        attrs=("shape", "broadcast_dimensions"),
        infer=_bid_infer,
        batch=_bid_batch,
        reference=_bid_reference,
        emit=lambda em, node, x: em.simple(
            "stablehlo.broadcast_in_dim",
            node,
            x,
            attrs={"broadcast_dimensions": i64_array(node.attr("broadcast_dimensions"))},
        ),
        samples=_bid_samples,
        vjp=_bid_vjp,
        doc="Broadcast to ``shape``; operand axis i maps to result axis broadcast_dimensions[i].",
    ),
    OpDef(
        name="reshape",
        traits={"cheap"},
        batch=_reshape_batch,
        arity=1,
        attrs=("shape",),
        infer=_reshape_infer,
        reference=lambda x, shape: x.reshape(tuple(shape)),
        emit=lambda em, node, x: em.simple("stablehlo.reshape", node, x),
        samples=_reshape_samples,
        vjp=lambda ct, y, x, shape: (apply("reshape", ct, shape=x.shape),),
        doc="Row-major reshape to ``shape`` (same number of elements).",
    ),
    OpDef(
        name="transpose",
        traits=(),
        batch=_transpose_batch,
        arity=1,
        attrs=("permutation",),
        infer=_transpose_infer,
        reference=lambda x, permutation: np.transpose(x, tuple(permutation)).copy(),
        emit=lambda em, node, x: em.simple(
            "stablehlo.transpose", node, x, attrs={"permutation": i64_array(node.attr("permutation"))}
        ),
        samples=_transpose_samples,
        vjp=_transpose_vjp,
        doc="Permute axes: result axis i is operand axis permutation[i].",
    ),
]
