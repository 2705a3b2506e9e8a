"""train.fit's workflow pieces: metric writers (JSON lines, CSV, TensorBoard event files),
evaluate, the logged learning rate and throughput, checkpoints every N steps with keep-last-K,
background saves, and resuming with the data pipeline's position."""

from __future__ import annotations

import csv
import json
import os
import struct
import threading
import time

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import data, layer, loss, optim, rng, train
from kaun_ir.errors import CheckpointError, KaunError
from kaun_ir.train import checkpointing, tfevents

RS = np.random.default_rng(1)
XS = RS.normal(size=(48, 8)).astype(np.float32)
YS = (XS[:, 0] > 0).astype(np.int32)
MODEL = layer.sequential([layer.linear(8, 16), layer.relu(), layer.dropout(0.2), layer.linear(16, 2)])
# one trainer for the whole file: its compiled step is reused by every test
TRAINER = train.make(MODEL, optim.adam(1e-2), loss=loss.cross_entropy_sparse)


def _fresh():
    with rng.scope(0):
        return train.init(TRAINER)


def _pipeline():
    return data.prepare((XS, YS), 8, shuffle=True, seed=3)


class Recorder(train.Callback):
    """Records what on_log saw; raises RuntimeError at ``crash_at`` (a power cut)."""

    def __init__(self, crash_at=None):
        self.seen, self.raw, self.crash_at, self.ended = [], [], crash_at, False

    def on_log(self, step, logs, state):
        self.raw.append(dict(logs))
        # throughput differs between runs; the rest is the run's record
        self.seen.append((step, {k: v for k, v in logs.items() if not k.endswith("_per_s")}))
        if step == self.crash_at:
            raise RuntimeError("power cut")

    def on_fit_end(self, step, state):
        self.ended = True


# -- TensorBoard event files ---------------------------------------------------------------------


