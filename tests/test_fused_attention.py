"""The fused attention op and its CPU kernel: values, gradients, vmap and jvp against JAX, with the
kernel and with its StableHLO decomposition (``KAUN_IR_KERNELS=0``, or no C++ compiler), and the
kernel library's build cache (key, a corrupted file, a missing or failing compiler)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.runtime import kernels
from kaun_ir.runtime.lower import lower

SHAPE = (2, 6, 3, 8)  # [B, T, H, D]


def _inputs(shape=SHAPE, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(np.float32) for _ in range(3))


def _kernel_available() -> bool:
    return bool(kernels.targets("cpu"))


@pytest.fixture(params=["kernel", "fallback"])
def mode(request, monkeypatch):
    """Run a test with the kernel (skipped where no C++ compiler builds it) and without."""
    if request.param == "kernel":
        monkeypatch.delenv(kernels.ENV, raising=False)
        if not _kernel_available():
            pytest.skip(f"no kernel library here: {kernels.status()}")
    else:
        monkeypatch.setenv(kernels.ENV, "0")
    return request.param


def _jax_attention(q, k, v, causal):
    return jax.nn.dot_product_attention(q, k, v, is_causal=causal)


@pytest.mark.parametrize("causal", [False, True])
def test_values_and_grads_match_jax(mode, causal):
    q, k, v = _inputs()
    w = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)

    def loss(q, k, v):
        return kn.sum(kn.fn.dot_product_attention(q, k, v, is_causal=causal) * w)

    forward = kn.jit(lambda q, k, v: kn.fn.dot_product_attention(q, k, v, is_causal=causal))
    out = forward(q, k, v)
    np.testing.assert_allclose(np.asarray(out), _jax_attention(q, k, v, causal), rtol=1e-5, atol=1e-5)
    backward = kn.jit(kn.grad(loss, argnums=(0, 1, 2)))
    grads = backward(q, k, v)
    want = jax.grad(lambda *a: jnp.sum(_jax_attention(*a, causal) * w), argnums=(0, 1, 2))(q, k, v)
    for got, ref in zip(grads, want):
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-4, atol=1e-5)
    # both executables call the kernel, or neither does
    for jitted in (forward, backward):
        assert ("stablehlo.custom_call" in jitted.lower(q, k, v)) == (mode == "kernel")


def test_unequal_lengths_and_value_width(mode):
    rng = np.random.default_rng(2)
    q = rng.standard_normal((3, 5, 2, 4)).astype(np.float32)
    k = rng.standard_normal((3, 7, 2, 4)).astype(np.float32)
    v = rng.standard_normal((3, 7, 2, 6)).astype(np.float32)
    for causal in (False, True):
        out = kn.jit(lambda q, k, v, c=causal: kn.fn.dot_product_attention(q, k, v, is_causal=c))(q, k, v)
        want = _jax_attention(q, k, v[..., :4], causal)  # jax needs one head dimension: check a slice
        np.testing.assert_allclose(np.asarray(out)[..., :4], want, rtol=1e-5, atol=1e-5)


def test_vmap_folds_into_the_batch(mode):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((4,) + SHAPE).astype(np.float32) for _ in range(3))
    out = kn.jit(
        kn.vmap(lambda q, k, v: kn.fn.dot_product_attention(q, k, v, is_causal=True), in_axes=(0, 0, 0))
    )(q, k, v)
    want = jax.vmap(lambda q, k, v: _jax_attention(q, k, v, True))(q, k, v)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)
    # an operand without the vmapped axis is broadcast along it
    out = kn.jit(kn.vmap(lambda q, k, v: kn.fn.dot_product_attention(q, k, v), in_axes=(0, None, None)))(
        q, k[0], v[0]
    )
    want = jax.vmap(lambda q: _jax_attention(q, k[0], v[0], False))(q)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)


def test_jvp_and_second_derivative(mode):
    q, k, v = _inputs((1, 4, 2, 3), seed=4)
    tq, tk, tv = _inputs((1, 4, 2, 3), seed=5)

    def f(q, k, v):
        return kn.fn.dot_product_attention(q, k, v, is_causal=True)

    _, tangent = kn.jvp(f, (q, k, v), (tq, tk, tv))
    _, want = jax.jvp(lambda q, k, v: _jax_attention(q, k, v, True), (q, k, v), (tq, tk, tv))
    np.testing.assert_allclose(np.asarray(tangent), want, rtol=1e-4, atol=1e-5)

    def g(q):
        return kn.sum(kn.grad(lambda q: kn.sum(f(q, k, v) ** 2))(q) ** 2)

    def g_jax(q):
        return jnp.sum(jax.grad(lambda q: jnp.sum(_jax_attention(q, k, v, True) ** 2))(q) ** 2)

    np.testing.assert_allclose(np.asarray(kn.grad(g)(q)), jax.grad(g_jax)(q), rtol=1e-3, atol=1e-4)


def test_kernel_matches_fallback_on_the_bench_shape(monkeypatch):
    """transformer's attention: [16, 64, 4, 32], causal; the kernel and the decomposition agree."""
    if not _kernel_available():
        pytest.skip(f"no kernel library here: {kernels.status()}")
    q, k, v = _inputs((16, 64, 4, 32), seed=6)
    g = np.random.default_rng(7).standard_normal((16, 64, 4, 32)).astype(np.float32)

    def f(q, k, v):
        out, vjp = kn.vjp(lambda q, k, v: kn.fn.dot_product_attention(q, k, v, is_causal=True), q, k, v)
        return (out, *vjp(g))

    with_kernel = [np.asarray(x) for x in kn.jit(f)(q, k, v)]
    monkeypatch.setenv(kernels.ENV, "0")
    without = [np.asarray(x) for x in kn.jit(lambda *a: f(*a))(q, k, v)]
    for a, b in zip(with_kernel, without):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_export_and_other_platforms_use_the_decomposition():
    graph = kn.trace(lambda q, k, v: kn.fn.dot_product_attention(q, k, v), *_inputs())
    assert "fused_attention" in graph.text()
    assert "custom_call" not in lower(graph)  # no kernels given: portable StableHLO
    assert kernels.targets("gpu") == {}
    text = lower(graph, kernels={"attention_forward": "some_target"})
    assert '"some_target"' in text and "api_version = 4 : i32" in text


