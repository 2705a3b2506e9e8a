"""``multi_head_attention``: self-attention over ``[B, T, E]`` with optional grouped key/value
heads, causal masking, rotary embeddings and attention dropout."""

from __future__ import annotations

from typing import Any, NamedTuple

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.builder import current_path, scope
from kaun_ir.layer.construct import (
    dense,
    infer_size,
    make_param,
    positive_int,
    rate_in_unit_interval,
    resolve_init,
)
from kaun_ir.layer.core import Layer, Vars
from kaun_ir.nn import attention as nn_attention
from kaun_ir.nn import init as initializers
from kaun_ir.surface.shapes import reshape
from kaun_ir.surface.tensor import type_of

__all__ = ["multi_head_attention"]

_LAYER = "multi_head_attention"


def _where() -> str:
    path = current_path()
    return f"{path}: " if path else ""


def _attention_mask(mask: Any, batch: int, seq_len: int):
    """``ctx["attention_mask"]`` as a bool mask broadcastable to ``[B, H, T, T]``: a ``[B, T]``
    key-padding mask (True = a real token) becomes ``[B, 1, 1, T]``; 4-d masks pass through."""
    t = type_of(mask)
    if not dtypes.is_bool(t.dtype):
        raise TypeError(
            f"{_where()}multi_head_attention: ctx['attention_mask'] must be bool (True = attend), got {t}"
        )
    if t.ndim == 2:
        if t.shape != (batch, seq_len):
            raise ShapeError(
                f"{_where()}multi_head_attention: a 2-d attention_mask must be [B, T] = "
                f"[{batch}, {seq_len}], got {t}"
            )
        return reshape(mask, (batch, 1, 1, seq_len))
    if t.ndim == 4:
        return mask  # checked against [B, H, T, T] by dot_product_attention
    raise ShapeError(
        f"{_where()}multi_head_attention: attention_mask must be [B, T] or [B, 1, T, T], got {t}"
    )


