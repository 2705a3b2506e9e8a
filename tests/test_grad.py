"""Whole-function derivatives: kaun_ir's reverse mode vs ``jax.value_and_grad`` / ``jax.vjp``.

Every test writes the same function twice, once with ``kaun_ir`` and once with ``jax.numpy`` /
``jax.lax`` (the oracle), evaluates both on the same parameter trees in float32 and float64,
and compares values, gradients and tree structure. The last part checks that the autodiff
pipeline produces a lean graph for an MLP loss (exact node counts, no duplicates, no
transposes).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import tree as kn_tree

FLOATS = [np.float32, np.float64]
TOL = {np.float32: dict(rtol=3e-4, atol=3e-5), np.float64: dict(rtol=1e-9, atol=1e-11)}


def rand(rng, shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def assert_trees_close(actual, expected, dtype):
    """Same tree structure, same dtypes, values within the tolerance of ``dtype``."""
    a_leaves, a_def = jax.tree_util.tree_flatten(actual)
    e_leaves, e_def = jax.tree_util.tree_flatten(expected)
    assert a_def == e_def, f"tree structure differs: {a_def} vs {e_def}"
    for a, e in zip(a_leaves, e_leaves):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape, (a.shape, e.shape)
        assert a.dtype == np.dtype(dtype), f"expected {np.dtype(dtype)}, got {a.dtype}"
        np.testing.assert_allclose(a, e, **TOL[dtype])


def oracle(fn, *args):
    """``jax.jit(fn)(*args)`` with 64-bit types enabled (float64 inputs stay float64).

    Compiling the oracle as one program is much faster than running it op by op.
    """
    with jax.enable_x64(True):
        return jax.tree_util.tree_map(np.asarray, jax.jit(fn)(*args))


def relu(h):
    return kn.fn.relu(h)


def dense(h, w, b):
    """``h @ w + b``: ``h [..., I]``, ``w [I, O]``, ``b [O]``."""
    return kn.matmul(h, w) + b


# ----------------------------------------------------------------------------- models (kaun_ir)


def kn_cross_entropy(logits, labels):
    """Mean negative log-likelihood of integer ``labels [N]`` under ``logits [N, C]``."""
    logp = kn.log_softmax(logits, axis=-1)
    return -kn.mean(kn.take_along_axis(logp, labels[:, None], axis=1))


def kn_mlp_loss(params, x, labels):
    h = x
    layers = params["layers"]
    for i, layer in enumerate(layers):
        h = dense(h, layer["w"], layer["b"])
        if i < len(layers) - 1:
            h = relu(h)
    return kn_cross_entropy(h, labels)


def kn_mlp_loss_one_hot(params, x, labels):
    h = x
    for i, layer in enumerate(params["layers"]):
        h = dense(h, layer["w"], layer["b"])
        if i < len(params["layers"]) - 1:
            h = relu(h)
    logp = kn.log_softmax(h, axis=-1)
    targets = kn.one_hot(labels, h.shape[-1], dtype=logp.dtype)
    return -kn.sum(targets * logp) / h.shape[0]


def kn_convnet_loss(params, x, labels):
    conv1, conv2, head = params
    h = relu(kn.fn.conv2d(x, conv1["w"], conv1["b"], padding=1))
    h = kn.fn.max_pool2d(h, 2)
    h = relu(kn.fn.conv2d(h, conv2["w"], conv2["b"], stride=2, padding=1))
    h = kn.reshape(h, (h.shape[0], -1))
    return kn_cross_entropy(dense(h, head["w"], head["b"]), labels)


def kn_layer_norm_loss(params, x, c):
    mu = kn.mean(x, axis=-1, keepdims=True)
    var = kn.var(x, axis=-1, keepdims=True)
    y = (x - mu) * kn.rsqrt(var + 1e-5) * params["gamma"] + params["beta"]
    return kn.sum(kn.tanh(y) * c)


def kn_attention_loss(params, x, c):
    q, k, v = (kn.matmul(x, params[name]) for name in ("wq", "wk", "wv"))
    d = q.shape[-1]
    scores = kn.matmul(q, kn.transpose(k, (0, 2, 1))) / math.sqrt(d)
    t = x.shape[1]
    causal = kn.arange(t)[:, None] >= kn.arange(t)[None, :]
    scores = kn.where(causal, scores, -1e9)
    out = kn.matmul(kn.softmax(scores, axis=-1), v)
    return kn.sum(out * c)


# ------------------------------------------------------------------------------- models (jax)


def jax_cross_entropy(logits, labels):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


def jax_mlp_loss(params, x, labels):
    h = x
    layers = params["layers"]
    for i, layer in enumerate(layers):
        h = h @ layer["w"] + layer["b"]
        if i < len(layers) - 1:
            h = jax.nn.relu(h)
    return jax_cross_entropy(h, labels)


def jax_conv(x, w, b, stride=1, padding=0):
    y = jax.lax.conv_general_dilated(
        x, w, (stride, stride), [(padding, padding)] * 2, dimension_numbers=("NCHW", "OIHW", "NCHW")
    )
    return y + b[None, :, None, None]


def jax_max_pool(x, k):
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, k, k), (1, 1, k, k), "VALID")


def jax_convnet_loss(params, x, labels):
    conv1, conv2, head = params
    h = jax.nn.relu(jax_conv(x, conv1["w"], conv1["b"], padding=1))
    h = jax_max_pool(h, 2)
    h = jax.nn.relu(jax_conv(h, conv2["w"], conv2["b"], stride=2, padding=1))
    h = h.reshape(h.shape[0], -1)
    return jax_cross_entropy(h @ head["w"] + head["b"], labels)


def jax_layer_norm_loss(params, x, c):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    y = (x - mu) * jax.lax.rsqrt(var + 1e-5) * params["gamma"] + params["beta"]
    return jnp.sum(jnp.tanh(y) * c)


def jax_attention_loss(params, x, c):
    q, k, v = (x @ params[name] for name in ("wq", "wk", "wv"))
    scores = q @ jnp.swapaxes(k, 1, 2) / math.sqrt(q.shape[-1])
    t = x.shape[1]
    causal = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]
    scores = jnp.where(causal, scores, -1e9)
    return jnp.sum((jax.nn.softmax(scores, axis=-1) @ v) * c)


# -------------------------------------------------------------------------------------- data


def mlp_data(dtype, seed=0, sizes=(6, 16, 5), n=8):
    rng = np.random.default_rng(seed)
    params = {
        "layers": [
            {"w": rand(rng, (a, b), dtype, 1 / math.sqrt(a)), "b": rand(rng, (b,), dtype, 0.1)}
            for a, b in zip(sizes[:-1], sizes[1:])
        ]
    }
    x = rand(rng, (n, sizes[0]), dtype)
    labels = rng.integers(0, sizes[-1], n).astype(np.int32)
    return params, x, labels


def convnet_data(dtype, seed=1):
    rng = np.random.default_rng(seed)
    params = (
        {"w": rand(rng, (4, 3, 3, 3), dtype, 0.3), "b": rand(rng, (4,), dtype, 0.1)},
        {"w": rand(rng, (6, 4, 3, 3), dtype, 0.2), "b": rand(rng, (6,), dtype, 0.1)},
        {"w": rand(rng, (24, 5), dtype, 0.2), "b": rand(rng, (5,), dtype, 0.1)},
    )
    x = rand(rng, (2, 3, 8, 8), dtype)
    labels = np.array([1, 3], np.int32)
    return params, x, labels


def layer_norm_data(dtype, seed=2):
    rng = np.random.default_rng(seed)
    params = {"gamma": 1 + rand(rng, (8,), dtype, 0.1), "beta": rand(rng, (8,), dtype, 0.1)}
    return params, rand(rng, (4, 8), dtype), rand(rng, (4, 8), dtype)


def attention_data(dtype, seed=3):
    rng = np.random.default_rng(seed)
    params = {name: rand(rng, (8, 4), dtype, 0.4) for name in ("wq", "wk", "wv")}
    return params, rand(rng, (2, 5, 8), dtype), rand(rng, (2, 5, 4), dtype)


# --------------------------------------------------------------------------- whole functions

MODELS = {
    "mlp": (kn_mlp_loss, jax_mlp_loss, mlp_data),
    "mlp_one_hot": (kn_mlp_loss_one_hot, jax_mlp_loss, mlp_data),
    "convnet": (kn_convnet_loss, jax_convnet_loss, convnet_data),
    "layer_norm": (kn_layer_norm_loss, jax_layer_norm_loss, layer_norm_data),
    "attention": (kn_attention_loss, jax_attention_loss, attention_data),
}


@pytest.mark.parametrize("dtype", FLOATS, ids=["f32", "f64"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_value_and_grad_matches_jax(model, dtype):
    kn_loss, jax_loss, data = MODELS[model]
    params, x, extra = data(dtype)
    value, grads = kn.value_and_grad(kn_loss)(params, x, extra)
    expected_value, expected_grads = oracle(jax.value_and_grad(jax_loss), params, x, extra)
    assert_trees_close(value, expected_value, dtype)
    assert_trees_close(grads, expected_grads, dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=["f32", "f64"])
def test_layer_norm_grad_wrt_params_and_input(dtype):
    params, x, c = layer_norm_data(dtype)
    grads = kn.grad(kn_layer_norm_loss, argnums=(0, 1))(params, x, c)
    expected = oracle(jax.grad(jax_layer_norm_loss, argnums=(0, 1)), params, x, c)
    assert isinstance(grads, tuple) and len(grads) == 2
    assert_trees_close(grads, expected, dtype)


def test_gradient_tree_keeps_list_and_tuple_containers():
    rng = np.random.default_rng(4)
    params = {"a": [rand(rng, (3,), np.float32), (rand(rng, (2, 3), np.float32), np.float32(1.5))]}

    def kn_f(p):
        v, (m, s) = p["a"]
        return kn.sum(kn.tanh(m @ v) * s)

    def jax_f(p):
        v, (m, s) = p["a"]
        return jnp.sum(jnp.tanh(m @ v) * s)

    grads = kn.grad(kn_f)(params)
    assert isinstance(grads["a"], list) and isinstance(grads["a"][1], tuple)
    assert_trees_close(grads, oracle(jax.grad(jax_f), params), np.float32)


# ------------------------------------------------------------------------ options of kn.grad


@pytest.mark.parametrize("dtype", FLOATS, ids=["f32", "f64"])
def test_has_aux(dtype):
    params, x, labels = mlp_data(dtype)

    def kn_f(p):
        h = relu(dense(x, p["layers"][0]["w"], p["layers"][0]["b"]))
        logits = dense(h, p["layers"][1]["w"], p["layers"][1]["b"])
        return kn_cross_entropy(logits, labels), {"logits": logits, "mean_h": kn.mean(h)}

    def jax_f(p):
        h = jax.nn.relu(x @ p["layers"][0]["w"] + p["layers"][0]["b"])
        logits = h @ p["layers"][1]["w"] + p["layers"][1]["b"]
        return jax_cross_entropy(logits, labels), {"logits": logits, "mean_h": jnp.mean(h)}

    (value, aux), grads = kn.value_and_grad(kn_f, has_aux=True)(params)
    (e_value, e_aux), e_grads = oracle(jax.value_and_grad(jax_f, has_aux=True), params)
    assert_trees_close((value, aux, grads), (e_value, e_aux, e_grads), dtype)
    if dtype == np.float32:  # kn.grad returns (grads, aux), like jax.grad
        grads_only, aux_only = kn.grad(kn_f, has_aux=True)(params)
        assert_trees_close((grads_only, aux_only), (e_grads, e_aux), dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=["f32", "f64"])
def test_argnums_tuple(dtype):
    rng = np.random.default_rng(5)
    a, b, c = rand(rng, (3, 4), dtype), rand(rng, (4,), dtype), rand(rng, (3,), dtype)

    def kn_f(a, b, c):
        return kn.sum(kn.sin(a @ b) * c) + kn.sum(b * b)

    def jax_f(a, b, c):
        return jnp.sum(jnp.sin(a @ b) * c) + jnp.sum(b * b)

    for argnums in [(0, 2), (2, 0), (1,), 1]:
        got = kn.grad(kn_f, argnums=argnums)(a, b, c)
        assert_trees_close(got, oracle(jax.grad(jax_f, argnums=argnums), a, b, c), dtype)
    # negative argnums count from the end, like Python indexing
    assert_trees_close(kn.grad(kn_f, argnums=(-1,))(a, b, c), kn.grad(kn_f, argnums=(2,))(a, b, c), dtype)


def test_integer_arguments_outside_argnums_are_fine():
    params, x, labels = mlp_data(np.float32)
    grads = kn.grad(kn_mlp_loss, argnums=(0, 1))(params, x, labels)
    expected = oracle(jax.grad(jax_mlp_loss, argnums=(0, 1)), params, x, labels)
    assert_trees_close(grads, expected, np.float32)


# ------------------------------------------------------------------------- grad and kn.jit


@pytest.mark.parametrize("dtype", FLOATS, ids=["f32", "f64"])
def test_grad_inside_jit(dtype):
    params, x, labels = mlp_data(dtype)

    @kn.jit
    def step(p, x, labels):
        loss, grads = kn.value_and_grad(kn_mlp_loss)(p, x, labels)
        return loss, sgd_step(p, grads, 0.1)

    loss, new = step(params, x, labels)
    e_loss, e_grads = oracle(jax.value_and_grad(jax_mlp_loss), params, x, labels)
    expected_new = jax.tree_util.tree_map(
        lambda p, g: (p - np.asarray(0.1, dtype) * g).astype(dtype), params, e_grads
    )
    assert_trees_close((loss, new), (e_loss, expected_new), dtype)


def sgd_step(params, grads, lr):
    """``params - lr * grads`` leaf by leaf, with kaun_ir's tree helpers."""
    leaves, treedef = kn_tree.flatten(params)
    g_leaves, _ = kn_tree.flatten(grads)
    return kn_tree.unflatten(treedef, [p - lr * g for p, g in zip(leaves, g_leaves)])


