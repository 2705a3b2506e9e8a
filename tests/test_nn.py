"""kaun_ir.nn.functional (the functional forms in kn.fn): normalisation, dropout, embedding, attention and
rotary embeddings against NumPy / jax references, values and gradients (kn.grad vs jax.grad)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.nn import attention as attn
from kaun_ir.nn import functional as nn

RNG = np.random.default_rng(0)
EPS = 1.5e-5  # not the default, to check that eps is passed through


def _rand(*shape, dtype=np.float64):
    return RNG.standard_normal(shape).astype(dtype)


def _close(got, want, tol=1e-10):
    got = np.asarray(got)
    assert got.shape == np.shape(want), (got.shape, np.shape(want))
    np.testing.assert_allclose(got, np.asarray(want), rtol=tol, atol=tol)


def _check(f, jax_f, args, tol=1e-10, grad_tol=1e-8):
    """``f(*args)`` (a tuple of arrays) and the gradient of ``sum(y**3)`` over its outputs w.r.t.
    every argument, against ``jax_f`` — one compiled function on each side."""
    argnums = tuple(range(len(args)))

    def loss(*a):
        ys = f(*a)
        return sum(kn.sum(y * y * y) for y in ys), ys

    def jax_loss(*a):
        ys = jax_f(*a)
        return sum(jnp.sum(y**3) for y in ys), ys

    (_, ys), grads = kn.value_and_grad(loss, argnums=argnums, has_aux=True)(*args)
    jax_value_and_grad = jax.jit(jax.value_and_grad(jax_loss, argnums=argnums, has_aux=True))
    (_, want_ys), want_grads = _x64(jax_value_and_grad)(*args)
    for y, w in zip(ys, want_ys):
        _close(y, w, tol)
    for g, w in zip(grads, want_grads):
        _close(g, w, grad_tol)


def _x64(f):
    """Run a jax oracle in float64."""

    def wrapped(*args, **kwargs):
        with jax.enable_x64(True):
            out = f(*args, **kwargs)
            return jax.tree_util.tree_map(np.asarray, out)

    return wrapped


# ------------------------------------------------------------------------------ normalisation


def _jax_batch_norm(x, scale, bias, mean, var, eps):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    normalised = (x - mean.reshape(shape)) / jnp.sqrt(var.reshape(shape) + eps)
    return normalised * scale.reshape(shape) + bias.reshape(shape)


def _jax_batch_stats(x):
    axes = tuple(i for i in range(x.ndim) if i != 1)
    return x.mean(axes), x.var(axes)


def test_batch_norm_inference_and_training_forms():
    """[N, C] and NCHW inputs, in one compiled function."""
    x2, x4, scale, bias = _rand(6, 3), _rand(2, 3, 4, 4), _rand(3), _rand(3)
    mean, var = _rand(3), np.abs(_rand(3)) + 0.5

    def forms(batch_norm, batch_stats):
        def f(x2, x4, scale, bias, mean, var):
            outs = []
            for x in (x2, x4):
                batch_mean, batch_var = batch_stats(x)
                outs += [
                    batch_norm(x, scale, bias, mean, var, EPS),
                    batch_mean,
                    batch_var,
                    batch_norm(x, scale, bias, batch_mean, batch_var, EPS),
                ]
            return tuple(outs)

        return f

    _check(
        forms(nn.batch_norm, nn.batch_stats),
        forms(_jax_batch_norm, _jax_batch_stats),
        (x2, x4, scale, bias, mean, var),
    )


def test_batch_norm_shape_errors():
    x = _rand(4, 3, 2, dtype=np.float32)
    with pytest.raises(kn.ShapeError, match=r"scale must have shape \[3\]"):
        nn.batch_norm(x, np.ones(4, np.float32), None, np.zeros(3, np.float32), np.ones(3, np.float32))
    with pytest.raises(kn.ShapeError, match="batch axis"):
        nn.batch_stats(np.ones(3, np.float32))
    with pytest.raises(TypeError, match="floating-point"):
        nn.batch_stats(np.ones((2, 3), np.int32))


def _jax_batch_norm_training(x, scale, bias, axis):
    others = tuple(i for i in range(x.ndim) if i != axis)
    shape = [x.shape[axis] if i == axis else 1 for i in range(x.ndim)]
    mean = x.mean(others, keepdims=True)
    var = ((x - mean) ** 2).mean(others, keepdims=True)
    y = (x - mean) / jnp.sqrt(var + EPS) * scale.reshape(shape) + bias.reshape(shape)
    return y, jax.lax.stop_gradient(mean.reshape(-1)), jax.lax.stop_gradient(var.reshape(-1))


@pytest.mark.parametrize("shape,axis", [((4, 3, 5, 6), 1), ((6, 5), 1), ((8, 1, 4), 1), ((2, 5, 4, 3), 3)])
def test_batch_norm_training_matches_the_op_by_op_form(shape, axis):
    """The fused training form (its own derivative rule) against jax's gradient of the formula
    in float64: the input, scale and bias gradients; mean and var carry none."""
    c = shape[axis]
    x, scale, bias = _rand(*shape) * 2.0 + 1.0, _rand(c), _rand(c)
    _check(
        lambda x, s, b: nn.batch_norm_training(x, s, b, EPS, axis),
        lambda x, s, b: _jax_batch_norm_training(x, s, b, axis),
        (x, scale, bias),
        grad_tol=1e-9,
    )


def test_batch_norm_training_low_precision_and_second_order():
    """bfloat16 inputs normalise in float32 (the gradient comes back in bfloat16); the rule's own
    derivative (a second-order gradient) matches jax's."""
    x, scale, bias = _rand(4, 3, 5), _rand(3), _rand(3)
    y, mean, var = nn.batch_norm_training(
        x.astype(jnp.bfloat16), scale.astype(np.float32), bias.astype(np.float32)
    )
    want = _x64(lambda *a: _jax_batch_norm_training(*a, 1))(x, scale, bias)
    assert np.asarray(y).dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y, np.float32), want[0], atol=0.05)
    np.testing.assert_allclose(np.asarray(mean, np.float32), want[1], atol=0.02)

    def inner(x, s, b):  # the input gradient of a weighted sum, then its gradient in the scale
        return nn.batch_norm_training(x, s, b, EPS)[0]

    w = _rand(4, 3, 5)
    g = kn.grad(lambda s: kn.sum(kn.grad(lambda x: kn.sum(inner(x, s, bias) * w))(x) ** 2))(scale)
    want_g = _x64(
        jax.grad(
            lambda s: jnp.sum(
                jax.grad(lambda x: jnp.sum(_jax_batch_norm_training(x, s, bias, 1)[0] * w))(x) ** 2
            )
        )
    )(scale)
    _close(g, want_g, 1e-8)


