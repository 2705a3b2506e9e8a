"""Shape-inferred layers: sizes left out of linear/conv/norm/attention layers are read from the
example given to layer.init (or train.init), by an abstract trace; the parameters equal those of
the explicit model (tree, shapes and, for one seed, values), given sizes are checked, and sizes
that cannot be inferred are errors naming the layer path."""

from __future__ import annotations

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import layer, optim, ptree, rng, train
from kaun_ir import tree as kn_tree
from kaun_ir.checkpoint import core as checkpoint


def _block(dim, heads):
    attention = layer.sequential([layer.layer_norm(dim), layer.multi_head_attention(dim, heads)])
    mlp = layer.sequential(
        [
            layer.rms_norm(dim),
            layer.linear(dim, 4 * dim if dim else None),
            layer.gelu(),
            layer.linear(4 * dim if dim else None, dim),
        ]
    )
    return layer.sequential([layer.residual(attention), layer.residual(mlp)])


def _inferred_block(dim_out, heads):
    attention = layer.sequential([layer.layer_norm(), layer.multi_head_attention(num_heads=heads)])
    mlp = layer.sequential(
        [
            layer.rms_norm(),
            layer.linear(out_features=4 * dim_out),
            layer.gelu(),
            layer.linear(out_features=dim_out),
        ]
    )
    return layer.sequential([layer.residual(attention), layer.residual(mlp)])


# (name, explicit model, the same model without input sizes, example input)
MODELS = [
    (
        "mlp",
        lambda: layer.sequential([layer.linear(64, 128), layer.relu(), layer.linear(128, 10)]),
        lambda: layer.sequential(
            [layer.linear(out_features=128), layer.relu(), layer.linear(out_features=10)]
        ),
        (5, 64),
    ),
    (
        "cnn",
        lambda: layer.sequential(
            [
                layer.conv2d(1, 8, 3),
                layer.batch_norm(8),
                layer.relu(),
                layer.max_pool2d(2),
                layer.conv2d(8, 12, 3, stride=2, padding=1, groups=4),
                layer.relu(),
                layer.flatten(),
                layer.linear(12 * 2 * 2, 10),
            ]
        ),
        lambda: layer.sequential(
            [
                layer.conv2d(out_channels=8, kernel_size=3),
                layer.batch_norm(),
                layer.relu(),
                layer.max_pool2d(2),
                layer.conv2d(out_channels=12, kernel_size=3, stride=2, padding=1, groups=4),
                layer.relu(),
                layer.flatten(),
                layer.linear(out_features=10),
            ]
        ),
        (3, 1, 8, 8),
    ),
    (
        "conv1d",
        lambda: layer.compose(layer.conv1d(3, 5, 2, padding="valid"), layer.layer_norm(6, use_bias=False)),
        lambda: layer.compose(
            layer.conv1d(out_channels=5, kernel_size=2, padding="valid"), layer.layer_norm(use_bias=False)
        ),
        (2, 3, 7),
    ),
    ("transformer_block", lambda: _block(16, 4), lambda: _inferred_block(16, 4), (2, 5, 16)),
]


def _assert_same_vars(a: layer.Vars, b: layer.Vars):
    for part in ("params", "state"):
        pa, pb = ptree.flatten_with_paths(getattr(a, part)), ptree.flatten_with_paths(getattr(b, part))
        assert [p for p, _ in pa] == [p for p, _ in pb]
        for (path, x), (_, y) in zip(pa, pb):
            assert np.shape(x) == np.shape(y), path
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=path)
    assert tree_structure(a.params) == tree_structure(b.params)


def tree_structure(t):
    return kn_tree.flatten(t)[1]


