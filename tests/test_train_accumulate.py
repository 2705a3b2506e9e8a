"""Gradient accumulation inside the compiled step: ``train.make(..., accumulate=N)`` equals the
step on the whole batch (checked against that step, NumPy gradients and optax)."""

import numpy as np
import optax
import pytest

import kaun_ir as kn
from kaun_ir import layer, loss, optim, rng, train

RS = np.random.default_rng(0)
X = RS.normal(size=(32, 8)).astype(np.float32)
T = RS.normal(size=(32, 3)).astype(np.float32)
LABELS = RS.integers(0, 3, 32).astype(np.int32)


def _init(trainer):
    with rng.scope(0):
        return train.init(trainer)


def test_accumulated_step_equals_the_big_batch_step():
    model = layer.sequential([layer.linear(8, 16), layer.relu(), layer.linear(16, 3)])
    big = train.make(model, optim.adam(1e-2), loss=loss.cross_entropy_sparse)
    acc = train.make(model, optim.adam(1e-2), loss=loss.cross_entropy_sparse, accumulate=4)
    s1, s2 = _init(big), _init(acc)
    for _ in range(3):
        l1, s1 = train.step(big, s1, X, LABELS)
        l2, s2 = train.step(acc, s2, X, LABELS)
        np.testing.assert_allclose(float(l2), float(l1), rtol=1e-6)
    for a, b in zip(kn.ptree.leaves(s2.vars.params), kn.ptree.leaves(s1.vars.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # one executable; the micro-batches are a loop inside it
    assert acc.cache.step.trace_count == 1
    assert train.step_graph(acc, s2, X, LABELS).op_counts().get("scan") == 1


def _numpy_grads(w, b, x, t):
    """d/dW, d/db of mean((x @ W + b - t)**2) over every element."""
    r = x @ w + b - t
    g = 2.0 * r / r.size
    return x.T @ g, g.sum(0)


def test_accumulated_gradients_match_numpy_and_optax():
    model = layer.linear(8, 3)
    trainer = train.make(model, optim.adam(1e-2), loss=loss.mse, accumulate=4)
    st = _init(trainer)
    w = np.array(st.vars.params["weight"], np.float64)
    b = np.array(st.vars.params["bias"], np.float64)
    tx = optax.adam(1e-2)
    params = {"bias": b, "weight": w}
    opt_state = tx.init(params)
    for _ in range(2):
        value, st = train.step(trainer, st, X, T)
        np.testing.assert_allclose(
            float(value), np.mean((X @ params["weight"] + params["bias"] - T) ** 2), rtol=1e-5
        )
        gw, gb = _numpy_grads(params["weight"], params["bias"], X.astype(np.float64), T.astype(np.float64))
        updates, opt_state = tx.update({"bias": gb, "weight": gw}, opt_state, params)
        params = optax.apply_updates(params, updates)
    np.testing.assert_allclose(np.asarray(st.vars.params["weight"]), params["weight"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(st.vars.params["bias"]), params["bias"], rtol=1e-4, atol=1e-6)


def test_multi_steps_over_micro_batches_equals_one_accumulated_step():
    model = layer.linear(8, 3)
    acc = train.make(model, optim.sgd(0.1), loss=loss.mse, accumulate=4)
    multi = train.make(model, optim.multi_steps(optim.sgd(0.1), 4), loss=loss.mse)
    s1, s2 = _init(acc), _init(multi)
    _, s1 = train.step(acc, s1, X, T)
    for i in range(4):
        _, s2 = train.step(multi, s2, X[8 * i : 8 * i + 8], T[8 * i : 8 * i + 8])
    for a, b in zip(kn.ptree.leaves(s1.vars.params), kn.ptree.leaves(s2.vars.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_accumulate_errors():
    model = layer.linear(8, 3)
    with pytest.raises(ValueError, match="loss=fn"):
        train.make(model, optim.sgd(0.1), accumulate=2)
    with pytest.raises(ValueError, match="positive int"):
        train.make(model, optim.sgd(0.1), loss=loss.mse, accumulate=0)
    trainer = train.make(model, optim.sgd(0.1), loss=loss.mse, accumulate=3)
    with pytest.raises(ValueError, match="multiple of 3"):
        train.step(trainer, _init(trainer), X, T)


def test_blocks_of_accumulated_steps_equal_single_steps():
    model = layer.sequential([layer.linear(8, 16), layer.relu(), layer.linear(16, 3)])
    trainer = train.make(model, optim.adam(1e-2), loss=loss.cross_entropy_sparse, accumulate=2)
    s1, s2 = _init(trainer), _init(trainer)
    singles = []
    for i in range(2):
        value, s1 = train.step(trainer, s1, X[16 * i : 16 * i + 16], LABELS[16 * i : 16 * i + 16])
        singles.append(float(value))
    losses, s2 = train.steps(trainer, s2, X.reshape(2, 16, 8), LABELS.reshape(2, 16))
    np.testing.assert_allclose(np.asarray(losses), singles, rtol=1e-6)
    for a, b in zip(kn.ptree.leaves(s1.vars.params), kn.ptree.leaves(s2.vars.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
