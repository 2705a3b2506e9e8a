"""Example models for the ``kaun-ir dump / export / viz`` tools, each with default example inputs.

    kaun-ir dump kaun_ir.tools.examples:mlp --stage optimized
    kaun-ir viz kaun_ir.tools.examples:transformer_block -o block.html

``mlp``: ``f32[32,784] -> f32[32,10]``; ``cnn``: NCHW ``f32[8,1,28,28] -> f32[8,10]``;
``transformer_block``: a pre-LN block ``f32[4,16,64] -> f32[4,16,64]``; ``train_step_mlp``: the
MLP with Adam and sparse cross-entropy on ``i32[32]`` labels.
"""

from __future__ import annotations

from .spec import Model, TrainSetup


def _mlp_layer():
    from kaun_ir import layer

    return layer.sequential([layer.linear(784, 256), layer.relu(), layer.linear(256, 10)])


def mlp() -> Model:
    """784 -> 256 -> ReLU -> 10 on a batch of 32."""
    from kaun_ir import ShapeDtype

    return Model(_mlp_layer(), (ShapeDtype((32, 784)),))


def cnn() -> Model:
    """conv3x3 16, ReLU, pool 2, conv3x3 32, ReLU, pool 2, dense 10 on ``[8, 1, 28, 28]`` (NCHW)."""
    from kaun_ir import ShapeDtype, layer

    model = layer.sequential([
        layer.conv2d(1, 16, 3), layer.relu(), layer.max_pool2d(2),
        layer.conv2d(16, 32, 3), layer.relu(), layer.max_pool2d(2),
        layer.flatten(), layer.linear(32 * 7 * 7, 10),
    ])
    return Model(model, (ShapeDtype((8, 1, 28, 28)),))


def residual(inner, name: str = "residual"):
    """``x + inner(x)`` as a layer (the inner layer's path is ``"body.<name>"``)."""
    from kaun_ir import layer
    from kaun_ir.ir.builder import scope

    def init_(dt):
        return inner.init(dt)

    def apply_(params, state, x, *, training, ctx):
        with scope(f"body.{inner.name}"):
            y, new_state = inner.apply(params, state, x, training=training, ctx=ctx)
        return x + y, new_state

    return layer.Layer(init_, apply_, name)


def transformer_block() -> Model:
    """Pre-LN: ``x + attn(ln1(x))``, then ``h + mlp(ln2(h))`` with a GELU MLP (4x expansion);
    ``[4, 16, 64]`` with 4 heads."""
    from kaun_ir import ShapeDtype, layer

    dim, heads = 64, 4
    attention = layer.sequential([layer.layer_norm(dim), layer.multi_head_attention(dim, heads)],
                                 name="attention")
    feed_forward = layer.sequential([layer.layer_norm(dim), layer.linear(dim, 4 * dim), layer.gelu(),
                                     layer.linear(4 * dim, dim)], name="mlp")
    block = layer.sequential([residual(attention), residual(feed_forward)], name="block")
    return Model(block, (ShapeDtype((4, 16, 64)),))


def train_step_mlp() -> TrainSetup:
    """The MLP trained with Adam on sparse cross-entropy (labels ``i32[32]``)."""
    from kaun_ir import ShapeDtype, int32, loss, optim

    def loss_fn_builder(x):
        labels = ShapeDtype((x.shape[0],), int32)  # an input of the step, like real labels
        return lambda logits: loss.cross_entropy_sparse(logits, labels)

    return TrainSetup(_mlp_layer(), optim.adam(1e-3), loss_fn_builder, (ShapeDtype((32, 784)),))
