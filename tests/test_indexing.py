"""take, take_along_axis, one_hot, dynamic_(update_)slice and advanced indexing against NumPy / JAX,
both under ``kn.jit`` (index arrays as run-time inputs) and eagerly on concrete arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn

RNG = np.random.default_rng(0)
X = RNG.standard_normal((5, 6, 7)).astype(np.float32)
IDX = np.array([[0, 4, -1], [2, 2, -5]], np.int32)


def check(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------------- take


@pytest.mark.parametrize("axis", [0, 1, 2, -1, None])
def test_take_matches_numpy(axis):
    jitted = kn.jit(lambda x, i: kn.take(x, i, axis=axis))
    check(jitted(X, IDX), np.take(X, IDX, axis=axis))
    check(kn.take(X, IDX, axis=axis), np.take(X, IDX, axis=axis))  # eager


@pytest.mark.parametrize(
    "indices",
    [
        3,
        -2,
        [1, 0, 1],
        [],
        [[5], [-6]],
        np.array([0, 5], np.int64),
        np.array([2, 1], np.uint8),
        np.array(4, np.int16),
    ],
)
def test_take_index_kinds(indices):
    want = np.take(X, np.asarray(indices, dtype=np.int64), axis=1)
    check(kn.take(X, indices, axis=1), want)
    check(kn.jit(lambda x: kn.take(x, indices, axis=1))(X), want)


def test_take_clamps_out_of_range_like_jnp_clip():
    idx = np.array([-100, -7, 6, 7, 100, 3], np.int32)
    want = jnp.take(X, idx, axis=1, mode="clip")
    check(kn.jit(lambda x, i: kn.take(x, i, axis=1))(X, idx), want)


def test_take_int_and_bool_data():
    data = np.arange(12, dtype=np.int32).reshape(3, 4)
    check(kn.take(data, [2, 0], axis=0), data[[2, 0]])
    mask = data % 3 == 0
    check(kn.take(mask, [3, 3, 1], axis=1), mask[:, [3, 3, 1]])


def test_take_from_empty_axis():
    empty = np.zeros((0, 3), np.float32)
    check(kn.take(empty, np.zeros((0,), np.int32), axis=0), np.zeros((0, 3), np.float32))
    with pytest.raises(IndexError, match="size 0"):
        kn.take(empty, [0], axis=0)


def test_take_errors():
    with pytest.raises(kn.ShapeError, match="axis 3"):
        kn.take(X, [0], axis=3)
    with pytest.raises(TypeError, match="integer"):
        kn.take(X, np.array([0.0, 1.0], np.float32), axis=0)
    with pytest.raises(TypeError, match="integer"):
        kn.take(X, [0.5], axis=0)
    with pytest.raises(IndexError, match="boolean"):
        kn.take(X, np.array([True, False]), axis=0)


def test_take_lowers_to_one_gather():
    text = kn.jit(lambda x, i: kn.take(x, i, axis=1)).lower(X, IDX)
    assert text.count('"stablehlo.gather"') == 1


# ------------------------------------------------------------------------ take_along_axis


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_take_along_axis_argsort(axis):
    order = np.argsort(X, axis=axis).astype(np.int32)
    want = np.take_along_axis(X, order, axis=axis)
    check(kn.jit(lambda x, i: kn.take_along_axis(x, i, axis))(X, order), want)
    check(kn.take_along_axis(X, order, axis), want)


def test_take_along_axis_broadcasts_and_wraps():
    x = RNG.standard_normal((4, 1, 3)).astype(np.float32)
    idx = np.array([[[0], [-1]]], np.int32)  # [1, 2, 1]: broadcasts to [4, 2, 1]
    check(kn.take_along_axis(x, idx, 2), np.take_along_axis(x, idx, 2))
    idx2 = np.array([[[3, 0, 1]], [[1, 1, 2]]], np.int64)[:, :, :2]  # [2, 1, 2] vs [4, 1, 3] axis 0
    with pytest.raises(kn.ShapeError):
        kn.take_along_axis(x, idx2, 0)
    idx3 = np.array([[[3]], [[-2]]], np.int32)  # [2, 1, 1] on axis 0: other axes broadcast
    check(kn.take_along_axis(x, idx3, 0), np.take_along_axis(x, idx3, 0))


def test_take_along_axis_flat_and_clamped():
    idx = np.array([0, 209, -1, 57], np.int32)
    check(kn.take_along_axis(X, idx, None), np.take_along_axis(X, idx, None))
    far = np.array([[-50], [9], [2]], np.int32)
    m = X[0, :3]
    check(kn.take_along_axis(m, far, 1), jnp.take_along_axis(m, far, 1, mode="clip"))


def test_take_along_axis_errors():
    with pytest.raises(kn.ShapeError, match="same rank"):
        kn.take_along_axis(X, np.zeros((2, 2), np.int32), 0)
    with pytest.raises(kn.ShapeError, match="axis"):
        kn.take_along_axis(X, np.zeros((1, 1, 1), np.int32), 5)
    with pytest.raises(TypeError):
        kn.take_along_axis(X, np.zeros((1, 1, 1), np.float32), 0)


# ---------------------------------------------------------------------------------- one_hot


@pytest.mark.parametrize(
    "labels,dtype,axis",
    [
        (np.array([0, 3, 1, 4], np.int32), kn.float32, -1),
        (np.array([[2, -1], [5, 0]], np.int32), kn.float32, -1),  # out of range -> zero rows
        (np.array([1, 0, 2], np.uint8), kn.int32, -1),
        (np.array([[1, 4, 0]], np.int64), kn.bfloat16, 0),
        (np.array(2, np.int32), kn.float32, -1),
    ],
)
def test_one_hot_matches_jax(labels, dtype, axis):
    want = np.asarray(jax.nn.one_hot(labels, 5, dtype=dtype, axis=axis))
    check(kn.jit(lambda lab: kn.one_hot(lab, 5, dtype=dtype, axis=axis))(labels), want)
    check(kn.one_hot(labels, 5, dtype=dtype, axis=axis), want)


def test_one_hot_list_and_errors():
    check(kn.one_hot([0, 2], 3), np.eye(3, dtype=np.float32)[[0, 2]])
    check(kn.one_hot(np.array([1], np.int32), 0), np.zeros((1, 0), np.float32))
    with pytest.raises(TypeError, match="integer"):
        kn.one_hot(np.array([0.0, 1.0], np.float32), 3)
    with pytest.raises(TypeError, match="integer"):
        kn.one_hot(np.array([True, False]), 3)
    with pytest.raises(TypeError, match="num_classes"):
        kn.one_hot([0], -1)


# --------------------------------------------------------------------------- dynamic slices


@pytest.mark.parametrize(
    "starts,sizes",
    [
        ((1, 2, 3), (2, 3, 4)),
        ((4, 5, 6), (2, 2, 2)),  # clamped at the end
        ((-1, -6, 0), (1, 3, 7)),  # negative starts count from the end, then clamp
        ((-20, 30, 2), (5, 0, 1)),
    ],
)
def test_dynamic_slice_matches_lax(starts, sizes):
    want = jax.lax.dynamic_slice(X, starts, sizes)
    check(kn.dynamic_slice(X, starts, sizes), want)
    scalars = [np.int32(s) for s in starts]
    check(kn.jit(lambda x, s: kn.dynamic_slice(x, s, sizes))(X, scalars), want)
    check(kn.jit(lambda x, s: kn.dynamic_slice(x, s, sizes))(X, np.array(starts, np.int32)), want)


def test_dynamic_slice_errors():
    with pytest.raises(kn.ShapeError):
        kn.dynamic_slice(X, (0, 0), (1, 1))
    with pytest.raises(kn.ShapeError):
        kn.dynamic_slice(X, (0, 0, 0), (6, 1, 1))
    with pytest.raises(TypeError, match="integer"):
        kn.dynamic_slice(X, (0, 0.5, 0), (1, 1, 1))


@pytest.mark.parametrize(
    "starts,update_shape",
    [
        ((1, 2, 3), (2, 3, 4)),
        ((4, 5, 6), (3, 2, 2)),  # clamped at the end
        ((-2, -1, 0), (1, 6, 7)),
        ((0, 0, 0), (0, 2, 2)),
    ],
)
def test_dynamic_update_slice_matches_lax(starts, update_shape):
    update = RNG.standard_normal(update_shape).astype(np.float32)
    want = jax.lax.dynamic_update_slice(X, update, starts)
    check(kn.dynamic_update_slice(X, update, starts), want)
    scalars = [np.int32(s) for s in starts]
    check(kn.jit(lambda x, u, s: kn.dynamic_update_slice(x, u, s))(X, update, scalars), want)


def test_dynamic_update_slice_converts_update_and_checks_rank():
    base = np.zeros((3, 4), np.int32)
    got = kn.dynamic_update_slice(base, np.ones((2, 2), np.float32) * 2, (1, 1))
    want = base.copy()
    want[1:3, 1:3] = 2
    check(got, want)
    with pytest.raises(kn.ShapeError, match="rank"):
        kn.dynamic_update_slice(base, np.ones((2,), np.int32), (0, 0))


# ------------------------------------------------------------------------ advanced indexing

ROWS = np.array([[0, 4], [-1, 2]], np.int32)
COLS = np.array([5, -6], np.int32)

PATTERNS = {
    "x[i]": lambda x, i, j: x[i],
    "x[:, i]": lambda x, i, j: x[:, i],
    "x[..., i]": lambda x, i, j: x[..., j],
    "x[i, 1:3]": lambda x, i, j: x[i, 1:3],
    "x[::-2, j]": lambda x, i, j: x[::-2, j],
    "x[i, j]": lambda x, i, j: x[i, j],
    "x[:, j, j]": lambda x, i, j: x[:, j, j],
    "x[i, :, j]": lambda x, i, j: x[i, :, j],  # separated: broadcast axes go first
    "x[0, :, j]": lambda x, i, j: x[0, :, j],  # an int counts as advanced
    "x[i, 2]": lambda x, i, j: x[i, 2],
    "x[None, i, j]": lambda x, i, j: x[None, i, j],
    "x[i, None, j]": lambda x, i, j: x[i, None, j],  # None separates too
    "x[1:, j, ..., j]": lambda x, i, j: x[1:, j, ..., j],  # so does an (empty) ellipsis
    "x[i, j, -1]": lambda x, i, j: x[i, j, -1],
    "x[[1, -1], 2:]": lambda x, i, j: x[[1, -1], 2:],
    "x[[[0], [3]], [1, 2]]": lambda x, i, j: x[[[0], [3]], [1, 2]],
    "x[[]]": lambda x, i, j: x[np.zeros((0,), np.int32)] if isinstance(x, np.ndarray) else x[[]],
}


@pytest.mark.parametrize("name", list(PATTERNS))
def test_advanced_indexing_traced(name):
    pattern = PATTERNS[name]
    want = pattern(X, ROWS, COLS)
    check(kn.jit(pattern)(X, ROWS, COLS), want)


@pytest.mark.parametrize(
    "index",
    [
        (ROWS,),
        (slice(None), ROWS),
        (ROWS, slice(1, 3)),
        (ROWS, COLS),
        (0, Ellipsis, COLS),
        ([2, 0], None, slice(None, None, 2)),
        (np.int64(3), COLS),
    ],
)
def test_advanced_indexing_eager(index):
    check(kn.getitem(X, index), X[index])


def test_advanced_indexing_with_static_index_arrays_while_tracing():
    # NumPy index arrays captured by the traced function become constants of the graph
    check(kn.jit(lambda x: x[ROWS, :, COLS[:, None, None]])(X), X[ROWS, :, COLS[:, None, None]])


def test_advanced_indexing_clamps_run_time_indices():
    rows = np.array([-100, 4, 5, 100], np.int32)
    want = np.asarray(jnp.asarray(X).at[rows].get(mode="clip"))
    check(kn.jit(lambda x, i: x[i])(X, rows), want)


def test_advanced_indexing_other_dtypes():
    data = np.arange(24, dtype=np.int64).reshape(4, 6)
    rows = np.array([3, 0], np.uint32)
    check(kn.jit(lambda x, i: x[i, 1::2])(data, rows), data[rows, 1::2])
    check(kn.jit(lambda x, i: x[:, i])(data > 10, np.array([[5]], np.int8)), (data > 10)[:, [[5]]])


def test_advanced_indexing_errors():
    with pytest.raises(IndexError, match="boolean mask"):
        kn.jit(lambda x: x[x > 0])(X)
    with pytest.raises(IndexError, match="boolean mask"):
        kn.getitem(X, (np.array([True, False, True, False, True]),))
    with pytest.raises(IndexError, match="boolean mask"):
        kn.jit(lambda x: x[[True, False, True, False, True]])(X)
    with pytest.raises(TypeError, match="integer"):
        kn.jit(lambda x: x[np.array([0.0, 1.0])])(X)
    with pytest.raises(IndexError, match="too many"):
        kn.jit(lambda x: x[ROWS, 0, 0, 0])(X)
    with pytest.raises(IndexError, match="do not broadcast"):
        kn.jit(lambda x: x[np.array([0, 1]), np.array([0, 1, 2])])(X)
    with pytest.raises(IndexError, match="out of bounds for axis 1"):
        kn.jit(lambda x: x[:, [0, 6]])(X)
    with pytest.raises(IndexError, match="single ellipsis"):
        kn.jit(lambda x: x[..., [0], ...])(X)
    with pytest.raises(IndexError, match="size 0"):
        kn.jit(lambda x, i: x[:, i])(np.zeros((2, 0), np.float32), np.array([0], np.int32))


def test_advanced_indexing_lowers_to_gather():
    graph_text = kn.jit(lambda x, i, j: x[i, :, j]).lower(X, ROWS, COLS)
    assert '"stablehlo.gather"' in graph_text


# ------------------------------------------------------------------------------ gradients


def _vjp_pair(kn_fn, jax_fn, x):
    """kn.vjp against jax.vjp with one random cotangent (exercises the ops' VJP rules)."""
    out, pullback = kn.vjp(kn_fn, x)
    ct = RNG.standard_normal(np.shape(out)).astype(np.float32)
    got = pullback(ct)[0]
    want = jax.vjp(jax_fn, x)[1](ct)[0]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_vjp_through_advanced_indexing_accumulates_duplicates():
    # ROWS has -1 and 4 (the same row): their cotangents add up
    _vjp_pair(lambda x: x[ROWS, :, COLS], lambda x: x[ROWS, :, COLS], X)


def test_vjp_through_take_with_clamped_indices():
    idx = np.array([0, 9, -9, 3, 3], np.int32)
    _vjp_pair(lambda x: kn.take(x, idx, axis=1), lambda x: jnp.take(x, idx, axis=1, mode="clip"), X)


def test_vjp_through_take_along_axis_and_dynamic_slices():
    order = np.argsort(X, axis=2).astype(np.int32)[..., :3]
    _vjp_pair(lambda x: kn.take_along_axis(x, order, 2), lambda x: jnp.take_along_axis(x, order, 2), X)
    _vjp_pair(
        lambda x: kn.dynamic_slice(x, (4, 1, -2), (2, 3, 2)),
        lambda x: jax.lax.dynamic_slice(x, (4, 1, -2), (2, 3, 2)),
        X,
    )
    upd = np.ones((2, 2, 2), np.float32)
    _vjp_pair(
        lambda x: kn.dynamic_update_slice(x, upd, (1, 5, 0)),
        lambda x: jax.lax.dynamic_update_slice(x, upd, (1, 5, 0)),
        X,
    )
