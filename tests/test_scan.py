"""``kn.scan`` and ``kn.fori_loop``: values and reverse-mode derivatives against ``jax.lax`` in float64."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn

RNG = np.random.default_rng(7)
W = RNG.standard_normal((3, 3)) * 0.5
XS = RNG.standard_normal((6, 3))
H0 = RNG.standard_normal(3)


def _close(got, want, tol=1e-10):
    got_leaves = jax.tree_util.tree_leaves(jax.tree_util.tree_map(np.asarray, got))
    want_leaves = jax.tree_util.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=tol, atol=tol)


def _rnn(np_mod, scan, reverse=False, unroll=1):
    def loss(w, h0, xs):
        def step(h, x):
            h = np_mod.tanh(h @ w + x)
            return h, {"sq": h * h, "sum": np_mod.sum(h)}

        h, ys = scan(step, h0, xs, reverse=reverse, unroll=unroll)
        return np_mod.sum(h) + np_mod.sum(ys["sq"] * 0.5) + np_mod.sum(ys["sum"] ** 2)

    return loss


@pytest.mark.parametrize("reverse,unroll", [(False, 1), (True, 1), (False, 4), (True, True)])
def test_scan_value_and_grad_match_jax(reverse, unroll):
    mine = _rnn(kn, kn.scan, reverse, unroll)
    theirs = _rnn(jnp, jax.lax.scan, reverse, unroll)
    with jax.enable_x64(True):
        want_v, want_g = jax.value_and_grad(theirs, argnums=(0, 1, 2))(W, H0, XS)
    got_v, got_g = kn.value_and_grad(mine, argnums=(0, 1, 2))(W, H0, XS)
    _close(got_v, want_v)
    _close(got_g, want_g)


@pytest.mark.parametrize("length,reverse,unroll", [(1, False, 1), (2, True, 1), (4, False, 2), (5, True, 3)])
def test_first_step_before_the_loop(length, reverse, unroll):
    """The lowering runs the first step before the while loop, and each stacked output starts as
    that step's value broadcast along the steps (no zero-filled buffer): values and gradients
    with no loop left, a loop of one trip, and unrolled trips with a straight-line remainder."""
    xs = XS[:length]
    mine = _rnn(kn, kn.scan, reverse, unroll)
    with jax.enable_x64(True):
        want = jax.value_and_grad(_rnn(jnp, jax.lax.scan, reverse, unroll), argnums=(0, 1, 2))(W, H0, xs)
    _close(kn.value_and_grad(mine, argnums=(0, 1, 2))(W, H0, xs), want)
    text = kn.runtime.lower(
        kn.trace(lambda h, xs: kn.scan(lambda h, x: (kn.sin(h + x), h * x), h, xs), H0, xs)
    )
    stacked = f"tensor<{length}x3xf64>"
    assert not [line for line in text.splitlines() if "stablehlo.constant" in line and stacked in line]


def test_scan_trees_no_xs_and_eager_call():
    def step(c, _):
        return {"a": c["a"] * 1.5, "n": c["n"] + 1}, c["a"]

    carry, ys = kn.scan(step, {"a": H0, "n": np.int32(0)}, None, length=4)
    np.testing.assert_allclose(np.asarray(carry["a"]), H0 * 1.5**4)
    assert int(carry["n"]) == 4
    np.testing.assert_allclose(np.asarray(ys), np.stack([H0 * 1.5**k for k in range(4)]))


def test_scan_is_one_while_loop_and_grad_of_grad():
    graph = kn.trace(lambda h, xs: kn.scan(lambda h, x: (kn.sin(h * x), None), h, xs)[0], H0, XS)
    assert kn.runtime.lower(graph).count('"stablehlo.while"') == 1

    def f(a, xs):
        return kn.sum(kn.scan(lambda h, x: (kn.sin(h * a + x), h * h), H0, xs)[1])

    def fj(a, xs):
        return jnp.sum(jax.lax.scan(lambda h, x: (jnp.sin(h * a + x), h * h), H0, xs)[1])

    with jax.enable_x64(True):
        want = jax.grad(jax.grad(fj))(0.7, XS)
    _close(kn.grad(kn.grad(f))(np.float64(0.7), XS), want, 1e-9)


def test_nested_scan_grad():
    def f(w, xs):
        def outer(h, row):
            inner, _ = kn.scan(lambda g, x: (kn.tanh(g * w + x), None), h, row[:, None] * np.ones(3))
            return inner, None

        return kn.sum(kn.scan(outer, H0, xs)[0])

    def fj(w, xs):
        def outer(h, row):
            inner, _ = jax.lax.scan(lambda g, x: (jnp.tanh(g * w + x), None), h, row[:, None] * jnp.ones(3))
            return inner, None

        return jnp.sum(jax.lax.scan(outer, H0, xs)[0])

    with jax.enable_x64(True):
        want = jax.grad(fj, argnums=(0, 1))(np.float64(0.3), XS)
    _close(kn.grad(f, argnums=(0, 1))(np.float64(0.3), XS), want)


def test_fori_loop_static_bounds_is_differentiable():
    def f(x):
        return kn.sum(kn.fori_loop(1, 5, lambda i, h: kn.tanh(h * x + i.astype(kn.float64)), x))

    def fj(x):
        return jnp.sum(jax.lax.fori_loop(1, 5, lambda i, h: jnp.tanh(h * x + i), x))

    with jax.enable_x64(True):
        want_v, want_g = jax.value_and_grad(fj)(H0)
    got_v, got_g = kn.value_and_grad(f)(H0)
    _close(got_v, want_v)
    _close(got_g, want_g)


def test_while_loop_grad_is_a_clear_error():
    def f(x, n):
        return kn.sum(kn.fori_loop(0, n, lambda i, h: h * x, x))  # traced bound: a while loop

    with pytest.raises(kn.GradientError, match="trip count.*kn.scan"):
        kn.grad(f)(H0, np.int32(3))


def test_scan_bad_input_errors():
    with pytest.raises(kn.ShapeError, match="different leading axes"):
        kn.scan(lambda h, x: (h, None), H0, (XS, XS[:2]))
    with pytest.raises(TypeError, match="carry must keep its shape and dtype"):
        kn.scan(lambda h, x: (h.astype(kn.float32), None), H0, XS)
    with pytest.raises(TypeError, match="pair"):
        kn.scan(lambda h, x: h, H0, XS)
    with pytest.raises(ValueError, match="length= argument is required"):
        kn.scan(lambda h, x: (h, None), H0, None)


def test_vmap_of_scan_and_of_its_gradient():
    loss = _rnn(kn, kn.scan)
    batch = np.stack([XS, XS[::-1], XS * 0.5])
    got = kn.vmap(loss, in_axes=(None, None, 0))(W, H0, batch)
    np.testing.assert_allclose(np.asarray(got), [float(kn.jit(loss)(W, H0, xs)) for xs in batch], rtol=1e-12)
    per_example = kn.vmap(kn.grad(loss), in_axes=(None, None, 0))(W, H0, batch)
    with jax.enable_x64(True):
        want = jax.vmap(jax.grad(_rnn(jnp, jax.lax.scan)), in_axes=(None, None, 0))(W, H0, batch)
    _close(per_example, want)


def test_jvp_through_scan():
    def f(w):
        return kn.sum(kn.scan(lambda h, x: (kn.tanh(h @ w + x), h * h), H0, XS)[1])

    def fj(w):
        return jnp.sum(jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + x), h * h), H0, XS)[1])

    tangent = np.ones_like(W)
    with jax.enable_x64(True):
        want = jax.jvp(fj, (W,), (tangent,))
    _close(kn.jvp(f, (W,), (tangent,)), want)


@pytest.mark.parametrize(
    ("lower", "upper", "which"),
    [(0.0, 3.5, "lower"), (0, 3.5, "upper"), (True, 3, "lower"), (np.float32(0), 3, "lower")],
)
def test_fori_loop_non_integer_bounds_are_a_type_error(lower, upper, which):
    # jax.lax.fori_loop rounds such bounds differently eagerly and under jit; an error is the only
    # answer that cannot silently give a different trip count
    with pytest.raises(TypeError, match=f"fori_loop: the {which} bound must be an integer"):
        kn.fori_loop(lower, upper, lambda i, c: c + 1.0, np.float32(0))


def test_fori_loop_traced_float_bound_is_a_type_error_and_int_bounds_run():
    count = kn.jit(lambda n: kn.fori_loop(0, n, lambda i, c: c + 1.0, np.float32(0)))
    assert float(count(np.int32(4))) == float(jax.lax.fori_loop(0, 4, lambda i, c: c + 1.0, 0.0))
    with pytest.raises(TypeError, match="upper bound must be an integer scalar, got Tensor"):
        count(np.float32(4))
    assert float(kn.fori_loop(np.int64(1), np.int32(3), lambda i, c: c + 1.0, np.float32(0))) == 2.0
