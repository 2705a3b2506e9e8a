"""The convolution primitive: its type rule, NumPy reference, emission, VJP (the operand and
kernel cotangents are convolutions themselves, with the roles of the operands transposed),
samples and FLOP rule."""

from __future__ import annotations

import itertools

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.conv_vjp import conv_vjp
from kaun_ir.ops.emit import i64_array, padding_literal
from kaun_ir.ops.linalg import check_numeric, random_operand, widened
from kaun_ir.ops.linalg_batch import convolution_batch


def _check_spec(spec, ndim: int, what: str) -> None:
    if sorted(spec) != list(range(ndim)):
        raise ShapeError(f"{what} {list(spec)} must be a permutation of the {ndim} axes of the operand")


def _conv_out_size(size, kernel, stride, lo, hi, lhs_dil, rhs_dil) -> int:
    padded = (size - 1) * lhs_dil + 1 + lo + hi if size else lo + hi
    window = (kernel - 1) * rhs_dil + 1
    return (padded - window) // stride + 1 if padded >= window else 0


def _conv_infer(
    lhs: TensorType,
    rhs: TensorType,
    window_strides,
    padding,
    lhs_dilation,
    rhs_dilation,
    lhs_spec,
    rhs_spec,
    out_spec,
    feature_group_count=1,
    batch_group_count=1,
) -> TensorType:
    if lhs.dtype != rhs.dtype:
        raise TypeError("operands must have the same dtype (convert explicitly first)")
    check_numeric(lhs, "convolution")
    if lhs.ndim != rhs.ndim or lhs.ndim < 3:
        raise ShapeError(f"input and kernel must have one rank of at least 3, got {lhs.ndim} and {rhs.ndim}")
    nd = lhs.ndim - 2
    _check_spec(lhs_spec, lhs.ndim, "lhs_spec")
    _check_spec(rhs_spec, rhs.ndim, "rhs_spec")
    _check_spec(out_spec, lhs.ndim, "out_spec")
    for name, values in (
        ("window_strides", window_strides),
        ("padding", padding),
        ("lhs_dilation", lhs_dilation),
        ("rhs_dilation", rhs_dilation),
    ):
        if len(values) != nd:
            raise ShapeError(f"{name} needs one entry per spatial axis ({nd}), got {len(values)}")
    if any(len(p) != 2 for p in padding):
        raise ShapeError("padding must be (low, high) pairs")
    if min(window_strides) < 1 or min(lhs_dilation) < 1 or min(rhs_dilation) < 1:
        raise ShapeError("strides and dilations must be at least 1")
    groups, bgroups = feature_group_count, batch_group_count
    if groups < 1 or bgroups < 1 or (groups > 1 and bgroups > 1):
        raise ShapeError("feature_group_count and batch_group_count must be >= 1, and not both > 1")
    batch, features = lhs.shape[lhs_spec[0]], lhs.shape[lhs_spec[1]]
    out_features, in_features = rhs.shape[rhs_spec[0]], rhs.shape[rhs_spec[1]]
    if features % groups or out_features % groups:
        raise ShapeError(
            f"feature_group_count {groups} must divide the input features ({features}) and "
            f"the kernel's output features ({out_features})"
        )
    if in_features * groups != features:
        raise ShapeError(
            f"input has {features} features but the kernel expects {in_features} x "
            f"{groups} group(s) = {in_features * groups}"
        )
    if batch % bgroups or out_features % bgroups:
        raise ShapeError(
            f"batch_group_count {bgroups} must divide the batch ({batch}) and the kernel's "
            f"output features ({out_features})"
        )
    spatial = [
        _conv_out_size(
            lhs.shape[lhs_spec[2 + i]],
            rhs.shape[rhs_spec[2 + i]],
            window_strides[i],
            *padding[i],
            lhs_dilation[i],
            rhs_dilation[i],
        )
        for i in range(nd)
    ]
    shape = [0] * lhs.ndim
    shape[out_spec[0]] = batch // bgroups
    shape[out_spec[1]] = out_features
    for i in range(nd):
        shape[out_spec[2 + i]] = spatial[i]
    return TensorType(lhs.dtype, tuple(shape))


def _dilate_and_pad(x: np.ndarray, dilation, padding) -> np.ndarray:
    """Spatial axes 2.. of ``x`` spread out by ``dilation`` (zeros between) and padded with zeros;
    negative padding crops."""
    shape = list(x.shape[:2]) + [(n - 1) * d + 1 if n else 0 for n, d in zip(x.shape[2:], dilation)]
    spread = np.zeros(shape, x.dtype)
    spread[(slice(None), slice(None)) + tuple(slice(None, None, d) for d in dilation)] = x
    grow = [(0, 0), (0, 0)] + [(max(lo, 0), max(hi, 0)) for lo, hi in padding]
    out = np.pad(spread, grow)
    crop = [slice(None), slice(None)] + [
        slice(-lo if lo < 0 else 0, n + hi if hi < 0 else None) for n, (lo, hi) in zip(out.shape[2:], padding)
    ]
    return out[tuple(crop)]


