"""kn.memory_report and kaun-ir memory: the replayed schedule checked against XLA's own statistics
and against the sizes of the arrays (NumPy), remat rows measured by compiling."""

from __future__ import annotations

import re

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


# -- attribution, CLI/API agreement and advice (a small CNN) -----------------------------------------


@pytest.fixture(scope="module")
def cnn_report():
    """A flat CNN (every top-level layer one op): XLA fuses the second convolution's bias, its
    ReLU and the average pool's backward into one kernel, and remat makes the peak larger."""
    model = layer.sequential(
        [
            layer.conv2d(3, 16),
            layer.relu(),
            layer.max_pool2d(2),
            layer.conv2d(16, 32),
            layer.relu(),
            layer.avg_pool2d(8),
            layer.flatten(),
            layer.linear(32, 64),
            layer.relu(),
            layer.linear(64, 10),
        ]
    )
    trainer = train.make(model, optim.adam(1e-3), loss=loss.cross_entropy_sparse)
    x = np.random.default_rng(0).normal(size=(64, 3, 16, 16)).astype(np.float32)
    st = rng.run(0, lambda: train.init(trainer, example=x))
    y = np.zeros(64, np.int32)
    return kn.memory_report(trainer, st, x, y), train.step_executable(trainer, st, x, y).hlo_text()


def test_fused_buffers_are_charged_to_every_layer_they_compute(cnn_report):
    from kaun_ir.runtime.memory import fusion_layers, layer_of

    rep, hlo = cnn_report
    fusions = fusion_layers(hlo)
    checked = 0
    for b in rep.buffers:
        if not b.fused:
            continue
        # the layers of a fusion, read here straight from the fused computation's op_name lines
        name = next(line for line in hlo.splitlines() if f"%{b.name} = " in line)
        computation = name.split("calls=%")[1].split(",")[0].split(" ")[0]
        body = hlo.split(f"%{computation} (", 1)[1].split("\n}", 1)[0]
        found = re.findall(r'= \S+ ([\w-]+)\(.*op_name="([^"]*)"', body)
        moving = {
            "broadcast",
            "constant",
            "iota",
            "reshape",
            "bitcast",
            "transpose",
            "copy",
            "convert",
            "slice",
        }
        expected = {layer_of(name) for op, name in found if op not in moving} or {
            layer_of(name) for _, name in found
        }
        assert set(b.fused) == expected == set(fusions[computation])
        checked += 1
    assert checked
    labels = {row[0] for row in rep.peak}
    # the fusion of conv bias + relu + avg-pool backward is labelled by all three, not by one
    assert any(lbl.startswith("fused: ") and "5.avg_pool2d" in lbl for lbl in labels)
    # no bare index (a parameter path or a copy of one) is left as a label
    assert not any(lbl.split(".")[0].isdigit() and "." not in lbl for lbl in labels)
    assert rep.by_kind == {kind: sum(r[2] for r in rep.peak if r[1] == kind) for kind in rep.by_kind}


def test_advice_when_remat_makes_it_worse(cnn_report):
    rep, _ = cnn_report
    (p1, s1, peak1), (p2, s2, peak2) = rep.remat
    assert peak1 > rep.peak_bytes and peak2 > rep.peak_bytes  # measured: both policies are worse
    advice = " ".join(rep.advice())
    assert "Remat will not help here" in advice and "makes the peak larger" in advice
    assert "'nothing' +" in advice and "blocks" in advice  # why, and what to do instead
    # the printed report ends with the advice
    assert rep.text().split("\nadvice:\n")[1].split() == " ".join(rep.advice()).split()


def test_advice_recommends_a_policy_that_helps(report):
    rep, *_ = report  # three blocks of two linears: remat "nothing" lowers the peak
    advice = " ".join(rep.advice())
    assert "Try train.make(..., remat='nothing')" in advice and "will not help" not in advice


def test_cli_and_api_agree(tmp_path, monkeypatch, capsys):
    source = """
import numpy as np
from kaun_ir import layer, loss, optim
from kaun_ir.tools.spec import TrainSetup
from kaun_ir.surface.trace import ShapeDtype
import kaun_ir as kn


def model():
    return layer.sequential([layer.linear(16, 32), layer.tanh(), layer.linear(32, 4)])


def setup():
    return TrainSetup(model(), optim.adam(1e-3), loss=loss.cross_entropy_sparse,
                      inputs=(ShapeDtype((64, 16)),), targets=(ShapeDtype((64,), kn.int32),))
"""
    (tmp_path / "memspec.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["memory", "memspec:setup", "--remat", "nothing", "--rows", "50"]) == 0
    printed = capsys.readouterr().out
    import memspec

    trainer = train.make(memspec.model(), optim.adam(1e-3), loss=loss.cross_entropy_sparse)
    st = rng.run(0, lambda: train.init(trainer))
    x, y = np.zeros((64, 16), np.float32), np.zeros(64, np.int32)
    api = kn.memory_report(trainer, st, x, y, remat=("nothing",))
    assert printed.strip() == api.text(rows=50).strip()
    assert "parameters" in printed and "optimiser state" in printed and "advice:" in printed


@pytest.mark.parametrize("policy", ["none", "Dots", "paths:", 'paths:a"b'])
def test_cli_memory_rejects_unknown_remat_policy(capsys, policy):
    # a usage error (exit status 2) naming the value and the valid policies, before any compiling
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["memory", "kaun_ir.tools.examples:train_step_mlp", "--remat", "dots", policy])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"invalid remat policy {policy!r}" in err
    assert "nothing, dots and paths:<pattern>|<pattern>" in err and "crashed" not in err
