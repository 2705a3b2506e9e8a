"""Functional neural-network building blocks (re-exported in ``kn.fn``): normalisation, dropout
and embedding lookup, and the checks they share with ``kaun_ir.nn.attention``.

Pure functions of their arguments (parameters and keys are passed in); the layers of
``kn.layer`` hold the parameters and call these. Every function traces, compiles and
differentiates, and works on concrete arrays.

Layouts:

* ``batch_norm``: channels-first like PyTorch, the feature axis is 1 (``[N, C]``, ``[N, C, L]``,
  ``[N, C, H, W]`` ...); statistics are over every other axis.

Low-precision inputs (float16 / bfloat16) are normalised in float32 and the
result is cast back.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.builder import current_path
from kaun_ir.surface import random
from kaun_ir.surface.creation import zeros_like
from kaun_ir.surface.elementwise import rsqrt, stop_gradient, where
from kaun_ir.surface.function import op_function
from kaun_ir.surface.promotion import astype
from kaun_ir.surface.reductions import mean as _mean
from kaun_ir.surface.reductions import sum as _sum
from kaun_ir.surface.shapes import reshape
from kaun_ir.surface.take import take
from kaun_ir.surface.tensor import type_of
from kaun_ir.transforms.custom import custom_vjp

__all__ = [
    "batch_norm",
    "batch_stats",
    "layer_norm",
    "rms_norm",
    "dropout",
    "embedding",
]

_LOW_PRECISION = (dtypes.float16, dtypes.bfloat16)


def where_prefix() -> str:
    """``"<layer path>: "`` for error messages (empty outside a layer)."""
    path = current_path()
    return f"{path}: " if path else ""


def float_input(x, fn: str):
    """The type of ``x``; TypeError naming ``fn`` unless it is floating point."""
    t = type_of(x)
    if not dtypes.is_float(t.dtype):
        raise TypeError(f"{where_prefix()}{fn} needs a floating-point input, got {t}")
    return t


def compute_dtype(dt):
    """The dtype to compute in: float32 for float16 / bfloat16 inputs, else ``dt`` itself."""
    return dtypes.float32 if dt in _LOW_PRECISION else dt


# ------------------------------------------------------------------------------ batch norm


def _feature_axis(shape: tuple[int, ...], axis: int | None, fn: str) -> int:
    if len(shape) < 2:
        raise ShapeError(
            f"{where_prefix()}{fn}: expected an input [N, C, ...] with a batch axis, got shape {list(shape)}"
        )
    axis = 1 if axis is None else axis
    if not -len(shape) <= axis < len(shape):
        raise ShapeError(f"{where_prefix()}{fn}: axis {axis} is out of range for shape {list(shape)}")
    return axis % len(shape)


def _per_feature(value, shape: tuple[int, ...], axis: int, dtype, what: str, fn: str):
    """A ``[C]`` vector reshaped to broadcast along ``axis`` of ``shape``."""
    t = type_of(value)
    if t.shape != (shape[axis],):
        raise ShapeError(
            f"{where_prefix()}{fn}: {what} must have shape [{shape[axis]}] (the size of axis {axis} "
            f"of the input {list(shape)}), got {t}"
        )
    kept = tuple(shape[axis] if i == axis else 1 for i in range(len(shape)))
    return reshape(astype(value, dtype), kept)


@op_function
def batch_stats(x, axis=None):
    """Mean and (biased) variance of ``x`` per feature, over every axis but the feature axis.

    ``x``: ``[N, C, ...]`` with the features on ``axis`` (default 1) -> ``(mean [C], var [C])``.
    These are what batch norm normalises with in training; feed them to :func:`batch_norm`.
    """
    t = float_input(x, "batch_stats")
    axis = _feature_axis(t.shape, axis, "batch_stats")
    compute = compute_dtype(t.dtype)
    xc = astype(x, compute)
    others = tuple(i for i in range(t.ndim) if i != axis)
    mu = _mean(xc, axis=others, keepdims=True)
    centred = xc - mu
    var = _mean(centred * centred, axis=others)
    return astype(reshape(mu, (t.shape[axis],)), t.dtype), astype(var, t.dtype)


@op_function
def batch_norm(x, scale, bias, mean, var, eps=1e-5, axis=None):
    """Batch normalisation with given statistics: ``(x - mean) / sqrt(var + eps) * scale + bias``.

    ``x``: ``[N, C, ...]`` (features on ``axis``, default 1: PyTorch's channels-first layout);
    ``scale``, ``bias``, ``mean``, ``var``: ``[C]`` (``scale`` / ``bias`` may be None). Result:
    the shape of ``x``. With running statistics this is the inference form; with
    ``batch_stats(x)`` it is the training form (the gradient flows through the statistics).
    """
    t = float_input(x, "batch_norm")
    axis = _feature_axis(t.shape, axis, "batch_norm")
    compute = compute_dtype(t.dtype)
    mu = _per_feature(mean, t.shape, axis, compute, "mean", "batch_norm")
    inv = rsqrt(_per_feature(var, t.shape, axis, compute, "var", "batch_norm") + float(eps))
    if scale is not None:
        inv = inv * _per_feature(scale, t.shape, axis, compute, "scale", "batch_norm")
    y = (astype(x, compute) - mu) * inv
    if bias is not None:
        y = y + _per_feature(bias, t.shape, axis, compute, "bias", "batch_norm")
    return astype(y, t.dtype)


def _training_parts(x, scale, bias, eps, axis):
    """The training-mode forward: ``(y, mean, var, centred, inv)``, statistics keeping their
    broadcast shape ``[1, .., C, .., 1]`` and in the compute dtype."""
    t = type_of(x)
    compute = compute_dtype(t.dtype)
    others = tuple(i for i in range(t.ndim) if i != axis)
    xc = astype(x, compute)
    mu = _mean(xc, axis=others, keepdims=True)
    centred = xc - mu
    var = _mean(centred * centred, axis=others, keepdims=True)
    inv = rsqrt(var + float(eps))
    scale_b = _per_feature(scale, t.shape, axis, compute, "scale", "batch_norm_training")
    bias_b = _per_feature(bias, t.shape, axis, compute, "bias", "batch_norm_training")
    y = centred * (inv * scale_b) + bias_b
    return astype(y, t.dtype), mu, var, centred, inv


def _stats_out(x, mu, var, axis):
    t = type_of(x)
    c = (t.shape[axis],)
    return stop_gradient(astype(reshape(mu, c), t.dtype)), stop_gradient(astype(reshape(var, c), t.dtype))


@custom_vjp
def _batch_norm_training(x, scale, bias, eps, axis):
    y, mu, var, _, _ = _training_parts(x, scale, bias, eps, axis)
    return (y, *_stats_out(x, mu, var, axis))


def _batch_norm_training_fwd(x, scale, bias, eps, axis):
    y, mu, var, centred, inv = _training_parts(x, scale, bias, eps, axis)
    return (y, *_stats_out(x, mu, var, axis)), (centred, inv, scale, bias)


def _batch_norm_training_bwd(residuals, g):
    # with xhat = (x - mean) * inv: dx = scale * inv * (dy - mean(dy) - xhat * mean(dy * xhat)),
    # dscale = sum(dy * xhat), dbias = sum(dy): two reductions over dy, where differentiating
    # the statistics op by op takes four. The mean and var outputs carry no gradient.
    centred, inv, scale, bias = residuals
    t, kept = type_of(centred), type_of(inv).shape
    # the statistics' axes: every axis where ``inv`` ([1, .., C, .., 1]) has size 1 (a size-1
    # feature axis among them changes nothing)
    others = tuple(i for i in range(t.ndim) if kept[i] == 1)
    n = t.size // type_of(inv).size
    dyc = astype(g[0], t.dtype)
    sum_dy = _sum(dyc, axis=others, keepdims=True)
    sum_dy_xc = _sum(dyc * centred, axis=others, keepdims=True)
    k = reshape(astype(scale, t.dtype), kept) * inv
    dx = k * (dyc - sum_dy * (1.0 / n) - centred * (inv * inv * sum_dy_xc * (1.0 / n)))
    c = type_of(scale).shape
    dscale = astype(reshape(sum_dy_xc * inv, c), type_of(scale).dtype)
    dbias = astype(reshape(sum_dy, c), type_of(bias).dtype)
    return astype(dx, type_of(g[0]).dtype), dscale, dbias, None, None


_batch_norm_training.defvjp(_batch_norm_training_fwd, _batch_norm_training_bwd)


@op_function
def batch_norm_training(x, scale, bias, eps=1e-5, axis=None):
    """Training-mode batch normalisation in one: ``(y, mean, var)``, ``y`` normalised with the
    batch's own mean and biased variance (the gradient flows through them), ``mean`` / ``var``
    (``[C]``, without gradient) for the running statistics.

    The same values as ``batch_norm(x, scale, bias, *batch_stats(x), eps, axis)``, with a
    derivative rule of its own: the input gradient takes two reductions over the cotangent
    (``sum(dy)``, ``sum(dy * (x - mean))``, also the bias and scale gradients) instead of the
    four that differentiating the statistics op by op gives. ``scale`` and ``bias``: ``[C]``.
    """
    t = float_input(x, "batch_norm_training")
    axis = _feature_axis(t.shape, axis, "batch_norm_training")
    return _batch_norm_training(x, scale, bias, float(eps), axis)


# ------------------------------------------------------------------- layer norm, rms norm


def _norm_axes(shape: tuple[int, ...], axis: Any, fn: str) -> tuple[int, ...]:
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    for a in axes:
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)):
            raise TypeError(f"{where_prefix()}{fn}: axis must be an int or a tuple of ints, got {axis!r}")
        if not -len(shape) <= a < len(shape):
            raise ShapeError(f"{where_prefix()}{fn}: axis {a} is out of range for shape {list(shape)}")
    return tuple(sorted({int(a) % len(shape) for a in axes}))


def _over_axes(value, shape: tuple[int, ...], axes: tuple[int, ...], dtype, what: str, fn: str):
    """A parameter of the normalised shape (``shape`` at ``axes``) made to broadcast against x."""
    t = type_of(value)
    want = tuple(shape[a] for a in axes)
    if t.shape != want:
        raise ShapeError(
            f"{where_prefix()}{fn}: {what} must have shape {list(want)} (axes {list(axes)} of the "
            f"input {list(shape)}), got {t}"
        )
    return reshape(astype(value, dtype), tuple(shape[i] if i in axes else 1 for i in range(len(shape))))


@op_function
def layer_norm(x, scale=None, bias=None, eps=1e-5, axis=-1):
    """Layer normalisation: ``(x - mean) / sqrt(var + eps) * scale + bias`` over ``axis``.

    ``x``: any shape; ``axis``: an int or a tuple (default the last axis); ``scale`` / ``bias``:
    the normalised shape (``[D]`` for the default), or None. Biased variance, like PyTorch.
    """
    t = float_input(x, "layer_norm")
    axes = _norm_axes(t.shape, axis, "layer_norm")
    compute = compute_dtype(t.dtype)
    xc = astype(x, compute)
    centred = xc - _mean(xc, axis=axes, keepdims=True)
    y = centred * rsqrt(_mean(centred * centred, axis=axes, keepdims=True) + float(eps))
    if scale is not None:
        y = y * _over_axes(scale, t.shape, axes, compute, "scale", "layer_norm")
    if bias is not None:
        y = y + _over_axes(bias, t.shape, axes, compute, "bias", "layer_norm")
    return astype(y, t.dtype)


@op_function
def rms_norm(x, scale=None, eps=1e-6, axis=-1):
    """Root-mean-square normalisation: ``x / sqrt(mean(x**2) + eps) * scale`` over ``axis``.

    ``x``: any shape; ``scale``: the normalised shape (``[D]`` for the default last axis) or None.
    """
    t = float_input(x, "rms_norm")
    axes = _norm_axes(t.shape, axis, "rms_norm")
    compute = compute_dtype(t.dtype)
    xc = astype(x, compute)
    y = xc * rsqrt(_mean(xc * xc, axis=axes, keepdims=True) + float(eps))
    if scale is not None:
        y = y * _over_axes(scale, t.shape, axes, compute, "scale", "rms_norm")
    return astype(y, t.dtype)


# ------------------------------------------------------------------------------ dropout


def check_rate(rate: Any, fn: str) -> float:
    """``rate`` as a float in ``[0, 1]``: TypeError / ValueError naming ``fn`` otherwise."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float, np.integer, np.floating)):
        raise TypeError(f"{fn}: rate must be a Python number, got {type(rate).__name__}")
    rate = float(rate)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"{fn}: rate must be in [0, 1], got {rate}")
    return rate


