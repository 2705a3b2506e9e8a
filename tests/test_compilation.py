"""The one home of compilation and dispatch (``kaun_ir.runtime.compilation``): what creating a
``kn.jit`` wrapper starts (nothing), the eager path's hook and cache key, the shared registry."""

import subprocess
import sys

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import optim
from kaun_ir.runtime import compilation, finite, stages
from kaun_ir.runtime.xla import backend, compiler, transfer
from kaun_ir.surface import eager, tensor


def _refuse(*args, **kwargs):
    raise AssertionError("creating a kn.jit wrapper reached the XLA runtime")


def test_creating_a_jit_wrapper_starts_nothing(monkeypatch):
    # every way into the runtime's client and devices fails the test if it is taken
    for module, name in (
        (backend, "client"),
        (backend, "default_device"),
        (backend, "devices"),
        (backend, "jax_module"),
        (transfer, "array_types"),
        (compiler, "compile"),
    ):
        monkeypatch.setattr(module, name, _refuse)
    before = (compilation.stats.compiles, compilation.stats.cache_hits)
    with stages.record() as recording:
        wrappers = [
            kn.jit(lambda x: x + 1),
            kn.jit(donate_argnums=(0,))(lambda x: x * 2),
            kn.jit(lambda x: x, pipeline="cse,dce"),
        ]
    assert recording.stages == []
    assert (compilation.stats.compiles, compilation.stats.cache_hits) == before
    assert all(w.trace_count == 0 and len(w.routes) == 0 for w in wrappers)


def test_a_fresh_process_has_no_client_after_creating_a_wrapper():
    code = (
        "import sys, kaun_ir as kn\n"
        "f = kn.jit(lambda x: x + 1)\n"
        "from kaun_ir.runtime.xla import backend\n"
        "print(backend.client.cache_info().currsize, 'jax' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "False"]


def test_the_eager_path_runs_through_the_runtime_hook():
    # the slot fills itself on first need (kaun_ir.hooks), whatever ran before in this process
    assert eager.runtime().run_op is compilation.run_op
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = tensor.apply("exponential", x)
    np.testing.assert_allclose(np.asarray(got), np.exp(x), rtol=1e-6)


def test_eager_cache_key_holds_the_finite_check_switch():
    # a shape no other test uses, so the first compilation of this op signature happens here
    x = np.zeros((3, 7, 2), np.float32)
    with finite.forced(True), pytest.raises(kn.NonFiniteError, match="log"):
        tensor.apply("log", x)
    # the checked executable must not answer an unchecked call (nor the other way round)
    assert np.isneginf(np.asarray(tensor.apply("log", x))).all()
    y = np.zeros((3, 7, 3), np.float32)
    assert np.isneginf(np.asarray(tensor.apply("log", y))).all()
    with finite.forced(True), pytest.raises(kn.NonFiniteError, match="log"):
        tensor.apply("log", y)


def test_optimiser_steps_on_arrays_share_one_compiled_function():
    params = {"w": np.ones((4,), np.float32)}
    grads = {"w": np.full((4,), 0.5, np.float32)}
    alg = optim.sgd(0.1)
    state = optim.init(alg, params)
    new_params, state = optim.update(alg, state, params, grads)
    (jitted,) = [fn for key, fn in compilation.shared_items("optim") if key == ("optim", "update")]
    traces = jitted.trace_count
    new_params, state = optim.update(alg, state, new_params, grads)
    assert jitted.trace_count == traces
    np.testing.assert_allclose(np.asarray(new_params["w"]), 1.0 - 2 * 0.1 * 0.5, rtol=1e-6)
