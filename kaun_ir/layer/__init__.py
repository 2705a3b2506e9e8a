"""``kn.layer``: models as data — ``Layer`` records of ``init`` and ``apply``, their ``Vars``,
combinators and the standard layers.

    model = kn.layer.sequential([kn.layer.linear(784, 128), kn.layer.relu(), kn.layer.linear(128, 10)])
    with kn.rng.scope(0):
        vars = kn.layer.init(model)                      # params [{"weight", "bias"}, [], {...}]
    logits, vars = kn.layer.apply(model, vars, x)        # compiled and cached

See :mod:`kaun_ir.layer.core` for the calling conventions and the ``ctx`` dict (random keys for
dropout, attention masks).
"""

from kaun_ir.layer import core as _core
from kaun_ir.layer import show as _show
from kaun_ir.layer.activation import gelu, relu, sigmoid, silu, tanh
from kaun_ir.layer.attention import multi_head_attention
from kaun_ir.layer.blocks import (
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    global_avg_pool,
    residual,
    tied_embedding,
)
from kaun_ir.layer.combinators import child_ctx, compose, sequential
from kaun_ir.layer.conv import conv1d, conv2d
from kaun_ir.layer.core import Layer, Vars, dtype, params, state, with_params, with_state
from kaun_ir.layer.dropout import dropout
from kaun_ir.layer.embedding import embedding
from kaun_ir.layer.forward import apply
from kaun_ir.layer.initialise import child_init, eval_shape, init
from kaun_ir.layer.linear import linear
from kaun_ir.layer.lora import lora, lora_frozen, lora_merge, lora_vars
from kaun_ir.layer.normalization import batch_norm, layer_norm, rms_norm
from kaun_ir.layer.pooling import avg_pool1d, avg_pool2d, flatten, max_pool1d, max_pool2d
from kaun_ir.layer.recurrent import from_torch as recurrent_from_torch
from kaun_ir.layer.recurrent import gru, lstm, rnn
from kaun_ir.layer.show import summary
from kaun_ir.names import public_dir

# Layer and Vars show themselves through layer.show, which is built on them: wired in here, once
_core.install_views(
    vars_repr=_show.vars_repr,
    vars_html=_show.vars_html,
    layer_repr=_show.layer_repr,
    layer_html=_show.layer_html,
)

__all__ = [
    "Layer",
    "Vars",
    "init",
    "apply",
    "params",
    "state",
    "dtype",
    "with_params",
    "with_state",
    "sequential",
    "compose",
    "child_ctx",
    "child_init",
    "eval_shape",
    "linear",
    "conv1d",
    "conv2d",
    "max_pool1d",
    "max_pool2d",
    "avg_pool1d",
    "avg_pool2d",
    "flatten",
    "dropout",
    "batch_norm",
    "layer_norm",
    "rms_norm",
    "embedding",
    "relu",
    "gelu",
    "silu",
    "tanh",
    "sigmoid",
    "multi_head_attention",
    "rnn",
    "gru",
    "lstm",
    "recurrent_from_torch",
    "residual",
    "global_avg_pool",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "tied_embedding",
    "summary",
    "lora",
    "lora_merge",
    "lora_vars",
    "lora_frozen",
]

__dir__ = public_dir(__all__)