@pytest.mark.parametrize("dtype", FLOATS, ids=["f32", "f64"])
def test_jit_of_grad(dtype):
    params, x, labels = mlp_data(dtype)
    compiled = kn.jit(kn.grad(kn_mlp_loss))
    jax_grad = jax.grad(jax_mlp_loss)
    assert_trees_close(compiled(params, x, labels), oracle(jax_grad, params, x, labels), dtype)
    # a second call with new data reuses the compiled graph and still agrees
    x2, labels2 = (x[::-1] * 0.5).astype(dtype), labels[::-1].copy()
    assert_trees_close(compiled(params, x2, labels2), oracle(jax_grad, params, x2, labels2), dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=["f32", "f64"])
def test_grad_closing_over_traced_values(dtype):
    rng = np.random.default_rng(6)
    w, x = rand(rng, (4,), dtype), rand(rng, (3, 4), dtype)

    @kn.jit
    def kn_step(w, x):
        scale = kn.sum(x * x)  # a traced value of the enclosing jit

        def loss(w):
            return kn.sum(kn.tanh(x @ w)) * scale  # closes over traced x and scale

        return kn.grad(loss)(w)

    def jax_step(w, x):
        scale = jnp.sum(x * x)
        return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)) * scale)(w)

    assert_trees_close(kn_step(w, x), oracle(jax_step, w, x), dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=["f32", "f64"])