def _conv_reference(
    lhs,
    rhs,
    window_strides,
    padding,
    lhs_dilation,
    rhs_dilation,
    lhs_spec,
    rhs_spec,
    out_spec,
    feature_group_count=1,
    batch_group_count=1,
):
    out_type = _conv_infer(
        TensorType(lhs.dtype, lhs.shape),
        TensorType(rhs.dtype, rhs.shape),
        window_strides,
        padding,
        lhs_dilation,
        rhs_dilation,
        lhs_spec,
        rhs_spec,
        out_spec,
        feature_group_count,
        batch_group_count,
    )
    # canonical layouts: x [N, C, spatial...], w [O, I, spatial...]
    x = _dilate_and_pad(widened(np.transpose(lhs, lhs_spec)), lhs_dilation, padding)
    w = widened(np.transpose(rhs, rhs_spec))
    n, c = x.shape[:2]
    o = w.shape[0]
    out_spatial = [out_type.shape[out_spec[2 + i]] for i in range(len(window_strides))]
    groups, bgroups = feature_group_count, batch_group_count
    out = np.zeros([n // bgroups, o] + out_spatial, x.dtype)
    if 0 in out_spatial or 0 in out.shape:
        return np.transpose(out, np.argsort(out_spec)).astype(lhs.dtype)
    for g in range(groups * bgroups):
        # feature groups split the input channels; batch groups split the batch (group-major)
        cs = slice(g * (c // groups), (g + 1) * (c // groups)) if groups > 1 else slice(None)
        bs = slice(g * (n // bgroups), (g + 1) * (n // bgroups)) if bgroups > 1 else slice(None)
        os_ = slice(g * (o // (groups * bgroups)), (g + 1) * (o // (groups * bgroups)))
        xg, wg = x[bs, cs], w[os_]
        for pos in itertools.product(*(range(k) for k in w.shape[2:])):
            # the input elements that kernel position ``pos`` meets, for every output position
            window = tuple(
                slice(p * d, p * d + s * (m - 1) + 1, s)
                for p, d, s, m in zip(pos, rhs_dilation, window_strides, out_spatial)
            )
            patch = xg[(slice(None), slice(None)) + window]
            out[:, os_] += np.einsum("nc...,oc->no...", patch, wg[(slice(None), slice(None)) + pos])
    inverse = np.argsort(out_spec)  # canonical axis j lands on result axis out_spec[j]
    return np.transpose(out, inverse).astype(lhs.dtype)


def _conv_letters(spec, first: str, second: str) -> str:
    letters = [""] * len(spec)
    letters[spec[0]], letters[spec[1]] = first, second
    for i, axis in enumerate(spec[2:]):
        letters[axis] = str(i)
    return f"[{', '.join(letters)}]"


def _conv_emit(em, node, lhs, rhs):
    a = node.attr
    numbers = (
        f"{_conv_letters(a('lhs_spec'), 'b', 'f')}x{_conv_letters(a('rhs_spec'), 'o', 'i')}"
        f"->{_conv_letters(a('out_spec'), 'b', 'f')}"
    )
    return em.simple(
        "stablehlo.convolution",
        node,
        lhs,
        rhs,
        attrs={
            "dimension_numbers": f"#stablehlo.conv<{numbers}>",
            "window_strides": i64_array(a("window_strides")),
            "padding": padding_literal(a("padding")),
            "lhs_dilation": i64_array(a("lhs_dilation")),
            "rhs_dilation": i64_array(a("rhs_dilation")),
            "feature_group_count": f"{a('feature_group_count')} : i64",
            "batch_group_count": f"{a('batch_group_count')} : i64",
        },
    )


# dimension orders of the samples (lhs/out: batch, feature, spatial; kernel: out, in, spatial)
NCW, NCHW, NHWC = (0, 1, 2), (0, 1, 2, 3), (0, 3, 1, 2)
OIW, OIHW, HWIO = (0, 1, 2), (0, 1, 2, 3), (3, 2, 0, 1)


def _conv_attrs(nd, strides=None, padding=None, lhs_dil=None, rhs_dil=None, specs=None, **extra):
    ones = (1,) * nd
    lhs_spec, rhs_spec, out_spec = specs or ((NCW, OIW, NCW) if nd == 1 else (NCHW, OIHW, NCHW))
    return {
        "window_strides": strides or ones,
        "padding": padding or ((0, 0),) * nd,
        "lhs_dilation": lhs_dil or ones,
        "rhs_dilation": rhs_dil or ones,
        "lhs_spec": lhs_spec,
        "rhs_spec": rhs_spec,
        "out_spec": out_spec,
        **extra,
    }


def _conv_samples(rng):
    tol = {"rtol": 1e-4, "atol": 1e-4}
    yield Sample((random_operand(rng, (2, 3, 9)), random_operand(rng, (4, 3, 3))), _conv_attrs(1), **tol)
    yield Sample(
        (random_operand(rng, (2, 3, 10)), random_operand(rng, (4, 3, 3))),
        _conv_attrs(1, strides=(2,), padding=((1, 2),), rhs_dil=(2,)),
        **tol,
    )
    yield Sample(
        (random_operand(rng, (2, 3, 7, 6)), random_operand(rng, (5, 3, 3, 2))), _conv_attrs(2), **tol
    )
    yield Sample(
        (random_operand(rng, (1, 2, 7, 8)), random_operand(rng, (3, 2, 3, 3))),
        _conv_attrs(2, strides=(2, 3), padding=((1, 1), (2, 0))),
        **tol,
    )
    # NHWC input with HWIO kernel and NCHW output, like the TensorFlow layouts
    yield Sample(
        (random_operand(rng, (2, 6, 5, 3)), random_operand(rng, (2, 3, 3, 4))),
        _conv_attrs(2, padding=((0, 1), (1, 1)), specs=(NHWC, HWIO, NCHW)),
        **tol,
    )
    # lhs dilation (a transposed convolution) and rhs dilation, negative padding crops
    yield Sample(
        (random_operand(rng, (1, 2, 4, 5)), random_operand(rng, (2, 2, 2, 3))),
        _conv_attrs(2, padding=((1, -1), (2, 2)), lhs_dil=(2, 3), rhs_dil=(1, 2)),
        **tol,
    )
    # feature groups, and depthwise (one group per channel, two outputs each)
    yield Sample(
        (random_operand(rng, (2, 4, 6, 6)), random_operand(rng, (6, 2, 3, 3))),
        _conv_attrs(2, feature_group_count=2),
        **tol,
    )
    yield Sample(
        (random_operand(rng, (2, 3, 6, 5)), random_operand(rng, (6, 1, 3, 2))),
        _conv_attrs(2, strides=(1, 2), padding=((1, 1), (0, 1)), feature_group_count=3),
        **tol,
    )
    # batch groups (how the kernel gradient of a grouped convolution is written)
    yield Sample(
        (random_operand(rng, (4, 3, 6, 5)), random_operand(rng, (6, 3, 2, 2))),
        _conv_attrs(2, batch_group_count=2),
        **tol,
    )
    yield Sample(
        (random_operand(rng, (2, 3, 5), np.float64), random_operand(rng, (2, 3, 2), np.float64)),
        _conv_attrs(1),
    )
    yield Sample(
        (random_operand(rng, (2, 3, 5), np.int32), random_operand(rng, (2, 3, 2), np.int32)),
        _conv_attrs(1, padding=((1, 1),)),
    )
    yield Sample(
        (
            random_operand(rng, (1, 2, 6, 6), dtypes.bfloat16),
            random_operand(rng, (2, 2, 3, 3), dtypes.bfloat16),
        ),
        _conv_attrs(2),
        rtol=3e-2,
        atol=1e-1,
    )
    # a window larger than the input gives an empty result
    yield Sample((random_operand(rng, (1, 1, 2)), random_operand(rng, (1, 1, 3))), _conv_attrs(1))


def _convolution_flops(inputs, outputs, **attrs) -> int:
    """2 * output elements * kernel window * input channels per group (the kernel's input dimension)."""
    kernel = inputs[1].shape
    spec = attrs["rhs_spec"]  # (output feature, input feature, spatial...)
    window = 1
    for axis in spec[2:]:
        window *= kernel[axis]
    return 2 * outputs[0].size * window * kernel[spec[1]]


OPS = [
    OpDef(
        name="convolution",
        traits=(),
        flops=_convolution_flops,
        arity=2,
        batch=convolution_batch,
        attrs=(
            "window_strides",
            "padding",
            "lhs_dilation",
            "rhs_dilation",
            "lhs_spec",
            "rhs_spec",
            "out_spec",
        ),
        optional={"feature_group_count": 1, "batch_group_count": 1},
        infer=_conv_infer,
        reference=_conv_reference,
        emit=_conv_emit,
        samples=_conv_samples,
        vjp=conv_vjp,
        doc="N-d convolution (cross-correlation) of input lhs with kernel rhs. lhs_spec is (batch axis, "
        "feature axis, spatial axes...), rhs_spec (output-feature axis, input-feature axis, spatial "
        "axes...), out_spec (batch axis, feature axis, spatial axes...) like XLA's "
        "ConvDimensionNumbers. padding holds a (low, high) pair per spatial axis (negative crops); "
        "lhs_dilation spreads the input (transposed convolution), rhs_dilation the kernel. "
        "feature_group_count splits input features and kernel outputs into groups; "
        "batch_group_count splits the batch (group-major) and kernel outputs. Derivative: "
        "convolutions (the input's: ct with the reversed kernel, strides turned into lhs "
        "dilation; the kernel's: the input with ct as the kernel), like jax.",
    ),
]
