"""The decoder-only transformer behind ``models.gpt2`` and ``models.llama``.

One configuration record covers both families: GPT-2 (learned positions, LayerNorm, GELU-tanh MLP,
biases, tied embeddings) and Llama (rotary positions, RMSNorm, SwiGLU MLP, grouped KV heads, no
biases). Parameters are a plain tree in kaun_ir's conventions (dense weights ``[in, out]``, norm
``scale``)::

    {"embed": {"weight": [V, D]},
     "positions": {"weight": [P, D]},                      # learned positions only
     "layers": [{"norm1": {"scale", "bias"?},
                 "attn": {"query" | "key" | "value" | "out": {"weight": [in, out], "bias"?}},
                 "norm2": {...},
                 "mlp": {"fc", "proj"} (GELU) | {"gate", "up", "down"} (SwiGLU)}, ...],
     "norm": {"scale", "bias"?},
     "lm_head": {"weight": [D, V]}}                         # untied embeddings only

:func:`forward` runs the whole sequence (causal), or — with a key/value cache — writes the new
keys and values at ``cache_pos`` and attends over the cache, which is what generation compiles.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from kaun_ir import dtypes
from kaun_ir.ir.builder import scope
from kaun_ir.layer.block_run import BlockRun, with_block_run
from kaun_ir.layer.construct import make_param
from kaun_ir.layer.core import Layer, Vars
from kaun_ir.nn import fn
from kaun_ir.nn import init as initializers
from kaun_ir.surface import linalg
from kaun_ir.surface.creation import arange
from kaun_ir.surface.dynamic_slice import dynamic_update_slice
from kaun_ir.surface.promotion import astype
from kaun_ir.surface.shapes import expand_dims, reshape
from kaun_ir.surface.trace import ShapeDtype


@dataclass(frozen=True)
class DecoderConfig:
    """Sizes and architecture switches of a decoder-only transformer (see the module docstring)."""

    vocab_size: int
    dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    hidden_dim: int
    max_positions: int
    norm: str = "layer"  # "layer" (LayerNorm) or "rms" (RMSNorm)
    norm_eps: float = 1e-5
    mlp: str = "gelu_tanh"  # "gelu_tanh", "gelu" or "swiglu"
    positions: str = "learned"  # "learned" or "rope"
    rope_theta: float = 10000.0
    attn_bias: bool = True
    mlp_bias: bool = True
    tie_embeddings: bool = True
    head_dim: int | None = None  # default dim // num_heads

    def __post_init__(self):
        for name in (
            "vocab_size",
            "dim",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "hidden_dim",
            "max_positions",
        ):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"DecoderConfig.{name} must be positive, got {getattr(self, name)!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim is None and self.dim % self.num_heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by num_heads ({self.num_heads})")
        for name, allowed in (
            ("norm", ("layer", "rms")),
            ("mlp", ("gelu_tanh", "gelu", "swiglu")),
            ("positions", ("learned", "rope")),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"DecoderConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}"
                )

    @property
    def head_size(self) -> int:
        return self.head_dim or self.dim // self.num_heads


# ------------------------------------------------------------------------------ parameters


def init_params(cfg: DecoderConfig, dtype=dtypes.float32, abstract: bool = False) -> dict:
    """Fresh parameters (normal(0.02) weights, zero biases, unit norm scales), keys drawn from
    the current ``kn.rng`` scope in a fixed order; ``abstract=True`` gives ``kn.ShapeDtype``
    leaves instead (the tree's structure and shapes, nothing drawn)."""
    if abstract:
        normal = zeros = ones = lambda key, shape, dt: ShapeDtype(shape, dt)  # noqa: E731
    else:
        draw = initializers.normal(0.02)
        normal = lambda key, shape, dt: make_param(draw, shape, dt)  # noqa: E731
        zeros, ones = initializers.zeros, initializers.ones

    def dense(fan_in, fan_out, bias):
        p = {"weight": normal(None, (fan_in, fan_out), dtype)}
        if bias:
            p["bias"] = zeros(None, (fan_out,), dtype)
        return p

    def norm():
        p = {"scale": ones(None, (cfg.dim,), dtype)}
        if cfg.norm == "layer":
            p["bias"] = zeros(None, (cfg.dim,), dtype)
        return p

    hd, d = cfg.head_size, cfg.dim
    params = {"embed": {"weight": normal(None, (cfg.vocab_size, d), dtype)}}
    if cfg.positions == "learned":
        params["positions"] = {"weight": normal(None, (cfg.max_positions, d), dtype)}
    layers = []
    for _ in range(cfg.num_layers):
        attn = {
            "query": dense(d, cfg.num_heads * hd, cfg.attn_bias),
            "key": dense(d, cfg.num_kv_heads * hd, cfg.attn_bias),
            "value": dense(d, cfg.num_kv_heads * hd, cfg.attn_bias),
            "out": dense(cfg.num_heads * hd, d, cfg.attn_bias),
        }
        if cfg.mlp == "swiglu":
            mlp = {
                "gate": dense(d, cfg.hidden_dim, cfg.mlp_bias),
                "up": dense(d, cfg.hidden_dim, cfg.mlp_bias),
                "down": dense(cfg.hidden_dim, d, cfg.mlp_bias),
            }
        else:
            mlp = {
                "fc": dense(d, cfg.hidden_dim, cfg.mlp_bias),
                "proj": dense(cfg.hidden_dim, d, cfg.mlp_bias),
            }
        layers.append({"norm1": norm(), "attn": attn, "norm2": norm(), "mlp": mlp})
    params["layers"] = layers
    params["norm"] = norm()
    if not cfg.tie_embeddings:
        params["lm_head"] = {"weight": normal(None, (d, cfg.vocab_size), dtype)}
    return params


# ------------------------------------------------------------------------------ forward pass


def _dense(p, x):
    y = linalg.matmul(x, p["weight"])
    return y + p["bias"] if "bias" in p else y


def _norm(cfg: DecoderConfig, p, x):
    if cfg.norm == "rms":
        return fn.rms_norm(x, p["scale"], cfg.norm_eps)
    return fn.layer_norm(x, p["scale"], p.get("bias"), cfg.norm_eps)


def _mlp(cfg: DecoderConfig, p, x):
    if cfg.mlp == "swiglu":
        return _dense(p["down"], fn.silu(_dense(p["gate"], x)) * _dense(p["up"], x))
    act = fn.gelu_approx if cfg.mlp == "gelu_tanh" else fn.gelu
    return _dense(p["proj"], act(_dense(p["fc"], x)))


def _attention(cfg: DecoderConfig, p, x, positions, cache, cache_pos):
    """Self-attention of ``x [B, T, D]``; with ``cache = (k [B, S, K, hd], v)`` the new keys and
    values are written at ``cache_pos`` and queries attend to cache positions up to their own."""
    batch, seq_len, _ = x.shape
    hd = cfg.head_size
    with scope("query"):
        q = reshape(_dense(p["query"], x), (batch, seq_len, cfg.num_heads, hd))
    with scope("key"):
        k = reshape(_dense(p["key"], x), (batch, seq_len, cfg.num_kv_heads, hd))
    with scope("value"):
        v = reshape(_dense(p["value"], x), (batch, seq_len, cfg.num_kv_heads, hd))
    if cfg.positions == "rope":
        with scope("rope"):
            q = fn.rope(q, positions, base=cfg.rope_theta)
            k = fn.rope(k, positions, base=cfg.rope_theta)
    new_cache = None
    with scope("attention"):
        if cache is None:
            out = fn.dot_product_attention(q, k, v, is_causal=True)
        else:
            cache_k, cache_v = cache
            zero = astype(0, dtypes.int32)
            start = [zero, cache_pos, zero, zero]
            cache_k = dynamic_update_slice(cache_k, astype(k, cache_k.dtype), start)
            cache_v = dynamic_update_slice(cache_v, astype(v, cache_v.dtype), start)
            keys = arange(cache_k.shape[1], dtype=dtypes.int32)
            # query t sits at cache_pos + t and sees keys 0 .. cache_pos + t
            allowed = expand_dims(keys, 0) <= expand_dims(positions, -1)  # [T, S]
            out = fn.dot_product_attention(q, cache_k, cache_v, mask=allowed)
            new_cache = (cache_k, cache_v)
    with scope("out"):
        out = _dense(p["out"], reshape(out, (batch, seq_len, cfg.num_heads * hd)))
    return out, new_cache


def _embed(cfg: DecoderConfig, params, ids, positions):
    """The token embeddings plus the learned position embeddings: ``[B, T, D]``."""
    with scope("embed"):
        x = fn.embedding(params["embed"]["weight"], ids)
    if cfg.positions == "learned":
        with scope("positions"):
            x = x + fn.embedding(params["positions"]["weight"], positions)
    return x


def _block(cfg: DecoderConfig, p, x, positions, cache=None, cache_pos=None):
    """One pre-norm transformer block: ``(x', new (k, v) or None)``."""
    with scope("norm1"):
        h = _norm(cfg, p["norm1"], x)
    with scope("attn"):
        attn, layer_cache = _attention(cfg, p["attn"], h, positions, cache, cache_pos)
    x = x + attn
    with scope("norm2"):
        h = _norm(cfg, p["norm2"], x)
    with scope("mlp"):
        x = x + _mlp(cfg, p["mlp"], h)
    return x, layer_cache


def _head(cfg: DecoderConfig, params, x):
    """The final norm and the output head: logits ``[B, T, V]``."""
    with scope("norm"):
        x = _norm(cfg, params["norm"], x)
    with scope("lm_head"):
        if cfg.tie_embeddings:
            return linalg.einsum("btd,vd->btv", x, params["embed"]["weight"])
        return linalg.matmul(x, params["lm_head"]["weight"])


def forward(cfg: DecoderConfig, params, ids, cache=None, cache_pos=None):
    """Logits ``[B, T, V]`` of token ids ``[B, T]``.

    Without ``cache``: positions ``0 .. T-1``, causal attention. With ``cache`` (a list of
    ``(k, v)`` per layer, each ``[B, S, K, hd]``) and an int32 scalar ``cache_pos``: positions
    ``cache_pos .. cache_pos+T-1``; returns ``(logits, new_cache)``.
    """
    seq_len = ids.shape[1]
    positions = arange(seq_len, dtype=dtypes.int32)
    if cache is not None:
        positions = positions + cache_pos
    x = _embed(cfg, params, ids, positions)
    new_cache = []
    for i, p in enumerate(params["layers"]):
        with scope(f"layers.{i}"):
            x, layer_cache = _block(cfg, p, x, positions, None if cache is None else cache[i], cache_pos)
            new_cache.append(layer_cache)
    logits = _head(cfg, params, x)
    return logits if cache is None else (logits, new_cache)


def empty_cache(cfg: DecoderConfig, batch: int, length: int, dtype=dtypes.float32) -> list:
    """A zero key/value cache: per layer ``(k, v)``, each ``[batch, length, K, hd]`` (NumPy)."""
    shape = (batch, length, cfg.num_kv_heads, cfg.head_size)
    return [(np.zeros(shape, dtype), np.zeros(shape, dtype)) for _ in range(cfg.num_layers)]


def _check_ids(cfg: DecoderConfig, name: str, ids) -> None:
    t = fn.type_of(ids)
    if t.ndim != 2 or not dtypes.is_integer(t.dtype):
        raise TypeError(f"{name}: expected integer token ids [B, T], got {t}")
    if cfg.positions == "learned" and t.shape[1] > cfg.max_positions:
        raise ValueError(f"{name}: {t.shape[1]} tokens exceed max_positions={cfg.max_positions}")


def _block_run(cfg: DecoderConfig, name: str) -> BlockRun:
    """The decoder as embeddings, ``num_layers`` identical blocks, final norm and head: how
    pipeline parallelism splits it (the blocks over the stages)."""

    def before(params, state, ids, *, training, ctx):
        _check_ids(cfg, name, ids)
        return _embed(cfg, params, ids, arange(ids.shape[1], dtype=dtypes.int32))

    def block_init(dt):
        return Vars(init_params(replace(cfg, num_layers=1), dt)["layers"][0], [], dt)

    def block_apply(p, state, x, *, training, ctx):
        return _block(cfg, p, x, arange(x.shape[1], dtype=dtypes.int32))[0], state

    def after(params, state, x, *, training, ctx):
        return _head(cfg, params, x)

    block = Layer(block_init, block_apply, "block")
    return BlockRun(before, lambda params: list(params["layers"]), block, after, "layers")


def decoder(cfg: DecoderConfig, name: str = "decoder") -> Layer:
    """The model as a ``kn.layer.Layer``: token ids ``[B, T]`` -> logits ``[B, T, vocab]``. Its
    ``num_layers`` blocks are declared as a run of identical blocks, so ``train.make(...,
    pipeline=kn.sharding.pipeline(stages=S, ...))`` splits them over ``S`` stages (embeddings
    before them, final norm and head after them)."""

    def init_(dt):
        return Vars(init_params(cfg, dt), [], dt)

    def apply_(params, state, ids, *, training, ctx):
        _check_ids(cfg, name, ids)
        return forward(cfg, params, ids), state

    return with_block_run(Layer(init_, apply_, name), _block_run(cfg, name))
