"""``kn.jit`` and the runtime: caching, static arguments, donation, lowering with locations,
export, compile failures, eager calls, devices and backend selection. NumPy is the oracle."""

from __future__ import annotations

import os
import re

import jax
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import runtime
from kaun_ir.runtime import executable
from kaun_ir.runtime.xla import backend, compiler, mlir, transfer

F32 = np.float32


def rand(*shape, dtype=F32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ------------------------------------------------------------------------ trees of arrays


def test_jit_nested_dict_list_tuple_inputs_and_outputs():
    def f(params, batch):
        hidden = batch[0] * params["dense"]["w"] + params["dense"]["b"]
        return {
            "out": [hidden, (kn.tanh(hidden), batch[1] + 1.0)],
            "nothing": None,
            "w": params["dense"]["w"],
        }

    params = {"dense": {"w": rand(3, seed=1), "b": rand(3, seed=2)}}
    batch = (rand(2, 3, seed=3), rand(4, seed=4))
    result = kn.jit(f)(params, batch)
    hidden = batch[0] * params["dense"]["w"] + params["dense"]["b"]
    assert set(result) == {"out", "nothing", "w"} and result["nothing"] is None
    assert isinstance(result["out"], list) and isinstance(result["out"][1], tuple)
    np.testing.assert_allclose(result["out"][0], hidden, rtol=1e-6)
    np.testing.assert_allclose(result["out"][1][0], np.tanh(hidden), rtol=1e-6)
    np.testing.assert_allclose(result["out"][1][1], batch[1] + 1.0, rtol=1e-6)
    np.testing.assert_array_equal(result["w"], params["dense"]["w"])
    assert isinstance(result["w"], jax.Array)


def test_jit_keyword_arguments():
    f = kn.jit(lambda x, *, scale, shift=None: x * scale + (0.0 if shift is None else shift))
    x = rand(3)
    np.testing.assert_allclose(f(x, scale=np.float32(2.0)), x * 2, rtol=1e-6)
    np.testing.assert_allclose(f(x, scale=np.float32(2.0), shift=x), x * 3, rtol=1e-6)
    assert f.trace_count == 2


# ------------------------------------------------------------------------ caching


def test_second_call_neither_retraces_nor_recompiles():
    f = kn.jit(lambda x, y: kn.exp(x) * y - 0.125)
    x, y = rand(7, 13, seed=5), rand(7, 13, seed=6)
    compiles = runtime.stats.compiles
    first = f(x, y)
    assert f.trace_count == 1
    assert runtime.stats.compiles == compiles + 1
    second = f(x, y)
    third = f(jax.device_put(x), jax.device_put(y))  # the same signature from device arrays
    assert f.trace_count == 1
    assert runtime.stats.compiles == compiles + 1
    for got in (first, second, third):
        np.testing.assert_allclose(got, np.exp(x) * y - 0.125, rtol=1e-5, atol=1e-6)


def test_new_shape_or_dtype_retraces():
    f = kn.jit(lambda x: x * 2)
    f(np.ones(3, F32))
    f(np.ones(4, F32))
    assert f.trace_count == 2
    f(np.ones(4, np.float16))
    assert f.trace_count == 3
    f(np.ones((4, 1), F32))
    assert f.trace_count == 4
    f(np.ones(3, F32)), f(np.ones(4, np.float16))  # every signature seen before is cached
    assert f.trace_count == 4
    g = kn.jit(lambda tree: tree["a"] * 2)
    g({"a": np.ones(2, F32)}), g({"a": np.ones(2, F32), "b": None}), g({"a": np.ones(2, F32)})
    assert g.trace_count == 2  # a new tree structure is a new signature


def test_python_scalars_are_static():
    f = kn.jit(lambda x, n, mode: x * n if mode == "scale" else x + n)
    x = np.arange(3, dtype=F32)
    np.testing.assert_array_equal(f(x, 2, "scale"), x * 2)
    np.testing.assert_array_equal(f(x, 2, "scale"), x * 2)
    assert f.trace_count == 1
    np.testing.assert_array_equal(f(x, 3, "scale"), x * 3)
    np.testing.assert_array_equal(f(x, 3, "shift"), x + 3)
    assert f.trace_count == 3
    f(x, 3.0, "shift"), f(x, True, "shift")  # equal values of other types are other signatures
    assert f.trace_count == 5
    graph = f.graph(x, 4, "scale")
    assert len(graph.inputs) == 1  # the scalar is baked in as a constant
    assert "4.0" in graph.text()
    assert len(kn.trace(lambda x, n: x * n, x, 2.5).inputs) == 1


def test_static_signed_zeros_are_two_signatures():
    """0.0 == -0.0 and both hash alike, but 1 / s tells them apart: a cache keyed by the value
    alone would run the -0.0 call with the 0.0 program."""
    f = kn.jit(lambda x, s: x / s)
    x = np.ones(2, F32)
    np.testing.assert_array_equal(f(x, 0.0), np.array([np.inf, np.inf], F32))
    np.testing.assert_array_equal(f(x, -0.0), np.array([-np.inf, -np.inf], F32))
    assert f.trace_count == 2
    np.testing.assert_array_equal(f(x, 0.0), np.array([np.inf, np.inf], F32))
    assert f.trace_count == 2


def test_numpy_scalars_are_inputs_not_static():
    f = kn.jit(lambda x, n: x * n)
    x = np.arange(3, dtype=F32)
    np.testing.assert_array_equal(f(x, np.float32(2)), x * 2)
    np.testing.assert_array_equal(f(x, np.float32(5)), x * 5)
    assert f.trace_count == 1
    assert len(f.graph(x, np.float32(5)).inputs) == 2


def test_jitted_function_inside_a_trace_is_inlined():
    inner = kn.jit(lambda x: kn.exp(x) + 1.0)
    graph = kn.trace(lambda x: inner(x) * 2.0, np.ones(3, F32))
    assert inner.trace_count == 0
    assert graph.op_counts()["exponential"] == 1


# ------------------------------------------------------------------------ donation


def test_donated_argument_is_deleted_and_aliased():
    def update(param, grad):
        return param - 0.5 * grad

    step = kn.jit(update, donate_argnums=(0,))
    param, grad = jax.device_put(np.ones(5, F32)), jax.device_put(np.full(5, 2.0, F32))
    new = step(param, grad)
    np.testing.assert_array_equal(new, np.zeros(5, F32))
    assert param.is_deleted()
    assert not grad.is_deleted()
    mlir = step.lower(np.ones(5, F32), np.ones(5, F32))
    assert re.search(r"%arg0: tensor<5xf32> \{tf.aliasing_output = 0 : i32\}", mlir)
    assert "%arg1: tensor<5xf32>," in mlir or "%arg1: tensor<5xf32>)" in mlir
    # numpy inputs are copied to the device first, so donating them is harmless to the caller
    host = np.ones(5, F32)
    step(host, np.ones(5, F32))
    np.testing.assert_array_equal(host, np.ones(5, F32))


def test_donation_of_a_tree_argument():
    step = kn.jit(lambda state, x: {"w": state["w"] + x, "n": state["n"] + 1}, donate_argnums=(0,))
    state = {"n": jax.device_put(np.int32(0)), "w": jax.device_put(np.zeros(3, F32))}
    new = step(state, np.ones(3, F32))
    assert state["w"].is_deleted() and state["n"].is_deleted()
    np.testing.assert_array_equal(new["w"], np.ones(3, F32))
    assert int(new["n"]) == 1


def test_donated_input_without_a_matching_output_is_not_aliased():
    step = kn.jit(lambda x: x[:2], donate_argnums=(0,))
    mlir = step.lower(np.ones(5, F32))
    assert "tf.aliasing_output" not in mlir
    np.testing.assert_array_equal(step(np.ones(5, F32)), np.ones(2, F32))


# ------------------------------------------------------------------------ lowering


def linear(x, w, b):
    with kn.ir.scope("1.linear"):
        return x * w + b


def test_lowered_module_parses_and_carries_layer_path_locations():
    x = rand(2, 3)
    graph = kn.trace(linear, x, rand(3), rand(3))
    mlir = runtime.lower(graph)
    pretty = runtime.parse_mlir(mlir)
    assert "stablehlo.multiply" in pretty and "stablehlo.add" in pretty
    assert 'loc("1.linear/multiply")' in mlir
    assert 'loc("1.linear/add")' in mlir
    assert 'loc("1.linear/broadcast_in_dim")' in mlir
    assert mlir.startswith("module @linear ")
    signature = "func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<3xf32>, %arg2: tensor<3xf32>)"
    assert signature in mlir


def test_parse_mlir_rejects_bad_text():
    with pytest.raises(ValueError, match="does not parse"):
        runtime.parse_mlir("module { this is not mlir }")


def test_compile_and_run_a_graph_directly():
    x, w, b = rand(2, 3), rand(3, seed=1), rand(3, seed=2)
    exe = runtime.compile(kn.trace(linear, x, w, b))
    (out,) = exe(x, w, b)
    np.testing.assert_allclose(out, x * w + b, rtol=1e-6)
    assert "multiply" in exe.hlo_text()
    with pytest.raises(TypeError, match="takes 3 argument"):
        exe(x, w)
    with pytest.raises(TypeError, match=r"argument 1: expected shape \(3,\)"):
        exe(x, np.ones(4, F32), b)


# ------------------------------------------------------------------------ export


def test_export_mlir_text_and_portable_bytecode(tmp_path):
    x = np.linspace(-1, 1, 6, dtype=F32).reshape(2, 3)
    graph = kn.trace(lambda v: kn.exp(v) * 2.0 - v, x)
    expected = np.exp(x) * 2.0 - x

    text_path = runtime.export(graph, str(tmp_path / "model.mlir"))
    assert open(text_path).read() == runtime.lower(graph)

    bc_path = runtime.export(graph, str(tmp_path / "model.mlirbc"))
    data = open(bc_path, "rb").read()
    assert data.startswith(b"ML\xefR")  # MLIR bytecode magic
    module = mlir.deserialize_portable(data)
    device = backend.default_device()
    loaded = compiler.compile(module, device)
    (out,) = compiler.execute(loaded, [transfer.to_device(x, np.dtype(F32), device)])
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6)
    (direct,) = runtime.compile(graph)(x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(direct))
    assert sorted(os.listdir(tmp_path)) == ["model.mlir", "model.mlirbc"]  # no temporary files left