def test_inner_grad_closing_over_outer_grad_variable(dtype):
    # d/da [ d/db sum(sin(a * b)) ] = d/da [a cos(ab)]: the inner function closes over the
    # outer grad's traced ``a``, so the inner gradient graph must capture it.
    rng = np.random.default_rng(7)
    a, b = rand(rng, (3,), dtype), rand(rng, (3,), dtype)

    def kn_outer(a):
        return kn.sum(kn.grad(lambda b: kn.sum(kn.sin(a * b)))(b) * b)

    def jax_outer(a):
        return jnp.sum(jax.grad(lambda b: jnp.sum(jnp.sin(a * b)))(b) * b)

    assert_trees_close(kn.grad(kn_outer)(a), oracle(jax.grad(jax_outer), a), dtype)


def test_grad_inside_a_scope_keeps_layer_paths():
    # the backward nodes carry the layer path of their forward node, and the scope around the
    # kn.grad call is applied once (not once for tracing and again for inlining)
    def loss(x):
        with kn.ir.scope("head"):
            y = kn.sin(x)
        return kn.sum(y)

    def outer(x):
        with kn.ir.scope("model"):
            return kn.grad(loss)(x)

    graph = kn.trace(outer, kn.ShapeDtype((2,)))
    paths = {node.op: node.path for node in graph.nodes}
    assert {node.path for node in graph.nodes} == {"model", "model.head"}, graph.text()
    assert paths["sine"] == paths["cosine"] == "model.head"
    assert paths["reduce"] == "model"


