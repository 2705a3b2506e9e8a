"""``kn.linalg``: NumPy's and JAX's ``linalg`` spelling, for what the op table can express.

``norm``, ``det``, ``slogdet``, ``solve``, ``inv``, ``cholesky`` and ``qr`` are composites of the
op table's primitives (elementwise ops, reductions, ``dot_general``): each factorisation is
unrolled over the columns of the matrix, one step per column (Gaussian elimination with partial
pivoting for ``det`` / ``slogdet`` / ``solve`` / ``inv``, the Cholesky–Banachiewicz recurrence,
Householder reflections for ``qr``). They trace, differentiate (``kn.grad`` runs through the
unrolled steps) and batch over leading axes, and the traced graph grows with the matrix size ``n``
(about ``n`` steps), so they suit small and medium matrices (up to a few hundred rows).
``eigh`` and ``svd`` need iterative algorithms the op table has no primitive for; they are not
provided. The products (``matmul``, ``tensordot``, ``outer``, ``einsum``) are here too.
"""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.names import public_dir
from kaun_ir.surface.elementwise import abs as absolute
from kaun_ir.surface.elementwise import log, sign, sqrt, where
from kaun_ir.surface.function import op_function
from kaun_ir.surface.linalg import einsum, matmul, outer, tensordot
from kaun_ir.surface.promotion import astype, dtype_of, shape_of
from kaun_ir.surface.reductions import argmax
from kaun_ir.surface.reductions import max as reduce_max
from kaun_ir.surface.reductions import min as reduce_min
from kaun_ir.surface.reductions import prod as reduce_prod
from kaun_ir.surface.reductions import sum as reduce_sum
from kaun_ir.surface.take import one_hot

__all__ = [
    "norm",
    "det",
    "slogdet",
    "solve",
    "inv",
    "cholesky",
    "qr",
    "matmul",
    "tensordot",
    "outer",
    "einsum",
]


def _float(name: str, a):
    dt = dtype_of(a)
    if not dtypes.is_float(dt):
        a = astype(a, dtypes.float32)
    return a


def _square(name: str, a):
    a = _float(name, a)
    shape = shape_of(a)
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise ShapeError(
            f"kn.linalg.{name}: a must be a (batch of) square matrices [..., n, n], got shape {list(shape)}"
        )
    return a, shape[-1]


def _eliminate(a, n: int, rhs=None):
    """Gaussian elimination with partial pivoting of ``a`` ([..., n, n], with ``rhs`` [..., n, k]
    carried along): ``(upper, rhs, sign)``, ``sign`` the determinant of the row permutation."""
    rows = np.arange(n)
    dt = dtype_of(a)
    flips = None
    for j in range(n):
        column = absolute(a[..., :, j])
        pivot = argmax(where(rows >= j, column, -1.0), axis=-1)  # [...]
        e_j = np.eye(n, dtype=dt)[j]
        u = e_j - one_hot(pivot, n, dtype=dt)  # swapping rows j and pivot is I - u u^T
        swapped = 1.0 - reduce_sum(u * u, axis=-1)  # -1 when the rows differ (u.u = 2), else 1
        flips = swapped if flips is None else flips * swapped
        a = a - u[..., :, None] * matmul(u[..., None, :], a)
        if rhs is not None:
            rhs = rhs - u[..., :, None] * matmul(u[..., None, :], rhs)
        head = a[..., j, j]
        safe = where(head == 0, 1.0, head)  # a zero pivot: the column is already zero below it
        factor = where(rows > j, a[..., :, j] / safe[..., None], 0.0)  # [..., n]
        a = a - factor[..., :, None] * a[..., j : j + 1, :]
        if rhs is not None:
            rhs = rhs - factor[..., :, None] * rhs[..., j : j + 1, :]
    return a, rhs, flips


def _diagonal(a, n: int):
    return reduce_sum(a * np.eye(n, dtype=dtype_of(a)), axis=-1)


@op_function
def det(a):
    """Determinant of ``a`` [..., n, n] -> [...] (as ``numpy.linalg.det``)."""
    a, n = _square("det", a)
    upper, _, flips = _eliminate(a, n)
    return flips * reduce_prod(_diagonal(upper, n), axis=-1)


