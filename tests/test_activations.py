"""Activation functions: values and gradients (kn.grad) against jax.nn, stability at large
inputs, derivatives at the kinks, second derivatives.

All activations are evaluated in one compiled function (and all gradients in one more) so the
file compiles a handful of executables, not one per function."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.nn import activations as act

JAX = {
    "relu": jax.nn.relu,
    "relu6": jax.nn.relu6,
    "leaky_relu": jax.nn.leaky_relu,
    "elu": jax.nn.elu,
    "selu": jax.nn.selu,
    "celu": jax.nn.celu,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_approx": functools.partial(jax.nn.gelu, approximate=True),
    "silu": jax.nn.silu,
    "swish": jax.nn.swish,
    "softplus": jax.nn.softplus,
    "softsign": jax.nn.soft_sign,
    "mish": jax.nn.mish,
    "log_sigmoid": jax.nn.log_sigmoid,
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
    "hard_sigmoid": jax.nn.hard_sigmoid,
    "hard_tanh": jax.nn.hard_tanh,
    "hard_swish": jax.nn.hard_swish,
    "hard_silu": jax.nn.hard_silu,
}
NAMES = sorted(JAX)
KINKS = np.array([0.0, 1.0, -1.0, 3.0, -3.0, 6.0])


def _inputs(dtype):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-8, 8, 200), [-40.0, -20.0, 20.0, 40.0]])
    # keep away from the kinks, where one-sided derivatives differ
    near = np.abs(x[:, None] - KINKS[None, :]).min(axis=1) < 1e-3
    return np.where(near, x + 0.01, x).astype(dtype)


def _all(x):
    return {name: getattr(act, name)(x) for name in NAMES}


def _sum_all(xs):
    return sum(kn.sum(getattr(act, name)(xs[name])) for name in NAMES)


@functools.cache
def _results():
    """Inputs, our float64 values and gradients, jax's float64 values and gradients, and our
    float32 / bfloat16 values — two compiled functions on each side."""
    x = _inputs(np.float64)
    values = kn.jit(_all)(x)
    grads = kn.grad(_sum_all)({name: x for name in NAMES})
    low = kn.jit(lambda a, b: (_all(a), _all(b)))(x.astype(np.float32), x.astype(kn.bfloat16))

    @jax.jit
    def oracle(x):
        return (
            {n: JAX[n](x) for n in NAMES},
            jax.grad(lambda xs: sum(jnp.sum(JAX[n](xs[n])) for n in NAMES))({n: x for n in NAMES}),
        )

    with jax.enable_x64(True):
        want, want_grads = oracle(x)

    def host(tree):
        return {k: np.asarray(v) for k, v in tree.items()}

    return x, host(values), host(grads), host(want), host(want_grads), host(low[0]), host(low[1])


def test_every_activation_is_exported_and_tested():
    assert sorted(act.__all__) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_value_and_gradient_match_jax(name):
    x, values, grads, want, want_grads, _, _ = _results()
    assert values[name].dtype == np.float64
    np.testing.assert_allclose(values[name], want[name], rtol=1e-12, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(grads[name], want_grads[name], rtol=1e-12, atol=1e-12, err_msg=name)
    assert np.isfinite(values[name]).all() and np.isfinite(grads[name]).all()


@pytest.mark.parametrize("name", NAMES)
def test_low_precision_values_keep_their_dtype(name):
    _, _, _, want, _, f32, bf16 = _results()
    assert f32[name].dtype == np.float32 and bf16[name].dtype == kn.bfloat16
    # float32 inputs are the float64 ones rounded: compare with a tolerance that allows for it
    np.testing.assert_allclose(f32[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(bf16[name].astype(np.float64), want[name], rtol=3e-2, atol=3e-2, err_msg=name)


def test_derivatives_at_kinks_follow_jax():
    """One-sided choices at the kinks, as jax.nn makes them (checked against jax once, then
    written out so this test needs no oracle compilation)."""
    x = np.array([0.0, 6.0, -3.0, 3.0, 1.0, -1.0], np.float32)
    want = {
        "relu": [0, 1, 0, 1, 1, 0],
        "relu6": [0, 0, 0, 1, 1, 0],
        "leaky_relu": [1, 1, 0.01, 1, 1, 0.01],
        "hard_tanh": [1, 0, 0, 0, 1, 1],
        "hard_sigmoid": [1 / 6, 0, 0, 0, 1 / 6, 1 / 6],
        "elu": [1, 1, np.exp(-3.0), 1, 1, np.exp(-1.0)],
    }
    grads = kn.grad(lambda xs: sum(kn.sum(getattr(act, n)(xs[n])) for n in want))({n: x for n in want})
    for n, w in want.items():
        np.testing.assert_allclose(np.asarray(grads[n]), np.asarray(w, np.float32), atol=1e-6, err_msg=n)


def test_hyper_parameters():
    x = np.linspace(-3, 3, 13).astype(np.float32)
    np.testing.assert_allclose(
        np.asarray(act.leaky_relu(x, 0.2)), np.asarray(jax.nn.leaky_relu(x, 0.2)), rtol=1e-6
    )
    np.testing.assert_allclose(np.asarray(act.elu(x, 0.5)), np.asarray(jax.nn.elu(x, 0.5)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(act.celu(x, 2.0)), np.asarray(jax.nn.celu(x, 2.0)), rtol=1e-6)
    with pytest.raises(ValueError, match="alpha"):
        act.celu(x, 0.0)


def test_second_derivatives_match_jax():
    x = np.array([-2.5, -0.7, 0.3, 1.9], np.float64)
    names = ["gelu", "gelu_approx", "silu", "softplus", "mish", "log_sigmoid", "elu"]

    def first(xs):
        return kn.grad(lambda ys: sum(kn.sum(getattr(act, n)(ys[n])) for n in names))(xs)

    second = kn.grad(lambda xs: sum(kn.sum(v) for v in first(xs).values()))({n: x for n in names})
    with jax.enable_x64(True):
        want = jax.jit(lambda x: {n: jax.vmap(jax.grad(jax.grad(JAX[n])))(x) for n in names})(x)
    for n in names:
        np.testing.assert_allclose(
            np.asarray(second[n]), np.asarray(want[n]), rtol=1e-10, atol=1e-12, err_msg=n
        )


def test_integer_inputs_become_float32_except_relu():
    x = np.array([-2, 0, 3], np.int32)
    assert np.asarray(act.relu(x)).dtype == np.int32
    np.testing.assert_array_equal(np.asarray(act.relu(x)), [0, 0, 3])
    y = np.asarray(act.gelu(x))
    assert y.dtype == np.float32
    want = [v * (1 + math.erf(v / math.sqrt(2))) / 2 for v in (-2.0, 0.0, 3.0)]
    np.testing.assert_allclose(y, want, rtol=1e-6)


def test_traced_inside_a_model_function():
    def f(x):
        return act.gelu(x) + act.silu(x) * 2

    graph = kn.trace(f, kn.ShapeDtype((3,), kn.float32))
    ops = {node.op for node in graph.nodes}
    assert "erf" in ops and "logistic" in ops