def test_export_rejects_other_extensions(tmp_path):
    graph = kn.trace(lambda v: -v, np.ones(2, F32))
    with pytest.raises(ValueError, match=r"\.mlir or \.mlirbc"):
        runtime.export(graph, str(tmp_path / "model.txt"))


# ------------------------------------------------------------------------ compile failures


@pytest.mark.parametrize("breakage", ["unknown op", "return type"])
def test_module_that_xla_rejects_raises_compile_error_with_repro(tmp_path, monkeypatch, breakage):
    monkeypatch.setenv("KAUN_IR_REPRO_DIR", str(tmp_path))
    good = runtime.lower(kn.trace(lambda v: kn.exp(v), np.ones(3, F32)))
    if breakage == "unknown op":
        bad = good.replace("stablehlo.exponential", "stablehlo.exponentiall")
    else:
        bad = good.replace("-> (tensor<3xf32>)", "-> (tensor<4xf32>)")
    assert bad != good
    compiles = runtime.stats.compiles
    with pytest.raises(kn.CompileError) as info:
        executable.compile_mlir(bad, backend.default_device(), "cse,dce")
    message = str(info.value)
    match = re.search(r"StableHLO written to (\S+\.mlir)$", message)
    assert match, message
    path = match.group(1)
    assert os.path.dirname(path) == str(tmp_path)
    repro = open(path).read()
    assert repro.endswith(bad)
    assert "// pipeline: cse,dce" in repro
    assert runtime.stats.compiles == compiles


