"""Running a model's forward pass: ``kn.layer.apply``, compiled once per model (the forward pass
under ``kn.jit``, kept in the layer's cache) on concrete arrays and traced through inside a trace.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kaun_ir import dtypes, rng, tree
from kaun_ir.ir.builder import current_builder
from kaun_ir.layer.core import Layer, Vars, check_layer
from kaun_ir.runtime import jit
from kaun_ir.surface.promotion import astype, dtype_of

__all__ = ["apply"]


def _cast_inputs(x: Any, dtype: np.dtype) -> Any:
    """Floating-point leaves of ``x`` converted to the model's dtype (integers, e.g. token ids,
    are left alone)."""
    leaves, treedef = tree.flatten(x)
    cast = [astype(leaf, dtype) if _is_float_leaf(leaf) else leaf for leaf in leaves]
    return tree.unflatten(treedef, cast)


def _is_float_leaf(leaf: Any) -> bool:
    if isinstance(leaf, (bool, int, float, str)) or leaf is None:
        return False
    try:
        return dtypes.is_float(dtype_of(leaf))
    except TypeError:
        return False


def traced_forward(model: Layer, params, state, x, ctx, training: bool, dtype: np.dtype):
    """``model.apply`` on ``x`` (floating-point leaves cast to ``dtype``), its result checked:
    ``(y, new_state)`` with ``new_state`` of the structure of ``state``."""
    x = _cast_inputs(x, dtype)
    out = model.apply(params, state, x, training=training, ctx=ctx)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(
            f"the apply function of layer {model.name!r} must return (output, state), got "
            f"{type(out).__name__}"
        )
    y, new_state = out
    before, after = tree.flatten(state)[1], tree.flatten(new_state)[1]
    if before != after:
        raise ValueError(
            f"the apply function of layer {model.name!r} returned a state whose structure "
            "differs from the state it was given"
        )
    return y, new_state


def compiled_forward(model: Layer):
    """The model's forward pass under ``kn.jit``, made once per model and kept on it."""
    compiled = model.cache.compiled
    if compiled is None:

        def forward(params, state, x, ctx, training, dtype_name):
            return traced_forward(model, params, state, x, ctx, training, dtypes.from_short_name(dtype_name))

        forward.__name__ = model.name if model.name.isidentifier() else "forward"
        compiled = jit(forward)
        model.cache.compiled = compiled
    return compiled


def apply(model: Layer, vars: Vars, x: Any, training: bool = False, ctx: dict | None = None):
    """The forward pass: ``(y, vars2)`` where ``vars2`` has the same params and the updated state.

    ``x`` is an array or a tree of arrays; floating-point leaves are converted to
    ``vars.dtype``. ``training`` switches dropout on and makes batch norm use (and update)
    batch statistics. ``ctx`` is the context dict described in :mod:`kaun_ir.layer.core` (e.g.
    ``{"rng": key, "attention_mask": mask}``). On concrete arrays the pass is compiled and
    cached per input signature; inside a trace it is traced through.
    """
    check_layer(model, "layer.apply: model")
    if not isinstance(vars, Vars):
        raise TypeError(
            f"layer.apply: vars must be a kn.layer.Vars (from layer.init), got {type(vars).__name__}"
        )
    if not isinstance(training, (bool, np.bool_)):
        raise TypeError(f"layer.apply: training must be a Python bool, got {type(training).__name__}")
    training = bool(training)
    if ctx is None:
        ctx = {}
    elif not isinstance(ctx, dict):
        raise TypeError(f"layer.apply: ctx must be a dict, got {type(ctx).__name__}")
    else:
        ctx = dict(ctx)
    if current_builder() is not None:
        y, new_state = traced_forward(model, vars.params, vars.state, x, ctx, training, vars.dtype)
    else:
        if training and "rng" not in ctx and rng.in_scope():
            ctx["rng"] = rng.next_key()
        compiled = compiled_forward(model)
        y, new_state = compiled(vars.params, vars.state, x, ctx, training, dtypes.short_name(vars.dtype))
    return y, Vars(vars.params, new_state, vars.dtype)
