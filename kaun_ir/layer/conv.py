"""Convolution layers: ``conv1d`` and ``conv2d``.

Each returns a :class:`~kaun_ir.layer.core.Layer`. Hyper-parameters are checked when the layer
is built (``ValueError`` naming the argument); input shapes when it is applied (``ShapeError``
naming the layer path, e.g. ``"1.linear: ..."``).
"""

from __future__ import annotations

from typing import Any

from kaun_ir.errors import ShapeError
from kaun_ir.layer.construct import (
    infer_size,
    int_tuple,
    make_param,
    optional_positive_int,
    path_prefix,
    positive_int,
    resolve_init,
)
from kaun_ir.layer.core import Layer, Vars
from kaun_ir.nn import fn
from kaun_ir.nn import init as initializers

__all__ = ["conv1d", "conv2d"]


def _conv_layer(
    nd: int,
    in_channels,
    out_channels,
    kernel_size,
    stride,
    padding,
    dilation,
    groups,
    weight_init,
    bias_init,
    use_bias,
) -> Layer:
    name = f"conv{nd}d"
    if out_channels is None:
        raise ValueError(
            f"layer.{name}: out_channels is required ({name}(out_channels=n) infers in_channels "
            "from the example given to layer.init)"
        )
    in_channels = optional_positive_int(in_channels, "in_channels", name)
    out_channels = positive_int(out_channels, "out_channels", name)
    groups = positive_int(groups, "groups", name)
    if (in_channels or groups) % groups or out_channels % groups:
        raise ValueError(
            f"layer.{name}: groups={groups} must divide in_channels ({in_channels}) and "
            f"out_channels ({out_channels})"
        )
    kernel = int_tuple(kernel_size, nd, "kernel_size", name, 1)
    strides = int_tuple(stride, nd, "stride", name, 1)
    dilations = int_tuple(dilation, nd, "dilation", name, 1)
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise ValueError(f"layer.{name}: padding must be 'same', 'valid' or ints, got {padding!r}")
        if padding == "same" and any(s != 1 for s in strides):
            raise ValueError(f"layer.{name}: padding='same' needs stride 1, got stride={stride!r}")
        pads: Any = padding
    else:
        pads = int_tuple(padding, nd, "padding", name, 0)
    weight_init = resolve_init(weight_init, initializers.glorot_uniform(), "weight_init", name)
    bias_init = resolve_init(bias_init, initializers.zeros, "bias_init", name)
    conv = fn.conv1d if nd == 1 else fn.conv2d
    spatial = "H, W" if nd == 2 else "L"

    def init_(dt, x=None):
        # channels are axis 1 of a batched input [N, C, ...], axis 0 of an unbatched [C, ...]
        axis = 1 if x is not None and len(getattr(x, "shape", ())) == nd + 2 else 0
        channels = infer_size(
            in_channels, x, axis, nd + 1, "in_channels", name, f"[N, C, {spatial}] or [C, {spatial}]"
        )
        if channels % groups:
            raise ShapeError(
                f"{path_prefix()}{name}: groups={groups} must divide the input's {channels} channels"
            )
        p = {"weight": make_param(weight_init, (out_channels, channels // groups) + kernel, dt)}
        if use_bias:
            p["bias"] = make_param(bias_init, (out_channels,), dt)
        return Vars(p, [], dt)

    def apply_(p, state, x, *, training, ctx):
        return conv(
            x, p["weight"], p.get("bias"), stride=strides, padding=pads, dilation=dilations, groups=groups
        ), state

    return Layer(init_, apply_, name)


def conv1d(
    in_channels: int | None = None,
    out_channels: int | None = None,
    kernel_size=3,
    stride=1,
    padding="same",
    dilation=1,
    groups: int = 1,
    weight_init=None,
    bias_init=None,
    use_bias: bool = True,
) -> Layer:
    """1-d convolution over ``[N, C, L]`` (or ``[C, L]``) -> ``[N, out_channels, L_out]``
    (``kn.fn.conv1d``). Parameters ``{"weight": [out, in/groups, k], "bias": [out]}``;
    ``padding`` is ``"same"`` (default; stride 1 only), ``"valid"`` or an int. ``in_channels``
    may be left out (``conv1d(out_channels=8)``) and is then read from the example given to
    ``layer.init(model, example)``. Default initialisers: glorot_uniform (fans per
    ``kn.init``'s [out, in, *kernel] rule) and zeros."""
    return _conv_layer(
        1,
        in_channels,
        out_channels,
        kernel_size,
        stride,
        padding,
        dilation,
        groups,
        weight_init,
        bias_init,
        use_bias,
    )


def conv2d(
    in_channels: int | None = None,
    out_channels: int | None = None,
    kernel_size=3,
    stride=1,
    padding="same",
    dilation=1,
    groups: int = 1,
    weight_init=None,
    bias_init=None,
    use_bias: bool = True,
) -> Layer:
    """2-d convolution over NCHW ``[N, C, H, W]`` (or ``[C, H, W]``) -> ``[N, out_channels, H', W']``
    (``kn.fn.conv2d``, PyTorch's conventions). Parameters ``{"weight": [out, in/groups, kh, kw],
    "bias": [out]}``; ``kernel_size``, ``stride``, ``dilation``, ``padding`` are ints or pairs,
    ``padding`` also ``"same"`` (the default, stride 1 only: PyTorch's default is 0, so pass
    ``padding=0`` when porting) or ``"valid"``. ``in_channels`` may be
    left out (``conv2d(out_channels=32, kernel_size=3)``) and is then read from the example given
    to ``layer.init(model, example)``. Default initialisers: glorot_uniform (fans per
    ``kn.init``'s [out, in, kh, kw] rule) and zeros."""
    return _conv_layer(
        2,
        in_channels,
        out_channels,
        kernel_size,
        stride,
        padding,
        dilation,
        groups,
        weight_init,
        bias_init,
        use_bias,
    )
