"""The layer abstraction: ``Layer`` (a record of ``init`` and ``apply``), ``Vars``, and the
combinators ``sequential`` and ``compose``.

A :class:`Layer` is plain data: two functions and a name.

* ``layer.init(dtype) -> Vars`` makes fresh parameters and state, drawing random keys from the
  current ``kn.rng`` scope. A layer whose sizes follow from its input takes a second argument,
  ``init(dtype, x)``: ``x`` is the input's abstract type (a ``kn.ShapeDtype`` tree, no data), or
  None when no example was given. Combinators pass it on with :func:`child_init` and find their
  next child's input with :func:`eval_shape` (an abstract trace: no computation, no compile).
* ``layer.apply(params, state, x, *, training, ctx) -> (y, new_state)`` is the forward pass. It
  is traced (it runs on symbolic tensors); ``params`` and ``state`` are trees of arrays,
  ``training`` a Python bool and ``ctx`` a dict (see below).

The module functions :func:`init` and :func:`apply` are what users call. :func:`apply` compiles
the forward pass with ``kn.jit`` (one executable per model, input signature and value of
``training``) when called on concrete arrays, and traces through when called inside another
trace (``kn.jit``, ``kn.grad``, ``train.step``).

**The context** ``ctx`` is a dict passed unchanged to every layer, except for two entries:

* ``ctx["rng"]``, a ``uint32[2]`` key, is the source of randomness in the forward pass
  (dropout). Combinators derive a distinct key per child with ``kn.random.fold_in``:
  ``sequential`` folds in the child's index, ``compose`` 0 (left) and 1 (right). Because the key
  is an *input* of the compiled function, a new key each call gives new masks without
  recompiling. ``train.step`` supplies ``fold_in(base_key, step)`` computed inside the compiled
  step from its step counter, so every step gets fresh randomness. When :func:`apply` runs
  eagerly with ``training=True``, no ``"rng"`` and an active ``kn.rng`` scope, it draws the key
  from the scope.
* ``ctx["attention_mask"]`` is read by attention layers (bool, True = attend).

Other entries are free for user layers; array values become inputs of the compiled function,
other values are static (part of the compile-cache key).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kaun_ir import dtypes, rng, tree
from kaun_ir.ir.builder import current_builder, scope
from kaun_ir.layer.roll import apply_layers as roll_layers
from kaun_ir.layer.roll import resolve_roll, rolling_allowed
from kaun_ir.surface import random
from kaun_ir.surface.promotion import astype, dtype_of
from kaun_ir.surface.trace import ShapeDtype, is_array_leaf, leaf_type, trace_flat

__all__ = [
    "Layer",
    "Vars",
    "init",
    "apply",
    "params",
    "state",
    "dtype",
    "with_params",
    "with_state",
    "sequential",
    "compose",
    "child_ctx",
    "child_init",
    "eval_shape",
]


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
        from kaun_ir.layer.show import vars_repr

        return vars_repr(self)

    def _repr_html_(self) -> str:
        from kaun_ir.layer.show import vars_html

        return vars_html(self)


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
        from kaun_ir.layer.show import layer_repr

        return layer_repr(self)

    def _repr_html_(self) -> str:
        from kaun_ir.layer.show import layer_html

        return layer_html(self)


def _check_layer(model: Any, what: str) -> Layer:
    if not isinstance(model, Layer):
        raise TypeError(f"{what} must be a kn.layer.Layer, got {type(model).__name__}")
    return model


def _float_dtype(dtype: Any) -> np.dtype:
    dt = dtypes.canonical(dtype)
    if not dtypes.is_float(dt):
        raise TypeError(
            f"layer.init: the parameter dtype must be floating point, got {dtypes.short_name(dt)}"
        )
    return dt


# ------------------------------------------------------------------------------ init / apply


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
    _check_layer(model, "layer.init: model")
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
        return _forward(layer, p, s, inputs, dict(ctx or {}), training, vars.dtype)[0]

    traced = trace_flat(forward, (params, state, x), {})
    outputs = [ShapeDtype(v.type.shape, v.type.dtype) for v in traced.graph.outputs]
    return tree.unflatten(traced.out_treedef, outputs)


def _spec_tree(t: Any) -> Any:
    leaves, treedef = tree.flatten(t)
    return tree.unflatten(
        treedef,
        [ShapeDtype(leaf_type(v).shape, leaf_type(v).dtype) if is_array_leaf(v) else v for v in leaves],
    )


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


def _forward(model: Layer, params, state, x, ctx, training: bool, dtype: np.dtype):
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


def _compiled(model: Layer):
    """The model's forward pass under ``kn.jit``, made once per model and kept on it."""
    compiled = model.cache.compiled
    if compiled is None:
        from kaun_ir.runtime import jit

        def forward(params, state, x, ctx, training, dtype_name):
            return _forward(model, params, state, x, ctx, training, dtypes.from_short_name(dtype_name))

        forward.__name__ = model.name if model.name.isidentifier() else "forward"
        compiled = jit(forward)
        model.cache.compiled = compiled
    return compiled


def apply(model: Layer, vars: Vars, x: Any, training: bool = False, ctx: dict | None = None):
    """The forward pass: ``(y, vars2)`` where ``vars2`` has the same params and the updated state.

    ``x`` is an array or a tree of arrays; floating-point leaves are converted to
    ``vars.dtype``. ``training`` switches dropout on and makes batch norm use (and update)
    batch statistics. ``ctx`` is the context dict described in the module docstring (e.g.
    ``{"rng": key, "attention_mask": mask}``). On concrete arrays the pass is compiled and
    cached per input signature; inside a trace it is traced through.
    """
    _check_layer(model, "layer.apply: model")
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
        y, new_state = _forward(model, vars.params, vars.state, x, ctx, training, vars.dtype)
    else:
        if training and "rng" not in ctx and rng.in_scope():
            ctx["rng"] = rng.next_key()
        compiled = _compiled(model)
        y, new_state = compiled(vars.params, vars.state, x, ctx, training, dtypes.short_name(vars.dtype))
    return y, Vars(vars.params, new_state, vars.dtype)


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


