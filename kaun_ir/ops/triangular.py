"""``triangular_solve``: a linear system whose matrix is triangular, solved by substitution
(``stablehlo.triangular_solve``), with its derivative and batching rule."""

from __future__ import annotations

import itertools

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.rules import apply, full_like, where

TRANSPOSES = ("NO_TRANSPOSE", "TRANSPOSE", "ADJOINT")


def _infer(a: TensorType, b: TensorType, left_side, lower, unit_diagonal, transpose_a) -> TensorType:
    if transpose_a not in TRANSPOSES:
        raise ValueError(f"transpose_a must be one of {', '.join(TRANSPOSES)}, got {transpose_a!r}")
    if a.dtype != b.dtype:
        raise TypeError("operands must have the same dtype (convert explicitly first)")
    if not dtypes.is_float(a.dtype):
        raise TypeError(f"triangular_solve needs floating-point operands, got {dtypes.short_name(a.dtype)}")
    if a.ndim < 2 or a.ndim != b.ndim:
        raise ShapeError(f"a and b must have one rank of at least 2, got {a.ndim} and {b.ndim}")
    if a.shape[-1] != a.shape[-2]:
        raise ShapeError(f"a must hold square matrices, got shape {tuple(a.shape)}")
    if a.shape[:-2] != b.shape[:-2]:
        raise ShapeError(f"batch axes differ: a {tuple(a.shape[:-2])}, b {tuple(b.shape[:-2])}")
    m = a.shape[-1]
    axis = -2 if left_side else -1
    if b.shape[axis] != m:
        side = "rows" if left_side else "columns"
        raise ShapeError(f"b must have {m} {side} (a is {m}x{m}), got shape {tuple(b.shape)}")
    return TensorType(b.dtype, b.shape)


def _triangle(a: np.ndarray, lower: bool, unit_diagonal: bool) -> np.ndarray:
    tri = np.tril(a) if lower else np.triu(a)
    if unit_diagonal:  # the diagonal is not read: an inf or NaN there must not leak (inf * 0)
        eye = np.eye(a.shape[-1], dtype=bool)
        tri = np.where(eye, np.ones((), tri.dtype), tri)
    return tri


def _reference(a, b, left_side, lower, unit_diagonal, transpose_a):
    """NumPy's solve on the triangle of ``a`` the op reads (float64): ``op(a) x = b`` with
    ``left_side``, ``x op(a) = b`` otherwise; ``op`` transposes for TRANSPOSE and ADJOINT."""
    tri = _triangle(a.astype(np.float64), lower, unit_diagonal)
    if transpose_a != "NO_TRANSPOSE":
        tri = np.swapaxes(tri, -1, -2)
    wide = b.astype(np.float64)
    if b.size == 0:
        return np.zeros(b.shape, b.dtype)
    if left_side:
        x = np.linalg.solve(tri, wide)
    else:  # x tri = b  <=>  tri^T x^T = b^T
        x = np.swapaxes(np.linalg.solve(np.swapaxes(tri, -1, -2), np.swapaxes(wide, -1, -2)), -1, -2)
    return x.astype(b.dtype)


def _emit(em, node, a, b):
    attrs = {
        "left_side": "true" if node.attr("left_side") else "false",
        "lower": "true" if node.attr("lower") else "false",
        "unit_diagonal": "true" if node.attr("unit_diagonal") else "false",
        "transpose_a": f"#stablehlo<transpose {node.attr('transpose_a')}>",
    }
    return em.simple("stablehlo.triangular_solve", node, a, b, attrs=attrs)


def _well_conditioned(rng, shape, dtype=np.float32):
    m = shape[-1]
    a = rng.uniform(-1, 1, shape) + (m + 1) * np.eye(m) * np.sign(rng.uniform(-1, 1, shape[:-1] + (1,)))
    return a.astype(dtype)


def _samples(rng):
    for left_side, lower, unit_diagonal, transpose_a in itertools.product(
        (True, False), (True, False), (False, True), TRANSPOSES
    ):
        attrs = {
            "left_side": left_side,
            "lower": lower,
            "unit_diagonal": unit_diagonal,
            "transpose_a": transpose_a,
        }
        b_shape = (3, 2) if left_side else (2, 3)
        yield Sample((_well_conditioned(rng, (3, 3)), rng.standard_normal(b_shape).astype(np.float32)), attrs)
    batched = {"left_side": True, "lower": False, "unit_diagonal": False, "transpose_a": "TRANSPOSE"}
    yield Sample(
        (_well_conditioned(rng, (2, 4, 4), np.float64), rng.standard_normal((2, 4, 3))), batched, rtol=1e-10
    )
    right = {"left_side": False, "lower": True, "unit_diagonal": False, "transpose_a": "NO_TRANSPOSE"}
    yield Sample(
        (_well_conditioned(rng, (2, 1, 3, 3)), rng.standard_normal((2, 1, 5, 3)).astype(np.float32)), right
    )
    yield Sample((_well_conditioned(rng, (3, 3)), np.zeros((3, 0), np.float32)), batched)


