"""Element-wise comparisons and choices: ``compare``, ``is_finite``, ``select`` and ``clamp``."""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample, per_output_element
from kaun_ir.ops.batching import elementwise
from kaun_ir.ops.elementwise_common import (
    ELEMENTWISE_TRAITS,
    random_array,
    require_kinds,
    same_dtype,
    same_shape,
    sum_to_shape,
)
from kaun_ir.ops.rules import binary, compare, full_like, where

_DIRECTIONS = {
    "EQ": np.equal,
    "NE": np.not_equal,
    "LT": np.less,
    "LE": np.less_equal,
    "GT": np.greater,
    "GE": np.greater_equal,
}


def _compare_infer(a: TensorType, b: TensorType, direction: str) -> TensorType:
    same_shape(a, b)
    same_dtype(a, b)
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(_DIRECTIONS)}, got {direction!r}")
    return TensorType(dtypes.bool_, a.shape)


def _compare_emit(em, node, a, b):
    return em.compare(a, b, node.inputs[0].type, node.attr("direction"))


def _compare_samples(rng):
    for direction in _DIRECTIONS:
        for dt in (dtypes.float32, dtypes.int32, dtypes.uint32, dtypes.bool_):
            a = random_array(rng, (3, 4), dt, -2, 2)
            b = random_array(rng, (3, 4), dt, -2, 2)
            b[0] = a[0]  # some ties
            yield Sample((a, b), {"direction": direction})
    yield Sample((np.zeros((0, 2), np.float32),) * 2, {"direction": "LT"})


def _is_finite_infer(x: TensorType) -> TensorType:
    require_kinds(x, "f", "is_finite")
    return TensorType(dtypes.bool_, x.shape)


def _is_finite_samples(rng):
    special = np.array([0.0, -1.5, np.inf, -np.inf, np.nan, 3e38], np.float32)
    yield Sample((special,))
    yield Sample((special.astype(np.float64).reshape(2, 3),))
    yield Sample((special.astype(dtypes.bfloat16),))
    yield Sample((random_array(rng, (), np.float32),))
    yield Sample((random_array(rng, (0, 3), np.float64),))


def _select_infer(pred: TensorType, on_true: TensorType, on_false: TensorType) -> TensorType:
    if pred.dtype != dtypes.bool_:
        raise TypeError(f"predicate must be bool, got {dtypes.short_name(pred.dtype)}")
    same_shape(on_true, on_false)
    same_dtype(on_true, on_false)
    if pred.shape not in ((), on_true.shape):
        raise ShapeError("predicate must be a scalar or have the shape of the branches")
    return on_true


def _select_samples(rng):
    for dt in (dtypes.float32, dtypes.int32):
        for shape in ((), (4,), (2, 3)):
            yield Sample(
                (rng.random(shape) < 0.5, random_array(rng, shape, dt), random_array(rng, shape, dt))
            )
    yield Sample(
        (np.array(True), random_array(rng, (2, 3), np.float32), random_array(rng, (2, 3), np.float32))
    )


def _select_vjp(ct, y, pred, on_true, on_false):
    zero = full_like(ct, 0)
    return None, where(pred, ct, zero), where(pred, zero, ct)


def _clamp_infer(lo: TensorType, x: TensorType, hi: TensorType) -> TensorType:
    same_dtype(lo, x, hi)
    for bound in (lo, hi):
        if bound.shape not in ((), x.shape):
            raise ShapeError("bounds must be scalars or have the operand's shape")
    return x


def _clamp_samples(rng):
    for dt in (dtypes.float32, dtypes.int32):
        x = random_array(rng, (3, 4), dt, -5, 5)
        yield Sample((np.array(-1, dt), x, np.array(2, dt)))
        yield Sample((random_array(rng, (3, 4), dt, -3, -1), x, random_array(rng, (3, 4), dt, 1, 3)))


def _clamp_vjp(ct, y, lo, x, hi):
    zero = full_like(ct, 0)
    inside = binary("and", compare("GT", x, lo), compare("LT", x, hi))
    below = binary("and", compare("GT", lo, x), compare("LT", lo, hi))
    above = compare("LT", hi, x)
    return (
        sum_to_shape(where(below, ct, zero), lo.shape),
        where(inside, ct, zero),
        sum_to_shape(where(above, ct, zero), hi.shape),
    )


OPS = [
    OpDef(
        name="compare",
        traits=ELEMENTWISE_TRAITS,
        flops=per_output_element,
        batch=elementwise("compare"),
        arity=2,
        attrs=("direction",),
        infer=_compare_infer,
        reference=lambda a, b, direction: _DIRECTIONS[direction](a, b),
        emit=_compare_emit,
        samples=_compare_samples,
        doc="Elementwise comparison with direction EQ/NE/LT/LE/GT/GE; result is bool.",
        nondiff="its result is boolean",
    ),
    OpDef(
        name="is_finite",
        traits=ELEMENTWISE_TRAITS,
        flops=per_output_element,
        batch=elementwise("is_finite"),
        arity=1,
        infer=_is_finite_infer,
        reference=np.isfinite,
        emit=lambda em, node, x: em.simple("stablehlo.is_finite", node, x),
        samples=_is_finite_samples,
        doc="is_finite(x): elementwise, true where a floating-point x is neither infinite nor NaN.",
        nondiff="its result is boolean",
    ),
    OpDef(
        name="select",
        traits=ELEMENTWISE_TRAITS,
        flops=per_output_element,
        batch=elementwise("select"),
        arity=3,
        infer=_select_infer,
        reference=lambda p, t, f: np.where(p, t, f),
        emit=lambda em, node, p, t, f: em.simple("stablehlo.select", node, p, t, f),
        samples=_select_samples,
        vjp=_select_vjp,
        doc="select(pred, on_true, on_false): elementwise choice; pred may be a scalar.",
    ),
    OpDef(
        name="clamp",
        traits=ELEMENTWISE_TRAITS,
        flops=per_output_element,
        batch=elementwise("clamp"),
        arity=3,
        infer=_clamp_infer,
        reference=lambda lo, x, hi: np.minimum(np.maximum(x, lo), hi),
        emit=lambda em, node, lo, x, hi: em.simple("stablehlo.clamp", node, lo, x, hi),
        samples=_clamp_samples,
        vjp=_clamp_vjp,
        doc="clamp(min, x, max); bounds may be scalars.",
    ),
]