@pytest.mark.parametrize("name,explicit,inferred,shape", MODELS, ids=[m[0] for m in MODELS])
def test_inferred_parameters_equal_the_explicit_ones(name, explicit, inferred, shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    with rng.scope(3):
        want = layer.init(explicit())
    model = inferred()
    with rng.scope(3):
        got = layer.init(model, kn.ShapeDtype(shape))  # no data: only the shape is read
    _assert_same_vars(got, want)
    # given sizes keep working alongside an example, and give the same again
    with rng.scope(3):
        _assert_same_vars(layer.init(explicit(), x), want)
    y_got, _ = layer.apply(model, got, x)
    y_want, _ = layer.apply(explicit(), want, x)
    np.testing.assert_array_equal(np.asarray(y_got), np.asarray(y_want))


def test_inference_compiles_nothing():
    explicit, inferred = MODELS[1][1](), MODELS[1][2]()
    with rng.scope(0):
        layer.init(explicit)  # compiles the initialisers for these shapes once
    before = kn.runtime.stats.compiles
    with rng.scope(0):
        layer.init(inferred, kn.ShapeDtype((3, 1, 8, 8)))
    assert kn.runtime.stats.compiles == before


def test_float64_and_positional_dtype_still_work():
    model = layer.sequential([layer.linear(out_features=3)])
    with rng.scope(0):
        v = layer.init(model, np.zeros((2, 4), np.float32), kn.float64)
        assert layer.init(layer.linear(4, 3), kn.float64).dtype == kn.float64
    assert v.dtype == kn.float64 and np.asarray(v.params[0]["weight"]).dtype == np.float64
    assert np.shape(v.params[0]["weight"]) == (4, 3)


def test_train_init_with_an_example_and_checkpoints_interchange(tmp_path):
    explicit, inferred = MODELS[0][1](), MODELS[0][2]()
    with rng.scope(1):
        st_explicit = train.init(train.make(explicit, optim.adam(1e-3)))
    trainer = train.make(inferred, optim.adam(1e-3))
    with rng.scope(1):
        st = train.init(trainer, example=np.zeros((4, 64), np.float32))
    _assert_same_vars(st.vars, st_explicit.vars)
    path = str(tmp_path / "inferred.safetensors")
    checkpoint.save(path, st.vars.params)
    loaded = checkpoint.load(path, like=st_explicit.vars.params)
    for (p, a), (_, b) in zip(ptree.flatten_with_paths(loaded), ptree.flatten_with_paths(st.vars.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=p)


# (model, example shape, error type, words the message must hold)
BAD = [
    (
        lambda: layer.sequential([layer.linear(out_features=4), layer.relu(), layer.linear(5, 2)]),
        (2, 3),
        kn.ShapeError,
        ["2.linear", "in_features=5", "has 4"],
    ),
    (
        lambda: layer.sequential([layer.conv2d(out_channels=4), layer.batch_norm(3)]),
        (1, 2, 5, 5),
        kn.ShapeError,
        ["1.batch_norm", "num_features=3", "has 4"],
    ),
    (
        lambda: layer.compose(layer.linear(out_features=6), layer.multi_head_attention(num_heads=4)),
        (2, 3, 5),
        kn.ShapeError,
        ["right.multi_head_attention", "divisible by num_heads"],
    ),
    (
        lambda: layer.sequential([layer.flatten(), layer.conv2d(out_channels=3)]),
        (2, 3, 4),
        kn.ShapeError,
        ["1.conv2d", "[N, C, H, W]"],
    ),
    (
        lambda: layer.sequential([layer.linear(out_features=4), layer.layer_norm()]),
        None,
        ValueError,
        ["0.linear", "in_features was not given", "layer.init(model, example)"],
    ),
    (
        lambda: layer.sequential([layer.linear(3, 4), layer.residual(layer.sequential([layer.rms_norm()]))]),
        None,
        ValueError,
        ["1.residual.block.sequential.0.rms_norm", "dim was not given"],
    ),
]


@pytest.mark.parametrize("make,shape,error,words", BAD, ids=[", ".join(b[3][:2]) for b in BAD])
def test_errors_name_the_layer_path(make, shape, error, words):
    with pytest.raises(error) as info, rng.scope(0):
        layer.init(make(), None if shape is None else kn.ShapeDtype(shape))
    for word in words:
        assert word in str(info.value), str(info.value)


def test_constructor_errors():
    with pytest.raises(ValueError, match="out_features is required"):
        layer.linear(10)
    with pytest.raises(ValueError, match="out_channels is required"):
        layer.conv2d()
    with pytest.raises(ValueError, match="num_heads is required"):
        layer.multi_head_attention()
    with pytest.raises(TypeError, match="example input"):
        layer.init(layer.linear(out_features=2), ["not an array"])


def test_layers_with_a_dtype_only_init_pass_the_type_through():
    def init_(dt):  # an older user layer: its init knows nothing of the input
        return layer.Vars({"s": kn.ones((), dt)}, [], dt)

    def apply_(params, state, x, *, training, ctx):
        return kn.concatenate([x, x * params["s"]], axis=-1), state

    doubling = layer.Layer(init_, apply_, "doubling")
    model = layer.sequential([doubling, layer.linear(out_features=3)])
    with rng.scope(0):
        v = layer.init(model, kn.ShapeDtype((2, 4)))
    assert np.shape(v.params[1]["weight"]) == (8, 3)
    assert layer.eval_shape(model, v, kn.ShapeDtype((7, 4))) == kn.ShapeDtype((7, 3))


@pytest.mark.parametrize("index", [1, 3], ids=["cnn", "transformer_block"])
def test_summary_of_the_inferred_model_equals_the_explicit_one(index):
    _, explicit, inferred, shape = MODELS[index]
    example = kn.ShapeDtype(shape)
    got = layer.summary(inferred(), example, print_fn=None)
    want = layer.summary(explicit(), example, print_fn=None)
    assert got == want and got[-1]["path"] == "total" and got[-1]["params"] > 0
