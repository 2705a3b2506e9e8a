"""kn.memory_report and kaun-ir memory: the replayed schedule checked against XLA's own statistics
and against the sizes of the arrays (NumPy), remat rows measured by compiling."""

from __future__ import annotations

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import layer, loss, optim, rng, train
from kaun_ir.tools import cli


@pytest.fixture(scope="module")
def report():
    model = layer.sequential(
        [
            layer.sequential([layer.linear(32, 128), layer.tanh(), layer.linear(128, 32), layer.tanh()])
            for _ in range(3)
        ]
    )
    trainer = train.make(model, optim.adam(1e-3), loss=loss.mse)
    st = rng.run(0, lambda: train.init(trainer))
    x = np.ones((512, 32), np.float32)
    rep = kn.memory_report(trainer, st, x, x, remat=("nothing",))
    params = sum(np.asarray(p).nbytes for p in kn.ptree.flatten(train.vars(st).params)[0])
    opt = sum(np.asarray(p).nbytes for p in kn.ptree.flatten(list(st.opt_state))[0])
    return rep, params, opt, 2 * x.nbytes


def test_arguments_match_xla_and_numpy(report):
    rep, params, opt, batch = report
    args = [b for b in rep.buffers if b.parameter is not None]
    assert sum(b.bytes for b in args) == rep.stats["argument"]  # XLA's buffer assignment
    assert rep.by_kind["parameters"] == params  # every argument is live throughout
    assert rep.by_kind["optimiser state"] == opt
    assert rep.by_kind["inputs"] == batch + 8  # x, the targets and the uint32[2] key


def test_peak_is_within_the_documented_bound(report):
    rep, *_ = report
    assert rep.peak_bytes == max(rep.timeline)
    # the replay ignores XLA's in-place reuse: at most 1.5 x XLA's total, never below the arguments
    assert rep.stats["argument"] < rep.peak_bytes <= 1.5 * rep.stats["total_bytes"]
    assert rep.by_kind["activations saved for backward"] > 0
    layers = {row[0] for row in rep.peak if row[1] == "activations saved for backward"}
    assert {"0.sequential", "1.sequential"} <= layers


def test_remat_rows_are_measured(report):
    rep, *_ = report
    ((policy, stats, peak),) = rep.remat
    assert policy == "nothing"
    assert stats["temp"] < rep.stats["temp"] and peak < rep.peak_bytes
    text = rep.text()
    assert "activations saved for backward" in text and "'nothing'" in text


def test_function_report():
    def f(w, x):
        return kn.sum(kn.tanh(x @ w) @ w.T)

    w, x = np.ones((64, 64), np.float32), np.ones((128, 64), np.float32)
    rep = kn.memory_report(f, w, x)
    assert sum(b.bytes for b in rep.buffers if b.parameter is not None) == w.nbytes + x.nbytes
    assert rep.remat == [] and rep.by_kind["inputs"] == w.nbytes + x.nbytes
    with pytest.raises(TypeError, match="trainer, a function or a kn.Graph"):
        kn.memory_report(3)


def test_cli_memory(capsys):
    assert cli.main(["memory", "kaun_ir.tools.examples:train_step_mlp", "--remat"]) == 0
    out = capsys.readouterr().out
    assert "XLA's buffer assignment" in out and "at the peak, by layer" in out


@pytest.mark.parametrize("policy", ["none", "Dots", "paths:", 'paths:a"b'])
def test_cli_memory_rejects_unknown_remat_policy(capsys, policy):
    # a usage error (exit status 2) naming the value and the valid policies, before any compiling
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["memory", "kaun_ir.tools.examples:train_step_mlp", "--remat", "dots", policy])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"invalid remat policy {policy!r}" in err
    assert "nothing, dots and paths:<pattern>|<pattern>" in err and "crashed" not in err
