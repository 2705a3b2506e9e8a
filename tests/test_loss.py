"""kn.loss against optax.losses / jax (the oracle): values, gradients by kn.grad vs jax.grad,
a second-order check, numerical stability and shape errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import kaun_ir as kn
from kaun_ir.errors import ShapeError
from kaun_ir.nn import loss

RNG = np.random.default_rng(0)
LOGITS = RNG.standard_normal((6, 5)).astype(np.float32) * 3
LABELS = RNG.integers(0, 5, size=6).astype(np.int32)
ONE_HOT = np.eye(5, dtype=np.float32)[LABELS]
SOFT = jax.nn.softmax(RNG.standard_normal((6, 5)).astype(np.float32))
BIN_LOGITS = RNG.standard_normal((4, 3)).astype(np.float32) * 4
BIN_LABELS = RNG.integers(0, 2, size=(4, 3)).astype(np.float32)
PRED = RNG.standard_normal((4, 3)).astype(np.float32) * 2
TARGET = RNG.standard_normal((4, 3)).astype(np.float32)


@pytest.fixture(autouse=True)
def _jax_default_precision():
    with jax.enable_x64(False):
        yield


def _sparse_oracle(logits, labels):
    return optax.losses.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


# name -> (our loss, the oracle, differentiable first argument, second argument)
CASES = {
    "cross_entropy": (
        loss.cross_entropy,
        lambda x, t: optax.losses.softmax_cross_entropy(x, t).mean(),
        LOGITS,
        ONE_HOT,
    ),
    "cross_entropy_soft": (
        loss.cross_entropy,
        lambda x, t: optax.losses.softmax_cross_entropy(x, t).mean(),
        LOGITS,
        np.asarray(SOFT),
    ),
    "cross_entropy_sparse": (loss.cross_entropy_sparse, lambda x, t: _sparse_oracle(x, t), LOGITS, LABELS),
    "cross_entropy_sparse_3d": (
        loss.cross_entropy_sparse,
        lambda x, t: _sparse_oracle(x, t),
        LOGITS.reshape(2, 3, 5),
        LABELS.reshape(2, 3),
    ),
    "binary_cross_entropy": (
        loss.binary_cross_entropy,
        lambda x, t: optax.losses.sigmoid_binary_cross_entropy(x, t).mean(),
        BIN_LOGITS,
        BIN_LABELS,
    ),
    "mse": (loss.mse, lambda p, t: optax.losses.squared_error(p, t).mean(), PRED, TARGET),
    "mae": (loss.mae, lambda p, t: jnp.mean(jnp.abs(p - t)), PRED, TARGET),
    "huber": (loss.huber, lambda p, t: optax.losses.huber_loss(p, t).mean(), PRED, TARGET),
    "huber_delta": (
        lambda p, t: loss.huber(p, t, delta=0.3),
        lambda p, t: optax.losses.huber_loss(p, t, delta=0.3).mean(),
        PRED,
        TARGET,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_value_and_gradient_match_optax(name):
    ours, oracle, x, t = CASES[name]
    # the oracle is compiled whole (jax's op-by-op mode compiles every op separately: slow)
    want_value, want_grad = jax.jit(jax.value_and_grad(oracle))(x, t)
    value = ours(x, t)  # concrete arrays: one compiled graph
    assert value.shape == () and value.dtype == np.float32
    np.testing.assert_allclose(np.asarray(value), np.asarray(want_value), rtol=1e-5, atol=1e-6)
    # value and gradient in one compiled step, w.r.t. the predictions / logits
    got_value, got_grad = kn.jit(kn.value_and_grad(ours))(x, t)
    np.testing.assert_allclose(np.asarray(got_value), np.asarray(want_value), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got_grad), np.asarray(want_grad), rtol=1e-5, atol=1e-7)


def test_gradient_with_respect_to_targets():
    """Soft targets and regression targets are differentiable too."""
    for ours, oracle, x, t in (
        CASES["cross_entropy_soft"],
        CASES["mse"],
        CASES["huber"],
        CASES["binary_cross_entropy"],
    ):
        got = kn.grad(ours, argnums=1)(x, t)
        want = jax.jit(jax.grad(oracle, argnums=1))(x, t)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-7)


def test_second_order():
    """Hessian-vector products (grad of grad) against jax."""
    v = RNG.standard_normal(LOGITS.shape).astype(np.float32)
    for ours, oracle, x, t in (
        CASES["cross_entropy_sparse"],
        CASES["cross_entropy_soft"],
        CASES["binary_cross_entropy"],
    ):
        vx = v[: x.shape[0], : x.shape[1]]

        def hvp(xp, f, t=t, vx=vx):
            return lambda z: xp.sum((jax.grad(f) if xp is jnp else kn.grad(f))(z, t) * vx)

        got = kn.grad(hvp(kn, ours))(x)
        want = jax.jit(jax.grad(hvp(jnp, oracle)))(x)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-6)


def test_stable_for_extreme_logits():
    big = np.asarray([[1000.0, -1000.0, 0.0], [-500.0, 0.0, 500.0]], np.float32)
    labels = np.asarray([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]], np.float32)
    value, grad = kn.value_and_grad(loss.binary_cross_entropy)(big, labels)
    want = jax.jit(lambda x, y: optax.losses.sigmoid_binary_cross_entropy(x, y).mean())(big, labels)
    np.testing.assert_allclose(np.asarray(value), np.asarray(want), rtol=1e-6)
    assert np.all(np.isfinite(np.asarray(grad)))
    value = loss.cross_entropy_sparse(big, np.asarray([1, 0], np.int32))
    np.testing.assert_allclose(np.asarray(value), (2000.0 + 1000.0) / 2, rtol=1e-6)


def test_integer_inputs_and_dtypes():
    bool_labels = BIN_LABELS.astype(bool)
    np.testing.assert_allclose(
        np.asarray(loss.binary_cross_entropy(BIN_LOGITS, bool_labels)),
        np.asarray(loss.binary_cross_entropy(BIN_LOGITS, BIN_LABELS)),
        rtol=1e-6,
    )
    int_pred = np.asarray([1, 2, 3], np.int32)
    assert loss.mse(int_pred, np.asarray([1, 1, 1], np.int32)).dtype == np.float32
    np.testing.assert_allclose(np.asarray(loss.mse(int_pred, np.asarray([1, 1, 1], np.int32))), 5.0 / 3)
    half = loss.cross_entropy(LOGITS.astype(np.float16), ONE_HOT)
    assert half.dtype == np.float16
    np.testing.assert_allclose(
        np.asarray(half, np.float32), np.asarray(loss.cross_entropy(LOGITS, ONE_HOT)), rtol=2e-3
    )


def test_inside_a_trace_with_captured_labels():
    """As train.step uses them: a loss closing over the batch labels, compiled once."""
    labels = LABELS

    @kn.jit
    def objective(w, x):
        return loss.cross_entropy_sparse(x @ w, labels)

    w = RNG.standard_normal((5, 5)).astype(np.float32)
    got = objective(w, LOGITS)
    want = jax.jit(lambda w, x: _sparse_oracle(x @ w, labels))(w, LOGITS)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5)


def test_shape_and_type_errors():
    with pytest.raises(ShapeError, match=r"logits \[6,5\] and one_hot \[6,4\]"):
        loss.cross_entropy(LOGITS, ONE_HOT[:, :4])
    with pytest.raises(ShapeError, match=r"labels \[6,1\].*\[6\]"):
        loss.cross_entropy_sparse(LOGITS, LABELS[:, None])
    with pytest.raises(TypeError, match="integers"):
        loss.cross_entropy_sparse(LOGITS, LABELS.astype(np.float32))
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        loss.cross_entropy_sparse(LOGITS, np.asarray([0, 1, 2, 3, 4, 5], np.int32))
    with pytest.raises(ShapeError, match=r"predictions \[4,3\] and targets \[4,1\]"):
        loss.mse(PRED, TARGET[:, :1])
    with pytest.raises(ShapeError, match="same shape"):
        loss.mae(PRED, TARGET.reshape(3, 4))
    with pytest.raises(ShapeError, match="same shape"):
        loss.binary_cross_entropy(BIN_LOGITS[:, 0], BIN_LABELS)
    with pytest.raises(ShapeError, match="class axis"):
        loss.cross_entropy(np.float32(1.0), np.float32(1.0))
    with pytest.raises(ValueError, match="delta"):
        loss.huber(PRED, TARGET, delta=0.0)
    with pytest.raises(ShapeError, match=r"\[4,3\]"):  # also while tracing
        kn.trace(lambda p, t: loss.huber(p, t), PRED, TARGET[:2])


# ------------------------------------------------ cross_entropy_sparse's own derivative rule


def _sparse_float64(logits, labels):
    """NumPy float64 oracle: ``(loss, d loss / d logits)``; labels outside ``[0, C)`` contribute
    0 to the sum (the mean still counts them) and get a zero gradient row."""
    x = np.asarray(logits, np.float64)
    classes = x.shape[-1]
    valid = (labels >= 0) & (labels < classes)
    lse = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    picked = np.take_along_axis(x, np.clip(labels, 0, classes - 1)[..., None], -1)[..., 0]
    count = labels.size
    value = np.where(valid, lse - picked, 0.0).sum() / count
    one_hot = (np.arange(classes) == labels[..., None]).astype(np.float64)
    grad = (np.exp(x - lse[..., None]) * valid[..., None] - one_hot) / count
    return value, grad


def test_sparse_labels_outside_the_classes_inside_a_trace():
    """Traced labels cannot be checked: -1 and C contribute nothing, and no gradient."""
    labels = np.asarray([0, -1, 5, 2, 4, -7], np.int32)
    value, grad = kn.jit(kn.value_and_grad(loss.cross_entropy_sparse))(LOGITS, labels)
    want_value, want_grad = _sparse_float64(LOGITS, labels)
    np.testing.assert_allclose(np.asarray(value), want_value, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-5, atol=1e-7)
    assert not np.asarray(grad)[[1, 2, 5]].any()


def test_sparse_forward_mode_and_per_example_gradients():
    """kn.jvp (derived from the rule) and kn.vmap of kn.grad (the rule batched) against jax."""
    tangent = RNG.standard_normal(LOGITS.shape).astype(np.float32)
    _, got = kn.jvp(lambda x: loss.cross_entropy_sparse(x, LABELS), (LOGITS,), (tangent,))
    _, want = jax.jvp(lambda x: _sparse_oracle(x, LABELS), (LOGITS,), (tangent,))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    rows, labels = LOGITS[:, None, :], LABELS[:, None]  # one example per vmapped call
    got = kn.vmap(kn.grad(loss.cross_entropy_sparse))(rows, labels)
    want = jax.jit(jax.vmap(jax.grad(_sparse_oracle)))(rows, labels)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, np.float16])
def test_cross_entropy_low_precision_logits(dtype):
    """Computed in float32, returned (value and gradient) in the logits' dtype."""
    logits = LOGITS.astype(dtype)
    value, grad = kn.value_and_grad(loss.cross_entropy_sparse)(logits, LABELS)
    assert value.dtype == dtype and grad.dtype == dtype
    want_value, want_grad = _sparse_float64(np.asarray(logits, np.float64), LABELS)
    np.testing.assert_allclose(np.asarray(value, np.float64), want_value, rtol=1e-2)
    np.testing.assert_allclose(np.asarray(grad, np.float64), want_grad, rtol=2e-2, atol=1e-3)
    # one-hot targets: the same loss and gradient as the labels
    value, grad = kn.value_and_grad(loss.cross_entropy)(logits, ONE_HOT.astype(dtype))
    assert value.dtype == dtype and grad.dtype == dtype
    np.testing.assert_allclose(np.asarray(value, np.float64), want_value, rtol=1e-2)
    np.testing.assert_allclose(np.asarray(grad, np.float64), want_grad, rtol=2e-2, atol=1e-3)


