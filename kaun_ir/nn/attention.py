"""Attention and rotary position embeddings (re-exported in ``kn.fn``): ``causal_mask``,
``dot_product_attention`` and ``rope``.

Layout ``[batch, time, heads, head_dim]`` like ``jax.nn.dot_product_attention`` (the batch axis
may be omitted). Low-precision inputs (float16 / bfloat16) are soft-maxed and rotated in float32
and the result is cast back.
"""

from __future__ import annotations

import math

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.nn.functional import check_rate, compute_dtype, dropout, float_input, where_prefix
from kaun_ir.surface.creation import arange
from kaun_ir.surface.elementwise import cos, sin, where
from kaun_ir.surface.function import op_function
from kaun_ir.surface.indexing import getitem
from kaun_ir.surface.linalg import einsum
from kaun_ir.surface.promotion import astype, dtype_of
from kaun_ir.surface.reductions import softmax
from kaun_ir.surface.shapes import concatenate, expand_dims, reshape
from kaun_ir.surface.tensor import apply, type_of

__all__ = ["dot_product_attention", "causal_mask", "rope"]


def causal_mask(q_len: int, k_len: int):
    """``bool[q_len, k_len]``, True where query ``i`` may attend key ``j``, i.e. ``j <= i``
    (aligned at the top-left corner, as ``jax.nn.dot_product_attention``'s ``is_causal``)."""
    rows = apply("iota", dtype=dtypes.int32, shape=(q_len, k_len), dimension=0)
    cols = apply("iota", dtype=dtypes.int32, shape=(q_len, k_len), dimension=1)
    return rows >= cols


def _attention_shapes(tq, tk, tv):
    if not (tq.ndim == tk.ndim == tv.ndim) or tq.ndim not in (3, 4):
        raise ShapeError(
            f"{where_prefix()}dot_product_attention: q, k, v must all be [B, T, H, D] (or all "
            f"[T, H, D]), got {tq}, {tk}, {tv}"
        )
    batch, q_len, heads, depth = tq.shape[-4] if tq.ndim == 4 else 1, *tq.shape[-3:]
    kv_batch, k_len, kv_heads, k_depth = tk.shape[-4] if tk.ndim == 4 else 1, *tk.shape[-3:]
    if kv_batch != batch or tv.shape[:-1] != tk.shape[:-1]:
        raise ShapeError(
            f"{where_prefix()}dot_product_attention: k and v must be [B, S, K, *] with q's batch "
            f"size, got q {tq}, k {tk}, v {tv}"
        )
    if k_depth != depth:
        raise ShapeError(
            f"{where_prefix()}dot_product_attention: q and k head dimensions differ ({depth} vs "
            f"{k_depth}): q {tq}, k {tk}"
        )
    if heads % kv_heads:
        raise ShapeError(
            f"{where_prefix()}dot_product_attention: the number of query heads ({heads}) must be a "
            f"multiple of the number of key/value heads ({kv_heads})"
        )
    return batch, q_len, heads, depth, k_len, kv_heads, tv.shape[-1]


def _broadcast_mask(mask, target: tuple[int, ...], what: str):
    t = type_of(mask)
    if t.ndim > 4:
        raise ShapeError(
            f"{where_prefix()}dot_product_attention: {what} must broadcast to [B, H, T, S] = "
            f"{list(target)}, got {t}"
        )
    padded = (1,) * (4 - t.ndim) + t.shape
    if any(m not in (1, n) for m, n in zip(padded, target)):
        raise ShapeError(
            f"{where_prefix()}dot_product_attention: {what} must broadcast to [B, H, T, S] = "
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
            raise TypeError(f"{where_prefix()}dot_product_attention: {name} must be floating point, got {t}")
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
    compute = compute_dtype(dtype)
    logits = reshape(astype(logits, compute), (batch, heads, q_len, k_len)) * scale
    target = (batch, heads, q_len, k_len)
    if bias is not None:
        logits = logits + astype(_broadcast_mask(bias, target, "bias"), compute)
    allowed = None
    if mask is not None:
        if not dtypes.is_bool(dtype_of(mask)):
            raise TypeError(
                f"{where_prefix()}dot_product_attention: mask must be bool (True = attend), "
                f"got {type_of(mask)}"
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
    rate = check_rate(dropout_rate, "dot_product_attention")
    if rate > 0.0:
        if key is None:
            raise ValueError(f"{where_prefix()}dot_product_attention: dropout_rate {rate} needs a random key")
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
    t = float_input(x, "rope")
    if t.ndim < 3:
        raise ShapeError(f"{where_prefix()}rope: expected x of shape [..., T, H, D], got {t}")
    seq_len, depth = t.shape[-3], t.shape[-1]
    if depth % 2:
        raise ShapeError(f"{where_prefix()}rope: the head dimension must be even, got {t}")
    half = depth // 2
    if positions is None:
        positions = arange(seq_len, dtype=dtypes.int32)
    tp = type_of(positions)
    if tp.ndim == 0 or tp.shape[-1] != seq_len or tp.ndim > t.ndim - 2:
        raise ShapeError(
            f"{where_prefix()}rope: positions must be [T] or [B, T] with T = {seq_len}, got {tp}"
        )
    compute = compute_dtype(t.dtype)
    frequencies = (float(base) ** (-np.arange(0, depth, 2, dtype=np.float64) / depth)).astype(compute)
    angles = expand_dims(astype(positions, compute), -1) * frequencies  # [..., T, D/2]
    angles = expand_dims(angles, -2)  # [..., T, 1, D/2]: the same rotation for every head
    c, s = cos(angles), sin(angles)
    xc = astype(x, compute)
    first = getitem(xc, (Ellipsis, slice(0, half)))
    second = getitem(xc, (Ellipsis, slice(half, depth)))
    out = concatenate([first * c - second * s, second * c + first * s], axis=-1)
    return astype(out, t.dtype)
