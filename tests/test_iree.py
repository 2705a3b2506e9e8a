"""IREE as the second compiler of the lowered StableHLO: ``kn.jit(f, backend="iree")``,
``train.make(..., backend="iree")``, ``KAUN_IR_BACKEND``, the compilation cache, the ops IREE
refuses (named before compiling), differential runs (``kn.debug.diff_backends``, ``kaun-ir
diff-backends``), the op table's samples and the bench workloads' steps on IREE.

Skipped as a whole without IREE (the extra ``iree``; ``make test-interop`` installs it). NumPy
(and, for training, JAX's reference step of the bench) is the oracle; XLA is compared with only
where the test is about the two compilers agreeing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("iree.runtime", reason="IREE is not installed (the extra iree; make test-interop)")

import kaun_ir as kn  # noqa: E402
from kaun_ir import layer, optim, train  # noqa: E402
from kaun_ir.errors import BackendError, CompileError  # noqa: E402
from kaun_ir.nn import loss  # noqa: E402
from kaun_ir.runtime import diff_backends, stages  # noqa: E402
from kaun_ir.runtime.iree import compiler as iree_compiler  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _mlp(w1, w2, x):
    return kn.sum(kn.tanh(x @ w1) @ w2), kn.tanh(x @ w1)


@pytest.fixture(scope="module")
def mlp_args():
    rng = np.random.default_rng(0)
    return (
        rng.standard_normal((8, 16)).astype(np.float32) * 0.3,
        rng.standard_normal((16, 4)).astype(np.float32) * 0.3,
        rng.standard_normal((5, 8)).astype(np.float32),
    )


@pytest.fixture(scope="module")
def mlp_iree():
    return kn.jit(_mlp, backend="iree")


def test_jit_on_iree_matches_numpy(mlp_iree, mlp_args):
    w1, w2, x = mlp_args
    total, hidden = mlp_iree(*mlp_args)
    want_hidden = np.tanh(x @ w1)
    assert isinstance(total, np.ndarray)
    np.testing.assert_allclose(hidden, want_hidden, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(total, (want_hidden @ w2).sum(), rtol=1e-5)
    assert mlp_iree.executable(*mlp_args).backend == "iree-cpu"
    assert mlp_iree.trace_count == 1
    mlp_iree(*mlp_args)
    assert mlp_iree.trace_count == 1  # the second call is the cached route


def test_gradient_on_iree_matches_numpy(mlp_args):
    w1, w2, x = mlp_args
    grad = kn.jit(kn.grad(lambda w1, w2, x: kn.sum(kn.tanh(x @ w1) @ w2)), backend="iree")(*mlp_args)
    h = np.tanh(x @ w1)
    want = x.T @ ((np.ones((5, 4)) @ w2.T) * (1 - h**2))
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-6)


def test_donation_is_accepted_and_leaves_the_arguments_intact(mlp_args):
    w1, w2, x = mlp_args
    before = w1.copy()
    f = kn.jit(lambda w, x: w * 2.0 + kn.sum(x), donate_argnums=(0,), backend="iree")
    out = f(w1, x)
    np.testing.assert_allclose(out, before * 2.0 + x.sum(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(w1, before)  # IREE takes copies: nothing was consumed
    assert f.executable(w1, x).donate == ()


def test_environment_chooses_the_backend(monkeypatch, mlp_args):
    monkeypatch.setenv("KAUN_IR_BACKEND", "iree-cpu")
    f = kn.jit(lambda x: x * 3.0)
    assert f.backend == "iree-cpu"
    out = f(mlp_args[2])
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, mlp_args[2] * 3.0)
    monkeypatch.setenv("KAUN_IR_BACKEND", "cpu")  # an XLA platform: XLA
    assert kn.jit(lambda x: x).backend == "xla"


def test_bad_backend_names_and_missing_devices_are_clear_errors():
    with pytest.raises(BackendError, match="backend='tvm'.*xla, iree, iree-cpu"):
        kn.jit(lambda x: x, backend="tvm")
    with pytest.raises(BackendError, match="train.make: backend='nope'"):
        train.make(layer.linear(2, 2), optim.sgd(0.1), loss.mse, backend="nope")
    for name, driver in (("iree-cuda", "cuda"), ("iree-vulkan", "vulkan")):
        try:
            import iree.runtime as ireert

            if ireert.get_driver(driver).query_available_devices():
                continue  # this machine has one: nothing to refuse
        except Exception:
            pass
        with pytest.raises(BackendError, match=f"backend='{name}'"):
            kn.jit(lambda x: x + 1.0, backend=name)(np.ones(3, np.float32))


def test_refused_ops_are_named_before_compiling():
    from optest import single_op_graph

    from kaun_ir import ops

    opdef = ops.TABLE["triangular_solve"]
    graph = single_op_graph(opdef, next(iter(opdef.samples(np.random.default_rng(0)))))
    with pytest.raises(BackendError, match=r"backend='iree-cpu'.*triangular_solve.*use backend='xla'"):
        kn.runtime.compile(graph, backend="iree")
    with pytest.raises(BackendError, match=r"sine .*float64"):
        kn.jit(kn.sin, backend="iree")(np.ones(3, np.float64))
    np.testing.assert_allclose(kn.jit(kn.sin, backend="iree")(np.ones(3, np.float32)), np.sin(np.ones(3)))
    mesh = kn.sharding.mesh((1,), ("data",))
    with pytest.raises(BackendError, match="sharded programs run on XLA only"):
        kn.runtime.compile(kn.trace(lambda x: x * 2.0, np.ones(2, np.float32)), mesh=mesh, backend="iree")


def test_compile_errors_name_the_backend_and_a_repro(monkeypatch, tmp_path):
    monkeypatch.setenv("KAUN_IR_REPRO_DIR", str(tmp_path))
    with pytest.raises(CompileError, match=r"IREE \(iree-cpu\) could not compile.*written to"):
        iree_compiler.compile_program("module { this is not stablehlo }", "iree-cpu")
    assert [p.name for p in tmp_path.iterdir()][0].startswith("iree-")


def test_the_disk_cache_serves_iree_programs_by_version_and_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("KAUN_IR_CACHE_DIR", str(tmp_path / "cache"))
    text = kn.jit(lambda x: x * 5.0 + 1.0).lower(np.ones(7, np.float32))

    def compile_stage():
        iree_compiler._PROGRAMS.clear()  # as a new process: only the disk cache can answer
        with stages.record() as rec:
            program = iree_compiler.compile_program(text, "iree-cpu")
        return [name for name, _, _ in rec.stages], program

    assert compile_stage()[0] == ["iree-compile"]
    names, program = compile_stage()
    assert names == ["iree-load"]
    np.testing.assert_allclose(program([np.arange(7, dtype=np.float32)])[0], np.arange(7) * 5.0 + 1.0)
    monkeypatch.setenv(iree_compiler.FLAGS_ENV, "--iree-opt-level=O1")  # other flags: another key
    assert compile_stage()[0] == ["iree-compile"]


def test_train_step_of_a_small_transformer_matches_xla():
    from kaun_ir.tools.examples import transformer_train_step

    setup = transformer_train_step(1)
    ids = np.random.default_rng(1).integers(0, 256, (4, 16)).astype(np.int32)
    losses = {}
    for backend in ("xla", "iree"):
        trainer = train.make(setup.model, setup.optimizer, loss.cross_entropy_sparse, backend=backend)
        with kn.rng.scope(0):
            st = train.init(trainer, example=ids)
        losses[backend] = []
        for _ in range(3):
            value, st = train.step(trainer, st, ids, ids)
            losses[backend].append(float(np.asarray(value)))
    assert losses["iree"][-1] < losses["iree"][0]  # it trains
    np.testing.assert_allclose(losses["iree"], losses["xla"], rtol=1e-4)


def test_diff_backends_compares_and_names_the_first_divergence(monkeypatch, mlp_args):
    report = kn.debug.diff_backends(_mlp, *mlp_args)
    assert report.ok and report.backends == ("xla", "iree-cpu") and len(report.outputs) == 2
    assert all(o.max_abs < 1e-4 for o in report.outputs)
    assert "output 1" in report.table()
    # make IREE's tanh wrong by 1e-2: the report must name that op, not the products after it
    real_run = diff_backends._run

    def skewed(graph, backend, inputs):
        outs = real_run(graph, backend, inputs)
        if backend != "iree-cpu":
            return outs
        tanh = {id(v) for node in graph.nodes if node.op == "tanh" for v in node.outputs}
        return [o + 1e-2 if id(v) in tanh else o for o, v in zip(outs, graph.outputs)]

    monkeypatch.setattr(diff_backends, "_run", skewed)
    report = kn.debug.diff_backends(_mlp, *mlp_args)
    assert not report.ok and not report.outputs[1].ok
    assert report.first_divergence.name.startswith("tanh (in the forward pass)")
    np.testing.assert_allclose(report.first_divergence.max_abs, 1e-2, rtol=1e-3)
    assert "first divergence: tanh" in report.table()


def test_cli_diff_backends_on_a_transformer_step(capsys):
    from kaun_ir.tools.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["diff-backends", "--help"])
    assert exit_info.value.code == 0 and "SPEC" in capsys.readouterr().out
    rc = main(["diff-backends", "kaun_ir.tools.examples:transformer_train_step", "--rtol", "1e-3"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "xla vs iree-cpu" in out and "output 0   scalar" in out
    assert (
        main(["diff-backends", "kaun_ir.tools.examples:mlp", "--input", "f32[4,784]", "--backends", "x"]) == 1
    )
    assert "give two backends" in capsys.readouterr().err


def test_opt_reports_run_time_on_both_backends(capsys, tmp_path):
    from kaun_ir.tools.cli import main

    path = tmp_path / "f.kir"
    path.write_text(kn.trace(lambda x: kn.exp(x) * 1.0 + 0.0, np.ones((4, 4), np.float32)).text())
    rc = main(
        ["opt", str(path), "-p", "canonicalize,dce", "--backend", "xla", "--backend", "iree", "--time", "2"]
    )
    captured = capsys.readouterr()
    assert rc == 0 and "exp" in captured.out
    assert "xla " in captured.err and "iree-cpu " in captured.err and "change" in captured.err


@pytest.mark.interop
def test_op_table_samples_on_iree():
    """Every op-table sample through IREE (in a child process: a crash inside IREE's runtime
    fails this test instead of the run), checked against the op's NumPy reference with the op
    table's tolerances; the refused ones raise BackendError naming the op."""
    from kaun_ir import ops
    from kaun_ir.runtime.iree.executable import REFUSED_F64_ON_CPU, REFUSED_OPS

    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "iree_ops_worker.py")],
        capture_output=True,
        text=True,
        cwd=HERE,
        timeout=900,
        env={**os.environ, "PYTHONPATH": HERE},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["failures"] == {}
    refused_ops = {case.rsplit("-", 1)[0] for case in result["refused"]}
    assert refused_ops <= set(REFUSED_OPS) | set(REFUSED_F64_ON_CPU) | {"scan"}  # scan: tanh f64 inside
    assert result["checked"] > 0.85 * sum(
        len(list(d.samples(np.random.default_rng(0)))) for d in ops.TABLE.values()
    )


