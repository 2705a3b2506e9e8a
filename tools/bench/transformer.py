"""The ``transformer`` and ``transformer12`` workloads of ``kaun-ir bench``: a decoder-only
transformer as a kaun_ir model, in JAX and in PyTorch eager over the same parameter tree.

Network (``cfg``: ``layers``, ``dim``, ``heads``, ``seq``, ``vocab``): learned token and position
embeddings; ``layers`` pre-layer-norm decoder blocks (causal self-attention, then a GELU MLP of
width ``4 * dim``, each with a residual connection); a final layer norm and a dense layer to
``vocab``. ``cfg["roll"]`` builds the blocks as one loop over stacked parameters
(``layer.sequential(roll=True)``); the references always read the unrolled parameter list.
"""

from __future__ import annotations

import math

# ------------------------------------------------------------------------------ kaun_ir model


def _token_embedding(vocab: int, seq: int, dim: int):
    """Token ids ``[B, T]`` -> ``[B, T, dim]``: learned token rows plus learned positions.
    Parameters ``{"tokens": [vocab, dim], "positions": [seq, dim]}``."""
    from kaun_ir import layer
    from kaun_ir.nn import functional as nn
    from kaun_ir.nn import init as initializers

    def init_(dt):
        return layer.Vars(
            {
                "tokens": initializers.zeros(None, (vocab, dim), dt),
                "positions": initializers.zeros(None, (seq, dim), dt),
            },
            [],
            dt,
        )

    def apply_(params, state, ids, *, training, ctx):
        return nn.embedding(params["tokens"], ids) + params["positions"], state

    return layer.Layer(init_, apply_, "token_embedding")


def decoder_block(dim: int, heads: int):
    """Pre-layer-norm decoder block: ``x + attn(ln1(x))`` then ``h + fc2(gelu(fc1(ln2(h))))``,
    causal self-attention, MLP width ``4 * dim``. ``[B, T, dim] -> [B, T, dim]``."""
    from kaun_ir import layer

    parts = {
        "ln1": layer.layer_norm(dim),
        "attn": layer.multi_head_attention(dim, heads, is_causal=True),
        "ln2": layer.layer_norm(dim),
        "fc1": layer.linear(dim, 4 * dim),
        "act": layer.gelu(),
        "fc2": layer.linear(4 * dim, dim),
    }
    trainable = ("ln1", "attn", "ln2", "fc1", "fc2")

    def init_(dt):
        return layer.Vars({name: parts[name].init(dt).params for name in trainable}, [], dt)

    def apply_(params, state, x, *, training, ctx):
        def run(name, value):
            y, _ = parts[name].apply(params.get(name, []), [], value, training=training, ctx=ctx)
            return y

        h = x + run("attn", run("ln1", x))
        return h + run("fc2", run("act", run("fc1", run("ln2", h)))), state

    return layer.Layer(init_, apply_, "decoder_block")


def kaun_model(cfg: dict):
    """Decoder-only transformer: ids ``[B, T]`` -> logits ``[B, T, vocab]``."""
    from kaun_ir import layer

    d, v = cfg["dim"], cfg["vocab"]
    blocks = [decoder_block(d, cfg["heads"]) for _ in range(cfg["layers"])]
    return layer.sequential(
        [_token_embedding(v, cfg["seq"], d), *blocks, layer.layer_norm(d), layer.linear(d, v)],
        roll=cfg.get("roll"),
    )


# ------------------------------------------------------------------------------ JAX reference


def _jax_layer_norm(x, p, eps=1e-5):
    import jax.numpy as jnp

    centred = x - jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(centred * centred, axis=-1, keepdims=True)
    return centred / jnp.sqrt(var + eps) * p["scale"] + p["bias"]


def _jax_attention(x, p, heads):
    import jax
    import jax.numpy as jnp

    b, t, d = x.shape
    hd = d // heads

    def project(name):
        return (x @ p[name]["weight"] + p[name]["bias"]).reshape(b, t, heads, hd)

    q, k, v = project("query"), project("key"), project("value")
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
    causal = jnp.tril(jnp.ones((t, t), bool))
    logits = jnp.where(causal, logits, -jnp.inf)
    weights = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
    return out @ p["out"]["weight"] + p["out"]["bias"]


def jax_forward(params, ids, cfg):
    """The decoder-only transformer in plain JAX over kaun_ir's parameter list."""
    import jax

    emb = params[0]
    x = emb["tokens"][ids] + emb["positions"]
    for p in params[1 : 1 + cfg["layers"]]:
        x = x + _jax_attention(_jax_layer_norm(x, p["ln1"]), p["attn"], cfg["heads"])
        h = _jax_layer_norm(x, p["ln2"]) @ p["fc1"]["weight"] + p["fc1"]["bias"]
        x = x + jax.nn.gelu(h, approximate=False) @ p["fc2"]["weight"] + p["fc2"]["bias"]
    x = _jax_layer_norm(x, params[-2])
    return x @ params[-1]["weight"] + params[-1]["bias"]


# ------------------------------------------------------------------------------ PyTorch eager


def _torch_attention(x, p, heads):
    import torch.nn.functional as F

    b, t, d = x.shape
    hd = d // heads

    def project(name):  # [B, T, D] -> [B, H, T, hd]
        return (x @ p[name]["weight"] + p[name]["bias"]).reshape(b, t, heads, hd).transpose(1, 2)

    # softmax(q k^T / sqrt(hd)) v with the causal mask, as in the JAX reference
    out = F.scaled_dot_product_attention(project("query"), project("key"), project("value"), is_causal=True)
    out = out.transpose(1, 2).reshape(b, t, d)
    return out @ p["out"]["weight"] + p["out"]["bias"]


def torch_forward(params, ids, cfg):
    """The decoder-only transformer in PyTorch eager (exact erf GELU and layer-norm eps 1e-5, as
    in the JAX reference)."""
    import torch.nn.functional as F

    def layer_norm(h, p):
        return F.layer_norm(h, (h.shape[-1],), p["scale"], p["bias"], eps=1e-5)

    emb = params[0]
    x = emb["tokens"][ids] + emb["positions"]
    for p in params[1 : 1 + cfg["layers"]]:
        x = x + _torch_attention(layer_norm(x, p["ln1"]), p["attn"], cfg["heads"])
        h = layer_norm(x, p["ln2"]) @ p["fc1"]["weight"] + p["fc1"]["bias"]
        x = x + F.gelu(h, approximate="none") @ p["fc2"]["weight"] + p["fc2"]["bias"]
    x = layer_norm(x, params[-2])
    return x @ params[-1]["weight"] + params[-1]["bias"]
