"""Pipeline parallelism (``train.make(..., pipeline=kn.sharding.pipeline(...))``).

The multi-device checks run in one child process with 8 virtual CPU devices
(pipeline_worker.py): an MLP stack and a small bench transformer trained pipelined over 4 stages
(x 2 data-parallel rows) and 8 stages, and a GPT-2-shaped ``kn.models`` decoder over a mesh of 8
stages alone, compared with the same model trained on one device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import layer, loss, optim, rng, train

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def checks():
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "pipeline_worker.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["mlp_4", "mlp_8", "transformer_4", "transformer_8"])
def test_pipelined_training_equals_one_device(checks, name):
    r = checks[name]
    assert "error" not in r, r["error"]
    np.testing.assert_allclose(r["loss"], r["loss_ref"], rtol=1e-5)
    assert r["param_err"] < 1e-5
    assert r["permutes"] > 0  # stages hand activations on with collective-permutes
    assert r["memory"]["temp"] > 0
    assert r["report_args"][0] == r["report_args"][1]  # kn.memory_report of a stage vs XLA


def test_pipelined_gpt2_decoder_equals_one_device(checks):
    # kn.models.gpt2 (8 blocks, one per stage) on a mesh with only a stage axis
    r = checks["gpt2_8"]
    assert "error" not in r, r["error"]
    assert r["leaves"] == 4 + 8 * 16  # every parameter has its gradient compared
    assert r["loss_diff"] < 2e-6, r
    assert r["grad_diff"] < 1e-6 * max(r["grad_max"], 1.0), r
    assert r["permutes"] > 0


def test_bubble_and_schedule():
    pipe = kn.sharding.pipeline(stages=4, microbatches=8)
    assert pipe.ticks == 11
    assert pipe.bubble == pytest.approx(3 / 11)
    rows = pipe.schedule_text().splitlines()
    assert len(rows) == 4 and rows[0].split()[2] == "0" and rows[3].split()[-1] == "7"


def test_bad_pipelines_are_named():
    with pytest.raises(ValueError, match="schedule"):
        kn.sharding.pipeline(stages=2, microbatches=2, schedule="zigzag")
    with pytest.raises(ValueError, match="microbatches"):
        kn.sharding.pipeline(stages=2, microbatches=0)
    model = layer.sequential([layer.linear(4, 4), layer.tanh(), layer.linear(4, 4)])
    trainer = train.make(
        model, optim.sgd(0.1), loss=loss.mse, pipeline=kn.sharding.pipeline(stages=3, microbatches=2)
    )
    with pytest.raises(ValueError, match="no run of identical blocks"):  # at the door: train.init
        rng.run(0, lambda: train.init(trainer))


def _refused(model, stages, **kw):
    trainer = train.make(
        model, optim.sgd(0.1), loss=loss.mse, pipeline=kn.sharding.pipeline(stages=stages, microbatches=2)
    )
    with pytest.raises(ValueError) as info:
        rng.run(0, lambda: train.init(trainer, **kw))
    return str(info.value)


def test_refusals_name_the_fix():
    # a flat sequential repeating (linear, tanh): the message says how to group it
    flat = layer.sequential([layer.linear(4, 8)] + [layer.linear(8, 8), layer.tanh()] * 4)
    message = _refused(flat, 2)
    assert "layers 1-8 repeat the group (linear, tanh) 4 times" in message
    assert "*[layer.sequential([linear, tanh]) for _ in range(4)]" in message
    # grouped as the message says, the same layers pipeline
    grouped = layer.sequential(
        [layer.linear(4, 8)] + [layer.sequential([layer.linear(8, 8), layer.tanh()]) for _ in range(4)]
    )
    trainer = train.make(grouped, optim.sgd(0.1), loss=loss.mse, pipeline=kn.sharding.pipeline(2, 2))
    st = rng.run(0, lambda: train.init(trainer))
    value, _ = train.step(trainer, st, np.ones((4, 4), np.float32), np.zeros((4, 8), np.float32))
    assert np.isfinite(float(value))
    # blocks that do not divide into the stages: refused at train.init, with the stages that would
    message = _refused(grouped, 3)
    assert "3 stages do not divide the 4 identical blocks of 'sequential' (layers 1-4)" in message
    assert "among 1, 2, 4" in message
    gpt = kn.models.gpt2(vocab_size=16, dim=8, num_layers=6, num_heads=2, max_positions=8)
    message = _refused(gpt, 4)
    assert "4 stages do not divide the 6 identical blocks of 'gpt2' (parameters 'layers')" in message
    assert "among 1, 2, 3, 6" in message
    # a model that is neither a sequential nor a decoder
    message = _refused(layer.residual(layer.linear(4, 4)), 2)
    assert "layer.sequential([<layers before>, *blocks, <layers after>]) or a kn.models decoder" in message


def test_pipelined_decoder_on_one_device_equals_plain():
    # a kn.models decoder (Llama-shaped: RoPE, RMSNorm, SwiGLU) pipelined without a mesh
    llama = kn.models.llama(vocab_size=32, dim=16, num_layers=4, num_heads=4, num_kv_heads=2, hidden_dim=32)
    ids = np.random.default_rng(1).integers(0, 32, (4, 9)).astype(np.int32)

    def next_token(logits, targets):
        return loss.cross_entropy_sparse(kn.reshape(logits, (-1, 32)), kn.reshape(targets, (-1,)))

    out = {}
    for key, pipe in (("plain", None), ("pp", kn.sharding.pipeline(stages=2, microbatches=2))):
        trainer = train.make(llama, optim.sgd(0.5), loss=next_token, pipeline=pipe)
        st = rng.run(0, lambda t=trainer: train.init(t))
        value, st = train.step(trainer, st, ids[:, :-1], ids[:, 1:])
        out[key] = (float(value), [np.asarray(p) for p in kn.ptree.leaves(train.vars(st).params)])
    assert out["pp"][0] == pytest.approx(out["plain"][0], rel=1e-6)
    for a, b in zip(out["plain"][1], out["pp"][1]):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


def test_one_device_pipeline_equals_plain_model():
    # without a mesh the pipelined step runs the same schedule on one device
    model = layer.sequential(
        [layer.linear(4, 8)] + [layer.linear(8, 8) for _ in range(4)] + [layer.linear(8, 2)]
    )
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    y = np.zeros((8, 2), np.float32)
    out = {}
    for key, pipe in (("plain", None), ("pp", kn.sharding.pipeline(stages=2, microbatches=4))):
        trainer = train.make(model, optim.sgd(0.1), loss=loss.mse, pipeline=pipe)
        st = rng.run(0, lambda t=trainer: train.init(t))
        value, st = train.step(trainer, st, x, y)
        out[key] = (float(value), [np.asarray(p) for p in kn.ptree.flatten(train.vars(st).params)[0]])
    assert out["pp"][0] == pytest.approx(out["plain"][0], rel=1e-6)
    for a, b in zip(out["plain"][1], out["pp"][1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_1f1b_recomputes_and_needs_less_memory():
    # the memory-bounded 1f1b variant rematerialises each tick's stage inside the loop body
    def block():
        return layer.sequential([layer.linear(64, 64), layer.tanh(), layer.linear(64, 64), layer.tanh()])

    model = layer.sequential([layer.linear(8, 64)] + [block() for _ in range(4)] + [layer.linear(64, 4)])
    x, y = np.ones((128, 8), np.float32), np.ones((128, 4), np.float32)
    seen = {}
    for schedule in ("gpipe", "1f1b"):
        pipe = kn.sharding.pipeline(stages=2, microbatches=4, schedule=schedule)
        trainer = train.make(model, optim.sgd(0.1), loss=loss.mse, pipeline=pipe)
        st = rng.run(0, lambda t=trainer: train.init(t))
        exe = train.step_executable(trainer, st, x, y)
        seen[schedule] = (exe.hlo_text().count(" dot("), exe.memory_analysis()["temp"])
    assert seen["1f1b"][0] > seen["gpipe"][0]  # the recomputed forward products
    assert seen["1f1b"][1] < seen["gpipe"][1]
