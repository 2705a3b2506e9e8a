"""Compilation stages: ``kaun_ir.runtime.stages`` records trace, every pass, lowering and XLA
compilation of the compilations inside its block (and nothing outside one), and
``kaun-ir bench --compile`` reports them against JAX's first step. No timing assertions."""

from __future__ import annotations

import json

import numpy as np

import kaun_ir as kn
from kaun_ir.runtime import stages
from kaun_ir.tools.cli import main


def test_record_sees_every_stage_of_a_compilation_and_only_inside_the_block():
    f = kn.jit(kn.grad(lambda w, x: kn.tanh(x @ w).sum()), pipeline="canonicalize,cse,dce")
    w, x = np.ones((3, 4), np.float32), np.ones((2, 3), np.float32)
    assert stages.current() is None
    with stages.record() as outer:
        f(w, x)
        with stages.record() as inner:
            kn.jit(lambda v: v * 2.0, pipeline="dce")(x)
    names = [name for name, _, _ in outer.stages]
    assert names[:6] == [
        "trace",
        "pass:canonicalize (#1)",
        "pass:cse (#2)",
        "pass:dce (#3)",
        "lower",
        "xla-compile",
    ]
    assert [n for n, _, _ in inner.stages] == ["trace", "pass:dce (#1)", "lower", "xla-compile"]
    assert outer.stages[6:] == inner.stages  # the inner block's stages are the outer's too
    traced = outer.stages[0][2]
    assert traced == len(kn.trace(kn.grad(lambda w, x: kn.tanh(x @ w).sum()), w, x).nodes)
    assert all(seconds >= 0 for _, seconds, _ in outer.stages)
    assert outer.total() == sum(s for _, s, _ in outer.stages)
    assert set(outer.by_name()) == set(names)
    with stages.record() as again:
        f(w, x)  # cached: no compilation, nothing recorded
    assert again.stages == [] and stages.current() is None


def test_bench_compile_reports_both_sides(capsys):
    assert main(["bench", "--compile", "-w", "mlp_small", "--small", "--layers", "", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["failed"] == []
    (row,) = report["rows"]
    ours = row["kaun_ir"]
    assert row["case"] == "mlp_small" and {"trace", "passes", "lower", "xla-compile"} <= set(row["seconds"])
    assert 0 < ours["nodes_optimised"] <= ours["nodes_traced"]
    assert ours["stablehlo_ops"] > 0 and row["jax"]["stablehlo_ops"] > 0
    assert row["ratio_vs_jax"] == ours["first_step_s"] / row["jax"]["first_step_s"]
    assert ours["first_step_cpu_s"] > 0 and row["jax"]["first_step_cpu_s"] > 0
    assert row["cpu_ratio_vs_jax"] == ours["first_step_cpu_s"] / row["jax"]["first_step_cpu_s"]
    assert main(["bench", "--compile", "--layers", "2,x"]) == 2