@op_function
def slogdet(a):
    """``(sign, logabsdet)`` of ``a`` [..., n, n] (as ``numpy.linalg.slogdet``): ``det(a) ==
    sign * exp(logabsdet)`` without overflow; a singular matrix gives ``(0, -inf)``."""
    a, n = _square("slogdet", a)
    upper, _, flips = _eliminate(a, n)
    diag = _diagonal(upper, n)
    return flips * reduce_prod(sign(diag), axis=-1), reduce_sum(log(absolute(diag)), axis=-1)


def _back_substitute(upper, rhs, n: int):
    """``x`` with ``upper @ x == rhs`` (``upper`` [..., n, n] upper triangular, ``rhs`` [..., n, k])."""
    solved = []
    for i in reversed(range(n)):
        known = rhs[..., i, :]
        for j, x_j in zip(range(i + 1, n), reversed(solved)):
            known = known - upper[..., i, j : j + 1] * x_j
        solved.append(known / upper[..., i, i : i + 1])
    return _stack_rows(list(reversed(solved)))


def _stack_rows(rows: list):
    from kaun_ir.surface.shapes import stack  # noqa: PLC0415 - one use

    return stack(rows, axis=-2)


@op_function
def solve(a, b):
    """``x`` with ``a @ x == b``: ``a`` [..., n, n]; ``b`` [..., n, k] -> [..., n, k], or ``b``
    [n] -> [n] (as ``numpy.linalg.solve``)."""
    a, n = _square("solve", a)
    b = astype(_float("solve", b), dtype_of(a))
    vector = len(shape_of(b)) == 1
    if vector:
        b = b[:, None]
    if shape_of(b)[-2] != n:
        raise ShapeError(
            f"kn.linalg.solve: b must have {n} rows (a is {n}x{n}), got shape {list(shape_of(b))}"
        )
    upper, rhs, _ = _eliminate(a, n, b + 0.0 * a[..., :, :1])  # rhs takes a's batch axes
    x = _back_substitute(upper, rhs, n)
    return x[..., 0] if vector else x


@op_function
def inv(a):
    """The inverse of ``a`` [..., n, n] (as ``numpy.linalg.inv``)."""
    a, n = _square("inv", a)
    return solve.traced(a, np.eye(n, dtype=dtype_of(a)) + 0.0 * a)


@op_function
def cholesky(a):
    """The lower-triangular ``L`` with ``L @ L.T == a`` for a symmetric positive-definite ``a``
    [..., n, n] (as ``numpy.linalg.cholesky``; only the lower triangle of ``a`` is read). A
    matrix that is not positive definite gives NaN."""
    a, n = _square("cholesky", a)
    rows = np.arange(n)
    dt = dtype_of(a)
    lower = 0.0 * a
    for j in range(n):
        column = a[..., :, j] - matmul(lower, lower[..., j, :][..., :, None])[..., 0]
        head = sqrt(column[..., j])
        new = where(rows > j, column / head[..., None], where(rows == j, head[..., None], 0.0))
        lower = lower + new[..., :, None] * np.eye(n, dtype=dt)[j]
    return lower


@op_function
def qr(a, mode: str = "reduced"):
    """``(q, r)`` with ``a == q @ r``, ``q`` orthonormal columns and ``r`` upper triangular, for
    ``a`` [..., m, n] and ``k = min(m, n)``: ``mode="reduced"`` gives ``q`` [..., m, k] and ``r``
    [..., k, n], ``"complete"`` ``q`` [..., m, m] and ``r`` [..., m, n], ``"r"`` only ``r``
    (as ``numpy.linalg.qr``; the signs of ``r``'s diagonal may differ from LAPACK's)."""
    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"kn.linalg.qr: mode must be 'reduced', 'complete' or 'r', got {mode!r}")
    a = _float("qr", a)
    shape = shape_of(a)
    if len(shape) < 2:
        raise ShapeError(
            f"kn.linalg.qr: a must be a (batch of) matrices [..., m, n], got shape {list(shape)}"
        )
    m, n = shape[-2], shape[-1]
    dt = dtype_of(a)
    rows = np.arange(m)
    r, q = a, np.eye(m, dtype=dt) + 0.0 * a[..., :1, :1]
    for j in range(min(m, n)):
        x = where(rows >= j, r[..., :, j], 0.0)
        length = sqrt(reduce_sum(x * x, axis=-1))
        lead = x[..., j]
        alpha = -where(lead >= 0, 1.0, -1.0) * length
        v = x - alpha[..., None] * np.eye(m, dtype=dt)[j]
        size = reduce_sum(v * v, axis=-1)
        beta = where(size > 0, 2.0 / where(size > 0, size, 1.0), 0.0)[..., None, None]
        r = r - beta * v[..., :, None] * matmul(v[..., None, :], r)
        q = q - beta * matmul(q, v[..., :, None]) * v[..., None, :]
    r = r * (rows[:, None] <= np.arange(n)[None, :])  # exact zeros below the diagonal
    if mode == "r":
        return r[..., : min(m, n), :]
    if mode == "complete":
        return q, r
    k = min(m, n)
    return q[..., :, :k], r[..., :k, :]


