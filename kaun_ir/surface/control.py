"""Structured control flow: ``kn.scan`` (the ``scan`` op), ``kn.while_loop`` (the ``while`` op) and
``kn.fori_loop`` (a ``scan`` when its bounds are Python integers, else a ``while``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kaun_ir import dtypes, tree
from kaun_ir.errors import ShapeError
from kaun_ir.ir.builder import Builder
from kaun_ir.ir.clone import rebind
from kaun_ir.ir.core import Graph, TensorType
from kaun_ir.surface.function import op_function
from kaun_ir.surface.promotion import astype
from kaun_ir.surface.tensor import Tensor, apply, to_value, type_of

__all__ = ["scan", "while_loop", "fori_loop"]


def _trace_region(fn: Callable, treedef, types, name: str) -> tuple[Graph, list[Tensor]]:
    with Builder(record_source=False) as builder:
        args = [Tensor(builder.add_input(t), builder) for t in types]
        out = fn(tree.unflatten(treedef, args))
        leaves, _ = tree.flatten(out)
        outputs = [to_value(builder, leaf) for leaf in leaves]
    return builder.finish(outputs, name=name), list(builder.captures)


def trace_loop_regions(cond_fun: Callable, body_fun: Callable, init_val: Any):
    """The (cond, body) graphs of a loop over ``init_val``'s tree; outer tensors they use become
    extra loop-carried values passed through unchanged (returned third when any exist)."""
    leaves, treedef = tree.flatten(init_val)
    types = [type_of(leaf) for leaf in leaves]
    cond, cond_caps = _trace_region(cond_fun, treedef, types, "cond")
    body, body_caps = _trace_region(body_fun, treedef, types, "body")
    captures: list[Tensor] = []
    for tensor in cond_caps + body_caps:
        if all(tensor.value is not c.value for c in captures):
            captures.append(tensor)
    if not captures:
        return cond, body
    all_types = types + [c.type for c in captures]
    args = Graph.arguments(all_types)
    position = {id(c.value): len(types) + k for k, c in enumerate(captures)}

    def widen(graph: Graph, own: list[Tensor], passthrough: bool) -> Graph:
        mapping = {id(graph.inputs[i]): args[i] for i in range(len(types))}
        for k, tensor in enumerate(own):
            mapping[id(graph.inputs[len(types) + k])] = args[position[id(tensor.value)]]
        extra = args[len(types) :] if passthrough else ()
        return rebind(graph, args, mapping, extra)

    return widen(cond, cond_caps, False), widen(body, body_caps, True), captures


@op_function
def while_loop(cond_fun: Callable, body_fun: Callable, init_val: Any) -> Any:
    """Run ``val = body_fun(val)`` while ``cond_fun(val)`` is true; returns the final ``val``.

    ``init_val`` is any tree of arrays; ``body_fun`` must return the same structure, shapes and
    dtypes, and ``cond_fun`` a bool scalar. Both are traced once into the regions of a single
    ``while`` op (lowered to ``stablehlo.while``), so the loop runs inside the compiled
    executable. Tensors of the enclosing trace that the functions use are carried along.
    """
    leaves, treedef = tree.flatten(init_val)
    regions = trace_loop_regions(cond_fun, body_fun, init_val)
    captures = regions[2] if len(regions) == 3 else []
    outs = apply("while", *leaves, *captures, regions=regions[:2])
    outs = (outs,) if not isinstance(outs, tuple) else outs
    return tree.unflatten(treedef, list(outs[: len(leaves)]))


def fori_loop(lower: int, upper: int, body_fun: Callable, init_val: Any) -> Any:
    """``val = body_fun(i, val)`` for ``i`` in ``range(lower, upper)``; returns the final ``val``.

    With Python-integer bounds the trip count is static and the loop is a ``scan`` (so it can be
    differentiated in reverse mode); with traced bounds it is a ``while`` loop, which cannot.
    ``i`` is an int32 scalar. Bounds must be integers (a float or bool bound, ``fori_loop(0.0,
    3.5, ...)``, is a ``TypeError`` rather than a silently rounded trip count).
    """
    _check_bound(lower, "lower")
    _check_bound(upper, "upper")
    if _static_int(lower) and _static_int(upper):
        lo, hi = int(lower), int(upper)

        def step(state, _):
            i, val = state
            return (i + np.int32(1), body_fun(i, val)), None

        (_, val), _ = scan(step, (np.int32(lo), init_val), None, length=max(hi - lo, 0))
        return val

    def cond(state):
        return state[0] < astype(upper, np.int32)

    def body(state):
        i, val = state
        return i + np.int32(1), body_fun(i, val)

    return while_loop(cond, body, (astype(lower, np.int32), init_val))[1]


def _check_bound(bound, which: str) -> None:
    if _static_int(bound):
        return
    dtype = type_of(bound).dtype if isinstance(bound, Tensor) else getattr(bound, "dtype", None)
    if (
        isinstance(bound, (bool, np.bool_))
        or dtype is None
        or not dtypes.is_integer(dtype)
        or dtypes.is_bool(dtype)
    ):
        what = (
            type(bound).__name__
            if dtype is None
            else f"{type(bound).__name__} of dtype {dtypes.short_name(dtype)}"
        )
        raise TypeError(f"fori_loop: the {which} bound must be an integer scalar, got {bound!r} ({what})")
    if tuple(getattr(bound, "shape", ())) != ():
        raise ShapeError(f"fori_loop: the {which} bound must be a scalar, got shape {tuple(bound.shape)}")


def _static_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def scan_regions(f: Callable, init: Any, xs: Any, length: int | None = None, consts: tuple = ()):
    """Trace ``f(carry, x, *consts) -> (carry, y)`` into the body of a ``scan`` op.

    Returns ``(body, captures, carry_def, y_def, length)``: the body graph takes
    ``(consts, captures, carry leaves, x slices)``; ``captures`` are the Tensors of enclosing traces
    that ``f`` uses (extra loop-invariant operands after ``consts``).
    """
    carry_leaves, carry_def = tree.flatten(init)
    x_leaves, x_def = tree.flatten(xs)
    x_types = [type_of(leaf) for leaf in x_leaves]
    for k, t in enumerate(x_types):
        if not t.shape:
            raise ShapeError(
                f"scan: scanned input {k} is the scalar {t}; each x needs a leading axis to scan over"
            )
    lengths = sorted({t.shape[0] for t in x_types})
    if len(lengths) > 1:
        raise ShapeError(
            f"scan: the scanned inputs have different leading axes {lengths} ({', '.join(map(str, x_types))})"
        )
    if length is None:
        if not lengths:
            raise ValueError("scan: with no scanned inputs (xs=None) the length= argument is required")
        length = lengths[0]
    if not _static_int(length) or length < 0:
        raise ValueError(f"scan: length must be a non-negative Python integer, got {length!r}")
    if lengths and lengths[0] != length:
        raise ShapeError(f"scan: length={length} but the scanned inputs have leading axis {lengths[0]}")
    carry_types = [type_of(leaf) for leaf in carry_leaves]
    const_types = [type_of(c) for c in consts]
    with Builder() as builder:
        c_args = [Tensor(builder.add_input(t), builder) for t in const_types]
        h_args = [Tensor(builder.add_input(t), builder) for t in carry_types]
        x_args = [Tensor(builder.add_input(TensorType(t.dtype, t.shape[1:])), builder) for t in x_types]
        out = f(tree.unflatten(carry_def, h_args), tree.unflatten(x_def, x_args), *c_args)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError("scan: the body must return a pair (carry, y); use (carry, None) for no y")
        new_carry, y = out
        new_leaves, new_def = tree.flatten(new_carry)
        if new_def != carry_def:
            raise TypeError(f"scan: the body returns a carry of structure {new_def} but init has {carry_def}")
        h_out = [to_value(builder, leaf) for leaf in new_leaves]
        for k, (value, want) in enumerate(zip(h_out, carry_types)):
            if value.type != want:
                raise TypeError(
                    f"scan: carry leaf {k} enters the body as {want} but comes back as "
                    f"{value.type}; the carry must keep its shape and dtype"
                )
        y_leaves, y_def = tree.flatten(y)
        y_out = [to_value(builder, leaf) for leaf in y_leaves]
    graph = builder.finish(h_out + y_out, name="body")
    captures = list(builder.captures)
    if captures:  # captured values are loop-invariant operands: move them next to the consts
        n_c = len(const_types)
        all_types = const_types + [c.type for c in captures] + carry_types + [a.type for a in x_args]
        args = Graph.arguments(all_types)
        n_cap, n_hx = len(captures), len(carry_types) + len(x_types)
        # traced order: consts, carry, xs, captures -> body order: consts, captures, carry, xs
        new_index = (
            list(range(n_c)) + [n_c + n_cap + k for k in range(n_hx)] + [n_c + k for k in range(n_cap)]
        )
        mapping = {id(graph.inputs[old]): args[new] for old, new in enumerate(new_index)}
        graph = rebind(graph, args, mapping)
    return graph, captures, carry_def, y_def, length


@op_function
def scan(
    f: Callable,
    init: Any,
    xs: Any = None,
    length: int | None = None,
    reverse: bool = False,
    unroll: int | bool = 1,
) -> tuple[Any, Any]:
    """Loop ``carry, y = f(carry, x)`` over the leading axis of ``xs``; returns ``(carry, ys)``.

    Like ``jax.lax.scan``: ``init`` and ``xs`` are trees of arrays (``xs=None`` with ``length=``
    for a loop without inputs), ``f`` returns the carry with unchanged structure, shapes and
    dtypes plus a tree ``y`` (or ``None``) whose leaves are stacked into ``ys`` along a new leading
    axis of ``length``. ``reverse=True`` runs from the last element to the first (``ys`` keeps
    the order of ``xs``). ``unroll`` copies the body that many times per loop trip (``True``:
    all). The whole loop is one ``scan`` op lowered to a single ``stablehlo.while``;
    ``kn.grad`` differentiates through it, saving the body's residuals stacked per iteration.
    """
    x_leaves, _ = tree.flatten(xs)
    body, captures, carry_def, y_def, length = scan_regions(f, init, xs, length)
    unroll = length if unroll is True else int(unroll)
    if unroll < 1:
        raise ValueError(f"scan: unroll must be >= 1 (or True), got {unroll}")
    carry_leaves, _ = tree.flatten(init)
    outs = apply(
        "scan",
        *captures,
        *carry_leaves,
        *x_leaves,
        regions=(body,),
        num_consts=len(captures),
        num_carry=len(carry_leaves),
        length=length,
        reverse=bool(reverse),
        unroll=max(unroll, 1),
    )
    outs = (outs,) if not isinstance(outs, tuple) else outs
    n = len(carry_leaves)
    return tree.unflatten(carry_def, list(outs[:n])), tree.unflatten(y_def, list(outs[n:]))