def _crc32c_bitwise(data: bytes) -> int:
    """CRC-32C computed bit by bit (no table), as an independent check of the writer's."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 * (crc & 1))
    return crc ^ 0xFFFFFFFF


def _unmask(masked: int) -> int:
    rot = (masked - 0xA282EAD8) & 0xFFFFFFFF
    return ((rot << 15) | (rot >> 17)) & 0xFFFFFFFF


def test_crc32c_check_value_and_tfrecord_framing(tmp_path):
    # the CRC-32C check value of "123456789" (RFC 3720, appendix B.4)
    assert tfevents.crc32c(b"123456789") == 0xE3069283
    f = tfevents.EventFile(tmp_path)
    f.write(7, {"loss": 0.25})
    f.close()
    raw = open(f.path, "rb").read()
    records, pos = [], 0
    while pos < len(raw):
        (length,) = struct.unpack_from("<Q", raw, pos)
        (head_crc,) = struct.unpack_from("<I", raw, pos + 8)
        assert _unmask(head_crc) == _crc32c_bitwise(raw[pos : pos + 8])
        payload = raw[pos + 12 : pos + 12 + length]
        (data_crc,) = struct.unpack_from("<I", raw, pos + 12 + length)
        assert _unmask(data_crc) == _crc32c_bitwise(payload)
        records.append(payload)
        pos += 16 + length
    assert len(records) == 2 and b"brain.Event:2" in records[0]
    assert struct.pack("<f", 0.25) in records[1] and b"loss" in records[1]


def test_tensorboard_reads_the_scalars(tmp_path):
    pytest.importorskip("google.protobuf")
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    writer = train.TensorBoardWriter(tmp_path / "tb")
    writer.write(1, {"loss": 2.5, "lr": 0.125})
    writer.write(2, {"loss": 1.5})
    writer.close()
    acc = accumulator.EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["loss", "lr"]
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 2.5), (2, 1.5)]
    assert [(e.step, e.value) for e in acc.Scalars("lr")] == [(1, 0.125)]


# -- logs from fit -------------------------------------------------------------------------------


def test_fit_writes_jsonl_csv_and_tensorboard_logs_with_lr_and_throughput(tmp_path):
    schedule = optim.schedule.warmup_cosine(0.0, 1e-2, warmup_steps=4, decay_steps=40)
    scheduled = train.make(MODEL, optim.adam(schedule), loss=loss.cross_entropy_sparse)
    with rng.scope(0):
        st = train.init(scheduled)
    writers = [
        train.JsonlWriter(tmp_path / "log.jsonl"),
        train.CsvWriter(tmp_path / "log.csv"),
        train.TensorBoardWriter(tmp_path / "tb"),
    ]
    losses = []
    st = train.fit(
        scheduled,
        st,
        _pipeline(),
        report=lambda step, loss, state: losses.append(float(loss)),
        report_every=2,
        callbacks=writers,
        eval_data=data.prepare((XS, YS), 16),
        eval_metrics={"accuracy": kn.metric.accuracy},
        progress=False,
    )
    rows = [json.loads(line) for line in open(tmp_path / "log.jsonl")]
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert all("loss" in r for r in train_rows) and all("loss" not in r for r in rows if r["kind"] == "eval")
    assert [r["step"] for r in train_rows] == [2, 4, 6]
    assert [r["loss"] for r in train_rows] == pytest.approx(losses)
    # the learning rate at step t, computed here from the schedule's formula
    for r in train_rows:
        t = r["step"]
        want = 1e-2 * t / 4 if t <= 4 else 0.5 * 1e-2 * (1 + np.cos(np.pi * (t - 4) / 36))
        assert r["lr"] == pytest.approx(want, rel=1e-5)
        assert r["steps_per_s"] > 0 and r["examples_per_s"] == pytest.approx(8 * r["steps_per_s"])
    assert "tokens_per_s" not in train_rows[0]  # float inputs are not tokens
    assert set(rows[-1]) == {"step", "kind", "eval/loss", "eval/accuracy"} and rows[-1]["step"] == 6
    assert rows[-1]["kind"] == "eval"
    with open(tmp_path / "log.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    assert list(table[0]) == [
        "step",
        "loss",
        "lr",
        "steps_per_s",
        "examples_per_s",
        "epoch",
        "eval/loss",
        "eval/accuracy",
    ]
    assert [float(r["loss"]) for r in table if r["loss"]] == pytest.approx(losses)
    assert table[-1]["loss"] == "" and float(table[-1]["eval/accuracy"]) == rows[-1]["eval/accuracy"]
    assert len(os.listdir(tmp_path / "tb")) == 1


def test_tokens_per_second_for_integer_inputs():
    vocab = 16
    ids = np.random.default_rng(0).integers(0, vocab, size=(32, 5)).astype(np.int32)
    labels = (ids[:, 0] % 2).astype(np.int32)
    lm = layer.sequential([layer.embedding(vocab, 4), layer.flatten(), layer.linear(20, 2)])
    lm_trainer = train.make(lm, optim.sgd(0.1), loss=loss.cross_entropy_sparse)
    with rng.scope(0):
        st = train.init(lm_trainer, example=ids[:8])
    rec = Recorder()
    train.fit(lm_trainer, st, data.prepare((ids, labels), 8), callbacks=[rec], report_every=2, progress=False)
    logs = rec.raw[-1]
    assert logs["tokens_per_s"] == pytest.approx(40 * logs["steps_per_s"])
    assert logs["lr"] == 0.1 and rec.ended


def test_evaluate_matches_numpy():
    linear = layer.linear(8, 3)
    ev_trainer = train.make(linear, optim.sgd(0.1), loss=loss.cross_entropy_sparse)
    with rng.scope(2):
        st = train.init(ev_trainer)
    labels = np.random.default_rng(3).integers(0, 3, size=48).astype(np.int32)
    # 48 examples in batches of 20: the last batch (8) must weigh less
    result = train.evaluate(
        ev_trainer, st, data.prepare((XS, labels), 20, drop_last=False), {"accuracy": kn.metric.accuracy}
    )
    w, b = np.asarray(st.vars.params["weight"]), np.asarray(st.vars.params["bias"])
    logits = XS.astype(np.float64) @ w + b
    logp = (
        logits
        - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True))
        - logits.max(1, keepdims=True)
    )
    assert result["loss"] == pytest.approx(-logp[np.arange(48), labels].mean(), rel=1e-5)
    assert result["accuracy"] == pytest.approx((logits.argmax(1) == labels).mean())


def test_evaluate_errors():
    st = _fresh()
    closure = train.make(MODEL, optim.sgd(0.1))
    with pytest.raises(ValueError, match="nothing to measure"):
        train.evaluate(closure, st, [(XS[:8], YS[:8])])
    with pytest.raises(TypeError, match="metric 'acc' is not callable"):
        train.evaluate(TRAINER, st, [(XS[:8], YS[:8])], {"acc": 1})


def test_callbacks_must_be_callbacks():
    with pytest.raises(TypeError, match="train.Callback"):
        train.fit(TRAINER, _fresh(), [(XS[:8], YS[:8])], callbacks=[print])


# -- data positions --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: data.prepare((np.arange(20), np.arange(20)), 3, shuffle=True, seed=1),
        lambda: data.batch(
            3, data.shuffle(data.of_tensors((np.arange(20), np.arange(20))), seed=2), drop_last=True
        ),
        lambda: data.map(lambda b: b, data.shuffle(data.of_iterable([(i, i) for i in range(20)]), seed=4)),
        lambda: data.prefetch(data.prepare((np.arange(20), np.arange(20)), 3, shuffle=True, seed=1)),
    ],
)
def test_seek_continues_the_same_sequence(build):
    def read(d, n):
        out = []
        while len(out) < n:
            try:
                out.append(np.asarray(next(d)[0]).tolist())
            except StopIteration:
                d.reset()
        return out

    full = read(build(), 30)
    first = build()
    head = read(first, 23)
    position = first.position()
    assert position["pass"] >= 1
    second = build()
    second.seek(position)
    assert head == full[:23] and read(second, 7) == full[23:]


def test_seek_rejects_bad_positions():
    with pytest.raises(ValueError, match="data.seek"):
        _pipeline().seek({"index": 2})


# -- checkpoints and resuming ------------------------------------------------------------------------


def _run(folder, crash_at=None, steps_per_call=1):
    rec = Recorder(crash_at)
    try:
        st = train.fit(
            TRAINER,
            _fresh(),
            _pipeline(),
            epochs=3,
            callbacks=[rec],
            checkpoint_dir=folder,
            checkpoint_every=4,
            keep_last=2,
            resume=True,
            steps_per_call=steps_per_call,
            progress=False,
        )
    except RuntimeError:
        return None, rec.seen
    return st, rec.seen


@pytest.mark.parametrize("steps_per_call", [1, 2])
def test_resume_continues_the_same_batches_bit_for_bit(tmp_path, steps_per_call):
    full, seen_full = _run(tmp_path / "a", steps_per_call=steps_per_call)
    assert full.step == 18 and [s for s, _ in seen_full] == list(range(1, 19))
    crashed, _ = _run(tmp_path / "b", crash_at=10, steps_per_call=steps_per_call)
    assert crashed is None
    assert train.checkpoint_steps(tmp_path / "b") == [4, 8]  # keep_last=2
    resumed, seen_after = _run(tmp_path / "b", steps_per_call=steps_per_call)
    # steps 9.. see the batches (and dropout masks) of the run that never stopped
    assert seen_after == seen_full[8:]
    for a, b in zip(kn.ptree.leaves(full.vars.params), kn.ptree.leaves(resumed.vars.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert train.checkpoint_steps(tmp_path / "b") == [16, 18]
    assert train.latest_checkpoint(tmp_path / "b").endswith("step_00000018.safetensors")
    # the files are ordinary training-state checkpoints
    loaded = train.load(train.latest_checkpoint(tmp_path / "b"), TRAINER)
    assert loaded.step == 18


def test_resume_with_a_plain_list_skips_the_batches_already_seen(tmp_path):
    batches = [(XS[i : i + 8], YS[i : i + 8]) for i in range(0, 48, 8)]
    full = train.fit(TRAINER, _fresh(), batches, epochs=2, progress=False)
    rec = Recorder(crash_at=4)
    with pytest.raises(RuntimeError):
        train.fit(
            TRAINER, _fresh(), batches, epochs=2, callbacks=[rec], checkpoint_dir=tmp_path, checkpoint_every=3
        )
    resumed = train.fit(
        TRAINER, _fresh(), batches, epochs=2, checkpoint_dir=tmp_path, resume=True, progress=False
    )
    assert resumed.step == 12
    for a, b in zip(kn.ptree.leaves(full.vars.params), kn.ptree.leaves(resumed.vars.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_save_runs_in_the_background(tmp_path, monkeypatch):
    started, release = threading.Event(), threading.Event()
    real = checkpointing.checkpoint.save

    def slow_save(path, tree, metadata=None):
        started.set()
        release.wait(10)
        return real(path, tree, metadata=metadata)

    monkeypatch.setattr(checkpointing.checkpoint, "save", slow_save)
    saver = checkpointing.Checkpointer(tmp_path, keep_last=None)
    st = _fresh()
    begin = time.perf_counter()
    path = saver.save(st, {"pass": 0, "index": 0}, 0)
    assert started.wait(10) and not os.path.exists(path)  # returned while the write waits
    assert time.perf_counter() - begin < 5
    release.set()
    saver.wait()
    assert train.load(path, TRAINER).step == st.step


def test_a_failed_background_write_is_raised(tmp_path, monkeypatch):
    def broken(path, tree, metadata=None):
        raise OSError("disk full")

    monkeypatch.setattr(checkpointing.checkpoint, "save", broken)
    saver = checkpointing.Checkpointer(tmp_path, keep_last=None)
    saver.save(_fresh(), None, 0)
    with pytest.raises(CheckpointError, match="disk full") as info:
        saver.wait()
    assert isinstance(info.value, KaunError)


def test_a_failed_run_raises_its_own_error_not_the_checkpoint_writers(tmp_path, monkeypatch):
    """The run dies (a callback raises) while a checkpoint write fails too: the run's error is the
    one raised, the checkpoint's a warning."""

    def broken(path, tree, metadata=None):
        raise OSError("disk full")

    monkeypatch.setattr(checkpointing.checkpoint, "save", broken)
    with pytest.warns(UserWarning, match="disk full"), pytest.raises(RuntimeError, match="power cut"):
        train.fit(
            TRAINER,
            _fresh(),
            _pipeline(),
            callbacks=[Recorder(crash_at=2)],
            checkpoint_dir=tmp_path,
            checkpoint_every=1,
            report_every=1,
            progress=False,
        )