# ---------------------------------------------------------------------------- higher order


def kn_curvy(x, a):
    return kn.sum(kn.tanh(a @ x)) + 0.5 * kn.sum(x * x * x) + kn.logsumexp(x * 2.0)


def jax_curvy(x, a):
    return jnp.sum(jnp.tanh(a @ x)) + 0.5 * jnp.sum(x * x * x) + jax.nn.logsumexp(x * 2.0)


@pytest.mark.parametrize("dtype", FLOATS, ids=["f32", "f64"])
def test_hessian_vector_product(dtype):
    rng = np.random.default_rng(8)
    x, v, a = rand(rng, (4,), dtype), rand(rng, (4,), dtype), rand(rng, (3, 4), dtype)
    # Hv = d/dx <grad f(x), v>  (reverse over reverse) vs jax's forward over reverse
    hvp = kn.grad(lambda x: kn.sum(kn.grad(kn_curvy)(x, a) * v))(x)
    expected = oracle(lambda: jax.jvp(lambda x: jax.grad(jax_curvy)(x, a), (x,), (v,))[1])
    assert_trees_close(hvp, expected, dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=["f32", "f64"])
def test_hessian_by_nested_grad(dtype):
    rng = np.random.default_rng(9)
    x, a = rand(rng, (3,), dtype), rand(rng, (2, 3), dtype)

    @kn.jit
    def hessian(x):
        # row i of the Hessian is the gradient of the i-th gradient component
        rows = [kn.grad(lambda x, i=i: kn.grad(kn_curvy)(x, a)[i])(x) for i in range(3)]
        return kn.stack(rows)

    expected = oracle(jax.hessian(jax_curvy), x, a)
    h = hessian(x)
    assert_trees_close(h, expected, dtype)
    np.testing.assert_allclose(np.asarray(h), np.asarray(h).T, **TOL[dtype])  # symmetric


