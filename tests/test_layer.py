"""kn.layer: each layer's forward pass against a jax reference with the same parameters, its
gradients (kn.grad through layer.apply) against jax.grad, batch-norm state threading, dropout
keys, combinator paths, caching and error messages.

Several layers are checked together in one model (one compiled function per side), because XLA
compilation dominates the cost of these small problems."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import layer, ptree, rng
from kaun_ir.nn import functional as nn
from kaun_ir.nn import init as kinit

LN_EPS, RMS_EPS, BN_EPS = 1e-5, 1e-6, 1e-5  # the layers' defaults


def _host(tree):
    return jax.tree_util.tree_map(np.asarray, tree)


def _close(got, want, tol=1e-9):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def _close_trees(got, want, tol=1e-9):
    got_paths, want_paths = ptree.flatten_with_paths(_host(got)), ptree.flatten_with_paths(_host(want))
    assert [p for p, _ in got_paths] == [p for p, _ in want_paths]
    for (path, g), (_, w) in zip(got_paths, want_paths):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=path)


def _check_model(model, x, jax_forward, *, training=False, ctx=None, wrt_x=True, seed=0):
    """Forward values, new state and the gradient of sum(y**3) w.r.t. params (and x) against
    ``jax_forward(params, state, x) -> (y, state)``, all in float64."""
    with rng.scope(seed):
        v = layer.init(model, kn.float64)
    argnums = (0, 1) if wrt_x else (0,)

    def loss(params, x):
        y, v2 = layer.apply(model, layer.with_params(v, params), x, training=training, ctx=ctx)
        return kn.sum(y**3), (y, v2.state)

    def jax_loss(params, x):
        y, state = jax_forward(params, v.state, x)
        return jnp.sum(y**3), (y, state)

    (_, (y, state)), grads = kn.value_and_grad(loss, argnums=argnums, has_aux=True)(v.params, x)
    with jax.enable_x64(True):
        params64 = _host(v.params)
        (_, (want_y, want_state)), want_grads = jax.jit(
            jax.value_and_grad(jax_loss, argnums=argnums, has_aux=True)
        )(params64, x)
    _close(y, want_y)
    _close_trees(state, want_state)
    _close_trees(grads, want_grads, 1e-8)
    return v, np.asarray(y)


# ------------------------------------------------------------------------------ jax references


def _jax_linear(p, x):
    return x @ p["weight"] + p["bias"]


def _jax_conv(p, x, stride, padding, dilation=1, groups=1):
    nd = x.ndim - 2
    spec = ("NCH", "OIH", "NCH") if nd == 1 else ("NCHW", "OIHW", "NCHW")

    def tup(v):
        return (v,) * nd if isinstance(v, int) else tuple(v)

    pad = padding.upper() if isinstance(padding, str) else [(q, q) for q in tup(padding)]
    y = jax.lax.conv_general_dilated(
        x,
        p["weight"],
        tup(stride),
        pad,
        rhs_dilation=tup(dilation),
        dimension_numbers=spec,
        feature_group_count=groups,
        precision="highest",
    )
    return y + p["bias"].reshape((-1,) + (1,) * nd)


def _jax_pool(x, kind, kernel, stride):
    dims, strides = (1, 1) + kernel, (1, 1) + stride
    if kind == "max":
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, dims, strides, "VALID")
    return jax.lax.reduce_window(x, 0.0, jax.lax.add, dims, strides, "VALID") / np.prod(kernel)


def _jax_layer_norm(p, x):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + LN_EPS) * p["scale"] + p["bias"]


def _jax_rms_norm(p, x):
    return x / jnp.sqrt((x * x).mean(-1, keepdims=True) + RMS_EPS) * p["scale"]


def _jax_rope(x, base=10000.0):
    seq_len, depth = x.shape[-3], x.shape[-1]
    half = depth // 2
    angles = np.arange(seq_len)[:, None] * base ** (-np.arange(0, depth, 2) / depth)
    c, s = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    first, second = x[..., :half], x[..., half:]
    return jnp.concatenate([first * c - second * s, second * c + first * s], axis=-1)


def _jax_mha(p, x, heads, kv_heads, is_causal=False, rope=False, mask=None):
    batch, seq_len, embed = x.shape
    hd = embed // heads
    q = _jax_linear(p["query"], x).reshape(batch, seq_len, heads, hd)
    k = _jax_linear(p["key"], x).reshape(batch, seq_len, kv_heads, hd)
    v = _jax_linear(p["value"], x).reshape(batch, seq_len, kv_heads, hd)
    if rope:
        q, k = _jax_rope(q), _jax_rope(k)
    k, v = jnp.repeat(k, heads // kv_heads, axis=2), jnp.repeat(v, heads // kv_heads, axis=2)
    logits = jnp.einsum("bthd,bshd->bhts", q, k, precision="highest") / np.sqrt(hd)
    allowed = jnp.ones(logits.shape, bool)
    if mask is not None:
        allowed = allowed & (mask[:, None, None, :] if mask.ndim == 2 else mask)
    if is_causal:
        allowed = allowed & jnp.tril(jnp.ones((seq_len, seq_len), bool))
    logits = jnp.where(allowed, logits, -0.7 * np.finfo(logits.dtype).max)
    out = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(logits, -1), v, precision="highest")
    return _jax_linear(p["out"], out.reshape(batch, seq_len, embed))


# ------------------------------------------------------------------------------ forward + grad


def test_cnn_layers_match_jax():
    """conv2d (same / strided+grouped), relu, pools, flatten, linear, gelu, tanh, sigmoid."""
    model = layer.sequential(
        [
            layer.conv2d(2, 4),  # 3x3, 'same'
            layer.relu(),
            layer.max_pool2d(2),  # 8x8 -> 4x4
            layer.conv2d(4, 6, kernel_size=(3, 2), stride=(2, 1), padding=1, groups=2),  # -> 2x5
            layer.tanh(),
            layer.avg_pool2d(2, stride=1),  # -> 1x4
            layer.flatten(),
            layer.linear(24, 5),
            layer.gelu(),
            layer.linear(5, 3),
            layer.sigmoid(),
        ]
    )

    def forward(p, state, x):
        x = jax.nn.relu(_jax_conv(p[0], x, 1, "same"))
        x = _jax_pool(x, "max", (2, 2), (2, 2))
        x = jnp.tanh(_jax_conv(p[3], x, (2, 1), 1, groups=2))
        x = _jax_pool(x, "avg", (2, 2), (1, 1)).reshape(x.shape[0], -1)
        x = jax.nn.gelu(_jax_linear(p[7], x), approximate=False)
        return jax.nn.sigmoid(_jax_linear(p[9], x)), state

    x = np.random.default_rng(0).standard_normal((2, 2, 8, 8))
    v, _ = _check_model(model, x, forward)
    shapes = {path: leaf.shape for path, leaf in ptree.flatten_with_paths(v.params)}
    assert shapes == {
        "0.weight": (4, 2, 3, 3),
        "0.bias": (4,),
        "3.weight": (6, 2, 3, 2),
        "3.bias": (6,),
        "7.weight": (24, 5),
        "7.bias": (5,),
        "9.weight": (5, 3),
        "9.bias": (3,),
    }
    assert v.params[1] == [] and v.params[2] == [] and v.state == [[]] * 11


def test_conv1d_and_batch_norm_training_match_jax():
    """conv1d (valid, dilated) and batch norm in training: batch statistics normalise, the
    running statistics update as momentum * running + (1 - momentum) * batch, silu."""
    model = layer.sequential(
        [
            layer.conv1d(3, 4, kernel_size=3, padding="valid", dilation=2),
            layer.batch_norm(4, momentum=0.9),
            layer.silu(),
            layer.flatten(),
        ]
    )

    def forward(p, state, x):
        x = _jax_conv(p[0], x, 1, "valid", dilation=2)
        mean, var = x.mean((0, 2)), x.var((0, 2))
        y = (x - mean[:, None]) / jnp.sqrt(var[:, None] + BN_EPS)
        y = y * p[1]["scale"][:, None] + p[1]["bias"][:, None]
        bn = state[1]
        new = {
            "running_mean": 0.9 * bn["running_mean"] + 0.1 * mean,
            "running_var": 0.9 * bn["running_var"] + 0.1 * var,
        }
        return jax.nn.silu(y).reshape(x.shape[0], -1), [[], new, [], []]

    x = np.random.default_rng(1).standard_normal((3, 3, 9)) * 2 + 1
    v, _ = _check_model(model, x, forward, training=True)
    assert v.params[0]["weight"].shape == (4, 3, 3)


def test_sequence_layers_match_jax():
    """embedding (scaled), layer norm, grouped-query causal attention with rope and a padding
    mask from ctx, rms norm, linear; params of compose under left/right."""
    heads, kv_heads = 4, 2
    model = layer.compose(
        layer.embedding(11, 8),
        layer.sequential(
            [
                layer.layer_norm(8),
                layer.multi_head_attention(8, heads, num_kv_heads=kv_heads, is_causal=True, rope=True),
                layer.rms_norm(8),
                layer.linear(8, 6),
            ]
        ),
    )
    ids = np.array([[1, 5, 2, 10, 0], [3, 3, 7, 1, 9]], np.int32)
    mask = np.array([[True] * 5, [True, True, True, False, False]])

    def forward(p, state, ids):
        x = p["left"]["weight"][ids] * np.sqrt(8)
        body = p["right"]
        x = _jax_layer_norm(body[0], x)
        x = _jax_mha(body[1], x, heads, kv_heads, is_causal=True, rope=True, mask=mask)
        x = _jax_rms_norm(body[2], x)
        return _jax_linear(body[3], x), state

    v, y = _check_model(model, ids, forward, ctx={"attention_mask": mask}, wrt_x=False)
    paths = [p for p, _ in ptree.flatten_with_paths(v.params)]
    assert "left.weight" in paths and "right.1.key.weight" in paths and "right.3.bias" in paths
    assert v.params["right"][1]["key"]["weight"].shape == (8, 4)  # 2 kv heads of dimension 2
    assert y.shape == (2, 5, 6)


def test_attention_without_rope_and_with_a_full_mask_matches_jax():
    model = layer.multi_head_attention(6, 3)
    rng_np = np.random.default_rng(2)
    x = rng_np.standard_normal((2, 4, 6))
    mask = rng_np.random((2, 1, 4, 4)) > 0.3
    mask[..., 0] = True  # every query sees something

    def forward(p, state, x):
        return _jax_mha(p, x, 3, 3, mask=mask), state

    _check_model(model, x, forward, ctx={"attention_mask": mask})


def test_embedding_without_scale_and_float32_inputs_cast_to_the_model_dtype():
    model = layer.embedding(5, 3, scale=False)
    with rng.scope(0):
        v = layer.init(model)
    ids = np.array([4, 0, 4], np.int32)
    y, _ = layer.apply(model, v, ids)
    _close(y, np.asarray(v.params["weight"])[ids], 0)
    lin = layer.linear(2, 2)
    with rng.scope(0):
        v64 = layer.init(lin, kn.float64)
    y, _ = layer.apply(lin, v64, np.ones((1, 2), np.float32))
    assert y.dtype == np.float64


# ------------------------------------------------------------------------------ batch norm state


def test_batch_norm_state_threading_training_versus_evaluation():
    bn = layer.batch_norm(2)  # momentum 0.99
    with rng.scope(0):
        v = layer.init(bn)
    _close(v.state["running_mean"], np.zeros(2), 0)
    _close(v.state["running_var"], np.ones(2), 0)
    x = np.random.default_rng(3).standard_normal((8, 2, 3)) * [[[2.0], [0.5]]] + [[[3.0], [-1.0]]]
    x = x.astype(np.float32)
    mean, var = x.mean((0, 2)), x.var((0, 2))

    # evaluation: running statistics (0, 1) are used and the state does not change
    y, v_eval = layer.apply(bn, v, x)
    _close(y, x / np.sqrt(1 + 1e-5), 1e-6)
    _close(v_eval.state["running_mean"], np.zeros(2), 0)

    # training: batch statistics normalise, the state moves 1% towards them, params unchanged
    y, v1 = layer.apply(bn, v, x, training=True)
    _close(y, (x - mean[:, None]) / np.sqrt(var[:, None] + 1e-5), 1e-5)
    _close(v1.state["running_mean"], 0.01 * mean, 1e-6)
    _close(v1.state["running_var"], 0.99 + 0.01 * var, 1e-6)
    assert v1.params is v.params
    y, v2 = layer.apply(bn, v1, x, training=True)
    _close(v2.state["running_mean"], 0.99 * 0.01 * mean + 0.01 * mean, 1e-6)

    # evaluation after training uses the updated running statistics
    y, _ = layer.apply(bn, v2, x)
    rm, rv = np.asarray(v2.state["running_mean"]), np.asarray(v2.state["running_var"])
    _close(y, (x - rm[:, None]) / np.sqrt(rv[:, None] + 1e-5), 1e-5)


# ------------------------------------------------------------------------------ dropout


def test_dropout_layer_keys_and_modes():
    model = layer.sequential([layer.dropout(0.5), layer.dropout(0.5)])
    v = layer.init(model)  # no parameters: no rng scope needed
    x = np.ones((4, 64), np.float32)
    y, _ = layer.apply(model, v, x)
    np.testing.assert_array_equal(np.asarray(y), x)  # evaluation: identity

    key = kn.random.key(0)
    a, _ = layer.apply(model, v, x, training=True, ctx={"rng": key})
    b, _ = layer.apply(model, v, x, training=True, ctx={"rng": key})
    c, _ = layer.apply(model, v, x, training=True, ctx={"rng": kn.random.key(1)})
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(a), np.asarray(c))
    # layer i of a sequential draws with fold_in(key, i)
    first = nn.dropout(kn.random.fold_in(key, 0), x, 0.5)
    want = nn.dropout(kn.random.fold_in(key, 1), first, 0.5)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(want))

    # inside an rng scope, each training call draws a fresh key from the scope
    with rng.scope(5):
        d, _ = layer.apply(model, v, x, training=True)
        e, _ = layer.apply(model, v, x, training=True)
    with rng.scope(5):
        d2, _ = layer.apply(model, v, x, training=True)
    assert not np.array_equal(np.asarray(d), np.asarray(e))
    np.testing.assert_array_equal(np.asarray(d), np.asarray(d2))

    # new keys do not recompile; training=True/False are two signatures
    assert model.cache.compiled.trace_count == 2

    with pytest.raises(ValueError, match=r"1\.dropout: dropout in training mode needs a random key"):
        layer.apply(layer.sequential([layer.relu(), layer.dropout(0.1)]), v, x, training=True)


# ------------------------------------------------------------------------------ combinators


def test_sequential_and_compose_paths_and_ir_scopes():
    inner = layer.sequential([layer.linear(3, 4), layer.relu()])
    model = layer.sequential([layer.flatten(), inner, layer.compose(layer.linear(4, 2), layer.tanh())])
    with rng.scope(0):
        v = layer.init(model)
    paths = [p for p, _ in ptree.flatten_with_paths(v.params)]
    assert paths == ["1.0.bias", "1.0.weight", "2.left.bias", "2.left.weight"]
    assert v.params[0] == [] and v.params[2]["right"] == []
    assert ptree.count_parameters(v.params) == 3 * 4 + 4 + 4 * 2 + 2

    graph = kn.trace(
        lambda p, x: layer.apply(model, layer.with_params(v, p), x)[0],
        v.params,
        kn.ShapeDtype((2, 3), kn.float32),
    )
    node_paths = {node.path for node in graph.nodes}
    assert "1.sequential.0.linear" in node_paths and "2.compose.left.linear" in node_paths
    assert any(node.op == "dot_general" and node.path == "1.sequential.0.linear" for node in graph.nodes)
    assert "1.sequential.0.linear" in graph.text()


def test_shape_errors_name_the_layer_path():
    model = layer.sequential([layer.linear(4, 8), layer.relu(), layer.linear(7, 2)])
    with rng.scope(0):
        v = layer.init(model)
    with pytest.raises(
        kn.ShapeError,
        match=r"^2\.linear: linear\(in_features=7, out_features=2\) expects an "
        r"input \[\.\.\., 7\], got f32\[3,8\]",
    ):
        layer.apply(model, v, np.ones((3, 4), np.float32))

    # a primitive's own shape error inside a custom layer carries the path too
    def bad_apply(params, state, x, *, training, ctx):
        return kn.matmul(x, np.ones((5, 2), np.float32)), state

    custom = layer.Layer(lambda dt: layer.Vars([], [], dt), bad_apply, "custom")
    with pytest.raises(kn.ShapeError, match=r"1\.custom: matmul of f32\[3,8\] and f32\[5,2\]"):
        layer.apply(
            layer.sequential([layer.linear(4, 8), custom]),
            layer.Vars([v.params[0], []], [[], []], kn.float32),
            np.ones((3, 4), np.float32),
        )
    with pytest.raises(kn.ShapeError, match=r"conv2d: input .* has 3 channels"):
        conv = layer.conv2d(2, 4)
        with rng.scope(0):
            layer.apply(conv, layer.init(conv), np.ones((1, 3, 5, 5), np.float32))
    with pytest.raises(kn.ShapeError, match=r"batch_norm\(num_features=3\) expects an input \[N, 3, "):
        bn = layer.batch_norm(3)
        layer.apply(bn, layer.init(bn), np.ones((2, 4), np.float32))
    with pytest.raises(TypeError, match="integer token ids"):
        emb = layer.embedding(4, 2)
        with rng.scope(0):
            layer.apply(emb, layer.init(emb), np.ones((2,), np.float32))


@pytest.mark.parametrize(
    "build, arg",
    [
        (lambda: layer.linear(0, 3), "in_features"),
        (lambda: layer.linear(3, 2.5), "out_features"),
        (lambda: layer.conv2d(3, 4, groups=2), "groups"),
        (lambda: layer.conv2d(4, 4, kernel_size=0), "kernel_size"),
        (lambda: layer.conv2d(4, 4, stride=2), "padding='same' needs stride 1"),
        (lambda: layer.conv1d(4, 4, padding="full"), "padding"),
        (lambda: layer.conv2d(4, 4, padding=-1), "padding"),
        (lambda: layer.max_pool2d(0), "kernel_size"),
        (lambda: layer.avg_pool2d(2, padding=2), "padding"),
        (lambda: layer.dropout(1.0), "rate"),
        (lambda: layer.dropout(-0.1), "rate"),
        (lambda: layer.batch_norm(4, momentum=1.5), "momentum"),
        (lambda: layer.batch_norm(4, eps=0), "eps"),
        (lambda: layer.layer_norm(0), "dim"),
        (lambda: layer.rms_norm(4, eps=-1), "eps"),
        (lambda: layer.embedding(0, 4), "vocab_size"),
        (lambda: layer.multi_head_attention(10, 3), "divisible by num_heads"),
        (lambda: layer.multi_head_attention(8, 4, num_kv_heads=3), "multiple of num_kv_heads"),
        (lambda: layer.multi_head_attention(6, 2, rope=True), "even head dimension"),
        (lambda: layer.multi_head_attention(8, 2, dropout=2.0), "dropout"),
        (lambda: layer.linear(2, 2, weight_init="glorot"), "weight_init"),
    ],
)
def test_invalid_hyper_parameters_raise_value_error(build, arg):
    with pytest.raises(ValueError, match=arg):
        build()


# ------------------------------------------------------------------------------ api surface


def test_apply_is_compiled_once_per_signature_and_traces_inside_jit():
    model = layer.sequential([layer.linear(3, 2), layer.relu()])
    with rng.scope(0):
        v = layer.init(model)
    x = np.ones((4, 3), np.float32)
    y1, _ = layer.apply(model, v, x)
    y2, _ = layer.apply(model, v, x * 2)
    assert model.cache.compiled.trace_count == 1
    layer.apply(model, v, np.ones((5, 3), np.float32))
    assert model.cache.compiled.trace_count == 2

    jitted = kn.jit(lambda p, x: layer.apply(model, layer.with_params(v, p), x)[0])
    np.testing.assert_allclose(np.asarray(jitted(v.params, x * 2)), np.asarray(y2), rtol=1e-6)
    assert model.cache.compiled.trace_count == 2  # traced through, not called compiled

    # the gradient through apply: d/dW sum(relu(x W + b)) for x = ones
    g = kn.grad(lambda p: kn.sum(layer.apply(model, layer.with_params(v, p), x)[0]))(v.params)
    active = (np.ones((1, 3)) @ np.asarray(v.params[0]["weight"]) + np.asarray(v.params[0]["bias"])) > 0
    _close(g[0]["bias"], 4.0 * active[0], 1e-6)
    _close(g[0]["weight"], np.repeat(4.0 * active, 3, axis=0), 1e-6)


def test_vars_accessors_and_init_dtypes():
    model = layer.batch_norm(3)
    v = layer.init(model, kn.bfloat16)
    assert layer.dtype(v) == kn.bfloat16 and layer.params(v) is v.params and layer.state(v) is v.state
    assert np.asarray(v.params["scale"]).dtype == kn.bfloat16
    v2 = layer.with_params(v, {"scale": 1, "bias": 2})
    v3 = layer.with_state(v, "s")
    assert v2.params == {"scale": 1, "bias": 2} and v2.state is v.state and v3.state == "s"
    with pytest.raises(TypeError, match="floating point"):
        layer.init(model, kn.int32)
    with pytest.raises(TypeError, match="Vars"):
        layer.apply(model, v.params, np.ones((2, 3), np.float32))
    with pytest.raises(TypeError, match="training must be a Python bool"):
        layer.apply(model, v, np.ones((2, 3), np.float32), training="yes")
    with pytest.raises(TypeError, match="Layer"):
        layer.sequential([layer.relu(), "relu"])


def test_initialisers_are_configurable():
    model = layer.linear(3, 2, weight_init=kinit.constant(0.5), bias_init=kinit.ones)
    with rng.scope(0):  # every parameter draws a key, whatever its initialiser
        v = layer.init(model)
    _close(v.params["weight"], np.full((3, 2), 0.5), 0)
    _close(v.params["bias"], np.ones(2), 0)
    with rng.scope(0):
        he = layer.init(layer.linear(300, 200, weight_init=kinit.he_normal))  # factory passed uncalled
    std = float(np.asarray(he.params["weight"]).std())
    assert abs(std / np.sqrt(2 / 300) - 1) < 0.05
