"""The ``sort`` primitive: values sorted along one axis together with the permutation that sorts
them (``kn.sort``, ``kn.argsort`` and ``kn.top_k`` are built on it)."""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.batching import unary_leading
from kaun_ir.ops.indexing_common import gather_along_axis
from kaun_ir.ops.rules import apply, astype, full_like


def _infer(x: TensorType, axis, descending, index_dtype):
    if not isinstance(axis, int) or not 0 <= axis < x.ndim:
        raise ShapeError(f"axis {axis} is out of range for a rank-{x.ndim} operand")
    idx = dtypes.canonical(index_dtype)
    if not dtypes.is_integer(idx):
        raise TypeError(f"index_dtype must be an integer dtype, got {dtypes.short_name(idx)}")
    return TensorType(x.dtype, x.shape), TensorType(idx, x.shape)


def _row_order(row: np.ndarray, descending: bool) -> np.ndarray:
    if dtypes.is_float(row.dtype):
        wide = row.astype(np.float64)
        if not descending:
            return np.argsort(wide, kind="stable")  # NaN last
        nan = np.isnan(wide)
        # primary key: NaN first; secondary: the value, largest first; ties keep their order
        return np.lexsort((np.where(nan, 0.0, -wide), np.where(nan, 0, 1)))
    wide = row.astype(np.int64) if row.dtype != np.uint64 else row  # bool: False < True
    return np.argsort(-wide if descending else wide, kind="stable")


def _reference(x, axis, descending, index_dtype):
    """NumPy's stable sort; NaN sorts after every number (ascending) or before (descending), and
    equal values keep their order either way."""
    if x.size == 0:
        return x.copy(), np.zeros(x.shape, index_dtype)
    moved = np.moveaxis(x, axis, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    order = np.zeros(flat.shape, np.int64)
    for i, row in enumerate(flat):
        order[i] = _row_order(row, descending)
    order = np.moveaxis(order.reshape(moved.shape), -1, axis)
    return np.take_along_axis(x, order, axis=axis), order.astype(index_dtype)


def _emit(em, node, x):
    """``stablehlo.sort`` (stable) of ``(x, iota)`` with a comparator that orders NaN after every
    number ascending and before every number descending, like the reference."""
    in_type = node.inputs[0].type
    axis, descending = node.attr("axis"), node.attr("descending")
    idx_t = node.types[1]
    val_s, idx_s = TensorType(in_type.dtype, ()), TensorType(idx_t.dtype, ())
    pred_t = TensorType(dtypes.bool_, ())
    iota = em.op("stablehlo.iota", [], [], [idx_t], {"iota_dimension": f"{axis} : i64"})[0]

    def body(inner, args):
        a, b = args[0], args[1]  # (x lhs, x rhs, index lhs, index rhs): only the values decide

        def logic(op, *xs):
            return inner.op(op, list(xs), [pred_t] * len(xs), [pred_t])[0]

        before = inner.compare(a, b, val_s, "GT" if descending else "LT")
        if dtypes.is_float(in_type.dtype):
            a_nan = inner.compare(a, a, val_s, "NE")
            b_nan = inner.compare(b, b, val_s, "NE")
            first, second = (a_nan, b_nan) if descending else (b_nan, a_nan)
            # descending: a NaN comes before any number; ascending: any number before a NaN
            only_first = logic("stablehlo.and", first, logic("stablehlo.not", second))
            before = logic("stablehlo.or", before, only_first)
        return [before]

    region = em.region([val_s, val_s, idx_s, idx_s], body, result_types=[pred_t])
    return em.op(
        "stablehlo.sort",
        [x, iota],
        [in_type, idx_t],
        [node.types[0], idx_t],
        {"dimension": f"{axis} : i64", "is_stable": "true"},
        [region],
    )


def _vjp(cts, outs, x, axis, descending, index_dtype):
    """The values' cotangent goes back to where each value came from: ``ct_x = take_along_axis(
    ct_values, argsort(indices))`` (the inverse permutation)."""
    ct_values = cts[0]
    if ct_values is None:
        return (None,)
    indices = outs[1]
    _, inverse = apply("sort", indices, axis=axis, descending=False, index_dtype=index_dtype)
    return (_permute(ct_values, inverse, axis),)


def _permute(x, permutation, axis: int):
    """``x`` reordered along ``axis``: ``out[..., j, ...] = x[..., permutation[..., j, ...], ...]``
    (``permutation`` has ``x``'s shape, so every index is in range)."""
    if 0 in tuple(x.shape):
        return full_like(x, 0)
    wide = {dtypes.int64, dtypes.uint32, dtypes.uint64}
    dtype = dtypes.int64 if permutation.dtype in wide else dtypes.int32
    return gather_along_axis(x, astype(permutation, dtype), axis)


def _samples(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    for descending in (False, True):
        yield Sample((x,), {"axis": 1, "descending": descending})
        yield Sample((x,), {"axis": 0, "descending": descending})
        ties = np.array([[3, 1, 3, 0, 1], [2, 2, 2, 2, 2], [-1, 5, -1, 7, 5]], np.float32)
        yield Sample((ties,), {"axis": 1, "descending": descending})
        nan = np.array([[1, np.nan, 3, -np.inf, np.inf, np.nan, 0]], np.float32)
        yield Sample((nan,), {"axis": 1, "descending": descending})
        ints = rng.integers(-4, 5, size=(3, 7)).astype(np.int32)
        yield Sample((ints,), {"axis": 1, "descending": descending})
        yield Sample(
            (rng.integers(0, 9, size=(5, 2)).astype(np.uint32),),
            {"axis": 0, "descending": descending, "index_dtype": np.dtype(np.int64)},
        )
        flags = rng.random((4, 7)) < 0.5
        yield Sample((flags,), {"axis": 1, "descending": descending})
        yield Sample((flags,), {"axis": 0, "descending": descending, "index_dtype": np.dtype(np.int64)})
        cube = rng.standard_normal((2, 3, 5)).astype(np.float64)
        yield Sample((cube,), {"axis": 2, "descending": descending})
    yield Sample((rng.standard_normal((5,)).astype(np.float32),), {"axis": 0, "descending": False})
    yield Sample((np.zeros((3, 0), np.float32),), {"axis": 1, "descending": True})


OPS = [
    OpDef(
        name="sort",
        traits=(),
        arity=1,
        attrs=("axis",),
        optional={"descending": False, "index_dtype": dtypes.int32},
        infer=_infer,
        reference=_reference,
        emit=_emit,
        samples=_samples,
        vjp=_vjp,
        batch=unary_leading("sort", ("axis",)),
        doc=(
            "``x`` sorted along ``axis`` (ascending, or ``descending``) and the permutation that sorts "
            "it, ``(values, indices)`` with ``values = take_along_axis(x, indices, axis)``. Stable: equal "
            "values keep their order in both directions. NaN sorts after every number ascending and "
            "before every number descending; ``False`` sorts before ``True``. Lowered to ``stablehlo.sort``."
        ),
    ),
]

__all__ = ["OPS"]