@pytest.mark.parametrize("dtype", FLOATS, ids=["f32", "f64"])
def test_hessian_vector_product_of_mlp_loss(dtype):
    # second order through dot_general, relu (select), log_softmax and take_along_axis
    params, x, labels = mlp_data(dtype, sizes=(3, 4, 3), n=4)
    w1 = params["layers"][0]["w"]
    v = rand(np.random.default_rng(10), w1.shape, dtype)

    def with_w1(w):
        return {"layers": [{"w": w, "b": params["layers"][0]["b"]}, params["layers"][1]]}

    def kn_loss(w):
        return kn_mlp_loss(with_w1(w), x, labels)

    def jax_loss(w):
        return jax_mlp_loss(with_w1(w), x, labels)

    hvp = kn.grad(lambda w: kn.sum(kn.grad(kn_loss)(w) * v))(w1)
    expected = oracle(lambda: jax.jvp(jax.grad(jax_loss), (w1,), (v,))[1])
    assert_trees_close(hvp, expected, dtype)


# --------------------------------------------------------------------------------- kn.vjp


def kn_multi_out(w, x):
    y = x @ w
    return {"y": y, "z": (kn.tanh(w), kn.sum(y * y))}


def jax_multi_out(w, x):
    y = x @ w
    return {"y": y, "z": (jnp.tanh(w), jnp.sum(y * y))}


