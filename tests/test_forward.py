"""Forward mode and Jacobians of whole functions vs JAX (float64): jvp, linearize, jacfwd, jacrev,
hessian and hvp of an MLP loss, attention and layer norm; composition with vmap; bad tangents."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import tree as kn_tree
from kaun_ir.transforms.jvp import jvp_graph

RNG = np.random.default_rng(3)


def _mlp_loss(np_):
    def loss(params, x, y):
        h = np_.tanh(x @ params["w1"] + params["b1"])
        out = h @ params["w2"]
        return np_.mean((out - y) ** 2)

    return loss


def _attention(np_, softmax):
    def attend(q, k, v):
        scores = q @ k.T / np.sqrt(q.shape[-1])
        return softmax(scores) @ v

    return attend


def _layer_norm(np_):
    def norm(x, gamma):
        mean = np_.mean(x, axis=-1, keepdims=True)
        var = np_.mean((x - mean) ** 2, axis=-1, keepdims=True)
        return (x - mean) / np_.sqrt(var + 1e-5) * gamma

    return norm


def _close(got, want, tol=1e-10):
    got_leaves, want_leaves = kn_tree.flatten(got)[0], jax.tree_util.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        assert np.shape(g) == np.shape(w)
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=tol, atol=tol)


PARAMS = {"w1": RNG.standard_normal((4, 5)), "b1": RNG.standard_normal(5), "w2": RNG.standard_normal((5, 2))}
X, Y = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 2))
Q, K, V = (RNG.standard_normal((3, 4)) for _ in range(3))
GAMMA = RNG.standard_normal(6)
XN = RNG.standard_normal((2, 6))


def test_jacobians_and_hessian_of_an_mlp_loss():
    ours, theirs = _mlp_loss(kn), _mlp_loss(jnp)
    with jax.enable_x64(True):
        _close(kn.jacrev(ours)(PARAMS, X, Y), jax.jacrev(theirs)(PARAMS, X, Y))
        _close(kn.jacfwd(ours, argnums=1)(PARAMS, X, Y), jax.jacfwd(theirs, argnums=1)(PARAMS, X, Y))
        _close(kn.hessian(ours, argnums=1)(PARAMS, X, Y), jax.hessian(theirs, argnums=1)(PARAMS, X, Y))
        tangent = {k: RNG.standard_normal(v.shape) for k, v in PARAMS.items()}
        (got,) = kn.hvp(lambda p: ours(p, X, Y), (PARAMS,), (tangent,))
        want = jax.jvp(jax.grad(lambda p: theirs(p, X, Y)), (PARAMS,), (tangent,))[1]
        _close(got, want)


def test_jacobians_of_attention_and_layer_norm():
    ours = _attention(kn, lambda s: kn.softmax(s, axis=-1))
    theirs = _attention(jnp, lambda s: jax.nn.softmax(s, axis=-1))
    with jax.enable_x64(True):
        _close(kn.jacfwd(ours, argnums=(0, 2))(Q, K, V), jax.jacfwd(theirs, argnums=(0, 2))(Q, K, V))
        _close(kn.jacrev(ours, argnums=1)(Q, K, V), jax.jacrev(theirs, argnums=1)(Q, K, V))
        norm_ours, norm_theirs = _layer_norm(kn), _layer_norm(jnp)
        _close(kn.jacrev(norm_ours)(XN, GAMMA), jax.jacrev(norm_theirs)(XN, GAMMA))
        scalar = lambda x: kn.sum(norm_ours(x, GAMMA) ** 3)  # noqa: E731
        _close(kn.hessian(scalar)(XN), jax.hessian(lambda x: jnp.sum(norm_theirs(x, GAMMA) ** 3))(XN))


def test_jvp_linearize_and_composition_with_vmap():
    f = _mlp_loss(kn)
    tangent = RNG.standard_normal(X.shape)
    with jax.enable_x64(True):
        want_out, want_t = jax.jvp(lambda x: _mlp_loss(jnp)(PARAMS, x, Y), (X,), (tangent,))
    out, t = kn.jvp(lambda x: f(PARAMS, x, Y), (X,), (tangent,))
    _close((out, t), (want_out, want_t))
    value, f_jvp = kn.linearize(lambda x: f(PARAMS, x, Y), X)
    _close((value, f_jvp(tangent)), (want_out, want_t))
    # per-example directional derivatives: vmap of jvp, and jvp inside jit
    xs, ts = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
    g = lambda x: kn.sin(x) * kn.sum(x)  # noqa: E731
    got = kn.jit(kn.vmap(lambda x, t: kn.jvp(g, (x,), (t,))[1]))(xs, ts)
    with jax.enable_x64(True):
        want = jax.vmap(lambda x, t: jax.jvp(lambda v: jnp.sin(v) * jnp.sum(v), (x,), (t,))[1])(xs, ts)
    _close(got, want)


def test_forward_mode_graph_is_an_ordinary_graph():
    graph = kn.trace(lambda x: kn.exp(x) * x, kn.ShapeDtype((3,), kn.float64))
    forward = jvp_graph(graph)
    assert [str(t) for t in forward.input_types] == ["f64[3]", "f64[3]"]
    assert kn.ir.parse(forward.text()).text() == forward.text()
    x, t = RNG.standard_normal(3), RNG.standard_normal(3)
    value, tangent = kn.runtime.compile(kn.passes.run(forward, "dce"))(x, t)
    np.testing.assert_allclose(np.asarray(tangent), (np.exp(x) * x + np.exp(x)) * t, rtol=1e-14)


def test_bad_tangents_give_clear_errors():
    f = lambda x: x * 2.0  # noqa: E731
    x = np.ones(3)
    with pytest.raises(kn.GradientError, match="tangent of primal 0 has dtype f32 but the primal is f64"):
        kn.jvp(f, (x,), (np.ones(3, np.float32),))
    with pytest.raises(kn.GradientError, match=r"has shape \[2\] but the primal has shape \[3\]"):
        kn.jvp(f, (x,), (np.ones(2),))
    with pytest.raises(kn.GradientError, match="one tangent per primal"):
        kn.jvp(f, (x,), np.ones(3))
    with pytest.raises(kn.GradientError, match="Jacobian with respect to argument 0 of type i32"):
        kn.jacfwd(f)(np.ones(3, np.int32))
