"""Sorting bool arrays (``False`` before ``True``, as NumPy and jax.numpy do), the one StableHLO
compare type per dtype, the one weak-scalar promotion rule, and the one gather along an axis.

Oracles: NumPy for ascending sorts and ``take_along_axis``, jax.numpy / ``jax.lax.top_k`` for
descending sorts, ``jnp.result_type`` for promotion with Python scalars, ``jax.grad`` for
gradients, the StableHLO spec for the compare type.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import dtypes
from kaun_ir.ops import rules
from kaun_ir.ops.emit import comparison_type
from kaun_ir.surface import promotion

RNG = np.random.default_rng(35)
FLAGS = RNG.random((3, 4, 9)) < 0.5
FLAGS[0, 0] = True  # a row of equal values
FLAGS[0, 1] = False


def _stable(x, axis):
    return np.argsort(x, axis=axis, kind="stable").astype(np.int32)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_sort_and_argsort_of_bool_match_numpy_along_every_axis(axis):
    got = np.asarray(kn.sort(FLAGS, axis=axis))
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, np.sort(FLAGS, axis=axis))
    # argsort is stable: equal flags keep their input order
    np.testing.assert_array_equal(np.asarray(kn.argsort(FLAGS, axis=axis)), _stable(FLAGS, axis))


@pytest.mark.parametrize("axis", [0, 2])
def test_descending_bool_sort_matches_jax(axis):
    got = np.asarray(kn.sort(FLAGS, axis=axis, descending=True))
    np.testing.assert_array_equal(got, np.asarray(jnp.sort(FLAGS, axis=axis, descending=True)))
    want = jnp.argsort(FLAGS, axis=axis, descending=True, stable=True)
    np.testing.assert_array_equal(np.asarray(kn.argsort(FLAGS, axis=axis, descending=True)), np.asarray(want))


def test_bool_sort_inside_a_jitted_function_and_under_vmap():
    def f(x):
        return kn.sort(x, axis=1), kn.argsort(x, axis=0), kn.sort(x, axis=1, descending=True)

    values, order, down = kn.jit(f)(FLAGS)
    np.testing.assert_array_equal(np.asarray(values), np.sort(FLAGS, axis=1))
    np.testing.assert_array_equal(np.asarray(order), _stable(FLAGS, 0))
    np.testing.assert_array_equal(np.asarray(down), np.asarray(jnp.sort(FLAGS, axis=1, descending=True)))
    batched = kn.vmap(lambda row: kn.argsort(row))(FLAGS[0])
    np.testing.assert_array_equal(np.asarray(batched), _stable(FLAGS[0], -1))


def test_bool_sort_of_a_list_and_of_a_single_element():
    np.testing.assert_array_equal(np.asarray(kn.sort([True, False, True])), [False, True, True])
    np.testing.assert_array_equal(np.asarray(kn.argsort(np.array([True]))), [0])


def test_top_k_of_bool_matches_jax():
    values, indices = kn.top_k(FLAGS, 4)
    want_values, want_indices = jax.lax.top_k(FLAGS, 4)
    np.testing.assert_array_equal(np.asarray(values), np.asarray(want_values))
    np.testing.assert_array_equal(np.asarray(indices), np.asarray(want_indices))


def test_gradient_through_a_bool_argsort_permutation_matches_jax():
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    w = np.arange(24, dtype=np.float32).reshape(4, 6)

    def loss(module):
        def f(t):
            order = module.argsort(t > 0, axis=1)
            picked = module.take_along_axis(t, order, axis=1)
            return module.sum(module.sort(t, axis=0) * w) + module.sum(picked * picked * w)

        return f

    got = kn.grad(loss(kn))(x)
    want = jax.grad(loss(jnp))(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


def test_bool_sort_lowers_with_an_unsigned_compare():
    text = kn.runtime.lower(kn.trace(lambda x: kn.sort(x, axis=1), FLAGS))
    assert set(re.findall(r"comparison_type (\w+)", text)) == {"UNSIGNED"}


@pytest.mark.parametrize(
    "dtype,kind",
    [
        (dtypes.bool_, "UNSIGNED"),  # the StableHLO spec compares i1 as unsigned
        (dtypes.uint8, "UNSIGNED"),
        (dtypes.uint64, "UNSIGNED"),
        (dtypes.int8, "SIGNED"),
        (dtypes.int64, "SIGNED"),
        (dtypes.float16, "FLOAT"),
        (dtypes.bfloat16, "FLOAT"),
        (dtypes.float64, "FLOAT"),
    ],
)
def test_one_compare_type_per_dtype(dtype, kind):
    assert comparison_type(dtype) == kind


@pytest.mark.parametrize(
    "dtype",
    [dtypes.bool_, dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.uint32, dtypes.float16, dtypes.bfloat16],
)
@pytest.mark.parametrize("scalar", [True, 3, 2.5])
def test_weak_scalar_promotion_matches_jax_in_both_layers(dtype, scalar):
    want = jnp.result_type(dtype, scalar)
    assert dtypes.weak_result_type([dtype], [scalar]) == want
    x = np.ones((), dtype)  # a constant: both promotions convert it with NumPy, nothing to run
    for promote in (promotion.promote, rules.promote):
        assert [np.asarray(v).dtype for v in promote(x, scalar)] == [want, want]


@pytest.mark.parametrize("scalars", [[True], [2], [1.5], [True, 2], [2, 1.5]])
def test_scalars_alone_promote_like_jax(scalars):
    assert dtypes.weak_result_type([], scalars) == jnp.result_type(*scalars)


@pytest.mark.parametrize("axis", [0, 1])
def test_take_along_axis_broadcasts_size_one_axes_like_numpy(axis):
    x = RNG.standard_normal((1, 5)).astype(np.float32) if axis == 1 else RNG.standard_normal((4, 1))
    index_shape = (3, 2) if axis == 1 else (2, 3)
    indices = RNG.integers(-x.shape[axis], x.shape[axis], size=index_shape).astype(np.int32)
    want = np.take_along_axis(x, indices, axis)  # NumPy broadcasts the other axis
    got = kn.take_along_axis(x, indices, axis=axis)
    np.testing.assert_array_equal(np.asarray(got), want)
