"""kn.jit under threads (one compilation per signature) and KAUN_IR_EXPLAIN_RECOMPILES."""

from __future__ import annotations

import logging
import threading

import numpy as np

import kaun_ir as kn


def test_threads_racing_on_a_first_call_compile_the_signature_once():
    def f(x):
        return kn.tanh(x) * 2.0

    compiled = kn.jit(f)
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    barrier = threading.Barrier(6)
    results, errors = [None] * 6, []

    def call(i):
        try:
            barrier.wait()
            results[i] = np.asarray(compiled(x))
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert compiled.trace_count == 1
    for r in results:
        np.testing.assert_allclose(r, np.tanh(x) * 2.0, rtol=1e-6)


def test_threads_with_different_signatures_each_get_their_own_executable():
    compiled = kn.jit(lambda x: x + 1.0)
    shapes = [(2,), (3,), (2,), (3,), (4,), (4,)]
    barrier = threading.Barrier(len(shapes))
    out = {}

    def call(i, shape):
        barrier.wait()
        out[i] = np.asarray(compiled(np.zeros(shape, np.float32)))

    threads = [threading.Thread(target=call, args=(i, s)) for i, s in enumerate(shapes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert compiled.trace_count == 3
    for i, shape in enumerate(shapes):
        np.testing.assert_array_equal(out[i], np.ones(shape, np.float32))


def test_explain_recompiles_names_the_argument_and_what_changed(monkeypatch, caplog):
    monkeypatch.setenv("KAUN_IR_EXPLAIN_RECOMPILES", "1")

    def model(params, x, scale=1.0):
        return (x @ params["w"]) * scale

    compiled = kn.jit(model)
    params = {"w": np.ones((3, 2), np.float32)}
    with caplog.at_level(logging.WARNING, logger="kaun_ir.jit"):
        compiled(params, np.ones((4, 3), np.float32))
        compiled(params, np.ones((4, 3), np.float32))  # cached: no log line
        compiled(params, np.ones((5, 3), np.float32))
        compiled(params, np.ones((5, 3), np.float64))
        compiled(params, np.ones((5, 3), np.float64), scale=2.0)
        compiled({"w": params["w"], "b": 1}, np.ones((5, 3), np.float32))
    lines = [r.getMessage() for r in caplog.records if r.name == "kaun_ir.jit"]
    assert len(lines) == 5, lines
    assert "first call" in lines[0]
    assert "args[1]: shape float32[4,3] -> float32[5,3]" in lines[1]
    assert "args[1]: dtype float32[5,3] -> float64[5,3]" in lines[2]
    assert "kwargs {scale: *}" in lines[3]  # a new keyword argument
    assert "argument tree changed" in lines[4]
    assert all(line.startswith("kn.jit(test_explain_recompiles") for line in lines)


def test_explain_recompiles_static_value(monkeypatch, caplog):
    monkeypatch.setenv("KAUN_IR_EXPLAIN_RECOMPILES", "1")
    compiled = kn.jit(lambda x, n: x * n)
    with caplog.at_level(logging.WARNING, logger="kaun_ir.jit"):
        compiled(np.ones(2, np.float32), 2)
        compiled(np.ones(2, np.float32), 3)
    assert "args[1]: static value static int 2 -> static int 3" in caplog.records[-1].getMessage()


def test_no_log_without_the_switch(monkeypatch, caplog):
    monkeypatch.delenv("KAUN_IR_EXPLAIN_RECOMPILES", raising=False)
    compiled = kn.jit(lambda x: x * 2.0)
    with caplog.at_level(logging.WARNING, logger="kaun_ir.jit"):
        compiled(np.ones(2, np.float32))
        compiled(np.ones(3, np.float32))
    assert not [r for r in caplog.records if r.name == "kaun_ir.jit"]


def test_train_step_from_several_threads_on_separate_states():
    from kaun_ir import layer, optim, rng, train
    from kaun_ir.nn import loss

    trainer = train.make(
        layer.sequential([layer.linear(3, 4), layer.relu(), layer.linear(4, 1)]), optim.sgd(0.1)
    )
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(8, 3)
    y = np.ones((8, 1), np.float32)

    def fresh():
        with rng.scope(0):
            return train.init(trainer)

    def run(st, steps=3):
        losses = []
        for _ in range(steps):
            value, st = train.step(trainer, st, x, lambda out: loss.mse(out, y))
            losses.append(float(value))
        return losses

    expected = run(fresh())
    states = [fresh() for _ in range(4)]
    barrier = threading.Barrier(4)
    results = [None] * 4

    def work(i):
        barrier.wait()
        results[i] = run(states[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 4
    assert trainer.cache.step.trace_count == 1
