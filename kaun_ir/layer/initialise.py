"""Making a model's variables: ``kn.layer.init``, with the sizes left out inferred from an example
input, and what combinators init their children with (:func:`child_init`, :func:`eval_shape`:
abstract traces, nothing runs or compiles).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from kaun_ir import dtypes, tree
from kaun_ir.layer.core import Layer, Vars, check_layer
from kaun_ir.layer.forward import traced_forward
from kaun_ir.surface.trace import ShapeDtype, is_array_leaf, leaf_type, trace_flat

__all__ = ["init", "child_init", "eval_shape"]


def _float_dtype(dtype: Any) -> np.dtype:
    dt = dtypes.canonical(dtype)
    if not dtypes.is_float(dt):
        raise TypeError(
            f"layer.init: the parameter dtype must be floating point, got {dtypes.short_name(dt)}"
        )
    return dt


def _is_dtype_like(value: Any) -> bool:
    return isinstance(value, (np.dtype, str)) or (isinstance(value, type) and issubclass(value, np.generic))


def init(model: Layer, example: Any = None, dtype: Any = None) -> Vars:
    """Fresh variables of ``model`` in ``dtype`` (default float32); random keys come from the
    current ``kn.rng`` scope (``with kn.rng.scope(seed): ...``), so the same seed gives identical
    parameters.

    ``example`` is an input (an array, a ``kn.ShapeDtype``, or a tree of them): sizes the layers
    left out (``layer.linear(out_features=10)``) are inferred from it by tracing the model
    abstractly — its data is never read and nothing is compiled for it. Given sizes are checked
    against it. The parameters are the same (same tree, shapes and, for one seed, values) as
    with every size written out. A dtype in the second position is the dtype (the older form
    ``layer.init(model, kn.float64)``).
    """
    check_layer(model, "layer.init: model")
    if dtype is None and example is not None and _is_dtype_like(example):
        example, dtype = None, example
    dt = _float_dtype(dtypes.float32 if dtype is None else dtype)
    x = None if example is None else _abstract(example, dt)
    result = child_init(model, dt, x)
    if not isinstance(result, Vars):
        raise TypeError(
            f"layer.init: the init function of layer {model.name!r} must return a "
            f"kn.layer.Vars, got {type(result).__name__}"
        )
    return result


def _abstract(example: Any, dtype: np.dtype) -> Any:
    """``example`` with every array leaf replaced by its ``kn.ShapeDtype``; floating-point leaves
    take the model's ``dtype`` (as :func:`apply` converts them)."""
    leaves, treedef = tree.flatten(example)
    specs = []
    for leaf in leaves:
        if not is_array_leaf(leaf):
            raise TypeError(
                f"layer.init: the example input must be arrays or kn.ShapeDtype specs, got "
                f"{type(leaf).__name__}"
            )
        t = leaf_type(leaf)
        specs.append(ShapeDtype(t.shape, dtype if dtypes.is_float(t.dtype) else t.dtype))
    return tree.unflatten(treedef, specs)


def _takes_input(layer: Layer) -> bool:
    """Whether ``layer.init`` accepts the input type as a second positional argument."""
    known = layer.cache.takes_input
    if known is None:
        try:
            parameters = inspect.signature(layer.init).parameters.values()
        except (TypeError, ValueError):
            known = False
        else:
            positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            known = len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in parameters)
        layer.cache.takes_input = known
    return known


def child_init(layer: Layer, dtype: np.dtype, x: Any = None) -> Vars:
    """``layer.init(dtype, x)`` for a layer that infers sizes from its input type ``x`` (a
    ``kn.ShapeDtype`` tree or None), ``layer.init(dtype)`` for one that does not. Combinators call
    it for their children (inside the child's ``kn.ir.scope`` so errors name the layer path)."""
    return layer.init(dtype, x) if _takes_input(layer) else layer.init(dtype)


def eval_shape(layer: Layer, vars: Vars, x: Any, training: bool = False, ctx: dict | None = None) -> Any:
    """The output type of ``layer`` on an input of abstract type ``x``: a ``kn.ShapeDtype`` tree
    found by tracing ``apply`` on symbolic tensors (nothing runs, nothing is compiled)."""
    params, state = (_spec_tree(t) for t in (vars.params, vars.state))

    def forward(p, s, inputs):
        return traced_forward(layer, p, s, inputs, dict(ctx or {}), training, vars.dtype)[0]

    traced = trace_flat(forward, (params, state, x), {})
    outputs = [ShapeDtype(v.type.shape, v.type.dtype) for v in traced.graph.outputs]
    return tree.unflatten(traced.out_treedef, outputs)


def _spec_tree(t: Any) -> Any:
    leaves, treedef = tree.flatten(t)
    return tree.unflatten(
        treedef,
        [ShapeDtype(leaf_type(v).shape, leaf_type(v).dtype) if is_array_leaf(v) else v for v in leaves],
    )
