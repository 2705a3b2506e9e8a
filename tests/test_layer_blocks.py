"""Residual connections, global / adaptive average pooling, tied embeddings, batch norm's
unbiased running variance; kn.sort / argsort / top_k and kn.random.categorical.

Oracles: NumPy (direct formulas, PyTorch's adaptive-pooling windows written out), jax.numpy /
jax.lax / jax.grad."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import layer, rng

RNG = np.random.default_rng(11)


def _init(model, example=None, seed=0):
    with rng.scope(seed):
        return layer.init(model, example) if example is not None else layer.init(model)


def _np(t):
    return jax.tree_util.tree_map(np.asarray, t)


# ------------------------------------------------------------------------------ residual


def test_residual_with_identity_and_projection_shortcuts():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    identity = layer.residual(layer.linear(4, 4))
    v = _init(identity)
    p = _np(v.params)["block"]
    want = x @ p["weight"] + p["bias"] + x
    np.testing.assert_allclose(np.asarray(layer.apply(identity, v, x)[0]), want, rtol=1e-5, atol=1e-6)

    projected = layer.residual(
        layer.sequential([layer.linear(4, 6), layer.relu()]), shortcut=layer.linear(4, 6)
    )
    v = _init(projected)
    p = _np(v.params)
    block = np.maximum(x @ p["block"][0]["weight"] + p["block"][0]["bias"], 0)
    skip = x @ p["shortcut"]["weight"] + p["shortcut"]["bias"]
    np.testing.assert_allclose(
        np.asarray(layer.apply(projected, v, x)[0]), block + skip, rtol=1e-5, atol=1e-6
    )

    with pytest.raises(kn.ShapeError, match="differ in shape"):
        layer.apply(layer.residual(layer.linear(4, 6)), _init(layer.residual(layer.linear(4, 6))), x)
    with pytest.raises(TypeError, match="must be a kn.layer.Layer"):
        layer.residual(3)


def test_residual_gradient_matches_jax():
    model = layer.residual(layer.linear(4, 4))
    v = _init(model)
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    grads = kn.grad(lambda p: kn.sum(layer.apply(model, layer.with_params(v, p), x)[0] ** 2))(v.params)

    def ref(p):
        y = x @ p["block"]["weight"] + p["block"]["bias"] + x
        return jnp.sum(y**2)

    want = jax.grad(ref)(_np(v.params))
    for a, b in zip(kn.ptree.leaves(grads), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ pooling


def _adaptive_reference(x, out_h, out_w):
    """PyTorch's AdaptiveAvgPool2d, window by window."""
    n, c, h, w = x.shape
    y = np.zeros((n, c, out_h, out_w), np.float64)
    for i in range(out_h):
        h0, h1 = math.floor(i * h / out_h), math.ceil((i + 1) * h / out_h)
        for j in range(out_w):
            w0, w1 = math.floor(j * w / out_w), math.ceil((j + 1) * w / out_w)
            y[:, :, i, j] = x[:, :, h0:h1, w0:w1].mean(axis=(2, 3))
    return y


@pytest.mark.parametrize("size,out", [((8, 6), (4, 3)), ((7, 5), (3, 2)), ((5, 3), (7, 4)), ((6, 6), 1)])
def test_adaptive_avg_pool2d_matches_pytorchs_windows(size, out):
    x = RNG.standard_normal((2, 3) + size).astype(np.float32)
    model = layer.adaptive_avg_pool2d(out)
    out_hw = (out, out) if isinstance(out, int) else out
    y = np.asarray(layer.apply(model, _init(model), x)[0])
    np.testing.assert_allclose(y, _adaptive_reference(x.astype(np.float64), *out_hw), rtol=1e-5, atol=1e-6)


def test_adaptive_avg_pool1d_and_global_avg_pool():
    x = RNG.standard_normal((2, 3, 7)).astype(np.float32)
    y = np.asarray(layer.apply(layer.adaptive_avg_pool1d(3), _init(layer.adaptive_avg_pool1d(3)), x)[0])
    want = _adaptive_reference(x[..., None].astype(np.float64), 3, 1)[..., 0]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    images = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    gap = layer.global_avg_pool()
    np.testing.assert_allclose(
        np.asarray(layer.apply(gap, _init(gap), images)[0]), images.mean(axis=(2, 3)), rtol=1e-5, atol=1e-6
    )
    kept = layer.global_avg_pool(keepdims=True)
    assert layer.apply(kept, _init(kept), images)[0].shape == (2, 3, 1, 1)
    with pytest.raises(kn.ShapeError, match=r"\[N, C, \*spatial\]"):
        layer.apply(gap, _init(gap), images[:, :, 0, 0])
    with pytest.raises(ValueError, match="output_size"):
        layer.adaptive_avg_pool2d((1, 2, 3))