# Derivative ------------------------------------------------------------------------------------

_FLIPPED = {"NO_TRANSPOSE": "TRANSPOSE", "TRANSPOSE": "NO_TRANSPOSE", "ADJOINT": "NO_TRANSPOSE"}


def _swap_last(x):
    n = x.ndim
    return apply("transpose", x, permutation=tuple(range(n - 2)) + (n - 1, n - 2))


def _triangle_mask(t: TensorType, lower: bool, strict: bool):
    n = len(t.shape)
    rows = apply("iota", dtype=dtypes.int32, shape=t.shape, dimension=n - 2)
    cols = apply("iota", dtype=dtypes.int32, shape=t.shape, dimension=n - 1)
    direction = ("GT" if strict else "GE") if lower else ("LT" if strict else "LE")
    return apply("compare", rows, cols, direction=direction)


def _vjp(ct, x, a, b, left_side, lower, unit_diagonal, transpose_a):
    """``x = op(a)^-1 b`` (left): ``ct_b = op(a)^-T ct`` (one more solve, the transpose flipped)
    and ``ct_op(a) = -ct_b x^T``; on the right ``ct_op(a) = -x^T ct_b``. ``ct_a`` is that (transposed
    back when ``op`` transposes), kept on the triangle the op reads."""
    ct_b = apply(
        "triangular_solve",
        a,
        ct,
        left_side=left_side,
        lower=lower,
        unit_diagonal=unit_diagonal,
        transpose_a=_FLIPPED[transpose_a],
    )
    batch = tuple(range(a.ndim - 2))
    last = a.ndim - 1
    if left_side:  # [.., m, n] x [.., m, n] -> [.., m, m], contracting n
        ct_op = apply(
            "dot_general",
            ct_b,
            x,
            lhs_batch=batch,
            rhs_batch=batch,
            lhs_contracting=(last,),
            rhs_contracting=(last,),
        )
    else:  # [.., n, m] x [.., n, m] -> [.., m, m], contracting n
        ct_op = apply(
            "dot_general",
            x,
            ct_b,
            lhs_batch=batch,
            rhs_batch=batch,
            lhs_contracting=(last - 1,),
            rhs_contracting=(last - 1,),
        )
    ct_op = -ct_op
    ct_a = ct_op if transpose_a == "NO_TRANSPOSE" else _swap_last(ct_op)
    mask = _triangle_mask(a.type, lower, strict=bool(unit_diagonal))
    return where(mask, ct_a, full_like(ct_a, 0)), ct_b


def _batch(batched, size, a, b, **attrs):
    """The batch axis is one more leading batch axis of the matrices: an operand without it is
    broadcast along it."""
    operands = []
    for x, is_batched in zip((a, b), batched):
        if not is_batched:
            x = apply(
                "broadcast_in_dim",
                x,
                shape=(size,) + tuple(x.shape),
                broadcast_dimensions=tuple(range(1, x.ndim + 1)),
            )
        operands.append(x)
    return apply("triangular_solve", *operands, **attrs)


def _flops(inputs, outputs, **attrs) -> int:
    """m^2 multiply-adds per right-hand side column (substitution): m * m * (b's elements / m)."""
    m = inputs[0].shape[-1]
    return m * outputs[0].size


OPS = [
    OpDef(
        name="triangular_solve",
        traits=(),
        arity=2,
        attrs=("left_side", "lower", "unit_diagonal", "transpose_a"),
        infer=_infer,
        reference=_reference,
        emit=_emit,
        samples=_samples,
        vjp=_vjp,
        batch=_batch,
        flops=_flops,
        doc=(
            "Solve a triangular system: ``op(a) @ x = b`` (``left_side``) or ``x @ op(a) = b``, where "
            "only the ``lower`` (else upper) triangle of ``a`` is read, its diagonal taken as ones "
            "with ``unit_diagonal``, and ``op`` is the identity (NO_TRANSPOSE) or the transpose "
            "(TRANSPOSE, ADJOINT: the same for real dtypes). Leading axes are batch axes. The "
            "derivative is one more solve with the transpose flipped, and a product kept on the "
            "triangle ``a`` contributes."
        ),
    ),
]
