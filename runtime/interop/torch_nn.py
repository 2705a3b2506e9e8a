"""The ATen table's neural-network ops: matrix products, convolution (also transposed),
upsampling, pooling, batch / group / layer normalisation and dropout."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import TorchImportError
from kaun_ir.runtime.interop.torch_args import rank as _ndim
from kaun_ir.runtime.interop.torch_args import registrar
from kaun_ir.runtime.interop.torch_args import shape as _shape
from kaun_ir.surface import creation, elementwise, indexing, linalg, reductions, shapes, take
from kaun_ir.surface.tensor import apply, type_of

#: this family's entries of the ATen table (``torch_ops.ATEN`` merges the families)
ATEN: dict[str, Callable] = {}
_register = registrar(ATEN)


# ------------------------------------------------------------------------------ linear algebra


@_register("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def matmul(a, b):
    """``a @ b``."""
    return linalg.matmul(a, b)


@_register("aten.addmm.default")
def addmm(bias, a, b, beta=1, alpha=1):
    """``beta * bias + alpha * (a @ b)``."""
    product = linalg.matmul(a, b)
    if alpha != 1:
        product = elementwise.multiply(product, alpha)
    if beta == 0:
        return product
    return elementwise.add(product, bias if beta == 1 else elementwise.multiply(bias, beta))


# ------------------------------------------------------------------------------ neural network


@_register("aten.convolution.default")
def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """N-d convolution (cross-correlation), ``NC...`` input and ``OI...`` weight, onto the
    ``convolution`` primitive. A transposed convolution (weight ``[I, O/groups, k...]``) is the
    convolution of the input dilated by the stride with the spatially flipped kernel, its two
    feature axes swapped per group, padded by ``dilation * (k - 1) - padding`` (plus
    ``output_padding`` at the high end)."""
    nd = _ndim(x) - 2
    layout = tuple(range(nd + 2))
    kernel = _shape(weight)[2:]
    if transposed:
        c_in, c_out_g = _shape(weight)[:2]
        w = shapes.reshape(weight, (groups, c_in // groups, c_out_g) + kernel)
        w = shapes.transpose(w, (0, 2, 1) + tuple(range(3, nd + 3)))
        w = shapes.reshape(w, (groups * c_out_g, c_in // groups) + kernel)
        weight = indexing.getitem(w, (slice(None), slice(None)) + (slice(None, None, -1),) * nd)
        pads = tuple(
            (d * (k - 1) - p, d * (k - 1) - p + o)
            for k, p, d, o in zip(kernel, padding, dilation, output_padding)
        )
        strides, lhs_dilation = (1,) * nd, tuple(stride)
    else:
        pads, strides, lhs_dilation = tuple((p, p) for p in padding), tuple(stride), (1,) * nd
    out = apply(
        "convolution",
        x,
        weight,
        window_strides=strides,
        padding=pads,
        lhs_dilation=lhs_dilation,
        rhs_dilation=tuple(dilation),
        lhs_spec=layout,
        rhs_spec=layout,
        out_spec=layout,
        feature_group_count=groups,
    )
    if bias is not None:
        out = elementwise.add(out, shapes.reshape(bias, (-1,) + (1,) * nd))
    return out


@_register("aten.upsample_nearest2d.vec", "aten.upsample_nearest2d.default", "aten.upsample_nearest1d.vec")
def upsample_nearest(x, output_size, scale_factors=None, *rest):
    """Nearest-neighbour upsampling: output position ``i`` reads input ``floor(i * in / out)``
    (``take`` along each spatial axis; with ``scale_factors``, ``floor(i / scale)``)."""
    nd = _ndim(x) - 2
    sizes = _shape(x)[2:]
    if isinstance(scale_factors, (list, tuple)) and scale_factors:
        scales = [float(f) for f in scale_factors]
        outs = (
            [int(math.floor(n * f)) for n, f in zip(sizes, scales)]
            if output_size is None
            else list(output_size)
        )
        steps = [1.0 / f for f in scales]
    else:
        outs = list(output_size)
        steps = [n / o for n, o in zip(sizes, outs)]
    for axis in range(nd):
        index = np.minimum(np.floor(np.arange(outs[axis]) * steps[axis]).astype(np.int32), sizes[axis] - 1)
        x = take.take(x, index, axis=2 + axis)
    return x


@_register("aten.elu.default")
def elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    """``scale * x`` for ``x > 0``, else ``scale * alpha * (exp(input_scale * x) - 1)``."""
    negative = elementwise.multiply(elementwise.expm1(elementwise.multiply(x, input_scale)), alpha * scale)
    return elementwise.where(elementwise.greater(x, 0), elementwise.multiply(x, scale), negative)


def _window_attrs(nd: int, kernel, stride, padding, dilation=1):
    def per_axis(v):
        v = list(v) if isinstance(v, (list, tuple)) else [v]
        return tuple(v * nd if len(v) == 1 else v)

    kernel = per_axis(kernel)
    stride = (
        kernel if stride is None or (isinstance(stride, (list, tuple)) and not stride) else per_axis(stride)
    )
    return {
        "window_dimensions": (1, 1) + kernel,
        "window_strides": (1, 1) + stride,
        "base_dilations": (1,) * (nd + 2),
        "window_dilations": (1, 1) + per_axis(dilation),
        "padding": ((0, 0), (0, 0)) + tuple((p, p) for p in per_axis(padding)),
    }


@_register("aten.max_pool2d_with_indices.default", "aten.max_pool1d_with_indices.default")
def max_pool_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """Max pooling (padding never wins) onto ``reduce_window``; the indices are not computed."""
    if ceil_mode:
        raise TorchImportError("max pooling with ceil_mode=True has no mapping yet")
    dt = type_of(x).dtype
    lowest = -np.inf if dtypes.is_float(dt) else np.iinfo(dt).min
    attrs = _window_attrs(_ndim(x) - 2, kernel_size, stride, padding, dilation)
    return apply("reduce_window", x, np.asarray(lowest, dt), kind="max", **attrs), None


@_register("aten.avg_pool2d.default", "aten.avg_pool1d.default")
def avg_pool(
    x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
):
    """Average pooling: a ``reduce_window`` sum divided by the window size (or, without
    ``count_include_pad``, by the same sum over ones)."""
    if ceil_mode:
        raise TorchImportError("average pooling with ceil_mode=True has no mapping yet")
    dt = type_of(x).dtype
    attrs = _window_attrs(_ndim(x) - 2, kernel_size, stride, padding)
    total = apply("reduce_window", x, np.asarray(0, dt), kind="sum", **attrs)
    if divisor_override:
        return elementwise.true_divide(total, float(divisor_override))
    if count_include_pad:
        return elementwise.true_divide(total, float(np.prod(attrs["window_dimensions"])))
    count = apply(
        "reduce_window", creation.ones((1, 1) + _shape(x)[2:], dt), np.asarray(0, dt), kind="sum", **attrs
    )
    return elementwise.true_divide(total, count)


@_register("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
def adaptive_avg_pool2d(x, output_size):
    """Adaptive average pooling when each output size divides the input size (decomposed:
    ``reshape`` and ``mean``)."""
    *lead, h, w = _shape(x)
    oh, ow = output_size
    if h % oh or w % ow:
        raise TorchImportError(f"adaptive average pooling of {h}x{w} to {oh}x{ow}: sizes must divide")
    blocks = shapes.reshape(x, (*lead, oh, h // oh, ow, w // ow))
    n = len(lead)
    return reductions.mean(blocks, axis=(n + 1, n + 3))


def _per_channel(v, ndim: int):
    return shapes.reshape(v, (1, -1) + (1,) * (ndim - 2))


def _normalize(x, mean_, var_, weight, bias, eps):
    n = _ndim(x)
    out = elementwise.multiply(
        elementwise.subtract(x, _per_channel(mean_, n)), _per_channel(elementwise.rsqrt(var_ + eps), n)
    )
    if weight is not None:
        out = elementwise.multiply(out, _per_channel(weight, n))
    if bias is not None:
        out = elementwise.add(out, _per_channel(bias, n))
    return out


@_register("aten._native_batch_norm_legit_no_training.default")
def batch_norm_inference(x, weight, bias, running_mean, running_var, momentum, eps):
    """Batch norm with the running statistics (eval mode); the saved statistics are not computed."""
    return _normalize(x, running_mean, running_var, weight, bias, eps), None, None


@_register("aten._native_batch_norm_legit_functional.default")
def batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """Batch norm (train mode: the batch's statistics) and the updated running statistics,
    ``(1 - momentum) * running + momentum * batch`` (the batch variance unbiased, as in PyTorch)."""
    if not training:
        out = batch_norm_inference(x, weight, bias, running_mean, running_var, momentum, eps)[0]
        return out, None, None, running_mean, running_var
    axes = tuple(i for i in range(_ndim(x)) if i != 1)
    count = int(np.prod([_shape(x)[i] for i in axes]))
    batch_mean = reductions.mean(x, axis=axes)
    batch_var = reductions.var(x, axis=axes)
    out = _normalize(x, batch_mean, batch_var, weight, bias, eps)
    unbiased = elementwise.multiply(batch_var, count / max(count - 1, 1))
    new_mean = elementwise.add(
        elementwise.multiply(running_mean, 1 - momentum), elementwise.multiply(batch_mean, momentum)
    )
    new_var = elementwise.add(
        elementwise.multiply(running_var, 1 - momentum), elementwise.multiply(unbiased, momentum)
    )
    return out, batch_mean, elementwise.rsqrt(batch_var + eps), new_mean, new_var


@_register("aten._native_batch_norm_legit.no_stats")
def batch_norm_no_stats(x, weight, bias, training, momentum, eps):
    """Batch norm with the batch's statistics and no running ones (instance norm's form)."""
    axes = tuple(i for i in range(_ndim(x)) if i != 1)
    batch_mean = reductions.mean(x, axis=axes)
    batch_var = reductions.var(x, axis=axes)
    out = _normalize(x, batch_mean, batch_var, weight, bias, eps)
    return out, batch_mean, elementwise.rsqrt(batch_var + eps)


@_register("aten.native_group_norm.default")
def group_norm(x, weight, bias, n, c, hw, group, eps):
    """Group norm: mean and variance over each group of ``c / group`` channels and the spatial
    axes; also the mean and ``1/std`` per ``[n, group]``."""
    shape = _shape(x)
    grouped = shapes.reshape(x, (shape[0], group, -1))
    mean_ = reductions.mean(grouped, axis=2, keepdims=True)
    centered = elementwise.subtract(grouped, mean_)
    var_ = reductions.mean(elementwise.multiply(centered, centered), axis=2, keepdims=True)
    rstd = elementwise.rsqrt(var_ + eps)
    out = shapes.reshape(elementwise.multiply(centered, rstd), shape)
    per_channel = (1, -1) + (1,) * (len(shape) - 2)
    if weight is not None:
        out = elementwise.multiply(out, shapes.reshape(weight, per_channel))
    if bias is not None:
        out = elementwise.add(out, shapes.reshape(bias, per_channel))
    return out, shapes.reshape(mean_, (shape[0], group)), shapes.reshape(rstd, (shape[0], group))


@_register("aten.native_layer_norm.default")
def layer_norm(x, normalized_shape, weight, bias, eps):
    """Layer norm over the last ``len(normalized_shape)`` axes; also the mean and ``1/std``."""
    axes = tuple(range(_ndim(x) - len(normalized_shape), _ndim(x)))
    mean_ = reductions.mean(x, axis=axes, keepdims=True)
    centered = elementwise.subtract(x, mean_)
    rstd = elementwise.rsqrt(
        reductions.mean(elementwise.multiply(centered, centered), axis=axes, keepdims=True) + eps
    )
    out = elementwise.multiply(centered, rstd)
    if weight is not None:
        out = elementwise.multiply(out, weight)
    if bias is not None:
        out = elementwise.add(out, bias)
    return out, mean_, rstd


@_register("aten.native_dropout.default")
def native_dropout(x, p, train):
    """Dropout with ``train=False`` or ``p=0`` (the identity); random dropout is not mapped."""
    if train and p > 0:
        raise TorchImportError(
            "aten.native_dropout in train mode needs random numbers: export the module in eval mode "
            "(module.eval()) or with dropout probability 0"
        )
    return x, None
