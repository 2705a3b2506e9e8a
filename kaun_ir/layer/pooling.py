"""Pooling and reshaping layers: ``max_pool1d/2d``, ``avg_pool1d/2d`` and ``flatten``.

Each returns a :class:`~kaun_ir.layer.core.Layer`. Hyper-parameters are checked when the layer
is built (``ValueError`` naming the argument); input shapes when it is applied (``ShapeError``
naming the layer path, e.g. ``"1.linear: ..."``).
"""

from __future__ import annotations

import math

from kaun_ir.errors import ShapeError
from kaun_ir.layer.construct import (
    int_tuple,
    path_prefix,
    stateless,
)
from kaun_ir.layer.core import Layer
from kaun_ir.nn import fn
from kaun_ir.surface.shapes import reshape
from kaun_ir.surface.tensor import type_of

__all__ = ["max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d", "flatten"]


def _pool_layer(nd: int, kind: str, kernel_size, stride, padding) -> Layer:
    name = f"{kind}_pool{nd}d"
    kernel = int_tuple(kernel_size, nd, "kernel_size", name, 1)
    strides = kernel if stride is None else int_tuple(stride, nd, "stride", name, 1)
    pads = int_tuple(padding, nd, "padding", name, 0)
    if any(2 * p > k for p, k in zip(pads, kernel)):
        raise ValueError(
            f"layer.{name}: padding {padding!r} must be at most half the kernel size {kernel_size!r}"
        )
    pool = getattr(fn, name)
    return stateless(name, lambda p, x, training, ctx: pool(x, kernel, strides, pads))


def max_pool1d(kernel_size, stride=None, padding=0) -> Layer:
    """Max pooling over ``[N, C, L]``; ``stride`` defaults to ``kernel_size`` (``kn.fn.max_pool1d``)."""
    return _pool_layer(1, "max", kernel_size, stride, padding)


def max_pool2d(kernel_size, stride=None, padding=0) -> Layer:
    """Max pooling over NCHW ``[N, C, H, W]``; ``stride`` defaults to ``kernel_size``
    (``kn.fn.max_pool2d``)."""
    return _pool_layer(2, "max", kernel_size, stride, padding)


def avg_pool1d(kernel_size, stride=None, padding=0) -> Layer:
    """Average pooling over ``[N, C, L]``; ``stride`` defaults to ``kernel_size``."""
    return _pool_layer(1, "avg", kernel_size, stride, padding)


def avg_pool2d(kernel_size, stride=None, padding=0) -> Layer:
    """Average pooling over NCHW ``[N, C, H, W]``; ``stride`` defaults to ``kernel_size``
    (``kn.fn.avg_pool2d``, zero padding counted)."""
    return _pool_layer(2, "avg", kernel_size, stride, padding)


def flatten() -> Layer:
    """``[N, d1, d2, ...] -> [N, d1 * d2 * ...]`` (the batch axis is kept)."""

    def forward(p, x, training, ctx):
        t = type_of(x)
        if t.ndim < 1:
            raise ShapeError(f"{path_prefix()}flatten expects an input with a batch axis, got {t}")
        return reshape(x, (t.shape[0], math.prod(t.shape[1:])))

    return stateless("flatten", forward)
