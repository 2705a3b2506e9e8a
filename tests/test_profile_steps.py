"""``kn.profile`` and ``train.fit(profile_steps=)`` cover exactly the steps asked: work queued
before the window stays out, the window's last step is not cut off, and the table says how many
steps its per-step figures cover. Kernel *counts* are compared (never times)."""

from __future__ import annotations

import collections
import gzip
import json

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import data, layer, loss, optim, rng, train

RS = np.random.default_rng(2)
XS = RS.normal(size=(64, 8)).astype(np.float32)
YS = (XS[:, 0] > 0).astype(np.int32)
MODEL = layer.sequential([layer.linear(8, 16), layer.relu(), layer.linear(16, 2)])
TRAINER = train.make(MODEL, optim.adam(1e-2), loss=loss.cross_entropy_sparse)


def _fresh():
    with rng.scope(0):
        return train.init(TRAINER)


def _executions(logdir) -> dict:
    """``{(module, run_id): kernel events}`` read straight from the raw trace jaxlib wrote."""
    raw = sorted((logdir / "plugins" / "profile").glob("*/*.trace.json.gz"))[-1]
    events = json.load(gzip.open(raw, "rt"))["traceEvents"]
    counts = collections.Counter()
    for event in events:
        args = event.get("args") or {}
        if event.get("ph") == "X" and "hlo_op" in args:
            counts[(args.get("hlo_module"), args.get("run_id"))] += 1
    return dict(counts)


def _fit_profile(logdir, capsys):
    pipeline = data.prepare((XS, YS), 8)  # 8 steps; steps 1-2 are queued when the window opens
    train.fit(TRAINER, _fresh(), pipeline, profile_steps=(3, 5), profile_dir=logdir, progress=False)
    return capsys.readouterr().out.splitlines()


def test_fit_profile_holds_the_asked_steps_and_repeats(tmp_path, capsys):
    first = _fit_profile(tmp_path / "a", capsys)
    second = _fit_profile(tmp_path / "b", capsys)
    runs_a, runs_b = _executions(tmp_path / "a"), _executions(tmp_path / "b")
    # three executions of the step, each whole (the same kernel count), in both runs
    assert len(runs_a) == len(runs_b) == 3
    assert len(set(runs_a.values()) | set(runs_b.values())) == 1
    assert first[0].startswith("kn.profile: per step, over 3 steps (steps 3-5)")
    # the table is per step and the same in both runs (kernel counts; times differ)
    per_step = next(iter(runs_a.values()))

    def counts(lines):
        return {line.split()[0]: int(line.split()[-3]) for line in lines[2:]}

    assert counts(first) == counts(second)
    assert sum(counts(first).values()) == per_step


def test_profile_leaves_out_work_queued_before_it(tmp_path):
    st = _fresh()
    for _ in range(3):
        _, st = train.step(TRAINER, st, XS[:8], YS[:8])  # dispatched, not waited for
    totals = []
    for name in ("a", "b"):
        with kn.profile(tmp_path / name, print_table=False) as prof:
            _, st = train.step(TRAINER, st, XS[:8], YS[:8])  # not read: the profile waits for it
        runs = _executions(tmp_path / name)
        assert len(runs) == 1 and prof.steps == 1
        assert list(prof.executions.values()) == [1]
        totals.append(sum(row["kernels"] for row in prof.layers))
        assert totals[-1] == next(iter(runs.values()))
    assert totals[0] == totals[1]


def test_profile_steps_argument_divides_the_table(tmp_path):
    st = _fresh()
    _, st = train.step(TRAINER, st, XS[:8], YS[:8])
    with kn.profile(tmp_path, print_table=False, steps=2) as prof:
        for _ in range(2):
            _, st = train.step(TRAINER, st, XS[:8], YS[:8])
    for row in prof.layers:
        assert row["kernels_per_step"] == row["kernels"] / 2
    assert "over 2 steps" in prof.table()
    with pytest.raises(ValueError, match="steps must be a positive int"):
        with kn.profile(tmp_path, steps=0):
            pass