# ------------------------------------------------------------------------ eager calls


def test_eager_functions_on_numpy_inputs():
    x = np.linspace(-2, 2, 12, dtype=F32).reshape(3, 4)
    y = kn.exp(x)
    assert isinstance(y, jax.Array) and y.dtype == F32
    np.testing.assert_allclose(y, np.exp(x), rtol=1e-6)
    np.testing.assert_array_equal(kn.where(x > 0, x, -1.0), np.where(x > 0, x, F32(-1.0)))
    np.testing.assert_array_equal(kn.where(x > 0, 1, 0), np.where(x > 0, 1, 0).astype(np.int32))
    np.testing.assert_allclose(kn.tanh(kn.exp(x)), np.tanh(np.exp(x)), rtol=1e-6)  # jax.Array input


@pytest.mark.parametrize(
    "args,kwargs",
    [
        ((5,), {}),
        ((2, 9), {}),
        ((10, 0, -3), {}),
        ((1.0, 2.0, 0.25), {}),
        ((0, 5), {"dtype": np.float32}),
        ((3, 3), {}),
    ],
)
def test_eager_arange(args, kwargs):
    got = np.asarray(kn.arange(*args, **kwargs))
    want = np.arange(*args, **kwargs)
    if "dtype" not in kwargs:
        want = want.astype(np.float32 if want.dtype.kind == "f" else np.int32)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


