"""``kn.models``: pretrained-model families built from kaun_ir layers, and their checkpoints.

- :func:`gpt2` / :func:`llama`: the GPT-2 and Llama decoder architectures as ``kn.layer.Layer``
  records (token ids ``[B, T]`` -> logits ``[B, T, vocab]``), configured by :class:`DecoderConfig`;
- :func:`from_pretrained`: a Hugging Face checkpoint directory (``config.json`` +
  ``model.safetensors``, sharded or not), read locally, mapped through :data:`NAME_TABLE`;
- :func:`generate`: KV-cache generation (greedy, temperature, top-k) with a bounded number of
  compiled executables.
"""

from __future__ import annotations

from kaun_ir.models.decoder import DecoderConfig, decoder, empty_cache, forward, init_params
from kaun_ir.models.generate import cache_length, executables, generate, sample
from kaun_ir.models.pretrained import NAME_TABLE, Pretrained, config_from_hf, from_pretrained
from kaun_ir.names import public_dir


def gpt2(
    vocab_size: int = 50257,
    dim: int = 768,
    num_layers: int = 12,
    num_heads: int = 12,
    max_positions: int = 1024,
    hidden_dim: int | None = None,
    norm_eps: float = 1e-5,
):
    """A GPT-2 decoder (learned positions, pre-LayerNorm, GELU-tanh MLP, tied embeddings) as a
    ``kn.layer.Layer``; the defaults are GPT-2 small (124M parameters)."""
    return decoder(
        DecoderConfig(
            vocab_size=vocab_size,
            dim=dim,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_heads,
            hidden_dim=hidden_dim or 4 * dim,
            max_positions=max_positions,
            norm="layer",
            norm_eps=norm_eps,
            mlp="gelu_tanh",
            positions="learned",
        ),
        "gpt2",
    )


def llama(
    vocab_size: int = 32000,
    dim: int = 4096,
    num_layers: int = 32,
    num_heads: int = 32,
    num_kv_heads: int | None = None,
    hidden_dim: int = 11008,
    max_positions: int = 4096,
    rope_theta: float = 10000.0,
    norm_eps: float = 1e-6,
    tie_embeddings: bool = False,
):
    """A Llama-family decoder (RoPE, RMSNorm, SwiGLU MLP, grouped KV heads, no biases) as a
    ``kn.layer.Layer``; the defaults are Llama-2 7B's sizes."""
    return decoder(
        DecoderConfig(
            vocab_size=vocab_size,
            dim=dim,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads or num_heads,
            hidden_dim=hidden_dim,
            max_positions=max_positions,
            norm="rms",
            norm_eps=norm_eps,
            mlp="swiglu",
            positions="rope",
            rope_theta=rope_theta,
            attn_bias=False,
            mlp_bias=False,
            tie_embeddings=tie_embeddings,
        ),
        "llama",
    )


__all__ = [
    "DecoderConfig",
    "NAME_TABLE",
    "Pretrained",
    "cache_length",
    "config_from_hf",
    "decoder",
    "empty_cache",
    "executables",
    "forward",
    "from_pretrained",
    "generate",
    "gpt2",
    "init_params",
    "llama",
    "sample",
]

__dir__ = public_dir(__all__)