def test_fit_argument_errors(tmp_path):
    st = _fresh()
    with pytest.raises(ValueError, match="checkpoint_dir"):
        train.fit(TRAINER, st, [], checkpoint_every=2)
    with pytest.raises(ValueError, match="resume=True needs checkpoint_dir"):
        train.fit(TRAINER, st, [], resume=True)
    with pytest.raises(FileNotFoundError, match="no such checkpoint"):
        train.fit(TRAINER, st, [], resume=str(tmp_path / "missing.safetensors"))
    with pytest.raises(ValueError, match="epochs"):
        train.fit(TRAINER, st, [], epochs=0)


# -- profiling ---------------------------------------------------------------------------------------


def test_fit_profiles_a_range_of_steps_with_layer_named_kernels(tmp_path, capsys):
    import gzip

    st = train.fit(TRAINER, _fresh(), _pipeline(), profile_steps=(2, 3), profile_dir=tmp_path, progress=False)
    assert st.step == 6
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].startswith("kn.profile: per step, over 2 steps (steps 2-3)")
    assert printed.splitlines()[1].split() == ["layer", "kernels", "ms", "%"]
    # the lowering's loc() became XLA's op_name metadata, and the kernels carry it
    hlo = train.step_executable(TRAINER, st, XS[:8], YS[:8]).hlo_text()
    assert 'op_name="0.linear/dot_general"' in hlo
    trace = json.load(gzip.open(tmp_path / "kaun_ir.trace.json.gz", "rt"))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    named = {e["args"]["kaun_ir.op_name"] for e in events if "kaun_ir.op_name" in e.get("args", {})}
    assert {"0.linear/dot_general", "3.linear/dot_general"} <= named
    assert any(name.startswith("optimizer/") for name in named)
    # the raw trace (TensorBoard's profiler plugin) is there too
    assert list((tmp_path / "plugins" / "profile").iterdir())
    rows = {line.split()[0] for line in printed.splitlines()[2:]}
    assert {"0.linear", "3.linear"} <= rows
    # a kernel inside a layer is named by that layer of this model; an op outside every layer (the
    # loop's own bookkeeping, e.g. stacking the logged losses) is named by itself
    assert all(row in {"0.linear", "1.relu", "2.dropout", "3.linear"} for row in rows if row[0].isdigit())


