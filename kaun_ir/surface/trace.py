"""``kn.trace``: run a function on symbolic tensors and record the IR graph."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kaun_ir import dtypes, tree
from kaun_ir.ir.builder import Builder
from kaun_ir.ir.core import Graph, TensorType
from kaun_ir.surface.tensor import Tensor, to_value, type_of


@dataclass(frozen=True)
class ShapeDtype:
    """An abstract input for tracing: a shape and a dtype, no data (like ``jax.ShapeDtypeStruct``)."""

    shape: tuple[int, ...]
    dtype: Any = dtypes.float32

    def __post_init__(self):
        # a normalisation, not a cache: dataclasses have no converters (tests/test_declared_state.py)
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", dtypes.canonical(self.dtype))


def is_array_leaf(x: Any) -> bool:
    """Leaves that become graph inputs: arrays, NumPy scalars, ShapeDtype specs, Tensors.

    Python scalars, strings and None are *static*: part of the compile-cache key in ``kn.jit``
    and passed to the function as they are.
    """
    if isinstance(x, (np.ndarray, np.generic, ShapeDtype, Tensor)):
        return True
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, type)


def leaf_type(x: Any) -> TensorType:
    """The ``TensorType`` of an argument leaf: a ``ShapeDtype`` or a concrete array-like value."""
    if isinstance(x, ShapeDtype):
        return TensorType(x.dtype, x.shape)
    return type_of(x)


@dataclass
class Traced:
    """The result of tracing: the graph plus what is needed to call it with a tree of arguments."""

    graph: Graph
    in_treedef: Any
    array_positions: list[int]  # indices (into the flat leaves) that are graph inputs
    out_treedef: Any
    captures: list  # Tensors of enclosing traces that became extra trailing inputs


def trace_flat(f: Callable, args: tuple, kwargs: dict, name: str | None = None) -> Traced:
    """Trace ``f(*args, **kwargs)``; every array leaf becomes an input, in flatten order."""
    leaves, treedef = tree.flatten((args, kwargs))
    positions = [i for i, leaf in enumerate(leaves) if is_array_leaf(leaf)]
    names = _input_names(args, kwargs)
    with Builder() as builder:
        symbolic = list(leaves)
        for i in positions:
            symbolic[i] = Tensor(builder.add_input(leaf_type(leaves[i])), builder)
        sym_args, sym_kwargs = tree.unflatten(treedef, symbolic)
        result = f(*sym_args, **sym_kwargs)
        out_leaves, out_treedef = tree.flatten(result)
        outputs = [to_value(builder, leaf) for leaf in out_leaves]
    input_names = names + [f"capture{i}" for i in range(len(builder.captures))]
    graph_name = name or getattr(f, "__name__", "main")
    if not graph_name.isidentifier():
        graph_name = "main"
    graph = builder.finish(outputs, name=graph_name, input_names=input_names)
    return Traced(graph, treedef, positions, out_treedef, list(builder.captures))


def _input_names(args: tuple, kwargs: dict) -> list[str]:
    names = []
    for i, arg in enumerate(args):
        for path, leaf in tree.paths(arg):
            if is_array_leaf(leaf):
                names.append(f"{i}.{path}" if path else str(i))
    for key in sorted(kwargs):
        for path, leaf in tree.paths(kwargs[key]):
            if is_array_leaf(leaf):
                names.append(f"{key}.{path}" if path else key)
    return names


def trace(f: Callable, *args, **kwargs) -> Graph:
    """Run ``f`` on symbolic tensors and return the recorded graph.

    ``args`` / ``kwargs`` may be concrete arrays, :class:`ShapeDtype` specs or nested
    dict/list/tuple trees of them; each array leaf is one graph input (in tree-flatten order,
    dict keys sorted) and each output leaf one graph output. Python scalars are passed through
    unchanged. Concrete arrays that ``f`` closes over become ``constant`` nodes.
    """
    return trace_flat(f, args, kwargs).graph