def _vector_norm(x, ord, axis, keepdims):
    magnitude = absolute(x)
    if ord is None or ord == 2:
        return sqrt(reduce_sum(magnitude * magnitude, axis=axis, keepdims=keepdims))
    if ord == np.inf:
        return reduce_max(magnitude, axis=axis, keepdims=keepdims)
    if ord == -np.inf:
        return reduce_min(magnitude, axis=axis, keepdims=keepdims)
    if ord == 0:
        return reduce_sum(astype(magnitude != 0, dtype_of(x)), axis=axis, keepdims=keepdims)
    if ord == 1:
        return reduce_sum(magnitude, axis=axis, keepdims=keepdims)
    power = float(ord)
    return reduce_sum(magnitude**power, axis=axis, keepdims=keepdims) ** (1.0 / power)


def _matrix_norm(x, ord, axis, keepdims):
    rows, cols = axis
    magnitude = absolute(x)
    if ord in (None, "fro"):
        return sqrt(reduce_sum(magnitude * magnitude, axis=axis, keepdims=keepdims))
    if ord in (1, -1):  # the largest / smallest column sum
        sums = reduce_sum(magnitude, axis=rows, keepdims=True)
        pick = reduce_max if ord == 1 else reduce_min
    elif ord in (np.inf, -np.inf):  # the largest / smallest row sum
        sums = reduce_sum(magnitude, axis=cols, keepdims=True)
        pick = reduce_max if ord == np.inf else reduce_min
    else:
        raise ValueError(
            f"kn.linalg.norm: matrix ord={ord!r} is not available (ord 2, -2 and 'nuc' need singular "
            "values, which the op table cannot compute); use None/'fro', 1, -1, inf or -inf"
        )
    out = pick(sums, axis=axis, keepdims=True)
    if keepdims:
        return out
    from kaun_ir.surface.shapes import squeeze  # noqa: PLC0415 - one use

    return squeeze(out, axis=tuple(sorted(axis)))


@op_function
def norm(x, ord=None, axis=None, keepdims: bool = False):
    """A vector or matrix norm, as ``numpy.linalg.norm``: with ``axis`` None, a 1-D ``x`` gives
    its vector norm, a 2-D one its matrix norm (``ord=None``: the 2-norm of the flattened ``x``);
    an int ``axis`` picks vector norms (``ord`` None/2, 1, inf, -inf, 0 or any power), a pair
    matrix norms (``ord`` None/"fro", 1, -1, inf, -inf)."""
    x = _float("norm", x)
    ndim = len(shape_of(x))
    if axis is None:
        if ord is None:
            return _vector_norm(x, None, None, keepdims)
        if ndim not in (1, 2):
            raise ValueError(f"kn.linalg.norm: ord={ord!r} with axis=None needs a 1-D or 2-D x, got {ndim}-D")
        axis = 0 if ndim == 1 else (0, 1)
    if isinstance(axis, (tuple, list)):
        if len(axis) != 2:
            raise ValueError(f"kn.linalg.norm: axis must be an int or a pair, got {axis!r}")
        axis = tuple(int(a) % ndim for a in axis)
        return _matrix_norm(x, ord, axis, keepdims)
    if isinstance(ord, str):
        raise ValueError(f"kn.linalg.norm: ord={ord!r} is a matrix norm; give axis as a pair")
    return _vector_norm(x, ord, int(axis), keepdims)


__dir__ = public_dir(__all__)