def test_profile_context_and_table():
    from kaun_ir.runtime.profiling import Profile, hlo_op_names, layer_of

    assert layer_of("2.block/0.attn/dot_general") == "2.block/0.attn" and layer_of("loss") == "loss"
    module, ops = hlo_op_names(
        'HloModule m, x\n  ROOT %dot.1 = f32[2]{0} dot(%a, %b), metadata={op_name="0.linear/dot"}\n'
    )
    assert module == "m" and ops == {"dot.1": "0.linear/dot"}
    prof = Profile("d", layers=[{"layer": "0.linear", "kernels": 2, "ms": 1.5, "percent": 100.0}])
    prof.layers[0].update(kernels_per_step=2, ms_per_step=1.5)
    assert "0.linear" in prof.table() and "1.500" in prof.table()


def test_profile_steps_errors(tmp_path):
    with pytest.raises(ValueError, match="profile_dir"):
        train.fit(TRAINER, _fresh(), [], profile_steps=(1, 2))
    with pytest.raises(ValueError, match="first <= last"):
        train.fit(TRAINER, _fresh(), [], profile_steps=(3, 2), profile_dir=tmp_path)


def test_trace_timeline_page(tmp_path):
    from kaun_ir.tools.viz import trace as timeline

    events = [
        {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "worker"}},
        {
            "ph": "X",
            "pid": 1,
            "tid": 2,
            "ts": 0.0,
            "dur": 5.0,
            "name": "0.linear/dot (f.1)",
            "args": {"hlo_op": "f.1", "kaun_ir.op_name": "0.linear/dot"},
        },
        {
            "ph": "X",
            "pid": 1,
            "tid": 2,
            "ts": 5.0,
            "dur": 5.0,
            "name": "copy.1",
            "args": {"hlo_op": "copy.1"},
        },
        {"ph": "X", "pid": 1, "tid": 2, "ts": 0.0, "dur": 99.0, "name": "$python", "args": {}},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    page = timeline.render(str(path))
    assert "2 kernels" in page and "worker" in page and "0.linear" in page and "(no layer path)" in page
    assert page.count("<rect") == 2 + 2  # two kernels, two legend entries


