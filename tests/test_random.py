"""kn.random: determinism, independence, bit-exact agreement with jax.random's default threefry
(jax.random.PRNGKey keys), sample moments, and use under kn.jit with the key as an input."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.errors import ShapeError

kr = kn.random


SEEDS = [0, 1, 42, 2**31 - 1]
SHAPES = [(), (1,), (5,), (3, 4), (2, 3, 5), (0,), (4, 0)]


def jkey(seed):
    return jax.random.PRNGKey(seed)


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    np.testing.assert_array_equal(a, b)


def test_key_matches_prng_key():
    for seed in SEEDS:
        same(kr.key(seed), jkey(seed))
    same(kr.key(np.int32(-1)), jkey(-1))  # a 32-bit seed has a zero high word
    same(kr.key(np.uint32(2**32 - 1)), jkey(np.uint32(2**32 - 1)))
    same(kn.jit(kr.key)(np.int32(7)), jkey(7))  # a traced seed
    with jax.enable_x64(True):  # 64-bit seeds: [seed >> 32, seed & 0xFFFFFFFF]
        for seed in (-1, 2**40 + 3, -(2**63), 2**63 - 1):
            same(kr.key(seed), jax.random.PRNGKey(seed))
        same(kr.key(np.int64(2**40 + 3)), jax.random.PRNGKey(2**40 + 3))
    with pytest.raises(ValueError, match="64 bits"):
        kr.key(2**64)
    with pytest.raises(TypeError):
        kr.key(1.5)


def test_same_key_same_bits_and_different_keys_differ():
    a = np.asarray(kr.bits(kr.key(0), (1000,)))
    same(a, kr.bits(kr.key(0), (1000,)))
    b = np.asarray(kr.bits(kr.key(1), (1000,)))
    c = np.asarray(kr.bits(kr.fold_in(kr.key(0), 7), (1000,)))
    k1, k2 = np.asarray(kr.split(kr.key(0)))
    d, e = np.asarray(kr.bits(k1, (1000,))), np.asarray(kr.bits(k2, (1000,)))
    draws = [a, b, c, d, e]
    for i in range(len(draws)):
        for j in range(i + 1, len(draws)):
            assert np.mean(draws[i] == draws[j]) < 0.01, (i, j)
    assert len(np.unique(a)) > 990  # no short cycles
    # as in jax, fold_in(key, i) is the i-th key of split(key, n)
    same(kr.fold_in(kr.key(0), 3), kr.split(kr.key(0), 5)[3])


def draws(r, k):
    """The same draws from ``r`` = kn.random or jax.random with key ``k``, by name."""
    out = {}
    for shape in ((), (5,), (2, 3, 5), (0,), (4, 0)):
        out[f"bits{shape}"] = r.bits(k, shape)
    out["bits_uint8"] = r.bits(k, (3, 7), np.uint8)
    for num in (1, 3, (2, 2)):
        out[f"split{num}"] = r.split(k, num)
    for data in (7, 2**31 + 5, np.int32(-3)):
        out[f"fold_in{data}"] = r.fold_in(k, data)
    for shape in ((), (3, 4)):  # uniform, normal and bernoulli of one shape share their bits
        out[f"uniform{shape}"] = r.uniform(k, shape)
        out[f"normal{shape}"] = r.normal(k, shape)
        out[f"bernoulli{shape}"] = r.bernoulli(k, 0.3, shape)
        out[f"randint{shape}"] = r.randint(k, shape, -5, 17)
    out["uniform_range"] = r.uniform(k, (3, 4), minval=-2.0, maxval=5.0)
    out["uniform_arrays"] = r.uniform(
        k, (2, 3), minval=np.array([0.0, 10.0, -1.0], np.float32), maxval=np.float32(20.0)
    )
    p = np.array([0.1, 0.5, 0.9], np.float32)
    out["bernoulli_p"] = r.bernoulli(k, p)
    out["bernoulli_p_shape"] = r.bernoulli(k, p, (4, 3))
    for dtype in (np.float16, kn.bfloat16):
        out[f"uniform_{np.dtype(dtype).name}"] = r.uniform(k, (50,), dtype)
        out[f"normal_{np.dtype(dtype).name}"] = r.normal(k, (50,), dtype)
    # randint's bits depend on the shape only: these share them
    out["randint_u8_full"] = r.randint(k, (30,), 0, 256, np.uint8)
    out["randint_i8_clipped"] = r.randint(k, (30,), -300, 300, np.int8)
    out["randint_i32_full"] = r.randint(k, (30,), -(2**31), 2**31 - 1)
    out["randint_empty_range"] = r.randint(k, (30,), 5, 5)  # gives minval
    lo, hi = np.array([0, 10, -7], np.int32), np.array([3, 1000, 7], np.int32)
    out["randint_arrays"] = r.randint(k, (4, 3), lo, hi)
    return out


# one compiled function per library, the key an input: every seed reuses them
KN_DRAWS = kn.jit(lambda k: draws(kr, k))
JAX_DRAWS = jax.jit(lambda k: draws(jax.random, k))


@pytest.mark.parametrize("seed", SEEDS)
def test_bits_split_fold_in_and_samplers_match_jax(seed):
    ours, theirs = KN_DRAWS(kr.key(seed)), JAX_DRAWS(jkey(seed))
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        if name.startswith("normal"):  # erf_inv may round differently; everything else is bit-exact
            tol = 1e-2 if "16" in name else 2e-6
            a, b = np.asarray(ours[name]), np.asarray(theirs[name])
            assert a.dtype == b.dtype and a.shape == b.shape, name
            np.testing.assert_allclose(
                a.astype(np.float32), b.astype(np.float32), rtol=tol, atol=tol, err_msg=name
            )
        else:
            try:
                same(ours[name], theirs[name])
            except AssertionError as err:
                raise AssertionError(f"{name}: {err}") from None
    assert KN_DRAWS.trace_count == 1


def test_eager_calls_match_jax():
    k, jk = kr.key(11), jkey(11)
    same(kr.bits(k, (3, 5)), jax.random.bits(jk, (3, 5)))
    same(kr.split(k, 3), jax.random.split(jk, 3))
    same(kr.fold_in(k, 2), jax.random.fold_in(jk, 2))
    same(kr.uniform(k, (4,)), jax.random.uniform(jk, (4,)))
    np.testing.assert_allclose(np.asarray(kr.normal(k, (4,))), jax.random.normal(jk, (4,)), rtol=2e-6)
    same(kr.bernoulli(k, 0.7, (6,)), jax.random.bernoulli(jk, 0.7, (6,)))
    same(kr.randint(k, (6,), 0, 10), jax.random.randint(jk, (6,), 0, 10))


def test_float64_matches_jax_x64():
    k = kr.key(5)
    u, n, b = kr.uniform(k, (500,), np.float64), kr.normal(k, (500,), np.float64), kr.bits(k, (6,), np.uint64)
    with jax.enable_x64(True):
        jk = jax.random.PRNGKey(5)
        same(u, jax.random.uniform(jk, (500,), np.float64))
        np.testing.assert_allclose(
            np.asarray(n), jax.random.normal(jk, (500,), np.float64), rtol=1e-13, atol=1e-13
        )
        same(b, jax.random.bits(jk, (6,), np.uint64))
        # maxval one past uint32's maximum (jax needs x64 to take 2**32)
        same(kr.randint(k, (30,), 0, 2**32, np.uint32), jax.random.randint(jk, (30,), 0, 2**32, np.uint32))


def test_erf_inv_accuracy():
    from scipy.special import erfinv

    from kaun_ir.surface.random.continuous import erf_inv

    x = np.concatenate([np.linspace(-0.999999, 0.999999, 4001), [0.0, 1e-30, -1e-7, 0.9999999999]])
    f = kn.jit(erf_inv)
    np.testing.assert_allclose(np.asarray(f(x)), erfinv(x), rtol=1e-11, atol=1e-15)
    x32 = x.astype(np.float32)
    np.testing.assert_allclose(np.asarray(f(x32)), erfinv(x32.astype(np.float64)), rtol=2e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(f(np.array([1.0, -1.0], np.float32))), [np.inf, -np.inf])


def test_moments():
    k1, k2, k3, k4 = np.asarray(kr.split(kr.key(123), 4))
    n = 100_000
    u = np.asarray(kr.uniform(k1, (n,)), np.float64)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
    z = np.asarray(kr.normal(k2, (n,)), np.float64)
    assert abs(z.mean()) < 0.015 and abs(z.std() - 1.0) < 0.015
    assert abs(np.mean(np.abs(z) < 1.0) - 0.6827) < 0.01 and abs(np.mean(z**3)) < 0.05
    b = np.asarray(kr.bernoulli(k3, 0.3, (n,)))
    assert b.dtype == np.bool_ and abs(b.mean() - 0.3) < 0.006
    r = np.asarray(kr.randint(k4, (n,), 3, 13))
    assert r.min() == 3 and r.max() == 12
    assert np.all(np.abs(np.bincount(r - 3, minlength=10) / n - 0.1) < 0.006)
    w = np.asarray(kr.uniform(k1, (n,), minval=-3.0, maxval=5.0))
    assert w.min() >= -3.0 and w.max() < 5.0 and abs(w.mean() - 1.0) < 0.05


def test_traced_key_gives_fresh_numbers_without_retracing():
    @kn.jit
    def draw(key, step):
        key = kr.fold_in(key, step)
        a, b = kr.split(key)
        return (
            kr.normal(a, (3, 4)),
            kr.uniform(b, (5,)),
            kr.bernoulli(b, 0.5, (2,)),
            kr.randint(a, (3,), 0, 9),
        )

    first = draw(kr.key(0), np.int32(0))
    second = draw(kr.key(0), np.int32(1))
    third = draw(kr.key(1), np.int32(0))
    again = draw(kr.key(0), np.int32(0))
    assert draw.trace_count == 1
    for x, y in zip(first, again):
        same(x, y)
    assert not np.array_equal(first[0], second[0]) and not np.array_equal(first[0], third[0])
    # the same numbers as the eager functions and as jax
    jk = jax.random.fold_in(jkey(0), 1)
    ja, jb = jax.random.split(jk)
    np.testing.assert_allclose(np.asarray(second[0]), jax.random.normal(ja, (3, 4)), rtol=2e-6, atol=2e-6)
    same(second[1], jax.random.uniform(jb, (5,)))
    same(second[3], jax.random.randint(ja, (3,), 0, 9))
    # a random op in the graph is a composite of integer ops: no new primitive
    ops = {node.op for node in draw.graph(kr.key(0), np.int32(0)).nodes}
    assert {"xor", "shift_left", "shift_right_logical", "add", "bitcast_convert"} <= ops


def test_bad_arguments():
    k = kr.key(0)
    with pytest.raises(TypeError, match="key"):
        kr.uniform(np.zeros(2, np.int32), (3,))
    with pytest.raises(TypeError, match="key"):
        kr.normal(np.zeros((2, 2), np.uint32), (3,))
    with pytest.raises(TypeError, match="float"):
        kr.uniform(k, (3,), np.int32)
    with pytest.raises(TypeError, match="unsigned"):
        kr.bits(k, (3,), np.int32)
    with pytest.raises(ShapeError, match="broadcast"):
        kr.uniform(k, (3,), minval=np.zeros(4, np.float32))
    with pytest.raises(ShapeError, match="broadcast"):
        kr.bernoulli(k, np.full((4,), 0.5, np.float32), (3,))
    with pytest.raises(TypeError, match="randint"):
        kr.randint(k, (3,), 0, 5, np.float32)
    with pytest.raises(TypeError, match="integer"):
        kr.fold_in(k, np.float32(1.0))
