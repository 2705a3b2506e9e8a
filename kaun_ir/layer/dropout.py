"""The ``dropout`` layer (its randomness comes from ``ctx["rng"]``).

Each returns a :class:`~kaun_ir.layer.core.Layer`. Hyper-parameters are checked when the layer
is built (``ValueError`` naming the argument); input shapes when it is applied (``ShapeError``
naming the layer path, e.g. ``"1.linear: ..."``).
"""

from __future__ import annotations

from kaun_ir.layer.construct import (
    path_prefix,
    rate_in_unit_interval,
    stateless,
)
from kaun_ir.layer.core import Layer
from kaun_ir.nn import functional as nn

__all__ = ["dropout"]


def dropout(rate: float) -> Layer:
    """Inverted dropout (``kn.fn.dropout``): in training, zero each element with probability
    ``rate`` and scale the rest by ``1 / (1 - rate)``; the identity in evaluation.

    The randomness comes from ``ctx["rng"]`` (see ``kn.layer``'s context): in training with
    ``rate > 0`` and no key, applying the layer raises ValueError.
    """
    rate = rate_in_unit_interval(rate, "rate", "dropout")

    def forward(p, x, training, ctx):
        if not training or rate == 0.0:
            return x
        key = ctx.get("rng")
        if key is None:
            raise ValueError(
                f"{path_prefix()}dropout in training mode needs a random key: pass "
                "ctx={'rng': key} to layer.apply, or call it inside `with kn.rng.scope(seed):`"
            )
        return nn.dropout(key, x, rate)

    return stateless("dropout", forward)