def test_one_profile_at_a_time(tmp_path):
    from kaun_ir.errors import ProfilerError

    with kn.profile(tmp_path / "a", print_table=False):
        with pytest.raises(ProfilerError, match="cannot start the profiler"):
            with kn.profile(tmp_path / "b", print_table=False):
                pass


def test_progress_bar_shows_lr_tokens_and_evaluation(capsys):
    vocab = 16
    ids = np.random.default_rng(0).integers(0, vocab, size=(32, 5)).astype(np.int32)
    labels = (ids[:, 0] % 2).astype(np.int32)
    lm = layer.sequential([layer.embedding(vocab, 4), layer.flatten(), layer.linear(20, 2)])
    lm_trainer = train.make(lm, optim.sgd(0.25), loss=loss.cross_entropy_sparse)
    with rng.scope(0):
        st = train.init(lm_trainer, example=ids[:8])
    pipeline = data.prepare((ids, labels), 8)
    train.fit(lm_trainer, st, pipeline, progress=True, eval_data=pipeline)
    bar = capsys.readouterr().err.split("\r")[-1]
    assert bar.startswith("[########################] 4/4  loss ")
    assert "lr 0.25" in bar and "tokens/s" in bar and "eval/loss" in bar and bar.endswith("\n")


def test_profile_trace_files_of_a_logdir_with_pattern_characters(tmp_path):
    from kaun_ir.runtime.xla import profiler

    logdir = tmp_path / "runs[exp1]"
    run = logdir / "plugins" / "profile" / "2026_01_01"
    run.mkdir(parents=True)
    (run / "host.trace.json.gz").write_bytes(b"")
    assert profiler.trace_files(str(logdir)) == [str(run / "host.trace.json.gz")]


def test_keep_last_never_removes_the_checkpoint_just_written(tmp_path):
    # a directory holding a later step of another run: pruning must not delete this run's files
    other = tmp_path / "step_00001000.safetensors"
    other.write_bytes(b"another run")
    saver = checkpointing.Checkpointer(tmp_path, keep_last=1)
    st = _fresh()
    path = saver.save(st, None, 0)
    saver.wait()
    assert os.path.exists(path) and other.exists()
    assert train.load(path, TRAINER).step == st.step