# ------------------------------------------------------------------------------ tied embedding


def test_tied_embedding_shares_one_matrix_between_input_and_head():
    body = layer.sequential([layer.layer_norm(8), layer.linear(8, 8)])
    model = layer.tied_embedding(11, 8, body, head_bias=True)
    ids = RNG.integers(0, 11, size=(2, 5)).astype(np.int32)
    v = _init(model, ids)
    assert set(v.params) == {"embedding", "body", "head_bias"}

    def ref(p):
        w = p["embedding"]["weight"]
        h = w[ids]
        ln, lin = p["body"]
        mu = h.mean(-1, keepdims=True)
        var = ((h - mu) ** 2).mean(-1, keepdims=True)
        h = (h - mu) / jnp.sqrt(var + 1e-5) * ln["scale"] + ln["bias"]
        h = h @ lin["weight"] + lin["bias"]
        return h @ w.T + p["head_bias"]

    params = _np(v.params)
    np.testing.assert_allclose(
        np.asarray(layer.apply(model, v, ids)[0]), np.asarray(ref(params)), rtol=1e-4, atol=1e-5
    )
    grads = kn.grad(lambda p: kn.sum(layer.apply(model, layer.with_params(v, p), ids)[0] ** 2))(v.params)
    want = jax.grad(lambda p: jnp.sum(ref(p) ** 2))(params)
    # the one matrix collects the gradient of the lookup and of the head
    np.testing.assert_allclose(
        np.asarray(grads["embedding"]["weight"]),
        np.asarray(want["embedding"]["weight"]),
        rtol=1e-4,
        atol=1e-4,
    )
    with pytest.raises(kn.ShapeError, match="must return"):
        bad = layer.tied_embedding(11, 8, layer.linear(8, 4))
        layer.apply(bad, _init(bad), ids)


# ------------------------------------------------------------------------------ batch norm


@pytest.mark.parametrize("unbiased", [False, True])
def test_batch_norm_running_variance_biased_or_unbiased(unbiased):
    model = layer.batch_norm(3, momentum=0.9, unbiased_running_var=unbiased)
    x = RNG.standard_normal((4, 3, 2, 2)).astype(np.float32)
    _, new = layer.apply(model, _init(model), x, training=True)
    n = 4 * 2 * 2
    var = x.astype(np.float64).var(axis=(0, 2, 3))
    if unbiased:  # what PyTorch's BatchNorm2d(momentum=0.1) stores
        var = var * n / (n - 1)
    np.testing.assert_allclose(np.asarray(new.state["running_var"]), 0.9 * 1.0 + 0.1 * var, rtol=1e-5)
    np.testing.assert_allclose(
        np.asarray(new.state["running_mean"]), 0.1 * x.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-7
    )


# ------------------------------------------------------------------------------ sorting


def test_sort_argsort_match_numpy_with_ties_and_nan():
    x = np.array([[3, 1, np.nan, 1, -np.inf, 2], [0, 0, 0, -1, 5, np.nan]], np.float32)
    np.testing.assert_array_equal(np.asarray(kn.sort(x)), np.sort(x, axis=-1))
    np.testing.assert_array_equal(np.asarray(kn.argsort(x)), np.argsort(x, axis=-1, kind="stable"))
    np.testing.assert_array_equal(np.asarray(kn.sort(x, axis=0)), np.sort(x, axis=0))
    np.testing.assert_array_equal(
        np.asarray(kn.sort(x, descending=True)), np.asarray(jnp.sort(x, descending=True))
    )
    np.testing.assert_array_equal(
        np.asarray(kn.argsort(x, descending=True)), np.asarray(jnp.argsort(x, descending=True, stable=True))
    )
    ints = RNG.integers(-5, 5, size=(4, 9)).astype(np.int32)
    np.testing.assert_array_equal(np.asarray(kn.sort(ints, axis=0)), np.sort(ints, axis=0))
    with pytest.raises(ValueError, match="axis 2"):
        kn.sort(ints, axis=2)


