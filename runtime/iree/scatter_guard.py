"""Out-of-bounds scatter indices made harmless before a graph goes to IREE.

StableHLO leaves a scatter window that does not fit in the operand to the implementation. XLA (and
the op's reference in kaun_ir's table) skip such an update; IREE 3.13's CPU code writes it,
outside the buffer: memory corruption, up to a crash of the process. :func:`guard_scatters`
rewrites every ``scatter`` / ``scatter_add`` so that IREE computes XLA's result: the operand is
padded at the end of each scattered dimension by the window's size, every index vector whose
window does not fit in the original operand is sent to the start of that padding, and the result
is sliced back. An update that XLA skips lands in the padding, which the slice drops; the others
land where they did. The cost is one pad and one slice of the operand per scatter.
"""

from __future__ import annotations

import numpy as np

from kaun_ir.ir.builder import Builder
from kaun_ir.ir.clone import copy_node
from kaun_ir.ir.core import Graph, Value
from kaun_ir.surface.tensor import Tensor, apply

__all__ = ["guard_scatters"]

_SCATTERS = ("scatter", "scatter_add")


def _window(node, shape: tuple) -> list[int]:
    """The window size of the scatter ``node`` along each operand dimension."""
    updates = node.inputs[2].type.shape
    inserted = set(node.attr("inserted_window_dims"))
    sizes = iter(updates[d] for d in node.attr("update_window_dims"))
    return [1 if o in inserted else next(sizes) for o in range(len(shape))]


def _per_component(values: list[int], indices: Tensor, ivd: int, dtype) -> Tensor:
    """``values`` (one per index-vector component) broadcast to the shape of ``indices``."""
    shape = tuple(indices.shape)
    if ivd == len(shape):  # an implicit index vector of one component
        const = apply("constant", value=np.asarray(values[0], dtype))
        return apply("broadcast_in_dim", const, shape=shape, broadcast_dimensions=())
    const = apply("constant", value=np.asarray(values, dtype))
    return apply("broadcast_in_dim", const, shape=shape, broadcast_dimensions=(ivd,))


def _guarded(node, operand: Tensor, indices: Tensor, updates: Tensor) -> Value:
    shape = tuple(operand.shape)
    window = _window(node, shape)
    dims = list(node.attr("scatter_dims_to_operand_dims"))
    ivd = node.attr("index_vector_dim")
    dtype = np.dtype(indices.dtype)
    high = [window[o] if o in dims else 0 for o in range(len(shape))]
    fill = apply("constant", value=np.zeros((), np.dtype(operand.dtype)))
    padded = apply("pad", operand, fill, low=(0,) * len(shape), high=tuple(high), interior=(0,) * len(shape))
    zero = _per_component([0] * len(dims), indices, ivd, dtype)
    last = _per_component([shape[o] - window[o] for o in dims], indices, ivd, dtype)
    fits = apply(
        "and",
        apply("compare", indices, zero, direction="GE"),
        apply("compare", indices, last, direction="LE"),
    )
    if ivd < len(indices.shape):  # every component of the vector fits
        fits = apply("reduce", fits, kind="and", dimensions=(ivd,))
        kept = [d for d in range(len(indices.shape)) if d != ivd]
        fits = apply("broadcast_in_dim", fits, shape=tuple(indices.shape), broadcast_dimensions=tuple(kept))
    outside = _per_component([shape[o] for o in dims], indices, ivd, dtype)
    safe = apply("select", fits, indices, outside)
    scattered = apply(node.op, padded, safe, updates, **dict(node.attrs))
    result = apply(
        "slice", scattered, start_indices=(0,) * len(shape), limit_indices=shape, strides=(1,) * len(shape)
    )
    return result.value


def guard_scatters(graph: Graph) -> Graph:
    """``graph`` with every top-level scatter guarded (see the module docstring); the graph itself
    when it has none. Scatters inside loop bodies are left as they are."""
    if not any(node.op in _SCATTERS for node in graph.nodes):
        return graph
    with Builder(record_source=False) as builder:
        args = [builder.add_input(v.type) for v in graph.inputs]
        env: dict[int, Value] = {id(old): new for old, new in zip(graph.inputs, args)}
        for node in graph.nodes:
            if node.op in _SCATTERS:
                operand, indices, updates = (Tensor(env.get(id(v), v), builder) for v in node.inputs)
                env[id(node.outputs[0])] = _guarded(node, operand, indices, updates)
                continue
            fresh = copy_node(node, env)
            builder.append(fresh)
            env.update((id(old), out) for old, out in zip(node.outputs, fresh.outputs))
        outputs = [env[id(v)] for v in graph.outputs]
    names = list(graph.input_names) if graph.input_names is not None else None
    return builder.finish(outputs, name=graph.name, input_names=names)
