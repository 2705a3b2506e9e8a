"""Dynamic slices: ``dynamic_slice`` reads and ``dynamic_update_slice`` writes a block at
run-time start positions (scalar integer operands, one per axis). As in StableHLO, each start is
clamped so the block fits inside the operand.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.emit import i64_array
from kaun_ir.ops.indexing_batch import dynamic_slice_batch, dynamic_update_slice_batch
from kaun_ir.ops.indexing_common import clamp_start, random_array, require_integer, start_index, zeros_like
from kaun_ir.ops.rules import apply


def _check_starts(x: TensorType, starts: Sequence[TensorType]) -> None:
    if len(starts) != x.ndim:
        raise ShapeError(f"needs one start index per operand axis ({x.ndim}), got {len(starts)}")
    for t in starts:
        if t.shape != ():
            raise ShapeError(f"start indices must be scalars, got {t}")
        require_integer(t, "start indices")
    if len({t.dtype for t in starts}) > 1:
        raise TypeError("start indices must all have the same dtype")


def _ds_infer(x: TensorType, *starts: TensorType, slice_sizes) -> TensorType:
    sizes = tuple(slice_sizes)
    _check_starts(x, starts)
    if len(sizes) != x.ndim:
        raise ShapeError(f"slice_sizes {list(sizes)} needs one entry per operand axis ({x.ndim})")
    for axis, (k, n) in enumerate(zip(sizes, x.shape)):
        if not 0 <= k <= n:
            raise ShapeError(f"axis {axis}: slice size {k} does not fit in size {n}")
    return TensorType(x.dtype, sizes)


def _ds_reference(x, *starts, slice_sizes):
    begin = [clamp_start(s, n, k) for s, n, k in zip(starts, x.shape, slice_sizes)]
    return x[tuple(slice(b, b + k) for b, k in zip(begin, slice_sizes))].copy()


def _ds_vjp(ct, y, x, *starts, slice_sizes):
    # the same clamped starts address the same block
    return (apply("dynamic_update_slice", zeros_like(x), ct, *starts),) + (None,) * len(starts)


def _ds_samples(rng):
    yield Sample((random_array(rng, (4, 5)), start_index(1), start_index(2)), {"slice_sizes": (2, 3)})
    # out of range on both sides: clamped to 0 and to size - slice size
    yield Sample((random_array(rng, (4, 5)), start_index(-3), start_index(10)), {"slice_sizes": (2, 3)})
    yield Sample((np.arange(7, dtype=np.int32), start_index(5, np.int64)), {"slice_sizes": (4,)})
    yield Sample(
        (random_array(rng, (3, 4), dtypes.bfloat16), start_index(2, np.uint32), start_index(1, np.uint32)),
        {"slice_sizes": (1, 4)},
    )
    yield Sample(
        (random_array(rng, (2, 3), dtypes.bool_), start_index(1), start_index(1)), {"slice_sizes": (0, 2)}
    )
    yield Sample(
        (random_array(rng, (2, 3, 4)), start_index(1), start_index(0), start_index(3)),
        {"slice_sizes": (1, 3, 2)},
    )
    yield Sample((random_array(rng, ()),), {"slice_sizes": ()})


def _dus_infer(x: TensorType, update: TensorType, *starts: TensorType) -> TensorType:
    if update.dtype != x.dtype:
        raise TypeError("update must have the operand's dtype (convert explicitly first)")
    if update.ndim != x.ndim:
        raise ShapeError(f"update of rank {update.ndim} for an operand of rank {x.ndim}")
    for axis, (u, n) in enumerate(zip(update.shape, x.shape)):
        if u > n:
            raise ShapeError(f"axis {axis}: update size {u} exceeds operand size {n}")
    _check_starts(x, starts)
    return x


def _dus_reference(x, update, *starts):
    begin = [clamp_start(s, n, u) for s, n, u in zip(starts, x.shape, update.shape)]
    out = x.copy()
    out[tuple(slice(b, b + u) for b, u in zip(begin, update.shape))] = update
    return out


def _dus_vjp(ct, y, x, update, *starts):
    ct_x = apply("dynamic_update_slice", ct, zeros_like(update), *starts)
    ct_update = apply("dynamic_slice", ct, *starts, slice_sizes=update.shape)
    return (ct_x, ct_update) + (None,) * len(starts)


def _dus_samples(rng):
    yield Sample((random_array(rng, (4, 5)), random_array(rng, (2, 3)), start_index(1), start_index(2)))
    yield Sample(
        (random_array(rng, (4, 5)), random_array(rng, (2, 3)), start_index(-1), start_index(4))
    )  # clamped
    yield Sample((np.arange(6, dtype=np.int32), np.array([9, 9], np.int32), start_index(7, np.int64)))
    yield Sample(
        (
            random_array(rng, (3, 3), dtypes.bool_),
            random_array(rng, (3, 0), dtypes.bool_),
            start_index(1),
            start_index(2),
        )
    )
    yield Sample(
        (
            random_array(rng, (2, 3, 4), np.float64),
            random_array(rng, (2, 3, 4), np.float64),
            start_index(1, np.uint8),
            start_index(0, np.uint8),
            start_index(3, np.uint8),
        )
    )
    yield Sample((random_array(rng, ()), random_array(rng, ())))


OPS = [
    OpDef(
        name="dynamic_slice",
        traits=(),
        batch=dynamic_slice_batch,
        arity=None,
        attrs=("slice_sizes",),
        infer=_ds_infer,
        reference=_ds_reference,
        emit=lambda em, node, x, *starts: em.simple(
            "stablehlo.dynamic_slice",
            node,
            x,
            *starts,
            attrs={"slice_sizes": i64_array(node.attr("slice_sizes"))},
        ),
        samples=_ds_samples,
        vjp=_ds_vjp,
        doc="dynamic_slice(x, *starts): the block of ``slice_sizes`` at run-time scalar integer "
        "starts (one per axis), each clamped into [0, size - slice size].",
    ),
    OpDef(
        name="dynamic_update_slice",
        traits=(),
        arity=None,
        infer=_dus_infer,
        reference=_dus_reference,
        batch=dynamic_update_slice_batch,
        emit=lambda em, node, x, update, *starts: em.simple(
            "stablehlo.dynamic_update_slice", node, x, update, *starts
        ),
        samples=_dus_samples,
        vjp=_dus_vjp,
        doc="dynamic_update_slice(x, update, *starts): ``x`` with ``update`` written at run-time "
        "scalar integer starts (one per axis), each clamped into [0, size - update size].",
    ),
]
