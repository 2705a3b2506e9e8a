"""kn.init: initialisers against jax.nn.initializers (same key -> same values) and their
distributions checked statistically on large draws; fan conventions; argument errors."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.nn import init

KEY = kn.random.key(42)
JAX_KEY = jax.random.PRNGKey(42)
BIG = (400, 300)  # 120k draws: sample moments within ~1% of the truth


def _np(x):
    return np.asarray(x)


@pytest.mark.parametrize(
    "name", ["glorot_uniform", "glorot_normal", "he_uniform", "he_normal", "lecun_uniform", "lecun_normal"]
)
def test_named_schemes_match_jax_on_dense_shapes(name):
    got = _np(getattr(init, name)()(KEY, (30, 20)))
    want = np.asarray(getattr(jax.nn.initializers, name)()(JAX_KEY, (30, 20), np.float32))
    assert got.dtype == np.float32 and got.shape == (30, 20)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_conv_kernel_fans_use_the_oihw_layout():
    shape = (8, 4, 3, 3)  # [out, in, kh, kw]: fan_in = 4 * 9, fan_out = 8 * 9
    got = _np(init.he_uniform()(KEY, shape))
    # jax's form of the same draw: uniform(-1, 1) * sqrt(3 * 2 / fan_in)
    want = _np(kn.random.uniform(KEY, shape, kn.float32, -1.0, 1.0)) * np.float32(math.sqrt(6 / 36))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # explicit axes follow jax: HWIO with in_axis=-2, out_axis=-1 has fans 36 and 72
    hwio = _np(init.glorot_uniform(in_axis=-2, out_axis=-1)(KEY, (3, 3, 4, 8)))
    limit = math.sqrt(6 / (36 + 72))
    assert np.abs(hwio).max() <= limit and np.abs(hwio).max() > 0.9 * limit


def test_simple_initialisers_match_jax():
    def pair(ours, theirs):
        return _np(ours(KEY, (30, 20))), np.asarray(theirs(JAX_KEY, (30, 20), np.float32))

    np.testing.assert_allclose(*pair(init.normal(0.5), jax.nn.initializers.normal(0.5)), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(*pair(init.uniform(0.5), jax.nn.initializers.uniform(0.5)))
    np.testing.assert_allclose(
        *pair(init.truncated_normal(0.5), jax.nn.initializers.truncated_normal(0.5)), rtol=1e-5, atol=1e-6
    )


def test_constants():
    z = _np(init.zeros(KEY, (2, 3)))
    o = _np(init.ones(None, (4,), kn.float64))
    c = _np(init.constant(-2.5)(KEY, (3,), kn.bfloat16))
    assert z.dtype == np.float32 and not z.any() and z.shape == (2, 3)
    assert o.dtype == np.float64 and (o == 1).all()
    assert c.dtype == kn.bfloat16 and (c.astype(np.float32) == -2.5).all()


@pytest.mark.parametrize(
    "shape, fans",
    [
        ((30, 20), (30, 20)),  # dense [in, out]
        ((8, 4, 3, 3), (36, 72)),  # conv2d [out, in, kh, kw]
        ((6, 2, 5), (10, 30)),  # conv1d [out, in, k]
        ((7,), (7, 7)),
        ((), (1, 1)),
    ],
)
def test_compute_fans_convention(shape, fans):
    assert init.compute_fans(shape) == tuple(float(f) for f in fans)


def test_compute_fans_with_explicit_axes():
    assert init.compute_fans((3, 3, 4, 8), in_axis=-2, out_axis=-1) == (36.0, 72.0)
    assert init.compute_fans((5, 6), in_axis=1, out_axis=0) == (6.0, 5.0)
    with pytest.raises(ValueError, match="rank"):
        init.compute_fans((5,), in_axis=0)


# (initialiser, expected variance on BIG = [400, 300], bound or None)
_FAN_IN, _FAN_OUT = 400.0, 300.0
_AVG = (_FAN_IN + _FAN_OUT) / 2
STATS = {
    "glorot_uniform": (init.glorot_uniform(), 1 / _AVG, math.sqrt(3 / _AVG)),
    "glorot_normal": (init.glorot_normal(), 1 / _AVG, 2 * math.sqrt(1 / _AVG) / 0.8796256610342398),
    "he_uniform": (init.he_uniform(), 2 / _FAN_IN, math.sqrt(6 / _FAN_IN)),
    "he_normal": (init.he_normal(), 2 / _FAN_IN, 2 * math.sqrt(2 / _FAN_IN) / 0.8796256610342398),
    "lecun_uniform": (init.lecun_uniform(), 1 / _FAN_IN, math.sqrt(3 / _FAN_IN)),
    "lecun_normal": (init.lecun_normal(), 1 / _FAN_IN, 2 * math.sqrt(1 / _FAN_IN) / 0.8796256610342398),
    "fan_out_normal": (init.variance_scaling(3.0, "fan_out", "normal"), 3 / _FAN_OUT, None),
    "normal": (init.normal(0.2), 0.04, None),
}


@pytest.mark.parametrize("name", sorted(STATS))
def test_distribution_moments_and_bounds(name):
    initializer, variance, bound = STATS[name]
    x = _np(initializer(KEY, BIG)).astype(np.float64)
    assert abs(x.mean()) < 4 * math.sqrt(variance / x.size)
    assert abs(x.var() / variance - 1) < 0.03, (x.var(), variance)
    if bound is not None:
        assert np.abs(x).max() <= bound * (1 + 1e-6)
        assert np.abs(x).max() > 0.95 * bound  # the range is used up to the limit
    if name.endswith("_uniform"):
        # a uniform's fourth standardised moment is 1.8 (a normal's is 3)
        assert abs((x**4).mean() / x.var() ** 2 - 1.8) < 0.05


def test_uniform_ranges():
    x = _np(init.uniform(0.3)(KEY, BIG))
    assert x.min() >= 0 and x.max() < 0.3 and abs(x.mean() - 0.15) < 0.005
    y = _np(init.uniform((-2.0, 1.0))(KEY, BIG))
    assert y.min() >= -2 and y.max() < 1 and abs(y.mean() + 0.5) < 0.02


def test_truncated_normal_stays_within_two_stddev():
    x = _np(init.truncated_normal(1.0)(KEY, BIG))
    assert np.abs(x).max() <= 2.0
    # the variance of a standard normal truncated to [-2, 2]
    assert abs(x.var() / 0.8796256610342398**2 - 1) < 0.03


@pytest.mark.parametrize("dtype", [kn.float64, kn.bfloat16, kn.float16])
def test_dtypes(dtype):
    for initializer in (init.he_normal(), init.glorot_uniform(), init.normal(1.0)):
        x = _np(initializer(KEY, (16, 8), dtype))
        assert x.dtype == dtype and x.shape == (16, 8)
        assert np.isfinite(x.astype(np.float32)).all() and x.astype(np.float32).std() > 0


def test_argument_errors():
    with pytest.raises(ValueError, match="mode"):
        init.variance_scaling(1.0, mode="fan_sideways")
    with pytest.raises(ValueError, match="distribution"):
        init.variance_scaling(1.0, distribution="cauchy")
    with pytest.raises(ValueError, match="scale"):
        init.variance_scaling(0.0)
    with pytest.raises(ValueError, match="low < high"):
        init.uniform((1.0, -1.0))
    with pytest.raises(ValueError, match="stddev"):
        init.normal(-1.0)
    with pytest.raises(TypeError, match="floating-point"):
        init.he_normal()(KEY, (3, 3), kn.int32)
    with pytest.raises(ValueError, match="negative"):
        init.zeros(KEY, (3, -1))


def test_same_key_same_values_different_keys_differ():
    a = _np(init.he_normal()(KEY, (5, 5)))
    b = _np(init.he_normal()(KEY, (5, 5)))
    c = _np(init.he_normal()(kn.random.key(43), (5, 5)))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