@pytest.mark.interop
@pytest.mark.parametrize(
    "name", ["mlp_small", "mlp", "cnn", "resnet", "transformer", "lstm", "transformer12"]
)
def test_bench_workloads_train_on_iree(name):
    from kaun_ir.tools.bench import measure
    from kaun_ir.tools.bench.workloads import WORKLOADS

    assert name in WORKLOADS
    result = measure.bench_workload(name, steps=3, rounds=0, small=True, variants=("iree",))
    losses = {impl: entry["loss_after_steps"] for impl, entry in result["implementations"].items()}
    np.testing.assert_allclose(losses["kaun_ir[iree]"], losses["jax"], rtol=measure.FUSED_LOSS_RTOL)


def test_runtime_compile_on_iree_checks_its_arguments():
    graph = kn.trace(
        lambda x, n: x * 2.0 + kn.astype(n, kn.float32), np.ones(3, np.float32), np.ones(3, np.int32)
    )
    exe = kn.runtime.compile(graph, backend="iree")
    (out,) = exe(np.arange(3, dtype=np.float32), np.array([1, 2, 3], np.int32))
    np.testing.assert_array_equal(out, [1.0, 4.0, 7.0])
    with pytest.raises(TypeError, match="argument 1: expected i32"):
        exe(np.ones(3, np.float32), np.ones(3, np.float32))  # never a silent f32 -> i32
    with pytest.raises(TypeError, match="takes 2 argument"):
        exe(np.ones(3, np.float32))


