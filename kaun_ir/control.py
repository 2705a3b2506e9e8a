"""Structured control flow: ``kn.while_loop`` and ``kn.fori_loop`` (traced into ``while``)."""

from __future__ import annotations

from typing import Any, Callable

from . import tree
from .api import op_function
from .ir.builder import Builder
from .ir.core import Graph
from .ir.rewrite import rebind
from .tensor import Tensor, apply, to_value, type_of

__all__ = ["while_loop", "fori_loop"]


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
        extra = args[len(types):] if passthrough else ()
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
    """``val = body_fun(i, val)`` for ``i`` in ``range(lower, upper)`` inside one ``while`` op."""
    import numpy as np

    def cond(state):
        return state[0] < np.int32(upper)

    def body(state):
        i, val = state
        return i + np.int32(1), body_fun(i, val)

    return while_loop(cond, body, (np.int32(lower), init_val))[1]
