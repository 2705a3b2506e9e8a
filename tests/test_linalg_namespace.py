"""``kn.linalg``: NumPy's linalg spelling (norm, det, slogdet, solve, inv, cholesky, qr) checked
against ``numpy.linalg`` eagerly, batched and under ``kn.jit``; one derivative against the
closed form; the errors for what the op table cannot express."""

from __future__ import annotations

import numpy as np
import pytest

import kaun_ir as kn

RS = np.random.default_rng(7)
A = RS.normal(size=(6, 6)).astype(np.float32)
BATCH = RS.normal(size=(3, 4, 4)).astype(np.float32)
SPD = (A @ A.T + 6 * np.eye(6)).astype(np.float32)
B = RS.normal(size=(6, 2)).astype(np.float32)
TOL = {"rtol": 2e-4, "atol": 2e-5}


def test_the_namespace_resolves_with_numpy_spellings():
    for name in ("norm", "det", "slogdet", "solve", "inv", "cholesky", "qr", "matmul", "outer"):
        assert callable(getattr(kn.linalg, name)) and getattr(kn.linalg, name).__doc__


@pytest.mark.parametrize("a", [A, BATCH], ids=["matrix", "batch"])
def test_det_slogdet_inv_against_numpy(a):
    np.testing.assert_allclose(np.asarray(kn.linalg.det(a)), np.linalg.det(a), **TOL)
    sign, logdet = kn.linalg.slogdet(a)
    want = np.linalg.slogdet(a)
    np.testing.assert_array_equal(np.asarray(sign), want.sign)
    np.testing.assert_allclose(np.asarray(logdet), want.logabsdet, **TOL)
    np.testing.assert_allclose(np.asarray(kn.linalg.inv(a)), np.linalg.inv(a), rtol=1e-3, atol=1e-4)


def test_solve_matrix_vector_and_jit():
    np.testing.assert_allclose(np.asarray(kn.linalg.solve(A, B)), np.linalg.solve(A, B), **TOL)
    np.testing.assert_allclose(np.asarray(kn.linalg.solve(A, B[:, 0])), np.linalg.solve(A, B[:, 0]), **TOL)
    jitted = kn.jit(lambda a, b: kn.linalg.solve(a, b))
    np.testing.assert_allclose(np.asarray(jitted(A, B)), np.linalg.solve(A, B), **TOL)
    # a pivot is needed: the leading entry is zero
    perm = np.array([[0.0, 1.0], [1.0, 0.0]], np.float32)
    got = kn.linalg.solve(perm, np.array([2.0, 3.0], np.float32))
    np.testing.assert_allclose(np.asarray(got), [3.0, 2.0])


def test_cholesky_and_singular_matrices():
    np.testing.assert_allclose(np.asarray(kn.linalg.cholesky(SPD)), np.linalg.cholesky(SPD), **TOL)
    singular = np.array([[1.0, 2.0], [2.0, 4.0]], np.float32)
    assert float(kn.linalg.det(singular)) == 0.0
    sign, logdet = kn.linalg.slogdet(singular)
    assert float(sign) == 0.0 and float(logdet) == -np.inf


@pytest.mark.parametrize("shape", [(5, 5), (7, 3), (3, 7)])
def test_qr_against_numpy(shape):
    a = RS.normal(size=shape).astype(np.float32)
    q, r = (np.asarray(t) for t in kn.linalg.qr(a))
    q_np, r_np = np.linalg.qr(a)
    assert q.shape == q_np.shape and r.shape == r_np.shape
    np.testing.assert_allclose(q @ r, a, atol=1e-5)
    np.testing.assert_allclose(q.T @ q, np.eye(q.shape[1]), atol=1e-5)
    assert np.all(np.tril(r, -1) == 0)
    # unique up to the signs of r's rows (and q's columns)
    signs = np.sign(np.diag(r)) * np.sign(np.diag(r_np))
    np.testing.assert_allclose(r * signs[:, None], r_np, atol=1e-4)
    q_complete, r_complete = kn.linalg.qr(a, mode="complete")
    assert np.asarray(q_complete).shape == (shape[0], shape[0])
    np.testing.assert_allclose(np.asarray(q_complete) @ np.asarray(r_complete), a, atol=1e-5)


@pytest.mark.parametrize(
    "ord_, axis",
    [(None, None), ("fro", None), (1, None), (-1, None), (np.inf, None), (-np.inf, None), (None, 1), (3, 0)],
)
def test_norm_against_numpy(ord_, axis):
    got = kn.linalg.norm(A, ord_, axis)
    np.testing.assert_allclose(np.asarray(got), np.linalg.norm(A, ord_, axis), **TOL)


def test_vector_norms_and_keepdims():
    v = A[0]
    for ord_ in (None, 1, 2, np.inf, -np.inf, 0, 0.5):
        np.testing.assert_allclose(float(kn.linalg.norm(v, ord_)), np.linalg.norm(v, ord_), rtol=1e-5)
    got = kn.linalg.norm(BATCH, axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(np.asarray(got), np.linalg.norm(BATCH, axis=(1, 2), keepdims=True), **TOL)


def test_gradient_of_logdet_is_the_inverse_transpose():
    grad = kn.grad(lambda m: kn.linalg.slogdet(m)[1])(SPD)
    np.testing.assert_allclose(np.asarray(grad), np.linalg.inv(SPD).T, rtol=1e-3, atol=1e-5)


def test_errors_name_the_argument_and_the_fix():
    with pytest.raises(kn.ShapeError, match=r"square matrices \[..., n, n\], got shape \[2, 3\]"):
        kn.linalg.det(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="singular values"):
        kn.linalg.norm(A, 2)
    with pytest.raises(ValueError, match="mode must be"):
        kn.linalg.qr(A, mode="full")
