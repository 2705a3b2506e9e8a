"""``kn.ir.interpret``: run a graph with each op's NumPy reference (the semantic oracle)."""

from __future__ import annotations

import numpy as np

from kaun_ir.errors import IRError
from kaun_ir.ir import optable
from kaun_ir.ir.core import Graph


def interpret(graph: Graph, *arrays) -> list[np.ndarray]:
    """Evaluate ``graph`` on host arrays with the NumPy references; returns a list of outputs."""
    ops = optable.table()

    if len(arrays) != len(graph.inputs):
        raise TypeError(f"graph @{graph.name} takes {len(graph.inputs)} input(s), got {len(arrays)}")
    env: dict[int, np.ndarray] = {}
    for i, (value, array) in enumerate(zip(graph.inputs, arrays)):
        arr = np.asarray(array)
        if arr.shape != value.type.shape:
            raise TypeError(f"input {i}: expected {value.type}, got shape {arr.shape}")
        env[id(value)] = arr.astype(value.type.dtype, copy=False)
    for node in graph.nodes:
        opdef = ops[node.op]
        args = [env[id(v)] for v in node.inputs]
        outs = opdef.run_reference(args, node.attr_dict, node.regions)
        if len(outs) != len(node.outputs):
            raise IRError(
                f"reference of {node.op} returned {len(outs)} results, expected {len(node.outputs)}"
            )
        for value, out in zip(node.outputs, outs):
            arr = np.asarray(out)
            if arr.shape != value.type.shape:
                raise IRError(f"reference of {node.op} gave shape {arr.shape}, type rule says {value.type}")
            env[id(value)] = arr.astype(value.type.dtype, copy=False)
    return [env[id(v)] for v in graph.outputs]