INDICES = [
    (slice(None, None, -1),),
    (Ellipsis, slice(None, None, -2)),
    (None, 1, Ellipsis, None),
    (slice(1, None), None, slice(3, 0, -1)),
    (-1, -2, -3),
    (Ellipsis,),
    (slice(5, 7),),
    (0, slice(None, None, -1), 2),
    (Ellipsis, None),
    (slice(-1, -5, -1), slice(None), slice(-1, None, -3)),
    (1,),
    (slice(None), -1),
    (slice(None, None, 2), Ellipsis, slice(1, 2)),
]


@pytest.mark.parametrize("index", INDICES, ids=[repr(i) for i in INDICES])
def test_basic_indexing_inside_jit_matches_numpy(index):
    x = np.arange(24, dtype=F32).reshape(2, 3, 4)
    got = np.asarray(kn.jit(lambda v: v[index])(x))
    assert got.shape == x[index].shape
    np.testing.assert_array_equal(got, x[index])


def test_basic_indexing_errors():
    x = np.arange(6, dtype=F32).reshape(2, 3)
    with pytest.raises(IndexError, match="too many indices"):
        kn.jit(lambda v: v[0, 0, 0])(x)
    with pytest.raises(IndexError, match="index 2 is out of bounds for axis 0 with size 2"):
        kn.jit(lambda v: v[2])(x)
    with pytest.raises(IndexError, match="single ellipsis"):
        kn.jit(lambda v: v[..., ...])(x)


# ------------------------------------------------------------------------ 64-bit types


def test_float64_inputs_stay_float64():
    x = np.array([1.0 + 2.0**-40, 1e300, np.pi])
    f = kn.jit(lambda v: v * 1.0 + 0.0)
    out = f(x)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(np.asarray(out), x)  # no precision lost on the way
    assert kn.exp(np.zeros(2)).dtype == np.float64
    assert "f64[3]" in f.graph(x).text()
    third = kn.jit(lambda v: v / 3.0)(np.array([1.0]))
    np.testing.assert_array_equal(np.asarray(third), np.array([1.0]) / 3.0)  # not float32's 1/3


def test_int64_and_uint64_values_survive():
    big = np.array([2**40 + 1, -(2**50)], np.int64)
    np.testing.assert_array_equal(np.asarray(kn.jit(lambda v: v * 3)(big)), big * 3)
    huge = np.array([2**63 + 5], np.uint64)
    np.testing.assert_array_equal(np.asarray(kn.jit(lambda v: v + np.uint64(1))(huge)), huge + np.uint64(1))


# ------------------------------------------------------------------------ devices, backend


def test_devices_and_backend():
    devices = runtime.devices()
    assert devices and all(d.platform == runtime.backend_name() for d in devices)
    assert runtime.backend_name() == os.environ.get("KAUN_IR_BACKEND", "cpu").strip().lower()


@pytest.mark.parametrize("device", [99, "cpu:0", None])
def test_jit_device_that_is_not_a_device_names_the_available_ones(device):
    x = rand(3)
    if device is None:  # a device of this backend works, given as an object
        got = kn.jit(lambda v: v * 2.0, device=runtime.devices()[0])(x)
        np.testing.assert_allclose(np.asarray(got), x * 2.0)
        return
    names = re.escape(str(runtime.devices()[0]))
    with pytest.raises(TypeError, match=rf"device={re.escape(repr(device))} is not a device.*{names}"):
        kn.jit(lambda v: v * 2.0, device=device)(x)
    with pytest.raises(TypeError, match="kn.runtime.devices"):
        runtime.compile(kn.trace(lambda v: v * 2.0, x), device=device)


def test_bogus_backend_is_a_clear_value_error(monkeypatch):
    monkeypatch.setenv("KAUN_IR_BACKEND", "bogus")
    with pytest.raises(ValueError, match=r"KAUN_IR_BACKEND='bogus': expected one of cpu, gpu, tpu"):
        backend.backend_name()
    monkeypatch.setenv("KAUN_IR_BACKEND", " CPU ")
    assert backend.backend_name() == "cpu"
    monkeypatch.delenv("KAUN_IR_BACKEND")
    assert backend.backend_name() in ("cpu", "gpu", "tpu")