@pytest.mark.parametrize("dtype", FLOATS, ids=["f32", "f64"])
def test_vjp_with_non_scalar_output_and_cotangent_tree(dtype):
    rng = np.random.default_rng(11)
    w, x = rand(rng, (4, 3), dtype), rand(rng, (5, 4), dtype)
    ct = {"y": rand(rng, (5, 3), dtype), "z": (rand(rng, (4, 3), dtype), np.asarray(0.7, dtype))}
    out, vjp_fn = kn.vjp(kn_multi_out, w, x)
    assert_trees_close(out, oracle(jax_multi_out, w, x), dtype)
    cts = vjp_fn(ct)
    assert isinstance(cts, tuple) and len(cts) == 2
    with jax.enable_x64(True):
        _, e_vjp_fn = jax.vjp(jax_multi_out, w, x)
        expected = jax.tree_util.tree_map(np.asarray, e_vjp_fn(ct))
    assert_trees_close(cts, expected, dtype)
    # the backward function can be called again with another cotangent
    ct2 = jax.tree_util.tree_map(lambda c: (2 * c).astype(dtype), ct)
    assert_trees_close(vjp_fn(ct2), jax.tree_util.tree_map(lambda e: 2 * e, expected), dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=["f32", "f64"])
def test_vjp_inside_jit(dtype):
    rng = np.random.default_rng(12)
    w, x = rand(rng, (4, 3), dtype), rand(rng, (5, 4), dtype)
    ct = {"y": rand(rng, (5, 3), dtype), "z": (rand(rng, (4, 3), dtype), np.asarray(-1.3, dtype))}

    @kn.jit
    def pullback(w, x, ct):
        _, back = kn.vjp(kn_multi_out, w, x)
        return back(ct)

    with jax.enable_x64(True):
        expected = jax.tree_util.tree_map(np.asarray, jax.vjp(jax_multi_out, w, x)[1](ct))
    assert_trees_close(pullback(w, x, ct), expected, dtype)


# ------------------------------------------------------------------------- stop_gradient


@pytest.mark.parametrize("dtype", FLOATS, ids=["f32", "f64"])
def test_stop_gradient(dtype):
    rng = np.random.default_rng(13)
    x = rand(rng, (5,), dtype)

    def kn_f(x):
        return kn.sum(kn.sin(x) * kn.stop_gradient(x * x)) + kn.sum(kn.stop_gradient(kn.exp(x)))

    def jax_f(x):
        return jnp.sum(jnp.sin(x) * jax.lax.stop_gradient(x * x)) + jnp.sum(jax.lax.stop_gradient(jnp.exp(x)))

    value, grads = kn.value_and_grad(kn_f)(x)
    assert_trees_close((value, grads), oracle(jax.value_and_grad(jax_f), x), dtype)
    # fully stopped: the gradient is exactly zero (and the value is still computed)
    zero = kn.grad(lambda x: kn.sum(kn.stop_gradient(kn.tanh(x))))(x)
    assert np.asarray(zero).dtype == np.dtype(dtype)
    np.testing.assert_array_equal(np.asarray(zero), np.zeros_like(x))


def test_stop_gradient_in_second_order():
    # d2/dx2 [x^2 * sg(x)] = 2 sg(x): the stopped factor is a constant for both derivatives
    x = np.float64(1.7)
    got = kn.grad(kn.grad(lambda x: x * x * kn.stop_gradient(x)))(x)
    expected = oracle(jax.grad(jax.grad(lambda x: x * x * jax.lax.stop_gradient(x))), x)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(got), 2 * x, rtol=1e-12)


# ----------------------------------------------------------------------------- lean graph


def mse_mlp_loss(x, w1, b1, w2, b2, y):
    h = kn.maximum(kn.matmul(x, w1) + b1, 0.0)
    d = kn.matmul(h, w2) + b2 - y
    return kn.mean(d * d)


