"""End to end: an MLP and a small conv net, traced, lowered, XLA-compiled, against JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import tree as kn_tree


def _mlp_params(rng, sizes):
    return [
        {
            "weight": (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32),
            "bias": rng.standard_normal(b).astype(np.float32) * 0.1,
        }
        for a, b in zip(sizes[:-1], sizes[1:])
    ]


def mlp(params, x):
    h = x
    for i, layer in enumerate(params):
        with kn.ir.scope(f"{2 * i}.linear"):
            h = h @ layer["weight"] + layer["bias"]
        if i < len(params) - 1:
            with kn.ir.scope(f"{2 * i + 1}.relu"):
                h = kn.maximum(h, 0.0)
    return kn.softmax(h, axis=-1)


def mlp_jax(params, x):
    h = x
    for i, layer in enumerate(params):
        h = h @ layer["weight"] + layer["bias"]
        if i < len(params) - 1:
            h = jnp.maximum(h, 0.0)
    return jax.nn.softmax(h, axis=-1)


def cnn(params, x):
    with kn.ir.scope("0.conv2d"):
        h = kn.fn.conv2d(x, params["c1"]["w"], params["c1"]["b"], padding=1)
    h = kn.maximum(h, 0.0)
    with kn.ir.scope("2.max_pool2d"):
        h = kn.fn.max_pool2d(h, 2)
    with kn.ir.scope("3.conv2d"):
        h = kn.fn.conv2d(h, params["c2"]["w"], params["c2"]["b"], stride=1, padding="valid")
    h = kn.maximum(h, 0.0)
    with kn.ir.scope("5.avg_pool2d"):
        h = kn.fn.avg_pool2d(h, 2)
    h = h.reshape(h.shape[0], -1)
    with kn.ir.scope("7.linear"):
        return h @ params["fc"]["w"] + params["fc"]["b"]


def cnn_jax(params, x):
    dn = ("NCHW", "OIHW", "NCHW")
    h = jax.lax.conv_general_dilated(x, params["c1"]["w"], (1, 1), ((1, 1), (1, 1)), dimension_numbers=dn)
    h = jnp.maximum(h + params["c1"]["b"][None, :, None, None], 0.0)
    h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
    h = jax.lax.conv_general_dilated(h, params["c2"]["w"], (1, 1), "VALID", dimension_numbers=dn)
    h = jnp.maximum(h + params["c2"]["b"][None, :, None, None], 0.0)
    h = jax.lax.reduce_window(h, 0.0, jax.lax.add, (1, 1, 2, 2), (1, 1, 2, 2), "VALID") / 4.0
    h = h.reshape(h.shape[0], -1)
    return h @ params["fc"]["w"] + params["fc"]["b"]


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(1234)


def test_mlp_forward_matches_jax(rng):
    params = _mlp_params(rng, [784, 128, 64, 10])
    x = rng.standard_normal((32, 784)).astype(np.float32)
    compiled = kn.jit(mlp)
    out = compiled(params, x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(mlp_jax(params, x)), rtol=1e-5, atol=1e-6)
    mlir = compiled.lower(params, x)
    kn.runtime.parse_mlir(mlir)
    assert 'loc("0.linear/dot_general")' in mlir
    # a new batch of the same shape reuses the executable
    compiled(params, rng.standard_normal((32, 784)).astype(np.float32))
    assert compiled.trace_count == 1


def test_cnn_forward_matches_jax(rng):
    params = {
        "c1": {
            "w": rng.standard_normal((8, 1, 3, 3)).astype(np.float32) / 3,
            "b": rng.standard_normal(8).astype(np.float32) * 0.1,
        },
        "c2": {
            "w": rng.standard_normal((16, 8, 3, 3)).astype(np.float32) / 8,
            "b": rng.standard_normal(16).astype(np.float32) * 0.1,
        },
        "fc": {
            "w": rng.standard_normal((16 * 2 * 2, 10)).astype(np.float32) / 8,
            "b": np.zeros(10, np.float32),
        },
    }
    x = rng.standard_normal((4, 1, 12, 12)).astype(np.float32)
    compiled = kn.jit(cnn)
    out = compiled(params, x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(cnn_jax(params, x)), rtol=1e-4, atol=1e-5)
    mlir = compiled.lower(params, x)
    kn.runtime.parse_mlir(mlir)
    assert "stablehlo.convolution" in mlir
    # with the backend-neutral pipeline (no pooling rewrite) the pools stay reduce_window ops
    neutral = kn.jit(cnn, pipeline=kn.runtime.pipelines.DEFAULT_JIT_PIPELINE)
    assert "stablehlo.reduce_window" in neutral.lower(params, x)
    np.testing.assert_allclose(np.asarray(neutral(params, x)), np.asarray(out), rtol=1e-4, atol=1e-5)
    # the NumPy reference interpreter agrees with XLA on the optimised graph
    graph = compiled.graph(params, x)
    reference = kn.ir.interpret(graph, *kn_tree.flatten((params, x))[0])[0]
    np.testing.assert_allclose(np.asarray(out), reference, rtol=1e-4, atol=1e-5)
