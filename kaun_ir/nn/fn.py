"""Neural-network functions with PyTorch's conventions (``torch.nn.functional``): convolutions
and pooling over channels-first inputs, and the activation functions of
:mod:`kaun_ir.nn.activations` (re-exported here: ``kn.fn.relu``, ``kn.fn.gelu``, ...).

Inputs are ``[N, C, spatial...]`` (or unbatched ``[C, spatial...]``), weights ``[O, C/groups,
kernel...]``. Convolutions lower to the ``convolution`` primitive, pools to ``reduce_window``.
All of them are differentiable; a max pool's gradient goes to the first maximal element of each
window (row-major), like PyTorch and jax.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.builder import current_path
from kaun_ir.names import public_dir
from kaun_ir.nn.activations import (
    celu,
    elu,
    gelu,
    gelu_approx,
    hard_sigmoid,
    hard_silu,
    hard_swish,
    hard_tanh,
    leaky_relu,
    log_sigmoid,
    mish,
    relu,
    relu6,
    selu,
    sigmoid,
    silu,
    softplus,
    softsign,
    swish,
    tanh,
)
from kaun_ir.nn.attention import causal_mask, dot_product_attention, rope
from kaun_ir.nn.functional import (
    batch_norm,
    batch_stats,
    dropout,
    embedding,
    layer_norm,
    rms_norm,
)
from kaun_ir.surface.creation import ones
from kaun_ir.surface.elementwise import add, divide
from kaun_ir.surface.function import op_function
from kaun_ir.surface.promotion import astype
from kaun_ir.surface.shapes import reshape
from kaun_ir.surface.tensor import apply, type_of

__all__ = [
    "conv1d",
    "conv2d",
    "max_pool1d",
    "max_pool2d",
    "avg_pool1d",
    "avg_pool2d",
    # the activation functions (kn.fn.relu ...)
    "relu",
    "relu6",
    "leaky_relu",
    "elu",
    "selu",
    "celu",
    "gelu",
    "gelu_approx",
    "silu",
    "swish",
    "softplus",
    "softsign",
    "mish",
    "log_sigmoid",
    "sigmoid",
    "tanh",
    "hard_sigmoid",
    "hard_tanh",
    "hard_swish",
    "hard_silu",
    # normalisation, dropout, embedding, attention (kn.fn.layer_norm ...)
    "batch_norm",
    "batch_stats",
    "layer_norm",
    "rms_norm",
    "dropout",
    "embedding",
    "dot_product_attention",
    "causal_mask",
    "rope",
]


def _where() -> str:
    path = current_path()
    return f"{path}: " if path else ""


def _tuple(value: Any, nd: int, name: str, fn: str) -> tuple[int, ...]:
    """An int or an nd-sequence of ints as an nd-tuple (PyTorch's ``_pair`` / ``_single``)."""
    if isinstance(value, (int, np.integer)):
        return (int(value),) * nd
    values = tuple(int(v) for v in value)
    if len(values) != nd:
        raise ValueError(f"{fn}: {name} needs 1 or {nd} values, got {list(values)}")
    return values


def _batched(x, nd: int, fn: str):
    """``x`` with a batch axis (added for unbatched input) and whether one was added."""
    t = type_of(x)
    if t.ndim == nd + 2:
        return x, False
    if t.ndim == nd + 1:
        return reshape(x, (1,) + t.shape), True
    raise ShapeError(f"{_where()}{fn}: expected a [N, C, {nd} spatial] or [C, {nd} spatial] input, got {t}")


# ------------------------------------------------------------------------------ convolution


def _conv(x, weight, bias, stride, padding, dilation, groups: int, nd: int, fn: str):
    tx, tw = type_of(x), type_of(weight)
    dtype = dtypes.result_type(tx.dtype, tw.dtype)
    if not dtypes.is_float(dtype):
        raise TypeError(f"{_where()}{fn} needs floating-point input and weight, got {tx} and {tw}")
    x, unbatched = _batched(astype(x, dtype), nd, fn)
    weight = astype(weight, dtype)
    if tw.ndim != nd + 2:
        raise ShapeError(
            f"{_where()}{fn}: weight must be [out_channels, in_channels/groups, {nd} kernel axes], got {tw}"
        )
    channels = type_of(x).shape[1]
    out_channels, per_group = tw.shape[:2]
    if groups < 1 or channels % groups or out_channels % groups:
        raise ShapeError(
            f"{_where()}{fn}: groups={groups} must divide the input channels ({channels}) and "
            f"the output channels ({out_channels})"
        )
    if per_group * groups != channels:
        raise ShapeError(
            f"{_where()}{fn}: input {tx} has {channels} channels but weight {tw} with "
            f"groups={groups} expects {per_group * groups}"
        )
    stride = _tuple(stride, nd, "stride", fn)
    dilation = _tuple(dilation, nd, "dilation", fn)
    kernel = tw.shape[2:]
    if isinstance(padding, str):
        if padding == "valid":
            pads = ((0, 0),) * nd
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError(f"{fn}: padding='same' is not supported for strided convolutions")
            # like PyTorch: the odd element of the total padding goes on the high side
            totals = [d * (k - 1) for d, k in zip(dilation, kernel)]
            pads = tuple((t // 2, t - t // 2) for t in totals)
        else:
            raise ValueError(f"{fn}: padding must be an int, a tuple, 'same' or 'valid', got {padding!r}")
    else:
        pads = tuple((p, p) for p in _tuple(padding, nd, "padding", fn))
        if any(p < 0 for p, _ in pads):
            raise ValueError(f"{fn}: padding must be non-negative, got {padding!r}")
    for axis in range(nd):
        size = type_of(x).shape[2 + axis] + sum(pads[axis])
        if size < dilation[axis] * (kernel[axis] - 1) + 1:
            raise ShapeError(
                f"{_where()}{fn}: kernel {list(kernel)} (dilation {list(dilation)}) is larger "
                f"than the padded input {tx}"
            )
    layout = tuple(range(nd + 2))  # NC..., OI..., NC...
    out = apply(
        "convolution",
        x,
        weight,
        window_strides=stride,
        padding=pads,
        lhs_dilation=(1,) * nd,
        rhs_dilation=dilation,
        lhs_spec=layout,
        rhs_spec=layout,
        out_spec=layout,
        feature_group_count=groups,
    )
    if bias is not None:
        tb = type_of(bias)
        if tb.shape != (out_channels,):
            raise ShapeError(f"{_where()}{fn}: bias must be [{out_channels}], got {tb}")
        out = add(out, reshape(astype(bias, dtype), (out_channels,) + (1,) * nd))
    return reshape(out, type_of(out).shape[1:]) if unbatched else out


@op_function
def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-d convolution (cross-correlation) like ``torch.nn.functional.conv1d``.

    Shapes: ``x [N, C, W]`` (or ``[C, W]``), ``weight [O, C/groups, K]``, ``bias [O]`` ->
    ``[N, O, W_out]`` with ``W_out = (W + 2*padding - dilation*(K-1) - 1) // stride + 1``.
    ``padding`` is an int, a 1-tuple, ``"valid"`` (0) or ``"same"`` (stride 1 only).
    """
    return _conv(x, weight, bias, stride, padding, dilation, groups, 1, "conv1d")


@op_function
def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-d convolution (cross-correlation) like ``torch.nn.functional.conv2d``.

    Shapes: ``x [N, C, H, W]`` (or ``[C, H, W]``), ``weight [O, C/groups, KH, KW]``, ``bias [O]``
    -> ``[N, O, H_out, W_out]``, each ``out = (in + 2*pad - dilation*(K-1) - 1) // stride + 1``.
    ``stride``, ``padding``, ``dilation`` are ints or pairs; ``padding`` may also be ``"valid"``
    or ``"same"`` (stride 1 only; an odd total puts the extra row/column at the end).
    """
    return _conv(x, weight, bias, stride, padding, dilation, groups, 2, "conv2d")


# ---------------------------------------------------------------------------------- pooling


def _pool_window(x, kernel_size, stride, padding, dilation, nd: int, fn: str):
    """Input with a batch axis, reduce_window attributes over it, and whether to drop the batch."""
    x, unbatched = _batched(x, nd, fn)
    kernel = _tuple(kernel_size, nd, "kernel_size", fn)
    stride = kernel if stride is None else _tuple(stride, nd, "stride", fn)
    pads = _tuple(padding, nd, "padding", fn)
    dilation = _tuple(dilation, nd, "dilation", fn)
    if min(kernel) < 1 or min(stride) < 1 or min(dilation) < 1:
        raise ValueError(f"{fn}: kernel_size, stride and dilation must be positive")
    for k, p, d in zip(kernel, pads, dilation):
        if not 0 <= p <= (d * (k - 1) + 1) // 2:  # PyTorch's rule
            raise ValueError(
                f"{fn}: padding should be at most half of the effective kernel size, got "
                f"padding {list(pads)} for kernel {list(kernel)}"
            )
    t = type_of(x)
    for axis in range(nd):
        if t.shape[2 + axis] + 2 * pads[axis] < dilation[axis] * (kernel[axis] - 1) + 1:
            raise ShapeError(f"{_where()}{fn}: kernel {list(kernel)} is larger than the padded input {t}")
    attrs = {
        "window_dimensions": (1, 1) + kernel,
        "window_strides": (1, 1) + stride,
        "base_dilations": (1,) * (nd + 2),
        "window_dilations": (1, 1) + dilation,
        "padding": ((0, 0), (0, 0)) + tuple((p, p) for p in pads),
    }
    return x, attrs, unbatched


def _unbatch(out, unbatched: bool):
    return reshape(out, type_of(out).shape[1:]) if unbatched else out


def _max_pool(x, kernel_size, stride, padding, dilation, nd: int, fn: str):
    dtype = type_of(x).dtype
    if dtypes.is_bool(dtype):
        raise TypeError(f"{fn} needs a numeric input, got bool")
    x, attrs, unbatched = _pool_window(x, kernel_size, stride, padding, dilation, nd, fn)
    # the identity of max: padding never wins
    lowest = -np.inf if dtypes.is_float(dtype) else np.iinfo(dtype).min
    out = apply("reduce_window", x, np.asarray(lowest, dtype), kind="max", **attrs)
    return _unbatch(out, unbatched)


def _avg_pool(x, kernel_size, stride, padding, count_include_pad: bool, nd: int, fn: str):
    dtype = type_of(x).dtype
    if not dtypes.is_float(dtype):
        raise TypeError(f"{fn} needs a floating-point input, got {dtypes.short_name(dtype)}")
    x, attrs, unbatched = _pool_window(x, kernel_size, stride, padding, 1, nd, fn)
    total = apply("reduce_window", x, np.asarray(0, dtype), kind="sum", **attrs)
    if count_include_pad:
        out = divide(total, float(np.prod(attrs["window_dimensions"])))
    else:
        # per window, the number of real (unpadded) elements: the same window sum over ones
        spatial = type_of(x).shape[2:]
        count = apply(
            "reduce_window", ones((1, 1) + spatial, dtype), np.asarray(0, dtype), kind="sum", **attrs
        )
        out = divide(total, count)
    return _unbatch(out, unbatched)


@op_function
def max_pool1d(x, kernel_size, stride=None, padding=0, dilation=1):
    """1-d max pooling like ``torch.nn.functional.max_pool1d`` (padding is -inf).

    Shapes: ``[N, C, W]`` (or ``[C, W]``) -> ``[N, C, W_out]``,
    ``W_out = (W + 2*padding - dilation*(kernel_size-1) - 1) // stride + 1``; stride defaults to
    kernel_size.
    """
    return _max_pool(x, kernel_size, stride, padding, dilation, 1, "max_pool1d")


@op_function
def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1):
    """2-d max pooling like ``torch.nn.functional.max_pool2d`` (padding is -inf).

    Shapes: ``[N, C, H, W]`` (or ``[C, H, W]``) -> ``[N, C, H_out, W_out]``, each
    ``out = (in + 2*padding - dilation*(kernel-1) - 1) // stride + 1``; ``kernel_size``,
    ``stride`` (default: kernel_size), ``padding``, ``dilation`` are ints or pairs.
    """
    return _max_pool(x, kernel_size, stride, padding, dilation, 2, "max_pool2d")


@op_function
def avg_pool1d(x, kernel_size, stride=None, padding=0, count_include_pad=True):
    """1-d average pooling like ``torch.nn.functional.avg_pool1d``.

    Shapes: ``[N, C, W]`` (or ``[C, W]``) -> ``[N, C, W_out]``,
    ``W_out = (W + 2*padding - kernel_size) // stride + 1``. Zero padding counts in the average
    unless ``count_include_pad=False``.
    """
    return _avg_pool(x, kernel_size, stride, padding, count_include_pad, 1, "avg_pool1d")


@op_function
def avg_pool2d(x, kernel_size, stride=None, padding=0, count_include_pad=True):
    """2-d average pooling like ``torch.nn.functional.avg_pool2d``.

    Shapes: ``[N, C, H, W]`` (or ``[C, H, W]``) -> ``[N, C, H_out, W_out]``, each
    ``out = (in + 2*padding - kernel) // stride + 1``. Zero padding counts in the average
    unless ``count_include_pad=False``.
    """
    return _avg_pool(x, kernel_size, stride, padding, count_include_pad, 2, "avg_pool2d")


__dir__ = public_dir(__all__)
