"""Dtype conversions: ``convert`` (by value) and ``bitcast_convert`` (by bits)."""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample, per_output_element
from kaun_ir.ops.batching import elementwise
from kaun_ir.ops.elementwise_common import ELEMENTWISE_TRAITS, random_array
from kaun_ir.ops.rules import apply, astype


def _convert_infer(x: TensorType, dtype) -> TensorType:
    return TensorType(dtypes.canonical(dtype), x.shape)


def _convert_reference(x, dtype):
    dt = np.dtype(dtype)
    if dt == dtypes.bool_:
        return x != 0
    if dt in dtypes.INTEGERS and x.dtype.kind == "f":
        return np.trunc(x.astype(np.float64)).astype(dt)
    return x.astype(dt)


def _convert_samples(rng):
    pairs = [
        (np.float32, np.float64),
        (np.float64, np.float32),
        (np.float32, np.int32),
        (np.int32, np.float32),
        (np.float32, dtypes.bfloat16),
        (dtypes.bfloat16, np.float32),
        (np.float32, np.float16),
        (np.bool_, np.float32),
        (np.int32, np.bool_),
        (np.float32, np.bool_),
        (np.int32, np.uint32),
        (np.uint32, np.int64),
        (np.int32, np.int32),
    ]
    for src, dst in pairs:
        yield Sample(
            (random_array(rng, (3, 4), src, -20, 20),), {"dtype": np.dtype(dst)}, rtol=1e-2, atol=1e-2
        )


def _convert_vjp(ct, y, x, dtype):
    return (astype(ct, x.dtype) if dtypes.is_float(x.dtype) else None,)


def _bitcast_infer(x: TensorType, dtype) -> TensorType:
    """Same width: same shape. A narrower result gains a trailing axis of ``src / dst`` elements;
    a wider one consumes the operand's trailing axis, which must hold ``dst / src`` elements."""
    dt = dtypes.canonical(dtype)
    if dt == dtypes.bool_ or x.dtype == dtypes.bool_:
        raise TypeError(
            f"bitcast_convert of bool ({dtypes.short_name(x.dtype)} -> {dtypes.short_name(dt)}): "
            "bools have no bit layout here (compare or convert instead)"
        )
    src, dst = x.dtype.itemsize, dt.itemsize
    if src == dst:
        return TensorType(dt, x.shape)
    if src > dst:
        return TensorType(dt, tuple(x.shape) + (src // dst,))
    if not x.shape or x.shape[-1] != dst // src:
        raise ShapeError(
            f"bitcast_convert {dtypes.short_name(x.dtype)} -> {dtypes.short_name(dt)} needs a trailing "
            f"axis of {dst // src} elements, got shape {tuple(x.shape)}"
        )
    return TensorType(dt, tuple(x.shape[:-1]))


def _bitcast_reference(x, dtype):
    """The bytes reinterpreted in the machine's (little-endian) order: element 0 of a new trailing
    axis is the least significant part."""
    dt = np.dtype(dtype)
    src, dst = x.dtype.itemsize, dt.itemsize
    shape = tuple(x.shape)
    # viewed flat: NumPy cannot view a 0-d array as another width (and ascontiguousarray makes
    # a 0-d array 1-d, which must not leak into the result's shape)
    flat = np.ascontiguousarray(x).reshape(-1).view(dt)
    if src == dst:
        return flat.reshape(shape)
    if src > dst:
        return flat.reshape(shape + (src // dst,))
    return flat.reshape(shape[:-1])


def _bitcast_samples(rng):
    for src, dst in (
        (np.float32, np.uint32),
        (np.uint32, np.float32),
        (np.int32, np.uint32),
        (np.float64, np.int64),
        (np.int32, np.int8),
        (np.float32, np.uint16),
        (np.float64, np.float32),
        (dtypes.bfloat16, np.uint8),
    ):
        yield Sample((random_array(rng, (2, 5), src, -100, 100),), {"dtype": np.dtype(dst)})
    for src, dst, n in ((np.uint8, np.int32, 4), (np.int16, np.float32, 2), (np.int32, np.float64, 2)):
        yield Sample((random_array(rng, (3, n), src, -100, 100),), {"dtype": np.dtype(dst)})
    yield Sample((random_array(rng, (4,), np.int8, -100, 100),), {"dtype": np.dtype(np.uint32)})


def _bitcast_batch(batched, size, x, dtype):
    """The batch axis leads and the trailing axis stays last: the op applies to the whole batch."""
    return apply("bitcast_convert", x, dtype=dtype)


OPS = [
    OpDef(
        name="convert",
        traits=ELEMENTWISE_TRAITS,
        flops=per_output_element,
        batch=elementwise("convert"),
        arity=1,
        attrs=("dtype",),
        infer=_convert_infer,
        reference=_convert_reference,
        emit=lambda em, node, x: em.simple("stablehlo.convert", node, x),
        samples=_convert_samples,
        vjp=_convert_vjp,
        doc="Convert to another dtype (float -> int truncates toward zero; -> bool is x != 0).",
    ),
    OpDef(
        name="bitcast_convert",
        traits=("cheap",),
        arity=1,
        attrs=("dtype",),
        infer=_bitcast_infer,
        batch=_bitcast_batch,
        reference=_bitcast_reference,
        emit=lambda em, node, x: em.simple("stablehlo.bitcast_convert", node, x),
        samples=_bitcast_samples,
        doc=(
            "Reinterpret the bits as another dtype. To a narrower dtype the result gains a trailing "
            "axis (``f32[n] -> u8[n,4]``), to a wider one the operand's trailing axis is consumed "
            "(``u8[n,4] -> i32[n]``); element 0 of that axis is the least significant part."
        ),
        nondiff="bit reinterpretation has no derivative",
    ),
]
