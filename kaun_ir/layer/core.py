"""The layer records: ``Layer`` (a record of ``init`` and ``apply``) and ``Vars`` (what ``init``
makes), with the accessors of ``Vars``; the calling conventions every layer follows.

A :class:`Layer` is plain data: two functions and a name.

* ``layer.init(dtype) -> Vars`` makes fresh parameters and state, drawing random keys from the
  current ``kn.rng`` scope. A layer whose sizes follow from its input takes a second argument,
  ``init(dtype, x)``: ``x`` is the input's abstract type (a ``kn.ShapeDtype`` tree, no data), or
  None when no example was given. Combinators pass it on with ``kn.layer.child_init`` and find
  their next child's input with ``kn.layer.eval_shape`` (an abstract trace: no computation, no
  compile).
* ``layer.apply(params, state, x, *, training, ctx) -> (y, new_state)`` is the forward pass. It
  is traced (it runs on symbolic tensors); ``params`` and ``state`` are trees of arrays,
  ``training`` a Python bool and ``ctx`` a dict (see below).

The functions ``kn.layer.init`` (``layer/initialise.py``) and ``kn.layer.apply``
(``layer/forward.py``) are what users call; the combinators ``sequential`` and ``compose`` are in
``layer/combinators.py``. ``apply`` compiles the forward pass with ``kn.jit`` (one executable
per model, input signature and value of ``training``) when called on concrete arrays, and
traces through when called inside another trace (``kn.jit``, ``kn.grad``, ``train.step``).

**The context** ``ctx`` is a dict passed unchanged to every layer, except for two entries:

* ``ctx["rng"]``, a ``uint32[2]`` key, is the source of randomness in the forward pass
  (dropout). Combinators derive a distinct key per child with ``kn.random.fold_in``:
  ``sequential`` folds in the child's index, ``compose`` 0 (left) and 1 (right). Because the key
  is an *input* of the compiled function, a new key each call gives new masks without
  recompiling. ``train.step`` supplies ``fold_in(base_key, step)`` computed inside the compiled
  step from its step counter, so every step gets fresh randomness. When ``kn.layer.apply`` runs
  eagerly with ``training=True``, no ``"rng"`` and an active ``kn.rng`` scope, it draws the key
  from the scope.
* ``ctx["attention_mask"]`` is read by attention layers (bool, True = attend).

Other entries are free for user layers; array values become inputs of the compiled function,
other values are static (part of the compile-cache key).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kaun_ir import dtypes

__all__ = ["Layer", "Vars", "params", "state", "dtype", "with_params", "with_state"]


@dataclass(frozen=True, repr=False)
class Vars:
    """A model's variables: trainable ``params``, non-trainable ``state`` (e.g. batch-norm
    statistics) and the floating-point ``dtype`` they were made with. Immutable; use
    :func:`with_params` / :func:`with_state` for modified copies."""

    params: Any
    state: Any
    dtype: np.dtype

    def __post_init__(self):
        object.__setattr__(self, "dtype", dtypes.canonical(self.dtype))

    def __repr__(self) -> str:  # shapes and dtypes, never the arrays
        return _VIEWS["vars_repr"](self)

    def _repr_html_(self) -> str:
        return _VIEWS["vars_html"](self)


class LayerCache:
    """What is derived from a layer's functions and kept with it, never part of its value:
    ``takes_input`` (whether ``init`` takes the input type; None until asked) and ``compiled``
    (the forward pass under ``kn.jit``; None until first applied to concrete arrays)."""

    __slots__ = ("takes_input", "compiled")

    def __init__(self):
        self.takes_input: bool | None = None
        self.compiled = None


@dataclass(frozen=True, eq=False, repr=False)
class Layer:
    """A model: ``init(dtype) -> Vars`` (or ``init(dtype, x) -> Vars`` for a layer that infers
    sizes from its input's abstract type ``x``, None when unknown) and ``apply(params, state, x,
    *, training, ctx) -> (y, state)``, plus a ``name`` used in layer paths (``"1.linear"``) and
    error messages.

    Compared by identity. Write new layers by giving the two functions::

        def scale_init(dtype):
            return kn.layer.Vars({"s": kn.ones((), dtype)}, [], dtype)

        def scale_apply(params, state, x, *, training, ctx):
            return x * params["s"], state

        scale = kn.layer.Layer(scale_init, scale_apply, "scale")
    """

    init: Callable[[np.dtype], Vars]
    apply: Callable[..., tuple[Any, Any]]
    name: str = "layer"
    #: caches of this layer (a :class:`LayerCache`); ``dataclasses.replace`` gives a fresh one
    cache: LayerCache = field(default_factory=LayerCache, init=False, compare=False, hash=False, repr=False)

    def __repr__(self) -> str:  # the structure, not function addresses
        return _VIEWS["layer_repr"](self)

    def _repr_html_(self) -> str:
        return _VIEWS["layer_html"](self)


def check_layer(model: Any, what: str) -> Layer:
    """``model``, checked to be a :class:`Layer` (``what`` names it in the error)."""
    if not isinstance(model, Layer):
        raise TypeError(f"{what} must be a kn.layer.Layer, got {type(model).__name__}")
    return model


# ------------------------------------------------------------------------------ accessors


def params(v: Vars) -> Any:
    """The trainable parameter tree."""
    return v.params


def state(v: Vars) -> Any:
    """The non-trainable state tree (e.g. batch-norm running statistics)."""
    return v.state


def dtype(v: Vars) -> np.dtype:
    """The parameter dtype."""
    return v.dtype


def with_params(v: Vars, p: Any) -> Vars:
    """``v`` with its parameters replaced by ``p``."""
    return Vars(p, v.state, v.dtype)


def with_state(v: Vars, s: Any) -> Vars:
    """``v`` with its state replaced by ``s``."""
    return Vars(v.params, s, v.dtype)


# How a Layer and its Vars show themselves (text and notebook HTML): drawn by layer.show, which is
# built on this module, so the layer package fills the slot (kaun_ir/layer/__init__.py).
_VIEWS: dict[str, Callable] = {}


def install_views(**views: Callable) -> None:
    """Called by ``kaun_ir.layer``: ``vars_repr``, ``vars_html``, ``layer_repr``, ``layer_html``."""
    _VIEWS.update(views)
