"""The ``gpt2_small`` and ``gpt2_small_lora`` workloads of ``kaun-ir bench``: GPT-2 at its real
size (124M parameters: 12 layers, width 768, 12 heads, vocabulary 50257) as ``kn.models.gpt2``,
in JAX and in PyTorch eager over the same parameter tree (``kn.models``' layout: dense weights
``[in, out]``, tied embeddings, GELU-tanh MLP, layer-norm eps 1e-5).

The LoRA variant puts rank-8 adapters on every attention query and value matrix
(``layer.lora``) and trains them alone (``optim.freeze(..., layer.lora_frozen)``), as
docs/training.md's recipe does; the references read the same ``{"base": ..., "lora": ...}`` tree
and use ``W + a @ b`` at the adapted matrices, with the base frozen (no gradient, no optimiser
state), so every implementation trains exactly the adapters.
"""

from __future__ import annotations

from kaun_ir.tools.bench import transformer as bench_transformer

#: the matrices the LoRA variant adapts (dotted paths of the base model's parameters)
LORA_TARGETS = r"layers\.\d+\.attn\.(query|value)\.weight"
LORA_RANK = 8


def _decoder(cfg: dict):
    from kaun_ir import models

    return models.gpt2(
        vocab_size=cfg["vocab"],
        dim=cfg["dim"],
        num_layers=cfg["layers"],
        num_heads=cfg["heads"],
        max_positions=cfg["seq"],
    )


def kaun_model(cfg: dict):
    """GPT-2 from ``kn.models`` (ids ``[B, T]`` -> logits ``[B, T, vocab]``); with
    ``cfg["lora"]`` wrapped in rank-8 adapters on the attention query and value matrices."""
    from kaun_ir import layer

    model = _decoder(cfg)
    return layer.lora(model, LORA_RANK, targets=LORA_TARGETS) if cfg.get("lora") else model


def _merged(params, cfg, matmul):
    """The base parameters, with ``W + a @ b`` at every adapted matrix for the LoRA variant
    (``alpha`` = rank: scale 1, as ``layer.lora``'s default)."""
    if not cfg.get("lora"):
        return params
    base, adapters = params["base"], params["lora"]["layers"]  # adapters: {"0": ..., "1": ...}
    layers = []
    for i, block in enumerate(base["layers"]):
        attn = dict(block["attn"])
        for name, pair in adapters[str(i)]["attn"].items():
            delta = matmul(pair["weight"]["a"], pair["weight"]["b"])
            attn[name] = {**attn[name], "weight": attn[name]["weight"] + delta}
        layers.append({**block, "attn": attn})
    return {**base, "layers": layers}


# ------------------------------------------------------------------------------ JAX reference
# (the attention is the transformer workload's: the same projections, causal mask and scale)


def _jax_norm(x, p):
    import jax.numpy as jnp

    centred = x - jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(centred * centred, axis=-1, keepdims=True)
    return centred / jnp.sqrt(var + 1e-5) * p["scale"] + p["bias"]


def jax_forward(params, ids, cfg):
    """GPT-2 in plain JAX over ``kn.models``' parameter tree."""
    import jax
    import jax.numpy as jnp

    params = _merged(params, cfg, jnp.matmul)
    x = params["embed"]["weight"][ids] + params["positions"]["weight"][: ids.shape[1]]
    for p in params["layers"]:
        x = x + bench_transformer._jax_attention(_jax_norm(x, p["norm1"]), p["attn"], cfg["heads"])
        h = _jax_norm(x, p["norm2"]) @ p["mlp"]["fc"]["weight"] + p["mlp"]["fc"]["bias"]
        x = x + jax.nn.gelu(h, approximate=True) @ p["mlp"]["proj"]["weight"] + p["mlp"]["proj"]["bias"]
    return _jax_norm(x, params["norm"]) @ params["embed"]["weight"].T


# ------------------------------------------------------------------------------ PyTorch eager


def torch_forward(params, ids, cfg):
    """GPT-2 in PyTorch eager over the same tree (``F.scaled_dot_product_attention``, GELU-tanh)."""
    import torch
    import torch.nn.functional as F

    def norm(h, p):
        return F.layer_norm(h, (h.shape[-1],), p["scale"], p["bias"], eps=1e-5)

    params = _merged(params, cfg, torch.matmul)
    x = params["embed"]["weight"][ids] + params["positions"]["weight"][: ids.shape[1]]
    for p in params["layers"]:
        x = x + bench_transformer._torch_attention(norm(x, p["norm1"]), p["attn"], cfg["heads"])
        h = norm(x, p["norm2"]) @ p["mlp"]["fc"]["weight"] + p["mlp"]["fc"]["bias"]
        x = x + F.gelu(h, approximate="tanh") @ p["mlp"]["proj"]["weight"] + p["mlp"]["proj"]["bias"]
    return norm(x, params["norm"]) @ params["embed"]["weight"].T