# Hand count of `autodiff,cse,dce` on mse_mlp_loss (x [8,4], w1 [4,16], b1 [16], w2 [16,3],
# b2 [3], y [8,3]; the pass differentiates w.r.t. every float input, y included).
#
# Forward, 14 nodes:
#   a = dot_general(x, w1); broadcast_in_dim(b1); add          a + b1
#   constant 0.0; broadcast_in_dim -> [8,16]; maximum          h = relu(.)
#   dot_general(h, w2); broadcast_in_dim(b2); add; subtract y  d
#   multiply d*d; reduce sum; constant 24.0; divide            loss = sum(d*d) / 24
#
# Reverse sweep, 20 nodes (ct = the incoming cotangent):
#   seed                 constant 1.0                                      +1 constant
#   divide by 24         ct / 24 (the 24 is not active: its rule's other    +1 divide
#                        output is dead and dce removes it)
#   reduce sum           broadcast_in_dim of the scalar ct to [8,3]         +1 broadcast_in_dim
#   multiply d*d         ct*d for both operands: cse merges the two, and    +1 multiply
#                        d's two contributions are summed                   +1 add
#   subtract y           ct to the sum, -ct to y                            +1 negate
#   add b2               ct to both operands                                (none)
#   broadcast b2         sum over the batch axis                            +1 reduce
#   dot h@w2             h_bar = ct·w2^T, w2_bar = h^T·ct, transposes       +2 dot_general
#                        folded into the contracting dims
#   maximum(a, 0)        win = select(a > 0, ct, 0): compare GT, select;    +1 compare, +1 select
#                        the 0 constant and its broadcast merge with the
#                        forward's under cse
#                        tie = select(a == 0, ct * 0.5, 0): compare EQ,     +1 compare, +1 select,
#                        constant 0.5 + broadcast, multiply, select         +1 constant,
#                                                                           +1 broadcast_in_dim,
#                                                                           +1 multiply
#                        a_bar = win + tie                                  +1 add
#                        (the 0 operand is not active: its ct is dead)
#   add b1               (none)
#   broadcast b1         sum over the batch axis                            +1 reduce
#   dot x@w1             x_bar and w1_bar                                   +2 dot_general
EXPECTED_MLP_COUNTS = {
    "dot_general": 2 + 4,
    "broadcast_in_dim": 3 + 2,
    "add": 2 + 2,
    "constant": 2 + 2,
    "maximum": 1,
    "subtract": 1,
    "multiply": 1 + 2,
    "reduce": 1 + 2,
    "divide": 1 + 1,
    "negate": 1,
    "compare": 2,
    "select": 2,
}
assert sum(EXPECTED_MLP_COUNTS.values()) == 14 + 20


def test_autodiff_cse_dce_graph_of_mlp_loss_is_lean():
    S = kn.ShapeDtype
    graph = kn.trace(mse_mlp_loss, S((8, 4)), S((4, 16)), S((16,)), S((16, 3)), S((3,)), S((8, 3)))
    lean = kn.passes.run(graph, "autodiff,cse,dce")
    counts = lean.op_counts()
    assert counts == EXPECTED_MLP_COUNTS, f"op counts differ from the hand count:\n{lean}"
    keys = [node.key for node in lean.nodes]
    assert len(keys) == len(set(keys)), "cse left duplicate nodes"
    assert "transpose" not in counts
    # the lean graph computes the loss and all six gradients
    rng = np.random.default_rng(14)
    args = [rand(rng, v.type.shape, np.float32) for v in graph.inputs]
    got = kn.runtime.compile(lean)(*args)

    def jax_loss(x, w1, b1, w2, b2, y):
        d = jnp.maximum(x @ w1 + b1, 0.0) @ w2 + b2 - y
        return jnp.mean(d * d)

    value, grads = oracle(jax.value_and_grad(jax_loss, argnums=tuple(range(6))), *args)
    assert_trees_close(tuple(got), (value, *grads), np.float32)