@op_function
def dropout(key, x, rate, training=True):
    """Inverted dropout: each element is zeroed with probability ``rate`` and the survivors are
    scaled by ``1 / (1 - rate)``, so the expectation is unchanged.

    ``key``: a ``uint32[2]`` key (``kn.random``); ``x``: any float shape, returned with that
    shape. The identity when ``training`` is False or ``rate == 0`` (``key`` may then be None);
    zeros when ``rate == 1``. The same key gives the same mask.
    """
    rate = check_rate(rate, "dropout")
    if not training or rate == 0.0:
        return x
    t = float_input(x, "dropout")
    if key is None:
        raise ValueError(f"{where_prefix()}dropout: training with rate {rate} needs a random key")
    if rate == 1.0:
        return zeros_like(x)
    keep = random.bernoulli(key, 1.0 - rate, t.shape)
    return where(keep, x / (1.0 - rate), 0.0)


# ------------------------------------------------------------------------------ embedding


@op_function
def embedding(table, ids):
    """Rows of ``table`` at integer ``ids``: ``[V, D]`` and ``I`` -> ``I + [D]``.

    Ids outside ``[0, V)`` are clamped (run-time values cannot raise), like ``kn.take``; the
    gradient w.r.t. ``table`` scatter-adds into the looked-up rows.
    """
    tt, ti = type_of(table), type_of(ids)
    if tt.ndim != 2:
        raise ShapeError(f"{where_prefix()}embedding: the table must be [vocab_size, embed_dim], got {tt}")
    if not dtypes.is_integer(ti.dtype):
        raise TypeError(f"{where_prefix()}embedding: ids must be integers, got {ti}")
    return take(table, ids, axis=0)
