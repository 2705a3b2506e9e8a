"""The token ``embedding`` layer.

Each returns a :class:`~kaun_ir.layer.core.Layer`. Hyper-parameters are checked when the layer
is built (``ValueError`` naming the argument); input shapes when it is applied (``ShapeError``
naming the layer path, e.g. ``"1.linear: ..."``).
"""

from __future__ import annotations

import math

from kaun_ir import dtypes
from kaun_ir.layer.construct import (
    make_param,
    path_prefix,
    positive_int,
    resolve_init,
    stateless,
)
from kaun_ir.layer.core import Layer
from kaun_ir.nn import functional as nn
from kaun_ir.nn import init as initializers
from kaun_ir.surface.tensor import type_of

__all__ = ["embedding"]


def embedding(vocab_size: int, embed_dim: int, scale: bool = True, embedding_init=None) -> Layer:
    """Token embedding: integer ids ``I`` -> ``I + [embed_dim]``, the rows of
    ``{"weight": [vocab_size, embed_dim]}`` (``kn.fn.embedding``; out-of-range ids are clamped).

    With ``scale=True`` (Kaun's default) the rows are multiplied by ``sqrt(embed_dim)``, as in
    the Transformer paper. The default initialiser is ``kn.init.normal(1 / sqrt(embed_dim))``,
    so scaled embeddings start with unit variance.
    """
    vocab_size = positive_int(vocab_size, "vocab_size", "embedding")
    embed_dim = positive_int(embed_dim, "embed_dim", "embedding")
    table_init = resolve_init(
        embedding_init, initializers.normal(1.0 / math.sqrt(embed_dim)), "embedding_init", "embedding"
    )
    factor = math.sqrt(embed_dim)

    def forward(p, ids, training, ctx):
        t = type_of(ids)
        if not dtypes.is_integer(t.dtype):
            raise TypeError(f"{path_prefix()}embedding expects integer token ids, got {t}")
        y = nn.embedding(p["weight"], ids)
        return y * factor if scale else y

    return stateless(
        "embedding", forward, lambda dt: {"weight": make_param(table_init, (vocab_size, embed_dim), dt)}
    )
