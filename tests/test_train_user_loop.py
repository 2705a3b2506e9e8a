"""The loop a user writes: ``train.step`` over ``jax.Array`` batches, explicit targets and a new
loss closure every step, on the repeated-step dispatch path. Oracle: NumPy SGD in float64."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from kaun_ir import layer, optim, rng, train
from kaun_ir.nn import loss
from kaun_ir.train.state import successor

LR = 0.5
RNG = np.random.default_rng(3)
BATCHES = [
    (RNG.normal(size=(6, 5)).astype(np.float32), RNG.integers(0, 3, size=6).astype(np.int32))
    for _ in range(3)
]


def _numpy_steps(params: dict, steps: int) -> tuple[list, dict]:
    """Per-step losses and the final parameters of plain SGD on the linear model's softmax
    cross-entropy, in float64."""
    w = np.asarray(params["weight"], np.float64)
    b = np.asarray(params["bias"], np.float64)
    losses = []
    for i in range(steps):
        x, y = BATCHES[i % len(BATCHES)]
        logits = x.astype(np.float64) @ w + b
        z = np.exp(logits - logits.max(axis=1, keepdims=True))
        p = z / z.sum(axis=1, keepdims=True)
        losses.append(float(np.mean(-np.log(p[np.arange(len(y)), y]))))
        g = p.copy()
        g[np.arange(len(y)), y] -= 1.0
        g /= len(y)
        w, b = w - LR * x.T.astype(np.float64) @ g, b - LR * g.sum(axis=0)
    return losses, {"weight": w, "bias": b}


def _closure(y):
    return lambda logits: loss.cross_entropy_sparse(logits, y)


@pytest.mark.parametrize("form", ["explicit", "closure"])
def test_a_loop_over_jax_arrays_trains_as_numpy_sgd_on_one_executable(form):
    model = layer.linear(5, 3)
    if form == "explicit":
        trainer = train.make(model, optim.sgd(LR), loss=loss.cross_entropy_sparse)
    else:
        trainer = train.make(model, optim.sgd(LR))
    with rng.scope(0):
        st = train.init(trainer)
    start = {k: np.array(v) for k, v in st.vars.params.items()}
    batches = [(jax.device_put(x), jax.device_put(y)) for x, y in BATCHES]
    losses = []
    for i in range(7):
        x, y = batches[i % len(batches)]
        if form == "explicit":
            value, st = train.step(trainer, st, x, y)
        else:
            value, st = train.step(trainer, st, x, _closure(y))  # a new closure every step
        losses.append(float(np.asarray(value)))
        assert st.step == i + 1 and st.cache.flat is not None  # the next step takes the fast path
    want_losses, want = _numpy_steps(start, 7)
    np.testing.assert_allclose(losses, want_losses, rtol=2e-5, atol=1e-6)
    for name in ("weight", "bias"):
        np.testing.assert_allclose(np.asarray(st.vars.params[name]), want[name], rtol=2e-5, atol=1e-6)
    compiled = trainer.cache.step
    assert len(compiled.executables()) == 1 and len(compiled.routes) == 1
    # the state the fast path built is an ordinary State: replace() and further steps work on it
    copy = dataclasses.replace(st, step=100)
    assert copy.cache.flat is None and copy.vars is st.vars and copy.key is st.key
    x, y = batches[0]
    targets = (y,) if form == "explicit" else (_closure(y),)
    value, after = train.step(trainer, copy, x, *targets)
    assert after.step == 101 and np.isfinite(float(np.asarray(value)))


def test_successor_fills_every_field_of_state_and_vars():
    trainer = train.make(layer.linear(2, 2), optim.sgd(0.1), loss=loss.mse)
    with rng.scope(0):
        st = train.init(trainer)
    new = successor(st, {"w": 1}, {"s": 2}, ("count", ()), 3, "flat")
    fields = {f.name for f in dataclasses.fields(train.State)}
    assert set(new.__dict__) == fields  # a field added to State must be added to successor
    assert set(new.vars.__dict__) == {f.name for f in dataclasses.fields(layer.Vars)}
    assert (new.vars.params, new.vars.state, new.vars.dtype) == ({"w": 1}, {"s": 2}, st.vars.dtype)
    assert (new.opt_state, new.step, new.key, new.optimizer) == (("count", ()), 3, st.key, st.optimizer)
    assert new.cache.flat == "flat" and new.cache is not st.cache
    with pytest.raises(dataclasses.FrozenInstanceError):
        new.step = 4


def test_train_loads_fit_and_its_writers_only_when_used():
    import subprocess
    import sys

    code = (
        "import sys, kaun_ir.train as t\n"
        "lazy = ['loop', 'callbacks', 'checkpointing', 'evaluation', 'inspection', 'io']\n"
        "print(sorted(m for m in lazy if 'kaun_ir.train.' + m in sys.modules))\n"
        "t.fit, t.JsonlWriter, t.latest_checkpoint, t.evaluate, t.step_graph, t.save\n"
        "print(sorted(m for m in lazy if 'kaun_ir.train.' + m in sys.modules))\n"
        "print(all(hasattr(t, name) for name in t.__all__), set(t.__all__) <= set(dir(t)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == "[]"
    assert lines[1] == str(sorted(["loop", "callbacks", "checkpointing", "evaluation", "inspection", "io"]))
    assert lines[2] == "True True"
    with pytest.raises(AttributeError, match="kaun_ir.train"):
        train.no_such_name  # noqa: B018
