"""Mixed precision: train.make(..., precision=...) — casts by the pass, float32 master weights,
float16 dynamic loss scaling inside the compiled step, digits accuracy."""

from __future__ import annotations

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import data, datasets, layer, optim, rng, train
from kaun_ir.nn import loss, metric

MODEL = layer.sequential([layer.linear(64, 128), layer.relu(), layer.linear(128, 10)])


@pytest.fixture(scope="module")
def digits():
    return datasets.digits(flatten=True)


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_mixed_precision_trains_digits(digits, precision):
    (x_train, y_train), (x_test, y_test) = digits
    tr = train.make(MODEL, optim.adam(3e-3), loss=loss.cross_entropy_sparse, precision=precision)
    st = rng.run(0, lambda: train.init(tr))
    for epoch in range(10):
        st = train.fit(tr, st, data.prepare((x_train, y_train), batch_size=32, shuffle=True, seed=epoch))
    accuracy = metric.accuracy(np.asarray(train.predict(tr, st, x_test)), y_test)
    assert accuracy >= 0.95, accuracy
    # master weights stay float32; the products of the step run in the low dtype
    assert all(np.asarray(p).dtype == np.float32 for p in kn.ptree.flatten(st.vars.params)[0])
    hlo = train.step_executable(tr, st, x_train[:32], y_train[:32]).hlo_text()
    assert ("bf16" if precision == "bfloat16" else "f16[") in hlo


def test_float16_overflow_skips_the_update_and_halves_the_scale(digits):
    (x_train, y_train), _ = digits
    policy = kn.precision.Policy(kn.float16, "dynamic", initial_scale=2.0**40)  # overflows float16
    tr = train.make(MODEL, optim.sgd(0.1), loss=loss.cross_entropy_sparse, precision=policy)
    st = rng.run(0, lambda: train.init(tr))
    before = [np.asarray(p).copy() for p in kn.ptree.flatten(st.vars.params)[0]]
    value, st = train.step(tr, st, x_train[:32], y_train[:32])
    assert np.isfinite(float(value))  # the reported loss is the unscaled one
    for a, b in zip(before, kn.ptree.flatten(st.vars.params)[0]):
        np.testing.assert_array_equal(np.asarray(b), a)
    assert float(kn.precision.loss_scale_of(st.opt_state)) == 2.0**39
    # with a representable scale the next steps update, and the reported loss matches float32
    host = kn.ptree.map(lambda a: np.array(a), st.vars.params)

    def fresh(trainer):  # each state owns its buffers (a step donates them)
        return train.make_state(trainer, layer.with_params(st.vars, kn.ptree.map(np.copy, host)))

    f32 = train.make(MODEL, optim.sgd(0.1), loss=loss.cross_entropy_sparse)
    scaled = train.make(MODEL, optim.sgd(0.1), loss=loss.cross_entropy_sparse, precision="float16")
    st32, st16 = fresh(f32), fresh(scaled)
    l32, st32 = train.step(f32, st32, x_train[:32], y_train[:32])
    l16, st16 = train.step(scaled, st16, x_train[:32], y_train[:32])
    assert abs(float(l16) - float(l32)) < 1e-3  # float16 products, float32 everywhere else
    for a, b in zip(kn.ptree.flatten(st32.vars.params)[0], kn.ptree.flatten(st16.vars.params)[0]):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-3)


def test_the_pass_and_policy_errors():
    graph = kn.trace(
        lambda w, x: kn.sum(kn.tanh(x @ w)), np.ones((4, 3), np.float32), np.ones((2, 4), np.float32)
    )
    out = kn.passes.run(graph, "mixed-precision{compute=bfloat16}")
    (dot,) = [n for n in out.nodes if n.op == "dot_general"]
    assert [v.type.dtype for v in dot.inputs] == [kn.bfloat16, kn.bfloat16] and dot.types[
        0
    ].dtype == kn.float32
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        kn.precision.Policy(kn.float32)
    with pytest.raises(ValueError, match="precision must be"):
        train.make(MODEL, optim.sgd(0.1), loss=loss.mse, precision="half-ish")