def multi_head_attention(
    embed_dim: int | None = None,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    dropout: float = 0.0,
    is_causal: bool = False,
    rope: bool = False,
    rope_base: float = 10000.0,
    use_bias: bool = True,
    weight_init=None,
    bias_init=None,
) -> Layer:
    """Multi-head self-attention: ``[B, T, E] -> [B, T, E]``.

    ``head_dim = embed_dim // num_heads``. Queries use ``num_heads`` heads, keys and values
    ``num_kv_heads`` (default ``num_heads``; fewer gives grouped-query attention, 1 multi-query).
    ``embed_dim`` may be left out (``multi_head_attention(num_heads=4)``): it is then the last
    axis of the example given to ``layer.init(model, example)``.
    Parameters (each ``{"weight": [in, out], "bias": [out]}``, glorot_uniform / zeros)::

        {"query": [E, H*hd], "key": [E, K*hd], "value": [E, K*hd], "out": [H*hd, E]}

    The forward pass projects, optionally applies rotary embeddings (``rope=True``, base
    ``rope_base``, positions ``0..T-1``) to queries and keys, runs
    ``kn.fn.dot_product_attention`` and projects back. ``is_causal`` masks future positions;
    ``ctx["attention_mask"]`` (bool, ``[B, T]`` key padding or ``[B, 1, T, T]``) masks more.
    In training with ``dropout > 0`` the attention weights are dropped using ``ctx["rng"]``.
    """
    if num_heads is None:
        raise ValueError(
            f"layer.{_LAYER}: num_heads is required ({_LAYER}(num_heads=n) infers embed_dim from "
            "the example given to layer.init)"
        )
    embed_dim = None if embed_dim is None else positive_int(embed_dim, "embed_dim", _LAYER)
    num_heads = positive_int(num_heads, "num_heads", _LAYER)
    num_kv_heads = num_heads if num_kv_heads is None else positive_int(num_kv_heads, "num_kv_heads", _LAYER)
    if num_heads % num_kv_heads:
        raise ValueError(
            f"layer.{_LAYER}: num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )
    rate = rate_in_unit_interval(dropout, "dropout", _LAYER)
    if not rope_base > 0:
        raise ValueError(f"layer.{_LAYER}: rope_base must be positive, got {rope_base!r}")
    heads = _Heads(num_heads, num_kv_heads, rate, is_causal, rope, rope_base)
    if embed_dim is not None:
        _head_dim(heads, embed_dim, ValueError)  # a bad combination fails at construction, as before
    weight_init = resolve_init(weight_init, initializers.glorot_uniform(), "weight_init", _LAYER)
    bias_init = resolve_init(bias_init, initializers.zeros, "bias_init", _LAYER)

    def init_(dt, x=None):
        dim = infer_size(embed_dim, x, -1, 3, "embed_dim", _LAYER, "[B, T, embed_dim]")
        head_dim = _head_dim(heads, dim, ShapeError)
        shapes = {
            "query": (dim, num_heads * head_dim),
            "key": (dim, num_kv_heads * head_dim),
            "value": (dim, num_kv_heads * head_dim),
            "out": (num_heads * head_dim, dim),
        }
        params = {}
        for name in ("query", "key", "value", "out"):  # a fixed order of key draws
            fan_in, fan_out = shapes[name]
            p = {"weight": make_param(weight_init, (fan_in, fan_out), dt)}
            if use_bias:
                p["bias"] = make_param(bias_init, (fan_out,), dt)
            params[name] = p
        return Vars(params, [], dt)

    def apply_(params, state, x, *, training, ctx):
        return _forward(heads, params, x, training, ctx), state

    return Layer(init_, apply_, _LAYER)


class _Heads(NamedTuple):
    """The checked hyper-parameters the forward pass needs."""

    num_heads: int
    num_kv_heads: int
    rate: float
    is_causal: bool
    rope: bool
    rope_base: float


def _head_dim(heads: _Heads, dim: int, error: type[Exception]) -> int:
    """``dim // num_heads``, or ``error`` (ValueError at construction, ShapeError at init) when
    ``dim`` does not split into heads, or rope needs an even head dimension it does not get."""
    where = _where() if error is ShapeError else f"layer.{_LAYER}: "
    if dim % heads.num_heads:
        raise error(f"{where}embed_dim ({dim}) must be divisible by num_heads ({heads.num_heads})")
    if heads.rope and (dim // heads.num_heads) % 2:
        raise error(
            f"{where}rope needs an even head dimension, got embed_dim / num_heads = {dim // heads.num_heads}"
        )
    return dim // heads.num_heads


def _forward(heads: _Heads, params, x, training: bool, ctx: dict):
    """Project to heads, optionally rotate, attend, and project back: ``[B, T, E] -> [B, T, E]``."""
    dim = type_of(params["query"]["weight"]).shape[0]
    head_dim = dim // heads.num_heads
    t = type_of(x)
    if t.ndim != 3 or t.shape[-1] != dim:
        raise ShapeError(f"{_where()}{_LAYER}(embed_dim={dim}) expects an input [B, T, {dim}], got {t}")
    batch, seq_len, _ = t.shape

    def project(name: str, count: int):
        with scope(name):
            y = dense(params[name], x, dim, f"{_LAYER} {name} projection")
            return reshape(y, (batch, seq_len, count, head_dim))

    q, k, v = (
        project("query", heads.num_heads),
        project("key", heads.num_kv_heads),
        project("value", heads.num_kv_heads),
    )
    if heads.rope:
        with scope("rope"):
            q, k = nn_attention.rope(q, base=heads.rope_base), nn_attention.rope(k, base=heads.rope_base)
    mask = ctx.get("attention_mask")
    if mask is not None:
        mask = _attention_mask(mask, batch, seq_len)
    drop = heads.rate if training else 0.0
    key = ctx.get("rng") if drop > 0 else None
    if drop > 0 and key is None:
        raise ValueError(
            f"{_where()}{_LAYER} with dropout in training mode needs a random key: pass "
            "ctx={'rng': key} to layer.apply, or call it inside `with kn.rng.scope(seed):`"
        )
    with scope("attention"):
        out = nn_attention.dot_product_attention(
            q, k, v, mask=mask, is_causal=heads.is_causal, dropout_rate=drop, key=key
        )
    with scope("out"):
        out = reshape(out, (batch, seq_len, heads.num_heads * head_dim))
        return dense(params["out"], out, heads.num_heads * head_dim, f"{_LAYER} output projection")