def test_sort_descending_orders_signed_zeros_and_nans_like_jnp():
    rng = np.random.default_rng(29)
    specials = np.array([0.0, -0.0, 1.0, -1.0, np.nan, -np.nan, np.inf, -np.inf], np.float32)
    x = rng.choice(specials, size=(6, 9)).astype(np.float32)
    x[0, :4] = [0.0, -0.0, -0.0, 0.0]
    eager = kn.jit(lambda t: kn.sort(t, axis=1, descending=True))
    for axis in (0, 1):
        want = np.asarray(jnp.sort(x, axis=axis, descending=True))
        got = np.asarray(kn.sort(x, axis=axis, descending=True))
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    got, want = np.asarray(eager(x)), np.asarray(jnp.sort(x, axis=1, descending=True))
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    # the gradient goes back to where each value came from
    w = np.arange(9, dtype=np.float32)
    y = rng.standard_normal((2, 9)).astype(np.float32)
    got = kn.grad(lambda t: kn.sum(kn.sort(t, descending=True) * w))(y)
    want = jax.grad(lambda t: jnp.sum(jnp.sort(t, descending=True) * w))(y)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("fn", [kn.sort, kn.argsort])
def test_sort_axis_errors_use_the_project_classes(fn):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(kn.ShapeError, match="axis 2 is out of range"):
        fn(x, axis=2)
    with pytest.raises(kn.ShapeError, match="axis -3 is out of range"):
        fn(x, axis=-3)
    with pytest.raises(TypeError, match="axis must be an integer, got 0.5"):
        fn(x, axis=0.5)
    with pytest.raises(kn.ShapeError, match="scalar"):
        fn(np.float32(1.0))


def test_top_k_values_indices_and_gradient_match_jax():
    x = RNG.standard_normal((3, 10)).astype(np.float32)
    x[0, 3] = x[0, 7]  # a tie: the lower index first
    values, indices = kn.top_k(x, 4)
    want_values, want_indices = jax.lax.top_k(x, 4)
    np.testing.assert_array_equal(np.asarray(values), np.asarray(want_values))
    np.testing.assert_array_equal(np.asarray(indices), np.asarray(want_indices))
    weights = np.arange(1, 5, dtype=np.float32)
    got = kn.grad(lambda t: kn.sum(kn.top_k(t, 4)[0] * weights))(x)
    want = jax.grad(lambda t: jnp.sum(jax.lax.top_k(t, 4)[0] * weights))(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want))
    with pytest.raises(ValueError, match="k must be"):
        kn.top_k(x, 11)


# ------------------------------------------------------------------------------ categorical


def test_categorical_frequencies_follow_softmax_and_shapes_follow_jax():
    probs_table = np.array([[0.1, 0.2, 0.7], [0.5, 0.0, 0.5]], np.float32)
    with np.errstate(divide="ignore"):
        logits = np.log(probs_table)  # log 0 = -inf excludes a class
    key = kn.random.key(3)
    draws = np.asarray(kn.random.categorical(key, logits, shape=(20000, 2)))
    assert draws.shape == (20000, 2) and draws.dtype == np.int32
    for row, probs in enumerate(np.exp(logits)):
        freq = np.bincount(draws[:, row], minlength=3) / len(draws)
        # 20000 draws: the standard error of a frequency is below 0.004
        np.testing.assert_allclose(freq, probs, atol=0.015)
    assert not np.any(draws[:, 1] == 1)
    np.testing.assert_array_equal(np.asarray(kn.random.categorical(key, logits, shape=(20000, 2))), draws)
    for axis, shape in ((-1, None), (0, None), (0, (5, 3))):
        jax_shape = jax.random.categorical(jax.random.PRNGKey(0), logits, axis=axis, shape=shape).shape
        assert kn.random.categorical(key, logits, axis=axis, shape=shape).shape == jax_shape
    with pytest.raises(ValueError, match="must end with"):
        kn.random.categorical(key, logits, shape=(4, 3))


def test_top_k_sampling_as_the_docstring_writes_it():
    logits = RNG.standard_normal((4, 50)).astype(np.float32)
    values, indices = kn.top_k(logits, 5)
    choice = kn.random.categorical(kn.random.key(0), values)
    token = np.asarray(kn.take_along_axis(indices, choice[:, None], axis=-1)[:, 0])
    top5 = np.argsort(-logits, axis=-1)[:, :5]
    assert all(t in row for t, row in zip(token, top5))
