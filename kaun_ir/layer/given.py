"""Variables the user hands in (loaded, converted or pretrained weights) checked against what a
model's ``init`` makes: the same paths, shapes and kinds of dtype, finite values — before any
step runs, each mismatch named by its dotted path."""

from __future__ import annotations

from typing import Any

import numpy as np

from kaun_ir import dtypes, ptree, rng, tree
from kaun_ir.errors import ShapeError
from kaun_ir.layer.core import Layer
from kaun_ir.layer.initialise import init
from kaun_ir.surface.trace import ShapeDtype, trace_flat

__all__ = ["expected_vars", "check_given"]


def expected_vars(model: Layer, example: Any, dtype: Any) -> tuple[Any, Any]:
    """``(params, state)`` of ``layer.init(model, example, dtype)`` as ``kn.ShapeDtype`` trees (an
    abstract trace; the current rng scope is not advanced)."""

    def make():
        with rng.scope(0):
            v = init(model, example, dtype)
        return v.params, v.state

    traced = trace_flat(make, (), {})
    leaves = [ShapeDtype(v.type.shape, v.type.dtype) for v in traced.graph.outputs]
    return tree.unflatten(traced.out_treedef, leaves)


def _shape_text(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _check_leaf(who: str, what: str, path: str, leaf: Any, spec: ShapeDtype) -> None:
    dtype = getattr(leaf, "dtype", None)
    if dtype is None or not hasattr(leaf, "shape"):
        raise TypeError(f"{who}: the {what} at {path!r} are a {type(leaf).__name__}, not an array")
    try:
        dtype = dtypes.canonical(dtype)
    except (TypeError, ValueError):
        raise TypeError(f"{who}: the {what} at {path!r} have dtype {dtype}, not a numeric array") from None
    want = dtypes.canonical(spec.dtype)
    if dtypes.is_float(want) and not dtypes.is_float(dtype):
        raise TypeError(
            f"{who}: the {what} at {path!r} are {dtypes.short_name(dtype)}, the model's are "
            f"{dtypes.short_name(want)}; convert them to a float type first"
        )
    if dtypes.is_float(dtype) and isinstance(leaf, np.ndarray) and not np.isfinite(leaf).all():
        raise ValueError(f"{who}: the {what} at {path!r} hold values that are not finite (NaN or inf)")


def check_given(model: Layer, who: str, what: str, expected: Any, given: Any) -> None:
    """``ShapeError`` unless ``given`` has the paths and shapes of ``expected`` (from
    :func:`expected_vars`); ``TypeError`` for a leaf that is not an array of the expected kind,
    ``ValueError`` for a host array holding NaN or inf."""
    want = dict(ptree.flatten_with_paths(expected))
    have = dict(ptree.flatten_with_paths(given))
    name = f"model {model.name!r}"
    missing = [path for path in want if path not in have]
    if missing:
        raise ShapeError(
            f"{who}: the given {what} lack {missing[:5]} (shape {_shape_text(want[missing[0]].shape)}), "
            f"which {name} has"
        )
    extra = [path for path in have if path not in want]
    if extra:
        raise ShapeError(f"{who}: the given {what} have {extra[:5]}, which {name} does not have")
    for path, spec in want.items():
        _check_leaf(who, what, path, have[path], spec)
        shape = tuple(have[path].shape)
        if shape != tuple(spec.shape):
            raise ShapeError(
                f"{who}: the {what} at {path!r} have shape {_shape_text(shape)}, {name} expects "
                f"{_shape_text(spec.shape)}"
            )
    if not ptree.structure_equal(expected, given):  # same paths, other containers (list vs dict)
        try:
            ptree.map2(lambda a, b: None, expected, given)
        except ValueError as err:
            raise ShapeError(f"{who}: the given {what} do not match {name}: {err}") from None
