"""What the layer constructors are built from: checks of hyper-parameters (``ValueError`` naming
the argument), initialiser resolution, parameter creation from the current ``kn.rng`` scope, the
``stateless`` wrapper and the dense map shared by ``linear`` and attention.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from kaun_ir import dtypes, rng
from kaun_ir.errors import ShapeError
from kaun_ir.ir.builder import current_path
from kaun_ir.layer.core import Layer, Vars
from kaun_ir.nn import init as initializers
from kaun_ir.surface.linalg import matmul
from kaun_ir.surface.tensor import type_of

__all__ = []


def path_prefix() -> str:
    """``"<layer path>: "`` for error messages raised while a layer is applied ("" outside one)."""
    path = current_path()
    return f"{path}: " if path else ""


def positive_int(value: Any, arg: str, layer: str) -> int:
    """``value`` as an int, or ValueError naming ``arg`` of constructor ``layer``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"layer.{layer}: {arg} must be a positive int, got {value!r}")
    return int(value)


def optional_positive_int(value: Any, arg: str, layer: str) -> int | None:
    """None (a size to infer from the input at ``layer.init``) or a positive int."""
    return None if value is None else positive_int(value, arg, layer)


def infer_size(
    given: int | None, x: Any, axis: int, min_ndim: int, arg: str, layer: str, expects: str
) -> int:
    """The size ``arg`` of ``layer``: read from axis ``axis`` of the abstract input ``x`` (a
    ``kn.ShapeDtype``, or None when ``layer.init`` got no example) and checked against ``given``.
    Errors name the layer path (the scope ``layer.init`` runs the child's init in)."""
    where = f"{current_path() or layer}: "  # the path ends with the layer's name
    if x is None:
        if given is None:
            raise ValueError(
                f"{where}{arg} was not given and there is no example input to infer it from; "
                f"pass {arg}=... or call layer.init(model, example)"
            )
        return given
    if not hasattr(x, "shape"):
        raise TypeError(f"{where}{layer} expects one array as input, got {type(x).__name__}")
    shape = tuple(x.shape)
    if len(shape) < min_ndim:
        raise ShapeError(f"{where}{layer} expects an input {expects}, got shape {list(shape)}")
    inferred = shape[axis]
    if given is not None and given != inferred:
        raise ShapeError(
            f"{where}{arg}={given} but the input {list(shape)} has {inferred} (an input {expects})"
        )
    return inferred


def rate_in_unit_interval(value: Any, arg: str, layer: str) -> float:
    """A probability in ``[0, 1)``, or ValueError naming ``arg``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"layer.{layer}: {arg} must be a number in [0, 1), got {value!r}")
    value = float(value)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"layer.{layer}: {arg} must be in [0, 1), got {value}")
    return value


def positive_float(value: Any, arg: str, layer: str) -> float:
    """``value`` as a float, or ``ValueError`` naming the layer and the argument unless it is a
    positive number."""
    is_number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not is_number or not value > 0:
        raise ValueError(f"layer.{layer}: {arg} must be a positive number, got {value!r}")
    return float(value)


# factories that users may pass uncalled (weight_init=kn.init.glorot_uniform)
_FACTORIES = {
    initializers.glorot_uniform,
    initializers.glorot_normal,
    initializers.he_uniform,
    initializers.he_normal,
    initializers.lecun_uniform,
    initializers.lecun_normal,
}


def resolve_init(value: Any, default: Callable, arg: str, layer: str) -> Callable:
    """An initialiser ``(key, shape, dtype) -> array`` from an argument: None means ``default``;
    a no-argument factory such as ``kn.init.glorot_uniform`` is called."""
    if value is None:
        return default
    if value in _FACTORIES:
        return value()
    if not callable(value):
        raise ValueError(
            f"layer.{layer}: {arg} must be an initialiser (key, shape, dtype) -> array, got {value!r}"
        )
    return value


def make_param(initializer: Callable, shape: tuple[int, ...], dt) -> Any:
    """One parameter: the initialiser called with the next key of the current rng scope."""
    return initializer(rng.next_key(), shape, dt)


def stateless(name: str, forward: Callable[..., Any], make_params: Callable | None = None) -> Layer:
    """A layer without state: ``forward(params, x, training, ctx) -> y``; ``make_params(dtype)``
    builds the parameter tree (``[]`` when omitted)."""

    def init_(dt):
        return Vars(make_params(dt) if make_params is not None else [], [], dt)

    def apply_(params, state, x, *, training, ctx):
        return forward(params, x, training, ctx), state

    return Layer(init_, apply_, name)


def warn_if_integer(t, what: str) -> None:
    """Integer inputs are promoted to the parameters' float dtype; say so (once per call site and
    trace), since token ids fed to a dense layer are usually a mistake (use ``embedding``)."""
    if not dtypes.is_float(t.dtype):
        warnings.warn(
            f"{path_prefix()}{what}: integer input {t} is converted to floating point (cast it "
            "yourself, or use layer.embedding for token ids)",
            UserWarning,
            stacklevel=3,
        )


def dense(params, x, in_features: int, what: str):
    """``x @ weight + bias`` with a check of ``x``'s last axis (shared with attention)."""
    t = type_of(x)
    if t.ndim < 1 or t.shape[-1] != in_features:
        raise ShapeError(f"{path_prefix()}{what} expects an input [..., {in_features}], got {t}")
    warn_if_integer(t, what)
    y = matmul(x, params["weight"])
    return y + params["bias"] if "bias" in params else y


def int_tuple(value: Any, nd: int, arg: str, layer: str, minimum: int) -> tuple[int, ...]:
    """``value`` (an int or a sequence of ``nd`` ints, each >= ``minimum``) as an ``nd``-tuple;
    ValueError naming ``arg`` and ``layer`` otherwise."""
    values = (value,) * nd if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value
    try:
        values = tuple(values)
    except TypeError:
        raise ValueError(f"layer.{layer}: {arg} must be an int or {nd} ints, got {value!r}") from None
    if len(values) != nd or any(
        isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum for v in values
    ):
        bound = "positive" if minimum > 0 else "non-negative"
        raise ValueError(f"layer.{layer}: {arg} must be a {bound} int or {nd} such ints, got {value!r}")
    return tuple(int(v) for v in values)
