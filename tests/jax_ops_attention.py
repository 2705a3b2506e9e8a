"""JAX equivalents of the fused attention ops (``fused_attention``, ``fused_attention_grad``),
written with ``jax.numpy`` from the formulas, for the generated op-table tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _logits(q, k, scale, causal):
    s = jnp.einsum("bthd,bshd->bhts", q, k) * scale
    if causal:
        t, n = s.shape[-2:]
        s = jnp.where(jnp.tril(jnp.ones((t, n), bool)), s, -jnp.inf)
    return s


def _fused_attention(q, k, v, scale, causal):
    s = _logits(q, k, scale, causal)
    lse = jax.nn.logsumexp(s, axis=-1)
    out = jnp.einsum("bhts,bshe->bthe", jax.nn.softmax(s, axis=-1), v)
    return out, lse


def _fused_attention_grad(q, k, v, out, lse, ct_out, ct_lse, scale, causal):
    # the op's inputs out and lse are read as given (not recomputed), as the backward pass does
    p = jnp.exp(_logits(q, k, scale, causal) - lse[..., None])
    dp = jnp.einsum("bthe,bshe->bhts", ct_out, v)
    delta = jnp.einsum("bthe,bthe->bht", ct_out, out) - ct_lse
    ds = p * (dp - delta[..., None]) * scale
    return (
        jnp.einsum("bhts,bshd->bthd", ds, k),
        jnp.einsum("bhts,bthd->bshd", ds, q),
        jnp.einsum("bhts,bthe->bshe", p, ct_out),
    )


JAX_OPS: dict = {
    "fused_attention": _fused_attention,
    "fused_attention_grad": _fused_attention_grad,
}
