"""Autoregressive generation with a key/value cache and a bounded number of executables.

Two compiled functions do the work: *prefill* runs the (padded) prompt through the model once and
fills the cache, *decode* appends one token: it writes its keys and values at the current
position and attends over the cache. Both take the position, the prompt length, the random key
and the temperature as run-time inputs, and the cache length is rounded up to a power of two
(at most ``max_positions``), so a model compiles one prefill and one decode executable per
(batch size, cache length, sampling mode) — not one per prompt length or per step.

Sampling: ``temperature=0`` is greedy (argmax); otherwise the logits are divided by the
temperature, restricted to the ``top_k`` largest (ties at the k-th value kept, as Hugging Face
does) and sampled with the Gumbel-max trick from ``kn.random``.
"""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes, ptree
from kaun_ir.models.decoder import DecoderConfig, empty_cache, forward
from kaun_ir.runtime import compilation
from kaun_ir.runtime.jit import jit
from kaun_ir.surface import random, reductions
from kaun_ir.surface.dynamic_slice import dynamic_slice
from kaun_ir.surface.elementwise import log, where
from kaun_ir.surface.promotion import astype
from kaun_ir.surface.shapes import reshape
from kaun_ir.surface.take import one_hot


def top_k_threshold(logits, k: int):
    """Per row of ``logits [B, V]``, the k-th largest value ``[B, 1]`` (duplicates counted)."""
    vocab = logits.shape[-1]
    remaining = logits
    value = None
    for _ in range(k):  # k argmax sweeps: exact with ties, cheap for the small k used in sampling
        index = reductions.argmax(remaining, axis=-1)
        chosen = one_hot(index, vocab, dtype=dtypes.bool_)
        value = reductions.max(where(chosen, remaining, -np.inf), axis=-1, keepdims=True)
        remaining = where(chosen, -np.inf, remaining)
    return value


def sample(logits, key, temperature, greedy: bool, top_k: int | None):
    """Next token ids ``[B]`` (int32) from last-position logits ``[B, V]``."""
    logits = astype(logits, dtypes.float32)
    if greedy:
        return astype(reductions.argmax(logits, axis=-1), dtypes.int32)
    scaled = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        scaled = where(scaled >= top_k_threshold(scaled, top_k), scaled, -np.inf)
    uniform = random.uniform(key, scaled.shape, minval=np.finfo(np.float32).tiny, maxval=1.0)
    gumbel = -log(-log(uniform))
    return astype(reductions.argmax(scaled + gumbel, axis=-1), dtypes.int32)


def _functions(cfg: DecoderConfig, greedy: bool, top_k: int | None):
    """The (prefill, decode) pair of ``kn.jit`` functions for one model config and sampling mode,
    kept for the process by the runtime."""
    return compilation.shared(("generate", cfg, greedy, top_k), lambda: _make_functions(cfg, greedy, top_k))


def _make_functions(cfg: DecoderConfig, greedy: bool, top_k: int | None):
    def prefill(params, cache, ids, length, rng_key, temperature):
        logits, cache = forward(cfg, params, ids, cache, astype(0, dtypes.int32))
        batch, _, vocab = logits.shape
        zero = astype(0, dtypes.int32)
        last = dynamic_slice(logits, [zero, length - 1, zero], (batch, 1, vocab))
        return sample(reshape(last, (batch, vocab)), rng_key, temperature, greedy, top_k), cache

    def decode(params, cache, token, position, rng_key, temperature):
        logits, cache = forward(cfg, params, reshape(token, (token.shape[0], 1)), cache, position)
        step_key = random.fold_in(rng_key, position)
        return sample(logits[:, 0, :], step_key, temperature, greedy, top_k), cache

    return jit(prefill), jit(decode, donate_argnums=(1,))


def cache_length(cfg: DecoderConfig, needed: int) -> int:
    """The cache length used for ``needed`` positions: the next power of two (>= 16), capped at
    ``max_positions``."""
    if needed > cfg.max_positions:
        raise ValueError(f"generate: {needed} positions exceed the model's max_positions={cfg.max_positions}")
    length = 16
    while length < needed:
        length *= 2
    return min(length, cfg.max_positions)


def generate(
    model,
    prompt,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int = 0,
    params=None,
) -> np.ndarray:
    """Continue ``prompt`` (int ids ``[B, T]`` or ``[T]``) by ``max_new_tokens`` tokens.

    ``model``: a :class:`~kaun_ir.models.Pretrained` (or a ``DecoderConfig`` with ``params=``).
    ``temperature=0`` is greedy decoding; otherwise sampling at ``temperature``, restricted to
    the ``top_k`` most likely tokens when given, reproducible for a ``seed``. Returns the prompt
    followed by the new tokens, int32 ``[B, T + max_new_tokens]`` (``[T + ...]`` for a 1-D
    prompt).
    """
    cfg = getattr(model, "config", model)
    params = model.params if params is None else params
    if not isinstance(cfg, DecoderConfig):
        raise TypeError(
            f"generate: expected a Pretrained model or a DecoderConfig, got {type(model).__name__}"
        )
    ids = np.asarray(prompt)
    squeeze = ids.ndim == 1
    ids = ids[None] if squeeze else ids
    if ids.ndim != 2 or ids.shape[1] == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"generate: prompt must be non-empty integer ids [B, T] or [T], got {ids.dtype}{list(ids.shape)}"
        )
    if max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"generate: top_k must be >= 1, got {top_k}")
    if temperature < 0:
        raise ValueError(f"generate: temperature must be >= 0, got {temperature}")
    batch, length = ids.shape
    total = length + max_new_tokens
    size = cache_length(cfg, total)
    greedy = temperature == 0
    prefill, decode = _functions(cfg, greedy, top_k)
    dtype = next(iter(ptree_leaves(params))).dtype
    cache = empty_cache(cfg, batch, size, dtype)
    padded = np.zeros((batch, size), np.int32)
    padded[:, :length] = ids
    rng_key = random.key(seed)
    temp = np.float32(temperature if temperature > 0 else 1.0)
    out = [ids.astype(np.int32)]
    if max_new_tokens:
        token, cache = prefill(params, cache, padded, np.int32(length), rng_key, temp)
        out.append(np.asarray(token)[:, None])
        for position in range(length, total - 1):
            token, cache = decode(params, cache, token, np.int32(position), rng_key, temp)
            out.append(np.asarray(token)[:, None])
    result = np.concatenate(out, axis=1)
    return result[0] if squeeze else result


def ptree_leaves(tree):
    """The leaves of a parameter tree in flattening order."""
    return ptree.flatten(tree)[0]


def executables(model) -> int:
    """How many executables generation has compiled for ``model``'s config so far."""
    cfg = getattr(model, "config", model)

    return sum(
        fn.trace_count for key, pair in compilation.shared_items("generate") if key[1] == cfg for fn in pair
    )