def test_ineligible_inputs_keep_the_plain_ops():
    q, k, v = _inputs()
    for kwargs in ({"bias": np.zeros((6, 6), np.float32)}, {"mask": np.ones((6, 6), bool)}):
        graph = kn.trace(lambda q, k, v, kw=kwargs: kn.fn.dot_product_attention(q, k, v, **kw), q, k, v)
        assert "fused_attention" not in graph.text()
    graph = kn.trace(
        lambda q, k, v: kn.fn.dot_product_attention(q, k, v), *(x.astype(np.float16) for x in (q, k, v))
    )
    assert "fused_attention" not in graph.text()


# The library: build cache, key, failures -> the plain StableHLO ---------------------------------


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty kernel cache folder and no remembered outcome (restored afterwards)."""
    monkeypatch.setenv(kernels.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(kernels.ENV, raising=False)
    kernels.reset()
    yield tmp_path
    monkeypatch.undo()
    kernels.reset()


def test_no_compiler_means_the_fallback(fresh, monkeypatch):
    monkeypatch.setenv("CXX", str(fresh / "no-such-compiler"))
    assert kernels.targets("cpu") == {}
    assert "compiler" in kernels.status()
    q, k, v = _inputs()
    out = kn.jit(lambda q, k, v: kn.fn.dot_product_attention(q, k, v, is_causal=True))(q, k, v)
    np.testing.assert_allclose(np.asarray(out), _jax_attention(q, k, v, True), rtol=1e-5, atol=1e-5)


def test_failing_build_means_the_fallback(fresh, monkeypatch):
    broken = fresh / "broken-cxx"
    broken.write_text("#!/bin/sh\necho 'broken 1.0'\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CXX", str(broken))
    assert kernels.targets("cpu") == {}
    assert "unavailable" in kernels.status()
    assert not list(fresh.glob("*.so")) and not list(fresh.glob("*.tmp"))


def test_switch_off(fresh, monkeypatch):
    monkeypatch.setenv(kernels.ENV, "0")
    assert kernels.targets("cpu") == {}
    assert kernels.ENV in kernels.status()


def test_cache_key_and_corrupted_library(fresh, monkeypatch):
    cxx = kernels.compiler()
    if cxx is None:
        pytest.skip("no C++ compiler here")
    key = kernels.library_key(cxx)
    assert key == kernels.library_key(cxx)
    monkeypatch.setattr(kernels, "FLAGS", (*kernels.FLAGS, "-DKAUN_IR_OTHER"))
    assert kernels.library_key(cxx) != key
    monkeypatch.setattr(kernels, "FLAGS", kernels.FLAGS[:-1])
    path = fresh / f"kaun_ir_kernels-{key}.so"
    path.write_bytes(b"not a shared library")
    targets = kernels.targets("cpu")
    assert targets and all(t.endswith(key) for t in targets.values())
    assert path.stat().st_size > 1000  # built again over the damaged file
