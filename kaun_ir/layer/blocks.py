"""Building blocks that porting ResNets and GPTs asked for: residual connections, global and
adaptive average pooling, and an embedding tied to the output head."""

from __future__ import annotations

import math
from typing import Any

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.builder import scope
from kaun_ir.layer.combinators import child_ctx
from kaun_ir.layer.construct import make_param, path_prefix, positive_int, resolve_init, stateless
from kaun_ir.layer.core import Layer, Vars
from kaun_ir.layer.initialise import child_init, eval_shape
from kaun_ir.nn import init as initializers
from kaun_ir.nn.functional import embedding
from kaun_ir.surface.elementwise import add, multiply
from kaun_ir.surface.linalg import matmul
from kaun_ir.surface.reductions import mean
from kaun_ir.surface.shapes import concatenate, reshape, transpose
from kaun_ir.surface.tensor import apply, type_of
from kaun_ir.surface.trace import ShapeDtype

__all__ = ["residual", "global_avg_pool", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "tied_embedding"]


def _check_layer(value: Any, what: str) -> None:
    if not isinstance(value, Layer):
        raise TypeError(f"layer.{what} must be a kn.layer.Layer, got {type(value).__name__}")


def _path_name(prefix: str, layer: Layer) -> str:
    return f"{prefix}.{layer.name}" if layer.name else prefix


def _slice_axis(x: Any, axis: int, start: int, stop: int) -> Any:
    shape = type_of(x).shape
    starts = tuple(start if i == axis else 0 for i in range(len(shape)))
    limits = tuple(stop if i == axis else d for i, d in enumerate(shape))
    return apply("slice", x, start_indices=starts, limit_indices=limits, strides=(1,) * len(shape))


def residual(block: Layer, shortcut: Layer | None = None, name: str = "residual") -> Layer:
    """``block(x) + shortcut(x)``; the shortcut is the identity when None (a ResNet basic block's
    shortcut is a strided 1x1 convolution and batch norm where the shape changes).

    Params and state ``{"block": ...}`` (and ``"shortcut"`` when given); layer paths
    ``"block.<name>"`` / ``"shortcut.<name>"``; ``ctx["rng"]`` is folded with 0 for the block and
    1 for the shortcut. The two outputs must have the same shape."""
    _check_layer(block, "residual: block")
    if shortcut is not None:
        _check_layer(shortcut, "residual: shortcut")

    def init_(dt, x=None):
        with scope(_path_name("block", block)):
            bv = child_init(block, dt, x)
        params, state = {"block": bv.params}, {"block": bv.state}
        if shortcut is not None:
            with scope(_path_name("shortcut", shortcut)):
                sv = child_init(shortcut, dt, x)
            params["shortcut"], state["shortcut"] = sv.params, sv.state
        return Vars(params, state, dt)

    def apply_(params, state, x, *, training, ctx):
        with scope(_path_name("block", block)):
            y, bs = block.apply(params["block"], state["block"], x, training=training, ctx=child_ctx(ctx, 0))
        new_state = {"block": bs}
        skip = x
        if shortcut is not None:
            with scope(_path_name("shortcut", shortcut)):
                skip, ss = shortcut.apply(
                    params["shortcut"], state["shortcut"], x, training=training, ctx=child_ctx(ctx, 1)
                )
            new_state["shortcut"] = ss
        if type_of(y).shape != type_of(skip).shape:
            raise ShapeError(
                f"{path_prefix() or 'residual: '}the block's output {type_of(y)} and the shortcut's "
                f"{type_of(skip)} differ in shape; give a shortcut layer that maps the input "
                "to the block's output shape"
            )
        return add(y, skip), new_state

    return Layer(init_, apply_, name)


def global_avg_pool(keepdims: bool = False) -> Layer:
    """The mean over every spatial axis of a channels-first input: ``[N, C, *spatial] -> [N, C]``
    (``[N, C, 1, ...]`` with ``keepdims``), PyTorch's ``AdaptiveAvgPool2d(1)`` + flatten."""

    def forward(p, x, training, ctx):
        t = type_of(x)
        if t.ndim < 3:
            raise ShapeError(f"global_avg_pool expects an input [N, C, *spatial], got {t}")
        return mean(x, axis=tuple(range(2, t.ndim)), keepdims=bool(keepdims))

    return stateless("global_avg_pool", forward)