def _jax_layer_norm(x, scale, bias, eps, axis):
    mean = x.mean(axis, keepdims=True)
    var = ((x - mean) ** 2).mean(axis, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * scale + bias


def _jax_rms_norm(x, scale, eps):
    return x / jnp.sqrt((x * x).mean(-1, keepdims=True) + eps) * scale


def test_layer_norm_and_rms_norm_values_and_gradients():
    x, scale, bias = _rand(2, 3, 5), _rand(5), _rand(5)
    _check(
        lambda x, s, b: (nn.layer_norm(x, s, b, EPS), nn.rms_norm(x, s, EPS)),
        lambda x, s, b: (_jax_layer_norm(x, s, b, EPS, -1), _jax_rms_norm(x, s, EPS)),
        (x, scale, bias),
    )


def test_layer_norm_over_several_axes_and_without_parameters():
    x = _rand(2, 3, 4)
    scale, bias = _rand(3, 4), _rand(3, 4)
    _close(
        nn.layer_norm(x, scale, bias, EPS, axis=(1, 2)), _x64(_jax_layer_norm)(x, scale, bias, EPS, (1, 2))
    )
    plain = np.asarray(nn.layer_norm(x, eps=EPS))
    _close(plain.mean(-1), np.zeros((2, 3)), 1e-12)
    with pytest.raises(kn.ShapeError, match=r"scale must have shape \[3, 4\]"):
        nn.layer_norm(x, _rand(4), None, EPS, axis=(1, 2))


def test_low_precision_norms_compute_in_float32():
    x = (_rand(4, 64) * 3 + 100).astype(kn.bfloat16)  # a large mean: bfloat16 sums would lose it
    y = np.asarray(nn.layer_norm(x, eps=1e-5))
    assert y.dtype == kn.bfloat16
    want = np.asarray(_x64(_jax_layer_norm)(x.astype(np.float64), 1.0, 0.0, 1e-5, -1))
    np.testing.assert_allclose(y.astype(np.float64), want, atol=0.05)


# ------------------------------------------------------------------------------ dropout


def test_dropout_masks_scaling_and_determinism():
    x = np.ones((200, 100), np.float32)
    k0, k1 = kn.random.key(0), kn.random.key(1)
    a = np.asarray(nn.dropout(k0, x, 0.3))
    b = np.asarray(nn.dropout(k0, x, 0.3))
    c = np.asarray(nn.dropout(k1, x, 0.3))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert set(np.unique(a)) <= {0.0, np.float32(1 / 0.7)}
    assert abs((a == 0).mean() - 0.3) < 0.01  # 20k draws
    # the mask is jax.random.bernoulli's with the same key
    keep = np.asarray(jax.jit(lambda k: jax.random.bernoulli(k, 0.7, (200, 100)))(jax.random.PRNGKey(0)))
    np.testing.assert_array_equal(a != 0, keep)


def test_dropout_identity_cases_and_errors():
    x = _rand(3, 4, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(nn.dropout(None, x, 0.5, training=False)), x)
    np.testing.assert_array_equal(np.asarray(nn.dropout(None, x, 0.0)), x)
    np.testing.assert_array_equal(np.asarray(nn.dropout(kn.random.key(0), x, 1.0)), np.zeros_like(x))
    with pytest.raises(ValueError, match="needs a random key"):
        nn.dropout(None, x, 0.5)
    with pytest.raises(ValueError, match=r"rate must be in \[0, 1\]"):
        nn.dropout(kn.random.key(0), x, 1.5)


def test_dropout_gradient_is_the_scaled_mask():
    x = _rand(5, 6, dtype=np.float32)
    key = kn.random.key(3)
    g = np.asarray(kn.grad(lambda x, key: kn.sum(nn.dropout(key, x, 0.25)))(x, key))
    mask = np.asarray(nn.dropout(key, np.ones_like(x), 0.25))
    np.testing.assert_allclose(g, mask, rtol=1e-6)


def test_dropout_fresh_masks_from_a_key_argument_without_recompiling():
    f = kn.jit(lambda key, x: nn.dropout(key, x, 0.5))
    x = np.ones((8, 8), np.float32)
    masks = {np.asarray(f(kn.random.key(i), x)).tobytes() for i in range(3)}
    assert len(masks) == 3 and f.trace_count == 1


# ------------------------------------------------------------------------------ embedding


def test_embedding_lookup_and_gradient():
    table = _rand(7, 3)
    ids = np.array([[1, 4, 1], [6, 0, 1]], np.int32)  # repeated ids: their gradients add up
    _check(lambda t: (nn.embedding(t, ids),), lambda t: (t[ids],), (table,))
    with pytest.raises(TypeError, match="ids must be integers"):
        nn.embedding(table, ids.astype(np.float32))
    with pytest.raises(kn.ShapeError, match="vocab_size, embed_dim"):
        nn.embedding(_rand(7), ids)


# ------------------------------------------------------------------------------ attention


def _jax_attention(q, k, v, mask=None, is_causal=False, bias=None, scale=None):
    """Plain jnp attention with repeated key/value heads (jax.nn.dot_product_attention itself
    computes float64 inputs at reduced precision, so it is not used as the oracle)."""
    heads, kv_heads = q.shape[-2], k.shape[-2]
    k = jnp.repeat(k, heads // kv_heads, axis=-2)
    v = jnp.repeat(v, heads // kv_heads, axis=-2)
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    logits = jnp.einsum("...thd,...shd->...hts", q, k, precision="highest") * scale
    if bias is not None:
        logits = logits + bias
    allowed = jnp.ones(logits.shape, bool)
    if mask is not None:
        allowed = allowed & mask
    if is_causal:
        allowed = allowed & jnp.tril(jnp.ones(logits.shape[-2:], bool))
    logits = jnp.where(allowed, logits, -0.7 * np.finfo(logits.dtype).max)
    weights = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("...hts,...shd->...thd", weights, v, precision="highest")


ATTENTION = {
    "plain": dict(q=(2, 4, 2, 3), kv=(2, 5, 2, 3)),
    "causal": dict(q=(2, 5, 2, 3), kv=(2, 5, 2, 3), is_causal=True),
    "grouped": dict(q=(2, 4, 6, 3), kv=(2, 4, 2, 3), is_causal=True),
    "multi_query": dict(q=(1, 3, 4, 2), kv=(1, 6, 1, 2)),
    "masked": dict(q=(2, 4, 2, 3), kv=(2, 5, 2, 3), mask=(2, 1, 4, 5)),
    "bias_and_scale": dict(q=(2, 4, 2, 3), kv=(2, 5, 2, 3), bias=(1, 2, 4, 5), scale=0.3),
    "unbatched": dict(q=(4, 2, 3), kv=(5, 2, 3)),
}


def _attention_case(case):
    spec = dict(ATTENTION[case])
    rng = np.random.default_rng(sorted(ATTENTION).index(case))
    q_shape, kv_shape = spec.pop("q"), spec.pop("kv")
    args = [rng.standard_normal(s) for s in (q_shape, kv_shape, kv_shape)]
    if "mask" in spec:
        spec["mask"] = rng.random(spec["mask"]) > 0.4
    if "bias" in spec:
        spec["bias"] = rng.standard_normal(spec["bias"])
    return args, spec


@functools.cache
def _attention_results():
    """Every case's output and input gradients, ours and jax's: all cases in one compiled
    function on each side (compilation dominates the cost of these small problems)."""
    cases = {case: _attention_case(case) for case in ATTENTION}
    inputs = {case: args for case, (args, _) in cases.items()}

    def run(attention, total):
        def loss(inputs):
            outs = {case: attention(*args, **cases[case][1]) for case, args in inputs.items()}
            return sum(total(y**3) for y in outs.values()), outs

        return loss

    ours = kn.value_and_grad(run(attn.dot_product_attention, kn.sum), has_aux=True)(inputs)
    theirs = _x64(jax.jit(jax.value_and_grad(run(_jax_attention, jnp.sum), has_aux=True)))(inputs)
    return ours, theirs


@pytest.mark.parametrize("case", sorted(ATTENTION))
def test_dot_product_attention_values_and_gradients(case):
    ((_, outs), grads), ((_, want_outs), want_grads) = _attention_results()
    _close(outs[case], want_outs[case])
    for g, w in zip(grads[case], want_grads[case]):
        _close(g, w, 1e-9)


def test_attention_float32_matches_jax_nn_and_handles_fully_masked_rows():
    q, k, v = (
        _rand(2, 3, 2, 4, dtype=np.float32),
        _rand(2, 3, 2, 4, dtype=np.float32),
        _rand(2, 3, 2, 4, dtype=np.float32),
    )
    mask = np.ones((2, 1, 3, 3), bool)
    mask[0, 0, 1] = False  # query 1 of batch 0 sees nothing: a uniform average, not NaN
    got = np.asarray(attn.dot_product_attention(q, k, v, mask=mask))
    want = np.asarray(jax.jit(jax.nn.dot_product_attention)(q, k, v, mask=mask))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[0, 1], v[0].mean(0), rtol=1e-5, atol=1e-6)


def test_attention_dropout_uses_the_key():
    q = k = v = _rand(1, 4, 2, 3, dtype=np.float32)
    a = np.asarray(attn.dot_product_attention(q, k, v, dropout_rate=0.5, key=kn.random.key(0)))
    b = np.asarray(attn.dot_product_attention(q, k, v, dropout_rate=0.5, key=kn.random.key(0)))
    c = np.asarray(attn.dot_product_attention(q, k, v, dropout_rate=0.5, key=kn.random.key(1)))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    with pytest.raises(ValueError, match="needs a random key"):
        attn.dot_product_attention(q, k, v, dropout_rate=0.5)


def test_attention_shape_errors():
    q = np.zeros((2, 4, 6, 3), np.float32)
    with pytest.raises(kn.ShapeError, match="multiple of the number of key/value heads"):
        attn.dot_product_attention(q, np.zeros((2, 4, 4, 3), np.float32), np.zeros((2, 4, 4, 3), np.float32))
    with pytest.raises(kn.ShapeError, match="head dimensions differ"):
        attn.dot_product_attention(q, np.zeros((2, 4, 6, 2), np.float32), np.zeros((2, 4, 6, 2), np.float32))
    with pytest.raises(kn.ShapeError, match=r"broadcast to \[B, H, T, S\]"):
        attn.dot_product_attention(q, q, q, mask=np.ones((3, 1, 4, 4), bool))
    with pytest.raises(TypeError, match="mask must be bool"):
        attn.dot_product_attention(q, q, q, mask=np.ones((4, 4), np.float32))


# ------------------------------------------------------------------------------ rope


def _np_rope(x, positions, base=10000.0):
    """Rotary embedding with explicit pair rotations (rotate-half layout)."""
    d = x.shape[-1]
    half = d // 2
    out = np.empty_like(x)
    positions = np.broadcast_to(positions, x.shape[:-2])
    for index in np.ndindex(*x.shape[:-2]):
        pos = positions[index]
        for i in range(half):
            angle = pos * base ** (-2 * i / d)
            a, b = x[index][..., i], x[index][..., i + half]
            out[index + (Ellipsis, i)] = a * np.cos(angle) - b * np.sin(angle)
            out[index + (Ellipsis, i + half)] = b * np.cos(angle) + a * np.sin(angle)
    return out


def test_rope_values_positions_and_gradient():
    x = _rand(2, 5, 3, 4)
    _close(attn.rope(x), _np_rope(x, np.arange(5)))
    positions = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]], np.int32)
    _close(attn.rope(x, positions, base=100.0), _np_rope(x, positions, base=100.0))
    # a rotation: norms of each (i, i + D/2) pair are preserved, so the gradient of the squared
    # norm is 2 x
    g = kn.grad(lambda x: kn.sum(attn.rope(x, positions) ** 2))(x)
    _close(g, 2 * x)
    # relative positions: <rope(q, m), rope(k, n)> depends only on m - n
    q, k = _rand(1, 1, 1, 4), _rand(1, 1, 1, 4)
    dots = [
        float(np.sum(np.asarray(attn.rope(q, np.array([m]))) * np.asarray(attn.rope(k, np.array([m - 2])))))
        for m in (2, 5)
    ]
    assert abs(dots[0] - dots[1]) < 1e-10


def test_rope_errors():
    with pytest.raises(kn.ShapeError, match="even"):
        attn.rope(np.zeros((2, 3, 1, 5), np.float32))
    with pytest.raises(kn.ShapeError, match="positions must be"):
        attn.rope(np.zeros((2, 3, 1, 4), np.float32), np.arange(4))
