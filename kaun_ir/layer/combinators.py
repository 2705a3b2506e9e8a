"""Layers made of layers: ``sequential`` (one after the other, optionally rolled into a loop) and
``compose`` (one on the other's output), and :func:`child_ctx`, the context a combinator gives
each child.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kaun_ir.ir.builder import current_builder, scope
from kaun_ir.layer.core import Layer, Vars, check_layer
from kaun_ir.layer.initialise import child_init, eval_shape
from kaun_ir.layer.roll import apply_layers as roll_layers
from kaun_ir.layer.roll import resolve_roll, rolling_allowed
from kaun_ir.surface import random

__all__ = ["sequential", "compose", "child_ctx"]


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
        check_layer(layer, f"sequential: element {i}")
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
    check_layer(left, "compose: left")
    check_layer(right, "compose: right")

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
