"""kn.sum / mean / max / ... / softmax against jax.numpy (the oracle), over axes, keepdims, dtypes.

To keep the run fast, most tests build one function returning many results and run it through
both ``kn.jit`` and ``jax.jit`` (one compile each); a few calls check the eager path too.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.errors import ShapeError

RNG = np.random.default_rng(0)


X3 = RNG.standard_normal((2, 3, 4)).astype(np.float32)
AXES = [None, 0, -1, (0, 2), (2, 0, 1), ()]
CASES = [(axis, keepdims) for axis in AXES for keepdims in (False, True)]
REDUCTIONS = ["sum", "mean", "max", "min", "prod", "var", "std", "all", "any"]

# the oracle namespace: jax.numpy plus the softmax family from jax.nn / jax.scipy
JAX = types.SimpleNamespace(
    **{name: getattr(jnp, name) for name in REDUCTIONS + ["argmax", "argmin"]},
    softmax=jax.nn.softmax,
    log_softmax=jax.nn.log_softmax,
    logsumexp=jax.scipy.special.logsumexp,
)


def both(body, *args):
    """``body(namespace, *args)`` (returning a list) under kn.jit with ``kn`` and jax.jit with jax."""
    ours = kn.jit(lambda *a: body(kn, *a))(*args)
    theirs = jax.jit(lambda *a: body(JAX, *a))(*args)
    return ours, theirs


def _data(dtype, shape=(2, 3, 4)):
    if dtype == np.bool_:
        return RNG.random(shape) < 0.6
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(0 if np.dtype(dtype).kind == "u" else -3, 4, size=shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def _check(actual, expected, rtol=2e-6, atol=2e-6):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    if actual.dtype.kind in "biu":
        np.testing.assert_array_equal(actual, expected)
    else:
        np.testing.assert_allclose(
            actual.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True
        )


def _check_all(pairs, **tol):
    ours, theirs = pairs
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        try:
            _check(a, b, **tol)
        except AssertionError as err:
            raise AssertionError(f"result {i}: {err}") from None


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
def test_every_reduction_axis_and_keepdims(dtype):
    x = _data(dtype)
    names = [n for n in REDUCTIONS if not (dtype == np.bool_ and n in ("var", "std"))]
    _check_all(both(lambda m, x: [getattr(m, n)(x, axis=a, keepdims=k) for n in names for a, k in CASES], x))


def test_eager_calls():
    for name in REDUCTIONS + ["argmax", "argmin", "logsumexp"]:
        _check(getattr(kn, name)(X3, axis=1), getattr(JAX, name)(X3, axis=1), rtol=1e-5)
    _check(kn.softmax(X3), jax.nn.softmax(X3), rtol=1e-5)
    _check(kn.sum(X3), jnp.sum(X3), rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float16, kn.bfloat16])
def test_narrow_dtypes(dtype):
    """bool / narrow integers accumulate in (u)int32; float16 / bfloat16 in float32 (as jnp)."""
    x = _data(dtype)
    names = ("sum", "prod", "mean", "max", "var")
    loose = dict(rtol=1e-2, atol=1e-2) if np.dtype(dtype).kind == "f" else {}
    _check_all(both(lambda m, x: [getattr(m, n)(x, axis=(0, 2)) for n in names], x), **loose)


def test_float64_against_numpy():
    x = _data(np.float64)  # jax without x64 would compute in float32: NumPy is the oracle here
    names = ("sum", "prod", "mean", "max", "min", "var", "std", "argmax")
    outs = kn.jit(lambda x: [getattr(kn, n)(x, axis=1) for n in names])(x)
    for name, out in zip(names, outs):
        expected = getattr(np, name)(x, axis=1)
        _check(out, expected.astype(np.int32) if name == "argmax" else expected, rtol=1e-12, atol=1e-12)


def test_scalar_and_size_one_axes():
    s = np.float32(2.5)
    x = _data(np.float32, (1, 3, 1))
    _check_all(
        both(
            lambda m, s, x: (
                [getattr(m, n)(s) for n in REDUCTIONS]
                + [getattr(m, n)(x, axis=a, keepdims=True) for n in REDUCTIONS for a in (0, (0, 2), None)]
                + [m.argmax(x, axis=0), m.argmin(x, axis=2, keepdims=True), m.softmax(x, axis=0)]
            ),
            s,
            x,
        )
    )


def test_size_zero_axes():
    x = np.zeros((0, 3), np.float32)
    names = ("sum", "prod", "all", "any")
    _check_all(
        both(
            lambda m, x: (
                [getattr(m, n)(x, axis=a) for n in names for a in (0, 1, None)]
                + [m.max(x, axis=1), m.logsumexp(x, axis=0), m.softmax(x, axis=0)]
            ),
            x,
        )
    )
    assert np.isnan(np.asarray(kn.mean(x, axis=0))).all()
    empty_int = kn.sum(np.zeros((0,), np.int32))
    assert empty_int.dtype == np.int32 and int(empty_int) == 0
    for name in ("max", "min", "argmax", "argmin"):
        with pytest.raises(ValueError, match="empty|zero-size"):
            getattr(kn, name)(x, axis=0)
        with pytest.raises(ValueError):
            getattr(kn, name)(x)


def test_var_std_ddof():
    x, i = _data(np.float32), _data(np.int32)
    _check_all(
        both(
            lambda m, x, i: [
                m.var(x, axis=1, ddof=1),
                m.std(x, axis=(0, 1), ddof=1, keepdims=True),
                m.std(i),
                m.var(i, axis=-1, ddof=2),
            ],
            x,
            i,
        )
    )


def test_max_min_propagate_nan():
    x = X3.copy()
    x[1, 2, 3] = np.nan
    _check_all(both(lambda m, x: [m.max(x, axis=2), m.min(x), m.max(x, axis=(0, 1))], x))


def test_argmax_argmin_axes_and_dtypes():
    x = _data(np.float32)
    _check_all(
        both(
            lambda m, x: [
                f(x, axis=a, keepdims=k)
                for f in (m.argmax, m.argmin)
                for a in (None, 0, 1, -1)
                for k in (False, True)
            ],
            x,
        )
    )
    ints, bools, uints, doubles = _data(np.int32), _data(np.bool_), _data(np.uint8), _data(np.float64)
    arrays = (ints, bools, uints, doubles)
    outs = kn.jit(lambda *xs: [f(v, axis=2) for f in (kn.argmax, kn.argmin) for v in xs])(*arrays)
    expected = [f(v, axis=2).astype(np.int32) for f in (np.argmax, np.argmin) for v in arrays]
    for out, want in zip(outs, expected):
        _check(out, want)


def test_arg_ties_and_nan_follow_numpy():
    ties = np.array([[1, 3, 3, 0, 3], [2, 2, 2, 2, 2], [-1, -5, -5, 7, -5], [0, 0, -9, 9, 9]], np.float32)
    nan = np.array(
        [
            [1, np.nan, 3, np.nan],
            [np.inf, 2, -np.inf, 0],
            [-np.inf] * 4,
            [np.nan] * 4,
            [np.inf] * 4,
            [5, 5, np.nan, 5],
        ],
        np.float32,
    )
    # a long axis, so XLA combines in a tree: still the first of equal values / the first NaN
    long = np.zeros((3, 1000), np.float32)
    long[0, [17, 400, 999]] = 1.0
    long[1, [500, 3]] = np.nan
    long[2, ::7] = -1.0

    def body(m, ties, nan, long):
        return [
            f(v, axis=a)
            for f in (m.argmax, m.argmin)
            for v, a in ((ties, 1), (ties.T, 0), (nan, 1), (nan, None), (long, 1))
        ]

    outs = kn.jit(lambda *a: body(kn, *a))(ties, nan, long)
    expected = [
        np.asarray(f(v, axis=a)).astype(np.int32)
        for f in (np.argmax, np.argmin)
        for v, a in ((ties, 1), (ties.T, 0), (nan, 1), (nan, None), (long, 1))
    ]
    for out, want in zip(outs, expected):
        _check(out, want)  # NumPy: ties pick the first index, the first NaN wins


def test_all_any_of_numbers():
    x = np.array([[0.0, 1.0, np.nan], [0.0, 0.0, 0.0], [2.0, -1.0, 3.0]], np.float32)
    i = np.array([[0, 3], [5, 7]], np.int32)
    _check_all(both(lambda m, x, i: [m.all(x, axis=1), m.any(x, axis=1), m.all(i, axis=0), m.any(i)], x, i))


def test_softmax_family():
    x = _data(np.float32) * 3
    axes = (-1, 0, (0, 1), None)
    _check_all(
        both(
            lambda m, x: (
                [m.softmax(x, axis=a) for a in axes]
                + [m.log_softmax(x, axis=a) for a in axes]
                + [m.logsumexp(x, axis=a, keepdims=k) for a in axes for k in (False, True)]
            ),
            x,
        ),
        rtol=1e-5,
        atol=1e-5,
    )


def test_softmax_rows_sum_to_one_and_large_values_do_not_overflow():
    x = RNG.standard_normal((5, 7)).astype(np.float32) * 1000.0
    big = np.array([[1e4, 1e4 + 1.0, -1e4], [88.0, 89.0, 90.0]], np.float32)
    edge = np.array([[-np.inf, -np.inf], [np.inf, 0.0]], np.float32)
    p, lse, log_p, lse_edge, p_int = kn.jit(
        lambda x, big, edge, i: [
            kn.softmax(x),
            kn.logsumexp(big, axis=1),
            kn.log_softmax(big),
            kn.logsumexp(edge, axis=1),
            kn.softmax(i),
        ]
    )(x, big, edge, np.arange(6, dtype=np.int32).reshape(2, 3))
    p = np.asarray(p)
    assert np.all(np.isfinite(p)) and np.all(p >= 0)
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=1e-5)
    assert np.all(np.isfinite(np.asarray(lse)))
    _check(lse, jax.scipy.special.logsumexp(big, axis=1), rtol=1e-6)
    assert np.all(np.isfinite(np.asarray(log_p)))
    # a row of -inf gives -inf (no NaN); +inf stays +inf
    np.testing.assert_array_equal(np.asarray(lse_edge), [-np.inf, np.inf])
    # integers are converted to float32
    _check(p_int, jax.nn.softmax(np.arange(6, dtype=np.float32).reshape(2, 3)))


def test_gradients_match_jax():
    x = _data(np.float32)
    x[0, 1, 2] = x[0, 1, 0]  # a tie for max / min
    z = x.copy()
    z[1, 2, 1] = 0.0  # a zero for prod

    def losses(m, g, x, z):
        def loss(f):
            return g(lambda v: m.sum(m.sin(f(v))))

        return [
            loss(lambda v: m.sum(v, axis=1))(x),
            loss(lambda v: m.mean(v, axis=(0, 2)))(x),
            loss(lambda v: m.max(v, axis=2, keepdims=True))(x),
            loss(lambda v: m.min(v))(x),
            loss(lambda v: m.prod(v, axis=-1))(x),
            loss(lambda v: m.prod(v, axis=-1))(z),
            loss(lambda v: m.var(v, axis=1))(x),
            loss(lambda v: m.std(v, axis=0))(x),
            loss(lambda v: m.logsumexp(v, axis=-1))(x),
            loss(lambda v: m.softmax(v, axis=1))(x),
            loss(lambda v: m.log_softmax(v))(x),
        ]

    ours = kn.jit(lambda x, z: losses(kn, kn.grad, x, z))(x, z)
    oracle = types.SimpleNamespace(**vars(JAX), sin=jnp.sin)
    theirs = jax.jit(lambda x, z: losses(oracle, jax.grad, x, z))(x, z)
    _check_all((ours, theirs), rtol=2e-5, atol=2e-6)


def test_softmax_max_is_not_differentiated():
    graph = kn.jit(kn.grad(lambda x: kn.sum(kn.logsumexp(x, axis=1)))).graph(X3)
    # the gradient is exp(x - lse): no cotangent flows through the max (no compare of x with it)
    assert "EQ" not in {node.attr("direction") for node in graph.nodes if node.op == "compare"}


def test_inside_jit_traces_reduce_ops():
    jitted = kn.jit(lambda x: [kn.sum(x, axis=1), kn.argmax(x, axis=-1), kn.softmax(x)])
    jitted(X3)
    ops = {node.op for node in jitted.graph(X3).nodes}
    assert {"reduce", "argmax"} <= ops


def test_bad_axes():
    with pytest.raises(ShapeError, match="out of bounds"):
        kn.sum(X3, axis=3)
    with pytest.raises(ShapeError, match="out of bounds"):
        kn.mean(X3, axis=(0, -4))
    with pytest.raises(ShapeError, match="repeated"):
        kn.max(X3, axis=(1, -2))
    with pytest.raises(TypeError, match="axis"):
        kn.argmax(X3, axis=(0, 1))
    with pytest.raises(TypeError, match="axis"):
        kn.sum(X3, axis=1.5)
