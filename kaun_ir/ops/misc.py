"""Primitives without operands: constant and iota."""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.batching import elementwise
from kaun_ir.ops.emit import dense_literal


def _constant_infer(value) -> TensorType:
    arr = value.array
    return TensorType(arr.dtype, arr.shape)


def _constant_samples(rng):
    yield Sample((), {"value": np.array(1.5, np.float32)})
    yield Sample((), {"value": rng.standard_normal((3, 4)).astype(np.float32)})
    yield Sample((), {"value": rng.standard_normal((50,)).astype(np.float64)})
    yield Sample((), {"value": np.array([[True, False, True]])})
    yield Sample((), {"value": np.arange(-3, 3, dtype=np.int32)})
    yield Sample((), {"value": np.array([np.inf, -np.inf, 0.0, -0.0], np.float32)})
    yield Sample((), {"value": np.zeros((0, 3), np.float32)})
    yield Sample((), {"value": rng.standard_normal((2, 3)).astype(dtypes.bfloat16)})


def _iota_infer(dtype, shape, dimension) -> TensorType:
    shape = tuple(shape)
    if not 0 <= dimension < len(shape):
        raise ShapeError(f"iota dimension {dimension} out of range for rank {len(shape)}")
    return TensorType(dtypes.canonical(dtype), shape)


def _iota_reference(dtype, shape, dimension):
    shape = tuple(shape)
    ramp = np.arange(shape[dimension]).reshape([-1 if i == dimension else 1 for i in range(len(shape))])
    return np.broadcast_to(ramp, shape).astype(dtype)


def _iota_samples(rng):
    yield Sample((), {"dtype": np.dtype(np.int32), "shape": (5,), "dimension": 0})
    yield Sample((), {"dtype": np.dtype(np.float32), "shape": (3, 4), "dimension": 1})
    yield Sample((), {"dtype": np.dtype(np.uint32), "shape": (2, 3, 2), "dimension": 0})


def _stop_gradient_samples(rng):
    yield Sample((rng.standard_normal((2, 3)).astype(np.float32),))
    yield Sample((np.arange(4, dtype=np.int32),))


OPS = [
    OpDef(
        name="stop_gradient",
        arity=1,
        infer=lambda x: x,
        reference=lambda x: x,
        emit=lambda em, node, x: x,  # the identity: no StableHLO op at all
        samples=_stop_gradient_samples,
        vjp=lambda ct, y, x: (None,),
        batch=elementwise("stop_gradient"),
        doc="The identity, whose derivative is zero.",
        traits={"elementwise", "cheap"},
        stablehlo=None,
    ),
    OpDef(
        name="constant",
        arity=0,
        attrs=("value",),
        infer=_constant_infer,
        reference=lambda value: value.array,
        emit=lambda em, node: em.op(
            "stablehlo.constant", [], [], node.types, {"value": dense_literal(node.attr("value").array)}
        ),
        samples=_constant_samples,
        doc="A literal array (attribute ``value``).",
        nondiff="a constant has no inputs",
        nobatch="it has no operands, so it never carries a batch axis",
        traits={"cheap"},
    ),
    OpDef(
        name="iota",
        arity=0,
        attrs=("dtype", "shape", "dimension"),
        infer=_iota_infer,
        reference=_iota_reference,
        emit=lambda em, node: em.op(
            "stablehlo.iota", [], [], node.types, {"iota_dimension": f"{node.attr('dimension')} : i64"}
        ),
        samples=_iota_samples,
        doc="Indices 0, 1, ... along ``dimension``, broadcast to ``shape``.",
        nondiff="iota has no inputs",
        nobatch="it has no operands, so it never carries a batch axis",
        traits=(),
    ),
]