# ------------------------------------------------------------------------------ combinators


def child_ctx(ctx: dict, index: int) -> dict:
    """The context for child ``index`` of a combinator: ``ctx`` with its ``"rng"`` key (if any)
    replaced by ``kn.random.fold_in(ctx["rng"], index)``, so that children draw independent
    randomness from one key."""
    if "rng" not in ctx or ctx["rng"] is None:
        return ctx
    child = dict(ctx)
    with scope("rng"):  # key derivation is grouped apart from the layer's own ops
        child["rng"] = random.fold_in(ctx["rng"], index)
    return child


def _path_name(prefix: str, layer: Layer) -> str:
    return f"{prefix}.{layer.name}" if layer.name else prefix


def sequential(
    layers: Sequence[Layer], name: str = "sequential", roll: bool | int | str | None = None
) -> Layer:
    """Layers applied one after the other; params and state are lists with one entry per layer
    (``[]`` for layers without parameters), so parameter paths read ``"0.weight"``, ``"2.bias"``.

    While tracing, layer ``i`` runs inside the layer-path scope ``f"{i}.{layer.name}"`` (nodes
    show ``"1.linear"``), and it receives ``ctx["rng"]`` folded with ``i``.

    ``roll`` turns runs of consecutive layers whose traced computations are identical up to
    their parameters (a transformer's blocks) into one loop (a ``scan`` over the blocks'
    parameters, stacked inside the graph), so XLA compiles the block once instead of once per
    layer. Parameters, state, gradients and results are those of the unrolled model; blocks that
    differ in any way stay unrolled. ``True`` rolls runs of 2 or more, ``False`` never rolls, an
    int ``N`` rolls runs of at least ``N``, ``"auto"`` runs of at least 12 (where rolling starts
    to shorten the first training step on XLA CPU). ``None`` (default) takes the
    ``KAUN_IR_ROLL`` environment variable (``0``, ``1``, ``auto`` or ``N``); unset: no rolling.
    See docs/loops.md.
    """
    layers = list(layers)
    for i, layer in enumerate(layers):
        _check_layer(layer, f"sequential: element {i}")
    min_run = resolve_roll(roll)

    def init_(dt, x=None):
        children = []
        for i, layer in enumerate(layers):
            with scope(_path_name(str(i), layer)):
                v = child_init(layer, dt, x)
                # the next child's input, only when an example is being followed
                x = eval_shape(layer, v, x) if x is not None and i + 1 < len(layers) else None
            children.append(v)
        return Vars([v.params for v in children], [v.state for v in children], dt)

    def apply_(params, state, x, *, training, ctx):
        if not isinstance(params, (list, tuple)) or len(params) != len(layers):
            raise ValueError(
                f"sequential of {len(layers)} layers needs a list of {len(layers)} parameter "
                f"trees, got {type(params).__name__} of length {_length(params)}"
            )
        if not isinstance(state, (list, tuple)) or len(state) != len(layers):
            raise ValueError(
                f"sequential of {len(layers)} layers needs a list of {len(layers)} state trees, "
                f"got {type(state).__name__} of length {_length(state)}"
            )
        if min_run and len(layers) >= min_run and current_builder() is not None and rolling_allowed():
            return roll_layers(
                layers,
                params,
                state,
                x,
                training=training,
                ctx=ctx,
                min_run=min_run,
                path_name=_path_name,
                child_ctx=child_ctx,
            )
        new_state = []
        for i, layer in enumerate(layers):
            with scope(_path_name(str(i), layer)):
                x, s = layer.apply(params[i], state[i], x, training=training, ctx=child_ctx(ctx, i))
            new_state.append(s)
        return x, new_state

    return Layer(init_, apply_, name)


def _length(t: Any) -> str:
    return str(len(t)) if hasattr(t, "__len__") else "?"


def compose(left: Layer, right: Layer, name: str = "compose") -> Layer:
    """``right`` applied to the output of ``left``; params and state are ``{"left": ...,
    "right": ...}``. The two layers' input and output types may differ (e.g. an embedding, int
    ids -> floats, then a dense layer). Layer paths ``"left.<name>"`` / ``"right.<name>"``;
    ``ctx["rng"]`` is folded with 0 for ``left`` and 1 for ``right``."""
    _check_layer(left, "compose: left")
    _check_layer(right, "compose: right")

    def init_(dt, x=None):
        with scope(_path_name("left", left)):
            lv = child_init(left, dt, x)
            h = eval_shape(left, lv, x) if x is not None else None
        with scope(_path_name("right", right)):
            rv = child_init(right, dt, h)
        return Vars({"left": lv.params, "right": rv.params}, {"left": lv.state, "right": rv.state}, dt)

    def apply_(params, state, x, *, training, ctx):
        for what, t in (("params", params), ("state", state)):
            if not isinstance(t, dict) or set(t) != {"left", "right"}:
                raise ValueError(
                    f"compose needs {what} of the form {{'left': ..., 'right': ...}}, got {type(t).__name__}"
                )
        with scope(_path_name("left", left)):
            h, ls = left.apply(params["left"], state["left"], x, training=training, ctx=child_ctx(ctx, 0))
        with scope(_path_name("right", right)):
            y, rs = right.apply(params["right"], state["right"], h, training=training, ctx=child_ctx(ctx, 1))
        return y, {"left": ls, "right": rs}

    return Layer(init_, apply_, name)
