"""Functional neural-network building blocks (re-exported in ``kn.fn``): normalisation, dropout,
embedding lookup, attention and rotary position embeddings.

Pure functions of their arguments (parameters and keys are passed in); the layers of
``kn.layer`` hold the parameters and call these. Every function traces, compiles and
differentiates, and works on concrete arrays.

Layouts:

* ``batch_norm``: channels-first like PyTorch, the feature axis is 1 (``[N, C]``, ``[N, C, L]``,
  ``[N, C, H, W]`` ...); statistics are over every other axis.
* ``dot_product_attention`` and ``rope``: ``[batch, time, heads, head_dim]`` like
  ``jax.nn.dot_product_attention`` (the batch axis may be omitted).

Low-precision inputs (float16 / bfloat16) are normalised and soft-maxed in float32 and the
result is cast back.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.builder import current_path
from kaun_ir.surface import random
from kaun_ir.surface.creation import arange, zeros_like
from kaun_ir.surface.elementwise import cos, rsqrt, sin, where
from kaun_ir.surface.function import op_function
from kaun_ir.surface.indexing import getitem
from kaun_ir.surface.linalg import einsum
from kaun_ir.surface.promotion import astype, dtype_of
from kaun_ir.surface.reductions import mean as _mean
from kaun_ir.surface.reductions import softmax
from kaun_ir.surface.shapes import concatenate, expand_dims, reshape
from kaun_ir.surface.take import take
from kaun_ir.surface.tensor import apply, type_of

__all__ = [
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

_LOW_PRECISION = (dtypes.float16, dtypes.bfloat16)


def _where() -> str:
    path = current_path()
    return f"{path}: " if path else ""


def _float_input(x, fn: str):
    t = type_of(x)
    if not dtypes.is_float(t.dtype):
        raise TypeError(f"{_where()}{fn} needs a floating-point input, got {t}")
    return t


def _compute_dtype(dt):
    return dtypes.float32 if dt in _LOW_PRECISION else dt


# ------------------------------------------------------------------------------ batch norm


def _feature_axis(shape: tuple[int, ...], axis: int | None, fn: str) -> int:
    if len(shape) < 2:
        raise ShapeError(
            f"{_where()}{fn}: expected an input [N, C, ...] with a batch axis, got shape {list(shape)}"
        )
    axis = 1 if axis is None else axis
    if not -len(shape) <= axis < len(shape):
        raise ShapeError(f"{_where()}{fn}: axis {axis} is out of range for shape {list(shape)}")
    return axis % len(shape)


def _per_feature(value, shape: tuple[int, ...], axis: int, dtype, what: str, fn: str):
    """A ``[C]`` vector reshaped to broadcast along ``axis`` of ``shape``."""
    t = type_of(value)
    if t.shape != (shape[axis],):
        raise ShapeError(
            f"{_where()}{fn}: {what} must have shape [{shape[axis]}] (the size of axis {axis} "
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
    t = _float_input(x, "batch_stats")
    axis = _feature_axis(t.shape, axis, "batch_stats")
    compute = _compute_dtype(t.dtype)
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
    t = _float_input(x, "batch_norm")
    axis = _feature_axis(t.shape, axis, "batch_norm")
    compute = _compute_dtype(t.dtype)
    mu = _per_feature(mean, t.shape, axis, compute, "mean", "batch_norm")
    inv = rsqrt(_per_feature(var, t.shape, axis, compute, "var", "batch_norm") + float(eps))
    if scale is not None:
        inv = inv * _per_feature(scale, t.shape, axis, compute, "scale", "batch_norm")
    y = (astype(x, compute) - mu) * inv
    if bias is not None:
        y = y + _per_feature(bias, t.shape, axis, compute, "bias", "batch_norm")
    return astype(y, t.dtype)


# ------------------------------------------------------------------- layer norm, rms norm


def _norm_axes(shape: tuple[int, ...], axis: Any, fn: str) -> tuple[int, ...]:
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    for a in axes:
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)):
            raise TypeError(f"{_where()}{fn}: axis must be an int or a tuple of ints, got {axis!r}")
        if not -len(shape) <= a < len(shape):
            raise ShapeError(f"{_where()}{fn}: axis {a} is out of range for shape {list(shape)}")
    return tuple(sorted({int(a) % len(shape) for a in axes}))


def _over_axes(value, shape: tuple[int, ...], axes: tuple[int, ...], dtype, what: str, fn: str):
    """A parameter of the normalised shape (``shape`` at ``axes``) made to broadcast against x."""
    t = type_of(value)
    want = tuple(shape[a] for a in axes)
    if t.shape != want:
        raise ShapeError(
            f"{_where()}{fn}: {what} must have shape {list(want)} (axes {list(axes)} of the "
            f"input {list(shape)}), got {t}"
        )
    return reshape(astype(value, dtype), tuple(shape[i] if i in axes else 1 for i in range(len(shape))))


@op_function
def layer_norm(x, scale=None, bias=None, eps=1e-5, axis=-1):
    """Layer normalisation: ``(x - mean) / sqrt(var + eps) * scale + bias`` over ``axis``.

    ``x``: any shape; ``axis``: an int or a tuple (default the last axis); ``scale`` / ``bias``:
    the normalised shape (``[D]`` for the default), or None. Biased variance, like PyTorch.
    """
    t = _float_input(x, "layer_norm")
    axes = _norm_axes(t.shape, axis, "layer_norm")
    compute = _compute_dtype(t.dtype)
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
    t = _float_input(x, "rms_norm")
    axes = _norm_axes(t.shape, axis, "rms_norm")
    compute = _compute_dtype(t.dtype)
    xc = astype(x, compute)
    y = xc * rsqrt(_mean(xc * xc, axis=axes, keepdims=True) + float(eps))
    if scale is not None:
        y = y * _over_axes(scale, t.shape, axes, compute, "scale", "rms_norm")
    return astype(y, t.dtype)


# ------------------------------------------------------------------------------ dropout


def _check_rate(rate: Any, fn: str) -> float:
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
    rate = _check_rate(rate, "dropout")
    if not training or rate == 0.0:
        return x
    t = _float_input(x, "dropout")
    if key is None:
        raise ValueError(f"{_where()}dropout: training with rate {rate} needs a random key")
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
        raise ShapeError(f"{_where()}embedding: the table must be [vocab_size, embed_dim], got {tt}")
    if not dtypes.is_integer(ti.dtype):
        raise TypeError(f"{_where()}embedding: ids must be integers, got {ti}")
    return take(table, ids, axis=0)


# ------------------------------------------------------------------------------ attention


def causal_mask(q_len: int, k_len: int):
    """``bool[q_len, k_len]``, True where query ``i`` may attend key ``j``, i.e. ``j <= i``
    (aligned at the top-left corner, as ``jax.nn.dot_product_attention``'s ``is_causal``)."""
    rows = apply("iota", dtype=dtypes.int32, shape=(q_len, k_len), dimension=0)
    cols = apply("iota", dtype=dtypes.int32, shape=(q_len, k_len), dimension=1)
    return rows >= cols


def _attention_shapes(tq, tk, tv):
    if not (tq.ndim == tk.ndim == tv.ndim) or tq.ndim not in (3, 4):
        raise ShapeError(
            f"{_where()}dot_product_attention: q, k, v must all be [B, T, H, D] (or all "
            f"[T, H, D]), got {tq}, {tk}, {tv}"
        )
    batch, q_len, heads, depth = tq.shape[-4] if tq.ndim == 4 else 1, *tq.shape[-3:]
    kv_batch, k_len, kv_heads, k_depth = tk.shape[-4] if tk.ndim == 4 else 1, *tk.shape[-3:]
    if kv_batch != batch or tv.shape[:-1] != tk.shape[:-1]:
        raise ShapeError(
            f"{_where()}dot_product_attention: k and v must be [B, S, K, *] with q's batch "
            f"size, got q {tq}, k {tk}, v {tv}"
        )
    if k_depth != depth:
        raise ShapeError(
            f"{_where()}dot_product_attention: q and k head dimensions differ ({depth} vs "
            f"{k_depth}): q {tq}, k {tk}"
        )
    if heads % kv_heads:
        raise ShapeError(
            f"{_where()}dot_product_attention: the number of query heads ({heads}) must be a "
            f"multiple of the number of key/value heads ({kv_heads})"
        )
    return batch, q_len, heads, depth, k_len, kv_heads, tv.shape[-1]


def _broadcast_mask(mask, target: tuple[int, ...], what: str):
    t = type_of(mask)
    if t.ndim > 4:
        raise ShapeError(
            f"{_where()}dot_product_attention: {what} must broadcast to [B, H, T, S] = "
            f"{list(target)}, got {t}"
        )
    padded = (1,) * (4 - t.ndim) + t.shape
    if any(m not in (1, n) for m, n in zip(padded, target)):
        raise ShapeError(
            f"{_where()}dot_product_attention: {what} must broadcast to [B, H, T, S] = "
            f"{list(target)}, got {t}"
        )
    return reshape(mask, padded)


@op_function
def dot_product_attention(
    q, k, v, bias=None, mask=None, is_causal=False, scale=None, dropout_rate=0.0, key=None
):
    """Scaled dot-product attention, ``softmax(q k^T * scale + bias, masked) v``, per head.

    Shapes (like ``jax.nn.dot_product_attention``): ``q [B, T, H, D]``, ``k [B, S, K, D]``,
    ``v [B, S, K, Dv]`` -> ``[B, T, H, Dv]``; the batch axis may be left out of all three.
    ``K`` may be smaller than ``H`` (grouped-query / multi-query attention): ``H`` must be a
    multiple of ``K`` and query head ``h`` uses key/value head ``h // (H // K)``.

    - ``bias``: added to the logits, broadcastable to ``[B, H, T, S]``.
    - ``mask``: bool broadcastable to ``[B, H, T, S]``, True where attention is allowed.
    - ``is_causal``: also mask key ``j > i`` for query ``i`` (top-left aligned).
    - ``scale``: the logit scale, default ``1 / sqrt(D)``.
    - ``dropout_rate`` > 0 drops attention weights (inverted dropout with ``key``).

    Masked logits become a large negative number, so a row with nothing to attend averages all
    values uniformly instead of producing NaN (as jax does). Low-precision inputs are
    soft-maxed in float32.
    """
    tq, tk, tv = type_of(q), type_of(k), type_of(v)
    for t, name in ((tq, "q"), (tk, "k"), (tv, "v")):
        if not dtypes.is_float(t.dtype):
            raise TypeError(f"{_where()}dot_product_attention: {name} must be floating point, got {t}")
    unbatched = tq.ndim == 3
    batch, q_len, heads, depth, k_len, kv_heads, v_depth = _attention_shapes(tq, tk, tv)
    if unbatched:
        q, k, v = expand_dims(q, 0), expand_dims(k, 0), expand_dims(v, 0)
    dtype = dtypes.result_type(tq.dtype, tk.dtype, tv.dtype)
    q, k, v = astype(q, dtype), astype(k, dtype), astype(v, dtype)
    groups = heads // kv_heads
    scale = 1.0 / math.sqrt(depth) if scale is None else float(scale)
    # query heads grouped by the key/value head they share: [B, T, K, G, D]
    grouped = reshape(q, (batch, q_len, kv_heads, groups, depth))
    logits = einsum("btkgd,bskd->bkgts", grouped, k)  # [B, K, G, T, S]
    compute = _compute_dtype(dtype)
    logits = reshape(astype(logits, compute), (batch, heads, q_len, k_len)) * scale
    target = (batch, heads, q_len, k_len)
    if bias is not None:
        logits = logits + astype(_broadcast_mask(bias, target, "bias"), compute)
    allowed = None
    if mask is not None:
        if not dtypes.is_bool(dtype_of(mask)):
            raise TypeError(
                f"{_where()}dot_product_attention: mask must be bool (True = attend), got {type_of(mask)}"
            )
        allowed = _broadcast_mask(mask, target, "mask")
    if is_causal:
        causal = reshape(causal_mask(q_len, k_len), (1, 1, q_len, k_len))
        allowed = causal if allowed is None else (allowed & causal)
    if allowed is not None:
        # a finite stand-in for -inf (as jax): a fully masked row stays NaN-free
        large_negative = np.asarray(-0.7 * float(np.finfo(compute).max), compute)
        logits = where(allowed, logits, large_negative)
    weights = astype(softmax(logits, axis=-1), dtype)
    rate = _check_rate(dropout_rate, "dot_product_attention")
    if rate > 0.0:
        if key is None:
            raise ValueError(f"{_where()}dot_product_attention: dropout_rate {rate} needs a random key")
        weights = dropout(key, weights, rate)
    weights = reshape(weights, (batch, kv_heads, groups, q_len, k_len))
    out = einsum("bkgts,bskd->btkgd", weights, v)  # [B, T, K, G, Dv]
    out = reshape(out, (batch, q_len, heads, v_depth))
    return reshape(out, (q_len, heads, v_depth)) if unbatched else out


# ------------------------------------------------------------------------------ rotary


@op_function
def rope(x, positions=None, base=10000.0):
    """Rotary position embeddings (Su et al., RoFormer): rotate feature pairs by ``pos * freq``.

    ``x``: ``[..., T, H, D]`` (``[B, T, H, D]`` or ``[T, H, D]``), ``D`` even; ``positions``:
    integer ``[T]`` or ``[B, T]`` (default ``0 .. T-1``). Pair ``i`` of a head is
    ``(x[..., i], x[..., i + D/2])`` — the "rotate half" layout of GPT-NeoX / Hugging Face
    Llama — rotated by the angle ``pos * base ** (-2i / D)``. Same shape and dtype as ``x``.
    """
    t = _float_input(x, "rope")
    if t.ndim < 3:
        raise ShapeError(f"{_where()}rope: expected x of shape [..., T, H, D], got {t}")
    seq_len, depth = t.shape[-3], t.shape[-1]
    if depth % 2:
        raise ShapeError(f"{_where()}rope: the head dimension must be even, got {t}")
    half = depth // 2
    if positions is None:
        positions = arange(seq_len, dtype=dtypes.int32)
    tp = type_of(positions)
    if tp.ndim == 0 or tp.shape[-1] != seq_len or tp.ndim > t.ndim - 2:
        raise ShapeError(f"{_where()}rope: positions must be [T] or [B, T] with T = {seq_len}, got {tp}")
    compute = _compute_dtype(t.dtype)
    frequencies = (float(base) ** (-np.arange(0, depth, 2, dtype=np.float64) / depth)).astype(compute)
    angles = expand_dims(astype(positions, compute), -1) * frequencies  # [..., T, D/2]
    angles = expand_dims(angles, -2)  # [..., T, 1, D/2]: the same rotation for every head
    c, s = cos(angles), sin(angles)
    xc = astype(x, compute)
    first = getitem(xc, (Ellipsis, slice(0, half)))
    second = getitem(xc, (Ellipsis, slice(half, depth)))
    out = concatenate([first * c - second * s, second * c + first * s], axis=-1)
    return astype(out, t.dtype)
