"""StableHLO import: programs JAX writes are imported, run through the default pipeline, lowered,
compiled and executed, and must equal what JAX itself computes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import kaun_ir as kn
from kaun_ir.errors import StableHLOImportError
from kaun_ir.tools.bench import reference as bench_reference
from kaun_ir.tools.bench import workloads as bench_workloads


def _run_imported(module, args):
    graph = kn.ir.from_stablehlo(module)
    graph.verify()
    optimized = kn.passes.run(graph, kn.runtime.pipelines.default_jit_pipeline())
    leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
    return graph, kn.runtime.compile(optimized)(*leaves)


def _check(fn, *args, rtol=1e-5, atol=1e-6):
    jitted = jax.jit(fn)
    graph, got = _run_imported(jitted.lower(*args).as_text(), args)
    expected = jax.tree_util.tree_leaves(jitted(*args))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert np.asarray(g).dtype == np.asarray(e).dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=rtol, atol=atol)
    return graph


def test_mlp_train_step_with_optax_adam():
    opt = optax.adam(1e-2)

    def loss(p, x, y):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        return optax.softmax_cross_entropy_with_integer_labels(h @ p["w2"] + p["b2"], y).mean()

    def step(p, s, x, y):
        value, grads = jax.value_and_grad(loss)(p, x, y)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, value

    r = np.random.default_rng(0)
    p = {
        "w1": r.standard_normal((8, 16), np.float32),
        "b1": np.zeros(16, np.float32),
        "w2": r.standard_normal((16, 4), np.float32),
        "b2": np.zeros(4, np.float32),
    }
    state = jax.tree_util.tree_map(np.asarray, opt.init(p))
    graph = _check(
        step, p, state, r.standard_normal((6, 8), np.float32), np.array([0, 3, 1, 2, 3, 0], np.int32)
    )
    counts = graph.op_counts()
    assert counts.get("dot_general", 0) >= 4 and "while" not in counts


# XLA needs tens of seconds to compile these steps (for JAX and for us alike), so they run in
# `make test-interop` (KAUN_IR_LONG_TESTS=1) rather than in the quick suite.
_LONG = pytest.mark.long


@_LONG
@pytest.mark.parametrize("name", ["transformer", "cnn"])
def test_bench_train_steps(name):
    workload = bench_workloads.WORKLOADS[name]
    cfg = workload.small
    with kn.rng.scope(0):
        structure = kn.layer.params(kn.layer.init(workload.kaun_model(cfg)))
    params = bench_workloads.initial_params(structure, seed=1)
    x, y = workload.batch(cfg, 2)

    def loss_of(p, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(workload.jax_forward(p, x, cfg), y).mean()

    graph = _check(jax.value_and_grad(loss_of), params, x, y, rtol=2e-4, atol=1e-6)
    step, opt = bench_reference.make_jax_step(workload, cfg)
    state = jax.tree_util.tree_map(np.asarray, opt.init(params))
    # Some gradients are exactly zero in exact arithmetic (attention's key bias: softmax ignores
    # a constant shift), so both sides hold rounding noise there, which Adam scales up to about
    # +-lr; the gradients themselves are compared tightly above.
    _check(step.__wrapped__, params, state, x, y, rtol=2e-4, atol=2.5 * workload.optimizer[1])
    if name == "cnn":
        assert {"reduce_window", "select_and_scatter_add", "convolution"} <= set(graph.op_counts())


def test_cnn_gradient():
    def loss(w, x):
        h = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        h = jax.lax.reduce_window(jax.nn.relu(h), -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
        return jnp.mean(h * h)

    r = np.random.default_rng(0)
    graph = _check(
        jax.value_and_grad(loss),
        r.standard_normal((3, 2, 3, 3), np.float32),
        r.standard_normal((2, 2, 6, 6), np.float32),
        rtol=1e-4,
        atol=1e-6,
    )
    assert {"reduce_window", "select_and_scatter_add", "convolution"} <= set(graph.op_counts())


def test_jax_random():
    def sample(key):
        k1, k2 = jax.random.split(key)
        return (
            jax.random.uniform(k1, (3,)),
            jax.random.normal(k2, (2, 2)),
            jax.random.bernoulli(k1, 0.3, (4,)),
            jax.random.randint(k2, (5,), 0, 10),
        )

    graph = _check(sample, np.asarray(jax.random.PRNGKey(3)))
    assert "while" in graph.op_counts()


def test_argmax_gather_scatter_and_is_finite():
    def f(x, idx):
        y = x.at[idx].set(x[idx] * 2.0).at[idx[:1]].max(5.0)
        ok = jnp.isfinite(jnp.log(x))
        return jnp.argmax(y, axis=1), jnp.argmin(x, axis=0), ok, jnp.take_along_axis(x, idx[:, None] % 3, 1)

    x = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    graph = _check(f, x, np.array([2, 0, 3, 1], np.int32))
    assert {"argmax", "argmin", "is_finite", "scatter"} <= set(graph.op_counts())


def test_batched_gather_from_vmap():
    graph = _check(
        jax.vmap(lambda row, i: row[i]),
        np.arange(12.0, dtype=np.float32).reshape(3, 4),
        np.array([3, 0, 2], np.int32),
    )
    assert "gather" in graph.op_counts()


def test_locations_become_layer_paths():
    def f(x):
        with jax.named_scope("encoder"):
            return jnp.tanh(x) * 2.0

    graph = kn.ir.from_stablehlo(jax.jit(f).lower(np.ones(3, np.float32)).as_text(debug_info=True))
    tanh = [n for n in graph.nodes if n.op == "tanh"][0]
    assert "encoder" in tanh.path.split(".")
    assert "encoder/" in tanh.location


def test_round_trip_of_our_own_lowering_keeps_paths(tmp_path):
    model = kn.layer.sequential([kn.layer.linear(3, 4), kn.layer.gelu()])
    with kn.rng.scope(0):
        variables = kn.layer.init(model)
    graph = kn.trace(
        lambda p, x: kn.layer.apply(model, kn.layer.with_params(variables, p), x)[0],
        kn.layer.params(variables),
        kn.ShapeDtype((2, 3), kn.float32),
    )
    path = str(tmp_path / "m.mlirbc")
    kn.runtime.export(graph, path)
    imported = kn.ir.from_stablehlo(open(path, "rb").read())
    assert any(n.path.startswith("0.linear") for n in imported.nodes if n.op == "dot_general")
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves(kn.layer.params(variables))]
    want = kn.runtime.compile(graph)(*leaves, x)
    got = kn.runtime.compile(imported)(*leaves, x)
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), rtol=1e-6, atol=1e-6)


def test_composite_is_inlined():
    @jax.jit
    def f(x):
        return jax.lax.composite(lambda v: jnp.exp(v) + 1.0, name="my.op")(x)

    x = np.linspace(-1, 1, 5, dtype=np.float32)
    text = f.lower(x).as_text()
    assert "stablehlo.composite" in text
    _, got = _run_imported(text, (x,))
    np.testing.assert_allclose(np.asarray(got[0]), np.exp(x) + 1.0, rtol=1e-6)


def test_unsupported_op_is_named_with_its_location():
    text = jax.jit(lambda x: jnp.fft.rfft(x)).lower(np.ones(4, np.float32)).as_text(debug_info=True)
    with pytest.raises(StableHLOImportError, match=r"stablehlo\.fft at .*fft"):
        kn.ir.from_stablehlo(text)


def test_bad_input():
    with pytest.raises(ValueError, match="does not parse"):
        kn.ir.from_stablehlo("module { this is not mlir }")
    with pytest.raises(TypeError):
        kn.ir.from_stablehlo(3)


def test_command_line_import_and_tools_read_mlir(tmp_path, capsys):
    from kaun_ir.tools.cli import main

    text = (
        jax.jit(lambda x: jnp.tanh(x) * 2.0 + 1.0).lower(np.ones((2, 3), np.float32)).as_text(debug_info=True)
    )
    mlir = tmp_path / "f.mlir"
    mlir.write_text(text)
    out = tmp_path / "f.kir"
    assert main(["import", str(mlir), "-o", str(out)]) == 0
    graph = kn.ir.parse(out.read_text())
    assert graph.op_counts()["tanh"] == 1
    assert main(["opt", str(mlir), "-p", "cse,dce"]) == 0
    assert "tanh" in capsys.readouterr().out
    kn.runtime.export(graph, str(tmp_path / "f.mlirbc"))
    assert main(["dump", str(tmp_path / "f.mlirbc")]) == 0
    assert "tanh" in capsys.readouterr().out
    bad = tmp_path / "bad.mlir"
    bad.write_text(jax.jit(jnp.fft.rfft).lower(np.ones(4, np.float32)).as_text())
    assert main(["import", str(bad), "-o", str(tmp_path / "bad.kir")]) == 1
    assert "stablehlo.fft" in capsys.readouterr().err
    assert not (tmp_path / "bad.kir").exists()
