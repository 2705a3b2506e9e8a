"""``scatter``: StableHLO scatter whose update computation is an attribute, ``kind``: 'set',
'add', 'multiply', 'min' or 'max' (``x.at[idx].set(u)``, ``.max(u)`` ... in general form). Its
shape rule, reference and emission are ``scatter_add``'s with another update computation.
"""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.indexing_batch import scatter_batch
from kaun_ir.ops.indexing_common import random_array
from kaun_ir.ops.scatter_add import (
    SCATTER_COMBINERS,
    scatter_emit,
    scatter_flops,
    scatter_infer,
    scatter_reference,
)
from kaun_ir.ops.scatter_vjp import scatter_vjp


def _generalscatter_infer(
    operand: TensorType,
    indices: TensorType,
    updates: TensorType,
    kind,
    update_window_dims,
    inserted_window_dims,
    scatter_dims_to_operand_dims,
    index_vector_dim,
    indices_are_sorted,
    unique_indices,
) -> TensorType:
    if kind not in SCATTER_COMBINERS:
        raise ValueError(f"kind must be one of {', '.join(SCATTER_COMBINERS)}, got {kind!r}")
    if kind != "set" and dtypes.is_bool(operand.dtype):
        raise TypeError(f"scatter kind {kind!r} needs numeric operands, got bool")
    return scatter_infer(
        operand,
        indices,
        updates,
        update_window_dims,
        inserted_window_dims,
        scatter_dims_to_operand_dims,
        index_vector_dim,
        indices_are_sorted,
        unique_indices,
    )


def _generalscatter_reference(operand, indices, updates, kind, **dims):
    return scatter_reference(operand, indices, updates, combine=SCATTER_COMBINERS[kind][1], **dims)


_ROWS = {
    "update_window_dims": (1,),
    "inserted_window_dims": (0,),
    "scatter_dims_to_operand_dims": (0,),
    "index_vector_dim": 1,
}


def _general_samples(rng):
    # x.at[idx].set(rows), unique rows; 7 is out of range and skipped
    yield Sample(
        (random_array(rng, (5, 3)), np.array([3, 0, 7], np.int32), random_array(rng, (3, 3))),
        {"kind": "set", **_ROWS},
    )
    # x.at[idx].max / .min with duplicates (no ties) and a skipped window
    for kind in ("max", "min"):
        yield Sample(
            (random_array(rng, (5, 3)), np.array([1, 4, 1, -1], np.int32), random_array(rng, (4, 3))),
            {"kind": kind, **_ROWS},
        )
    # x.at[idx].multiply with unique indices (differentiable) and with duplicates on ints
    yield Sample(
        (
            random_array(rng, (6,), np.float64),
            np.array([[5], [0], [2]], np.int32),
            random_array(rng, (3,), np.float64),
        ),
        {
            "kind": "multiply",
            "update_window_dims": (),
            "inserted_window_dims": (0,),
            "scatter_dims_to_operand_dims": (0,),
            "index_vector_dim": 1,
            "unique_indices": True,
        },
    )
    yield Sample(
        (
            random_array(rng, (3, 4), np.int32),
            np.array([[0, 1], [0, 1], [2, 3]], np.int32),
            random_array(rng, (3,), np.int32),
        ),
        {
            "kind": "multiply",
            "update_window_dims": (),
            "inserted_window_dims": (0, 1),
            "scatter_dims_to_operand_dims": (0, 1),
            "index_vector_dim": 1,
        },
    )
    yield Sample(
        (random_array(rng, (5, 3)), np.array([1, 4, 1], np.int32), random_array(rng, (3, 3))),
        {"kind": "add", **_ROWS},
    )
    yield from _general_more_samples(rng)


def _general_more_samples(rng):
    """Windows written with set, bool data, and max on bfloat16."""
    # 2x2 windows written with set; bool data; point writes with the index vector first
    yield Sample(
        (
            random_array(rng, (4, 4)),
            np.array([[0, 0], [2, 2], [3, 1]], np.int64),
            random_array(rng, (3, 2, 2)),
        ),
        {
            "kind": "set",
            "update_window_dims": (1, 2),
            "inserted_window_dims": (),
            "scatter_dims_to_operand_dims": (0, 1),
            "index_vector_dim": 1,
        },
    )
    yield Sample(
        (
            random_array(rng, (3, 4), dtypes.bool_),
            np.array([[0, 2], [3, 1]], np.int32),
            random_array(rng, (2,), dtypes.bool_),
        ),
        {
            "kind": "set",
            "update_window_dims": (),
            "inserted_window_dims": (0, 1),
            "scatter_dims_to_operand_dims": (0, 1),
            "index_vector_dim": 0,
        },
    )
    yield Sample(
        (
            random_array(rng, (4,), dtypes.bfloat16),
            np.array([[1], [3]], np.int32),
            random_array(rng, (2,), dtypes.bfloat16),
        ),
        {
            "kind": "max",
            "update_window_dims": (),
            "inserted_window_dims": (0,),
            "scatter_dims_to_operand_dims": (0,),
            "index_vector_dim": 1,
        },
    )


OPS = [
    OpDef(
        name="scatter",
        traits=(),
        flops=scatter_flops,
        arity=3,
        batch=scatter_batch("scatter"),
        attrs=(
            "kind",
            "update_window_dims",
            "inserted_window_dims",
            "scatter_dims_to_operand_dims",
            "index_vector_dim",
        ),
        optional={"indices_are_sorted": False, "unique_indices": False},
        infer=_generalscatter_infer,
        reference=_generalscatter_reference,
        emit=lambda em, node, *operands: scatter_emit(em, node, *operands, kind=node.attr("kind")),
        samples=_general_samples,
        vjp=scatter_vjp,
        doc="scatter(operand, indices, updates, kind=): StableHLO scatter whose update computation "
        "is ``kind``: 'set' (the update replaces; among duplicate indices one unspecified update "
        "wins), 'add', 'multiply', 'min' or 'max'. A window that does not fit in the operand is "
        "skipped. Gradients: 'multiply' needs unique_indices; 'min'/'max' split ties evenly. "
        "Batching dims are not supported.",
    ),
]