def test_compare_counts_nans_and_infinities_where_both_have_them():
    a = np.array([1.0, np.nan, np.inf, 2.0], np.float32)
    same = diff_backends.compare("x", a, a.copy(), 1e-6, 0.0)
    assert same.ok and same.max_abs == 0.0
    moved = diff_backends.compare("x", a, np.array([1.0, 0.0, np.inf, 2.5], np.float32), 1e-6, 0.0)
    assert not moved.ok and moved.max_abs == 0.5 and moved.max_rel == 0.25
    ints = diff_backends.compare("i", np.array([1, 2]), np.array([1, 3]), 1.0, 1.0)
    assert not ints.ok  # integers compare exactly, whatever the tolerance


def test_out_of_bounds_scatter_indices_are_skipped_as_on_xla():
    """IREE writes an update whose window does not fit outside the buffer; the guard sends it to
    padding that is sliced away, so the result is the op's reference (which skips it)."""
    from optest import samples_of, single_op_graph

    from kaun_ir import ops
    from kaun_ir.ir import interpret

    for name, index in (("scatter_add", 0), ("scatter", 1)):
        sample = next(s for n, i, s in samples_of({name: ops.TABLE[name]}) if i == index)
        assert (np.asarray(sample.inputs[1]) < 0).any() or (np.asarray(sample.inputs[1]) >= 5).any()
        graph = single_op_graph(ops.TABLE[name], sample)
        (got,) = kn.runtime.compile(graph, backend="iree")(*sample.inputs)
        np.testing.assert_allclose(got, interpret(graph, *sample.inputs)[0], rtol=1e-6)
