"""The dense layer ``linear``: ``x @ weight + bias``.

Each returns a :class:`~kaun_ir.layer.core.Layer`. Hyper-parameters are checked when the layer
is built (``ValueError`` naming the argument); input shapes when it is applied (``ShapeError``
naming the layer path, e.g. ``"1.linear: ..."``).
"""

from __future__ import annotations

from kaun_ir.layer.construct import (
    dense,
    infer_size,
    make_param,
    optional_positive_int,
    positive_int,
    resolve_init,
)
from kaun_ir.layer.core import Layer, Vars
from kaun_ir.nn import init as initializers
from kaun_ir.surface.tensor import type_of

__all__ = ["linear"]


def linear(
    in_features: int | None = None,
    out_features: int | None = None,
    weight_init=None,
    bias_init=None,
    use_bias: bool = True,
) -> Layer:
    """Fully connected layer ``y = x @ weight + bias``: ``[..., in] -> [..., out]``.

    Parameters ``{"weight": [in_features, out_features], "bias": [out_features]}`` (no bias with
    ``use_bias=False``). ``in_features`` may be left out (``linear(out_features=10)``): it is
    then the last axis of the example given to ``layer.init(model, example)``. Defaults:
    ``weight_init = kn.init.glorot_uniform()``, ``bias_init = kn.init.zeros``.
    """
    if out_features is None:
        raise ValueError(
            "layer.linear: out_features is required (linear(out_features=n) infers in_features "
            "from the example given to layer.init)"
        )
    in_features = optional_positive_int(in_features, "in_features", "linear")
    out_features = positive_int(out_features, "out_features", "linear")
    weight_init = resolve_init(weight_init, initializers.glorot_uniform(), "weight_init", "linear")
    bias_init = resolve_init(bias_init, initializers.zeros, "bias_init", "linear")

    def init_(dt, x=None):
        n_in = infer_size(in_features, x, -1, 1, "in_features", "linear", "[..., in_features]")
        p = {"weight": make_param(weight_init, (n_in, out_features), dt)}
        if use_bias:
            p["bias"] = make_param(bias_init, (out_features,), dt)
        return Vars(p, [], dt)

    def apply_(params, state, x, *, training, ctx):
        n_in = type_of(params["weight"]).shape[0]
        return dense(params, x, n_in, f"linear(in_features={n_in}, out_features={out_features})"), state

    return Layer(init_, apply_, "linear")
