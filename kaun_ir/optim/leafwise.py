"""Leaf-wise helpers shared by the optimisers and the gradient transformations: argument
checks, the per-step scalars (learning rate, bias corrections) cast once per dtype, and the
mapping of a per-leaf update over parameter-shaped trees."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from kaun_ir import dtypes, ptree
from kaun_ir.errors import ShapeError
from kaun_ir.surface.elementwise import add, multiply
from kaun_ir.surface.promotion import astype, dtype_of, shape_of
from kaun_ir.surface.tensor import Tensor

__all__ = []  # helpers of the optimiser modules; nothing public


# ------------------------------------------------------------------------ validation


def _number(
    opt: str, name: str, value: Any, low: float = 0.0, high: float | None = None, high_open: bool = True
) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"optim.{opt}: {name} must be a number, got {value!r}")
    value = float(value)
    if value != value:
        raise ValueError(f"optim.{opt}: {name} must be a number, got nan")
    too_high = high is not None and (value >= high if high_open else value > high)
    if value < low or too_high or value != value:
        upper = "" if high is None else f" and {'<' if high_open else '<='} {high}"
        raise ValueError(f"optim.{opt}: {name} must be >= {low}{upper}, got {value}")
    return value


def _learning_rate_arg(opt: str, lr: Any) -> Any:
    if callable(lr):
        return lr
    return _number(opt, "lr", lr)


# -------------------------------------------------------------------- per-step scalars


def _learning_rate(lr: Any, t: Any) -> Any:
    """The learning rate of step ``t``: a Python float or a float32 scalar Tensor."""
    value = lr(t) if callable(lr) else lr
    if isinstance(value, (Tensor, float, int)) and not isinstance(value, bool):
        return value
    host = np.asarray(value)  # a concrete array returned by a user's schedule
    if host.shape != () or host.dtype.kind not in "iuf":
        raise TypeError(f"optim: the learning-rate schedule returned {value!r}; it must be a scalar")
    return float(host)


class _Scalars:
    """Named per-step scalars, each cast at most once per parameter dtype."""

    def __init__(self, **values: Any):
        self.values = values
        self.cast: dict = {}

    def __call__(self, name: str, like: Any) -> Any:
        value = self.values[name]
        if isinstance(value, float):  # a Python float adapts to the leaf's dtype by itself
            return value
        key = (name, dtype_of(like))
        if key not in self.cast:
            self.cast[key] = astype(value, key[1])
        return self.cast[key]


def _scale(value: Any, factor: float) -> Any:
    """``value * factor`` for a Python float or a scalar Tensor."""
    return value * factor if isinstance(value, (float, int)) else multiply(value, factor)


def _step_float(t: Any) -> Any:
    return astype(t, dtypes.float32)


# ------------------------------------------------------------------- leaf-wise mapping


def _shape_text(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _leaves_like(params: Any, tree: Any, what: str, opt: str) -> list:
    """``tree``'s leaves, checked to have ``params``' structure and shapes."""
    try:
        ptree.map2(lambda a, b: None, params, tree)
    except ValueError as err:
        raise ValueError(f"optim.{opt}: {what} do not match the parameters: {err}") from None
    pairs = zip(ptree.flatten_with_paths(params), ptree.leaves(tree))
    leaves = []
    for (path, p), leaf in pairs:
        if shape_of(p) != shape_of(leaf):
            where = f"at {path!r}" if path else "at the root"
            raise ShapeError(
                f"optim.{opt}: {what} {where} have shape {_shape_text(shape_of(leaf))}, "
                f"the parameter {_shape_text(shape_of(p))}"
            )
        leaves.append(leaf)
    return leaves


def _map_leaves(opt: str, fn: Callable, params: Any, grads: Any, trees: tuple, n_out: int) -> tuple:
    """Apply ``fn(param, grad, *slot_leaves) -> n_out results`` leaf by leaf; returns ``n_out``
    trees of ``params``' structure."""
    param_leaves, rebuild = ptree.flatten(params)
    columns = [param_leaves, _leaves_like(params, grads, "the gradients", opt)]
    columns += [_leaves_like(params, tree, "the optimiser state trees", opt) for tree in trees]
    results = [fn(*row) for row in zip(*columns)]
    return tuple(rebuild([r[i] for r in results]) for i in range(n_out))


def _state_dtype_arg(opt: str, state_dtype: Any) -> Any:
    if state_dtype is None:
        return None
    dtype = dtypes.canonical(state_dtype)
    if not dtypes.is_float(dtype):
        raise ValueError(
            f"optim.{opt}: state_dtype must be a floating-point dtype, got {dtypes.short_name(dtype)}"
        )
    return dtype


def _in(like: Any, x: Any) -> Any:
    """``x`` in ``like``'s dtype (the slot dtype the arithmetic runs in)."""
    return astype(x, dtype_of(like))


def _out(p: Any, u: Any) -> Any:
    """An update in its parameter's dtype."""
    return astype(u, dtype_of(p))


def _ema(decay: float, new: Any, old: Any) -> Any:
    """``(1 - decay) * new + decay * old`` (optax's moment update)."""
    return add(multiply(1.0 - decay, new), multiply(decay, old))