@pytest.mark.parametrize("fast", [True, False])
def test_transfer_and_execute_paths_agree(monkeypatch, fast):
    """The runtime's direct jaxlib paths (host->device put, C++ result handlers) and the public
    fallbacks (``jax.device_put``, jaxlib's generic ``execute``) give the same arrays, dtypes
    included: 64-bit, bool, 0-d, empty and non-contiguous inputs."""
    if not fast:  # a jaxlib without those entry points: the fallbacks must take over
        monkeypatch.setattr(compiler, "_result_handler_factory", lambda: None)
        monkeypatch.setattr(transfer, "_host_put", lambda device: None)
    inputs = [
        np.arange(6, dtype=np.float64).reshape(2, 3).T,
        np.array([True, False]),
        np.float32(2.5),
        np.zeros((0, 3), np.int64),
        np.arange(4, dtype=np.uint32),
    ]
    f = kn.jit(lambda a, b, c, d, e: (a * 2.0, ~b, c + 1, d + 1, e ^ np.uint32(5)))
    out = f(*inputs)
    want = (inputs[0] * 2.0, ~inputs[1], np.float32(3.5), inputs[3] + 1, inputs[4] ^ np.uint32(5))
    for got, expected in zip(out, want):
        assert got.dtype == np.asarray(expected).dtype
        np.testing.assert_array_equal(np.asarray(got), expected)
    moved = transfer.to_device(inputs[0], np.dtype(np.float64), backend.default_device())
    np.testing.assert_array_equal(np.asarray(moved), inputs[0])
    assert (transfer._host_put(backend.default_device()) is None) == (not fast)


def test_result_handlers_are_built_for_both_jaxlib_signatures(monkeypatch):
    """jaxlib <= 0.10's array_result_handler takes _skip_checks, 0.11's does not: the adapter
    asks once and then keeps to the form this jaxlib takes."""
    calls = []

    def old_form(aval, sharding, committed, _skip_checks=False):
        calls.append(("old", _skip_checks))
        return ("handler", aval, sharding, committed)

    def new_form(aval, sharding, committed):
        calls.append(("new",))
        return ("handler", aval, sharding, committed)

    monkeypatch.setattr(compiler, "_SKIP_CHECKS_ARG", [None])
    assert compiler._handler(old_form, "aval", "sharding") == ("handler", "aval", "sharding", True)
    assert calls == [("old", True)]
    monkeypatch.setattr(compiler, "_SKIP_CHECKS_ARG", [None])
    calls.clear()
    assert compiler._handler(new_form, "aval", "sharding") == ("handler", "aval", "sharding", True)
    assert compiler._handler(new_form, "a2", "s2") == ("handler", "a2", "s2", True)
    assert calls == [("new",), ("new",)]  # the rejected keyword form was tried only once
    # and this jaxlib's real handlers, in the form it takes, give the values NumPy does
    monkeypatch.setattr(compiler, "_SKIP_CHECKS_ARG", [None])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = kn.jit(lambda a: (a * 2.0, a.sum(axis=0)))(x)
    np.testing.assert_array_equal(np.asarray(out[0]), x * 2.0)
    np.testing.assert_array_equal(np.asarray(out[1]), x.sum(axis=0))


_MOVE_64_BIT = """
import jax, numpy as np
from kaun_ir.runtime.xla import transfer
first, second = jax.devices()[:2]
with jax.enable_x64(True):
    x = jax.device_put(np.array([2**40 + 1, -3], np.int64), first)
moved = transfer.to_device(x, np.dtype(np.int64), second)
assert moved.dtype == np.int64, moved.dtype
assert moved.devices() == {second}, moved.devices()
assert np.asarray(moved).tolist() == [2**40 + 1, -3], np.asarray(moved)
print("ok")
"""


def test_64_bit_array_moved_to_another_device_stays_64_bit():
    """A 64-bit jax.Array on one device (a PyTorch int64 tensor taken through DLPack lands on the
    CPU) moved to another device keeps its dtype and values: jax.device_put would narrow it to
    32 bits without x64 (first seen moving token ids to a GPU)."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", _MOVE_64_BIT], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