def _bins(size: int, out: int) -> list[tuple[int, int]]:
    """PyTorch's adaptive pooling windows: bin ``i`` covers ``[floor(i*size/out), ceil((i+1)*size/out))``."""
    return [((i * size) // out, -((-(i + 1) * size) // out)) for i in range(out)]


def _adaptive_axis(x: Any, axis: int, out: int) -> Any:
    size = type_of(x).shape[axis]
    if size % out == 0:  # equal windows: one reshape and one mean
        shape = list(type_of(x).shape)
        shape[axis : axis + 1] = [out, size // out]
        return mean(reshape(x, tuple(shape)), axis=axis + 1)
    pieces = [
        mean(_slice_axis(x, axis, start, stop), axis=axis, keepdims=True) for start, stop in _bins(size, out)
    ]
    return concatenate(pieces, axis=axis)


def _adaptive(nd: int, output_size: Any, name: str) -> Layer:
    sizes = (output_size,) * nd if isinstance(output_size, int) else tuple(output_size)
    if len(sizes) != nd:
        raise ValueError(f"layer.{name}: output_size must be an int or {nd} ints, got {output_size!r}")
    sizes = tuple(positive_int(s, "output_size", name) for s in sizes)

    def forward(p, x, training, ctx):
        t = type_of(x)
        if t.ndim != nd + 2:
            raise ShapeError(f"{name} expects an input [N, C, {'L' if nd == 1 else 'H, W'}], got {t}")
        for k, out in enumerate(sizes):
            x = _adaptive_axis(x, 2 + k, out)
        return x

    return stateless(name, forward)


def adaptive_avg_pool1d(output_size: int) -> Layer:
    """Average pooling to a fixed length, like PyTorch's ``AdaptiveAvgPool1d``: ``[N, C, L] ->
    [N, C, output_size]``; window ``i`` averages ``[floor(i*L/out), ceil((i+1)*L/out))``."""
    return _adaptive(1, output_size, "adaptive_avg_pool1d")


def adaptive_avg_pool2d(output_size: Any) -> Layer:
    """Average pooling to a fixed size, like PyTorch's ``AdaptiveAvgPool2d``: ``[N, C, H, W] ->
    [N, C, *output_size]`` (an int means square); windows as in :func:`adaptive_avg_pool1d`,
    per axis. ``adaptive_avg_pool2d(1)`` is :func:`global_avg_pool` with ``keepdims``."""
    return _adaptive(2, output_size, "adaptive_avg_pool2d")


def tied_embedding(
    vocab_size: int,
    embed_dim: int,
    body: Layer,
    scale: bool = False,
    head_bias: bool = False,
    embedding_init=None,
    name: str = "tied_embedding",
) -> Layer:
    """A language-model shell whose output head reuses the embedding matrix (weight tying, as in
    GPT-2 / nanoGPT): ``ids [..., T] -> embed -> body -> logits [..., T, vocab_size]`` with
    ``logits = h @ weight.T`` (+ a bias of ``[vocab_size]`` with ``head_bias``).

    Params ``{"embedding": {"weight": [vocab_size, embed_dim]}, "body": ...}`` (plus
    ``"head_bias"``): the one matrix gets the gradients of both uses. ``scale`` multiplies the
    embedded rows by ``sqrt(embed_dim)`` (off by default, as in GPT-2). ``body`` maps
    ``[..., T, embed_dim]`` to ``[..., T, embed_dim]`` (position embeddings, blocks, final norm).
    Layer paths ``"embedding"``, ``"body.<name>"``, ``"head"``."""
    vocab_size = positive_int(vocab_size, "vocab_size", name)
    embed_dim = positive_int(embed_dim, "embed_dim", name)
    _check_layer(body, f"{name}: body")
    table_init = resolve_init(embedding_init, initializers.normal(0.02), "embedding_init", name)
    factor = math.sqrt(embed_dim)

    def init_(dt, x=None):
        with scope("embedding"):
            params: dict = {"embedding": {"weight": make_param(table_init, (vocab_size, embed_dim), dt)}}
        h = None
        if x is not None:
            h = ShapeDtype(tuple(x.shape) + (embed_dim,), dt)
        with scope(_path_name("body", body)):
            bv = child_init(body, dt, h)
            if h is not None:
                eval_shape(body, bv, h)  # the body must keep the width: checked at init
        params["body"] = bv.params
        if head_bias:
            params["head_bias"] = initializers.zeros(None, (vocab_size,), dt)
        return Vars(params, {"body": bv.state}, dt)

    def apply_(params, state, ids, *, training, ctx):
        t = type_of(ids)
        if not dtypes.is_integer(t.dtype):
            raise TypeError(f"{name} expects integer token ids, got {t}")
        weight = params["embedding"]["weight"]
        with scope("embedding"):
            h = embedding(weight, ids)
            if scale:
                h = multiply(h, factor)
        with scope(_path_name("body", body)):
            h, bs = body.apply(params["body"], state["body"], h, training=training, ctx=child_ctx(ctx, 0))
        ht = type_of(h)
        if ht.ndim < 1 or ht.shape[-1] != embed_dim:
            raise ShapeError(f"{name}: the body must return [..., {embed_dim}] for the tied head, got {ht}")
        with scope("head"):
            logits = matmul(h, transpose(weight, (1, 0)))
            if head_bias:
                logits = add(logits, params["head_bias"])
        return logits, {"body": bs}

    return Layer(init_, apply_, name)
