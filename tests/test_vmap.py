"""``kn.vmap``: composition with grad / jit / itself, trees of axes, loops, random keys, errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import tree as kn_tree

RNG = np.random.default_rng(0)


def _mlp_params(sizes=(5, 8, 3), dtype=np.float64):
    return [
        {"w": RNG.standard_normal((a, b)).astype(dtype) * 0.5, "b": RNG.standard_normal(b).astype(dtype)}
        for a, b in zip(sizes[:-1], sizes[1:])
    ]


def _mlp(params, x, np_=kn):
    for k, p in enumerate(params):
        x = x @ p["w"] + p["b"]
        if k < len(params) - 1:
            x = np_.tanh(x)
    return x


def _loss(params, x, y):
    out = _mlp(params, x)
    return kn.mean((out - y) ** 2)


def test_per_example_gradients_match_a_python_loop():
    params = _mlp_params()
    x, y = RNG.standard_normal((6, 5)), RNG.standard_normal((6, 3))
    batched = kn.vmap(kn.grad(_loss), in_axes=(None, 0, 0))(params, x, y)
    single = kn.jit(kn.grad(_loss))
    for i in range(6):
        one = single(params, x[i], y[i])
        for got, want in zip(kn_tree.flatten(batched)[0], kn_tree.flatten(one)[0]):
            np.testing.assert_allclose(np.asarray(got)[i], np.asarray(want), rtol=1e-12, atol=1e-12)

    # and against jax, an independent oracle
    def jax_loss(p, x, y):
        return jnp.mean((_mlp(p, x, jnp) - y) ** 2)

    with jax.enable_x64(True):
        want = jax.vmap(jax.grad(jax_loss), in_axes=(None, 0, 0))(params, x, y)
    for got, w in zip(kn_tree.flatten(batched)[0], jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(w), rtol=1e-10, atol=1e-12)


def test_ensemble_over_stacked_parameter_trees_and_its_gradient():
    members = [_mlp_params() for _ in range(3)]
    stacked = [{k: np.stack([m[i][k] for m in members]) for k in ("w", "b")} for i in range(2)]
    x = RNG.standard_normal((4, 5))
    out = kn.vmap(_mlp, in_axes=(0, None))(stacked, x)
    for m, member in enumerate(members):
        np.testing.assert_allclose(np.asarray(out)[m], np.asarray(kn.jit(_mlp)(member, x)), rtol=1e-12)
    # the gradient of a loss over the whole ensemble: grad of vmap
    y = RNG.standard_normal((4, 3))

    def ensemble_loss(p):
        return kn.sum(kn.vmap(_loss, in_axes=(0, None, None))(p, x, y))

    got = kn.grad(ensemble_loss)(stacked)
    for m, member in enumerate(members):
        want = kn.grad(_loss)(member, x, y)
        for g, w in zip(kn_tree.flatten(got)[0], kn_tree.flatten(want)[0]):
            np.testing.assert_allclose(np.asarray(g)[m], np.asarray(w), rtol=1e-11, atol=1e-12)


def test_in_axes_trees_out_axes_nesting_and_jit():
    a = RNG.standard_normal((3, 4))
    b = RNG.standard_normal((4, 2))

    def f(p, v):
        return kn.sum(p["m"] * v, axis=0) + p["s"], v.T

    p = {"m": a, "s": RNG.standard_normal(4)}
    got, transposed = kn.jit(kn.vmap(f, in_axes=({"m": None, "s": None}, 1), out_axes=(1, 0)))(p, b)
    want = np.stack([np.sum(a * b[:, k], axis=0) + p["s"] for k in range(2)], axis=1)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(transposed), b.T, rtol=0)
    # vmap of vmap: an outer product table
    u, v = RNG.standard_normal(3), RNG.standard_normal(5)
    table = kn.vmap(kn.vmap(lambda s, t: s * t, in_axes=(None, 0)), in_axes=(0, None))(u, v)
    np.testing.assert_allclose(np.asarray(table), np.outer(u, v), rtol=1e-15)
    # nothing mapped: axis_size broadcasts
    ones = kn.vmap(lambda: kn.ones((2,)), axis_size=4)()
    assert np.asarray(ones).shape == (4, 2)


def test_while_loop_with_a_condition_per_example():
    def count_down(n, x):
        def body(state):
            k, acc = state
            return k - 1, acc * 2.0 + 1.0

        return kn.while_loop(lambda s: s[0] > 0, body, (n, x))[1]

    n = np.array([0, 3, 1, 5], np.int32)
    x = RNG.standard_normal((4, 2))
    got = kn.vmap(count_down)(n, x)
    want = np.stack(
        [
            (lambda v, k: [v := v * 2.0 + 1.0 for _ in range(k)] and v)(x[i], int(n[i])) if n[i] else x[i]
            for i in range(4)
        ]
    )
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)


def test_random_under_vmap_follows_the_key():
    keys = kn.random.split(kn.random.key(1), 4)
    mapped = np.asarray(kn.vmap(lambda k: kn.random.normal(k, (3,)))(keys))
    with jax.enable_x64(False):
        want = jax.vmap(lambda k: jax.random.normal(k, (3,)))(np.asarray(keys))
    np.testing.assert_allclose(mapped, np.asarray(want), rtol=1e-5, atol=1e-6)
    assert len({tuple(row) for row in mapped.round(6)}) == 4  # a stream per example
    shared = np.asarray(
        kn.vmap(lambda x, k: x + kn.random.normal(k, (3,)), in_axes=(0, None))(
            np.zeros((4, 3), np.float32), kn.random.key(1)
        )
    )
    assert np.all(shared == shared[0])  # an unmapped key: every example draws the same numbers


def test_bad_input_gives_clear_errors():
    x = np.zeros((3, 2))
    with pytest.raises(kn.BatchingError, match="in_axes has 1 entries but the function was called with 2"):
        kn.vmap(lambda a, b: a + b, in_axes=(0,))(x, x)
    with pytest.raises(kn.BatchingError, match=r"mismatched batch sizes \(argument 0: 3, argument 1: 4\)"):
        kn.vmap(lambda a, b: a.sum() + b.sum())(x, np.zeros((4, 2)))
    with pytest.raises(kn.BatchingError, match="axis 2 does not exist"):
        kn.vmap(lambda a: a, in_axes=2)(x)
    with pytest.raises(kn.BatchingError, match="out_axes is None for output 0"):
        kn.vmap(lambda a: a * 2, out_axes=None)(x)
    with pytest.raises(kn.BatchingError, match="needs at least one mapped argument"):
        kn.vmap(lambda a: a, in_axes=None)(x)
    with pytest.raises(kn.BatchingError, match=r"in_axes\[0\] has keys \['a'\] but the argument has keys"):
        kn.vmap(lambda p: p["b"], in_axes=({"a": 0},))({"b": x})


def test_vmap_and_jvp_as_passes():
    graph = kn.trace(
        lambda w, x: kn.tanh(x @ w), kn.ShapeDtype((3, 2), kn.float64), kn.ShapeDtype((3,), kn.float64)
    )
    batched = kn.passes.run(graph, "vmap{size=4 unmapped=0},cse,dce")
    assert [str(t) for t in batched.input_types] == ["f64[3,2]", "f64[4,3]"]
    w, xs = RNG.standard_normal((3, 2)), RNG.standard_normal((4, 3))
    np.testing.assert_allclose(np.asarray(kn.runtime.compile(batched)(w, xs)[0]), np.tanh(xs @ w), rtol=1e-14)
    forward = kn.passes.run(graph, "jvp,cse,dce")
    tw, tx = RNG.standard_normal((3, 2)), RNG.standard_normal(3)
    _, tangent = kn.runtime.compile(forward)(w, xs[0], tw, tx)
    want = (1 - np.tanh(xs[0] @ w) ** 2) * (xs[0] @ tw + tx @ w)
    np.testing.assert_allclose(np.asarray(tangent), want, rtol=1e-13)
    with pytest.raises(kn.BatchingError, match=r"unmapped input\(s\) \[5\] out of range"):
        kn.passes.run(graph, "vmap{unmapped=5}")
