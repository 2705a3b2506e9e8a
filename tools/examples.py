"""Example models for the ``kaun-ir dump / export / viz`` tools, each with default example inputs.

    kaun-ir dump kaun_ir.tools.examples:mlp --stage optimized
    kaun-ir viz kaun_ir.tools.examples:transformer_block -o block.html

``mlp``: ``f32[32,784] -> f32[32,10]``; ``cnn``: NCHW ``f32[8,1,28,28] -> f32[8,10]``;
``transformer_block``: a pre-LN block ``f32[4,16,64] -> f32[4,16,64]``; ``train_step_mlp``: the
MLP with Adam and sparse cross-entropy on ``i32[32]`` labels; ``transformer_train_step``: a
2-block decoder-only language model on token ids ``i32[4,16]`` with AdamW and next-token
cross-entropy (``transformer_train_step_12``: the same with 12 blocks, a large graph).
"""

from __future__ import annotations

from kaun_ir.tools.spec import Model, TrainSetup


def _mlp_layer():
    from kaun_ir import layer

    return layer.sequential([layer.linear(784, 256), layer.relu(), layer.linear(256, 10)])


def mlp() -> Model:
    """784 -> 256 -> ReLU -> 10 on a batch of 32."""
    from kaun_ir.surface.trace import ShapeDtype

    return Model(_mlp_layer(), (ShapeDtype((32, 784)),))


def cnn() -> Model:
    """conv3x3 16, ReLU, pool 2, conv3x3 32, ReLU, pool 2, dense 10 on ``[8, 1, 28, 28]`` (NCHW)."""
    from kaun_ir import layer
    from kaun_ir.surface.trace import ShapeDtype

    model = layer.sequential(
        [
            layer.conv2d(1, 16, 3),
            layer.relu(),
            layer.max_pool2d(2),
            layer.conv2d(16, 32, 3),
            layer.relu(),
            layer.max_pool2d(2),
            layer.flatten(),
            layer.linear(32 * 7 * 7, 10),
        ]
    )
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


def _block(dim: int, heads: int, causal: bool = False):
    """Pre-LN: ``x + attn(ln1(x))``, then ``h + mlp(ln2(h))`` with a GELU MLP (4x expansion):
    ``[B, T, dim] -> [B, T, dim]``."""
    from kaun_ir import layer

    attention = layer.sequential(
        [layer.layer_norm(dim), layer.multi_head_attention(dim, heads, is_causal=causal)], name="attention"
    )
    feed_forward = layer.sequential(
        [layer.layer_norm(dim), layer.linear(dim, 4 * dim), layer.gelu(), layer.linear(4 * dim, dim)],
        name="mlp",
    )
    return layer.sequential([residual(attention), residual(feed_forward)], name="block")


def transformer_block() -> Model:
    """Pre-LN: ``x + attn(ln1(x))``, then ``h + mlp(ln2(h))`` with a GELU MLP (4x expansion);
    ``[4, 16, 64]`` with 4 heads."""
    from kaun_ir.surface.trace import ShapeDtype

    return Model(_block(64, 4), (ShapeDtype((4, 16, 64)),))


def transformer_train_step(layers: int = 2) -> TrainSetup:
    """A decoder-only language model trained with AdamW (1e-3, weight decay 0.01) on next-token
    cross-entropy: token ids ``i32[4, 16]`` -> embedding (vocab 256, dim 64) -> ``layers`` causal
    pre-LN blocks (4 heads) -> layer norm -> logits ``[4, 16, 256]``; labels ``i32[4, 16]``."""
    from kaun_ir import layer, optim
    from kaun_ir.dtypes import int32
    from kaun_ir.nn import loss
    from kaun_ir.surface.trace import ShapeDtype

    vocab, dim, heads, batch, seq = 256, 64, 4, 4, 16
    blocks = [_block(dim, heads, causal=True) for _ in range(layers)]
    model = layer.sequential(
        [layer.embedding(vocab, dim), *blocks, layer.layer_norm(dim), layer.linear(dim, vocab)],
        name="transformer",
    )

    def loss_fn_builder(ids):
        labels = ShapeDtype(tuple(ids.shape), int32)  # the next tokens: an input of the step
        return lambda logits: loss.cross_entropy_sparse(logits, labels)

    return TrainSetup(
        model, optim.adamw(1e-3, weight_decay=0.01), loss_fn_builder, (ShapeDtype((batch, seq), int32),)
    )


def transformer_train_step_12() -> TrainSetup:
    """:func:`transformer_train_step` with 12 blocks: a large graph for trying the viewer (its
    training step has about 29,000 nodes before optimisation)."""
    return transformer_train_step(12)


def train_step_mlp() -> TrainSetup:
    """The MLP trained with Adam on sparse cross-entropy (labels ``i32[32]``)."""
    from kaun_ir import optim
    from kaun_ir.dtypes import int32
    from kaun_ir.nn import loss
    from kaun_ir.surface.trace import ShapeDtype

    def loss_fn_builder(x):
        labels = ShapeDtype((x.shape[0],), int32)  # an input of the step, like real labels
        return lambda logits: loss.cross_entropy_sparse(logits, labels)

    return TrainSetup(_mlp_layer(), optim.adam(1e-3), loss_fn_builder, (ShapeDtype((32, 784)),))


def sharded_mlp_grad():
    """The gradient of a 784 -> 256 -> 10 MLP's loss on 8 devices: the batch of 64 split over
    ``data`` (constrained on the input), the hidden layer split over ``model``
    (``kaun-ir dump kaun_ir.tools.examples:sharded_mlp_grad --stats --devices 8``)."""
    from kaun_ir import sharding
    from kaun_ir.sharding.placement import Spec
    from kaun_ir.surface.elementwise import tanh
    from kaun_ir.surface.reductions import mean
    from kaun_ir.surface.trace import ShapeDtype
    from kaun_ir.transforms.autodiff import grad

    mesh = sharding.mesh((4, 2), ("data", "model"))

    def loss_grad(w1, w2, x):
        def loss(w1, w2):
            rows = sharding.constrain(x, Spec("data"), mesh=mesh)
            h = rows @ sharding.constrain(w1, Spec(None, "model"), mesh=mesh)
            return mean((tanh(h) @ w2) ** 2)

        return grad(loss, argnums=(0, 1))(w1, w2)

    return loss_grad, (ShapeDtype((784, 256)), ShapeDtype((256, 10)), ShapeDtype((64, 784)))
