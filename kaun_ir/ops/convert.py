"""Dtype conversions: ``convert`` (by value) and ``bitcast_convert`` (by bits)."""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample, per_output_element
from kaun_ir.ops.batching import elementwise
from kaun_ir.ops.elementwise_common import ELEMENTWISE_TRAITS, random_array
from kaun_ir.ops.rules import astype


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
    dt = dtypes.canonical(dtype)
    if dt.itemsize != x.dtype.itemsize or dt == dtypes.bool_ or x.dtype == dtypes.bool_:
        raise TypeError(
            f"bitcast_convert needs dtypes of one bit width, got "
            f"{dtypes.short_name(x.dtype)} -> {dtypes.short_name(dt)}"
        )
    return TensorType(dt, x.shape)


def _bitcast_samples(rng):
    for src, dst in (
        (np.float32, np.uint32),
        (np.uint32, np.float32),
        (np.int32, np.uint32),
        (np.float64, np.int64),
    ):
        yield Sample((random_array(rng, (2, 5), src, -100, 100),), {"dtype": np.dtype(dst)})


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
        traits=ELEMENTWISE_TRAITS,
        arity=1,
        attrs=("dtype",),
        infer=_bitcast_infer,
        batch=elementwise("bitcast_convert"),
        reference=lambda x, dtype: x.view(np.dtype(dtype)),
        emit=lambda em, node, x: em.simple("stablehlo.bitcast_convert", node, x),
        samples=_bitcast_samples,
        doc="Reinterpret the bits as another dtype of the same width.",
        nondiff="bit reinterpretation has no derivative",
    ),
]