def test_sparse_non_finite_logits_stay_non_finite():
    logits = LOGITS.copy()
    logits[0, 1] = np.nan
    logits[1, LABELS[1]] = -np.inf
    assert np.isnan(np.asarray(loss.cross_entropy_sparse(logits[:1], LABELS[:1])))
    assert np.asarray(loss.cross_entropy_sparse(logits[1:2], LABELS[1:2])) == np.inf


def test_cross_entropy_gradients_keep_no_full_size_temporary():
    """The rules recompute the softmax from the logits in the gradient's own element-wise pass:
    XLA's temporaries of value_and_grad hold no [N, C] buffer (the composites kept exp(logits),
    and the sparse one also a one-hot product: the largest buffers of a language model's step)."""
    logits = RNG.standard_normal((64, 4096)).astype(np.float32)
    labels = RNG.integers(0, 4096, size=64).astype(np.int32)
    soft = np.asarray(jax.nn.softmax(RNG.standard_normal((64, 4096)).astype(np.float32)))
    sparse_step = kn.jit(kn.value_and_grad(loss.cross_entropy_sparse))
    value, grad = sparse_step(logits, labels)
    want_value, want_grad = _sparse_float64(logits, labels)
    np.testing.assert_allclose(np.asarray(value), want_value, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-4, atol=1e-9)
    soft_step = kn.jit(kn.value_and_grad(loss.cross_entropy))
    value, grad = soft_step(logits, soft)
    x = logits.astype(np.float64)
    top = x.max(-1, keepdims=True)
    log_probs = x - top - np.log(np.exp(x - top).sum(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(value), -(soft * log_probs).sum(-1).mean(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), (np.exp(log_probs) - soft) / 64, rtol=1e-3, atol=1e-9)
    for step in (sparse_step, soft_step):
        temp = step.executables()[-1].memory_analysis()["temp"]
        assert temp < logits.nbytes // 4, temp
