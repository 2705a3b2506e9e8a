"""The partitioned stage: a graph compiled for a mesh, every value typed with the layout XLA's
sharding propagation gave it (``f32[8@data,16@model]``, docs/ir.md), and the collectives XLA's
partitioner inserted, per layer.

The layouts come from running Shardy's propagation (the first pipeline of XLA's partitioner) on
the module lowered with one location per node, so each op's result layout maps back onto the
node that emitted it; the collectives come from the compiled executable's partitioned HLO, whose
``op_name`` metadata holds the layer paths of the lowering's locations.
"""

from __future__ import annotations

from kaun_ir.ir.core import Graph, Node, TensorType
from kaun_ir.runtime import collectives
from kaun_ir.runtime.executable import Executable
from kaun_ir.runtime.lower import NODE_TAG, lower
from kaun_ir.runtime.xla.shardings import propagated_shardings

__all__ = ["partitioned_graph", "comm_table"]


def _typed(ttype: TensorType, layout) -> TensorType:
    """``ttype`` with ``layout`` (None: unannotated; a layout of the wrong rank is dropped)."""
    if layout is None or len(layout) != len(ttype.shape):
        return TensorType(ttype.dtype, ttype.shape)
    return TensorType(ttype.dtype, ttype.shape, layout)


def _check_executable(executable, who: str) -> None:
    if not isinstance(executable, Executable):
        raise TypeError(
            f"{who}: expected a compiled executable (kn.jit(f, mesh=...).executable(*args) or "
            f"train.step_executable(...)), got {type(executable).__name__}"
        )


def partitioned_graph(executable) -> Graph:
    """The graph of a partitioned ``executable`` (``kn.runtime.Executable`` with a mesh) with
    every top-level value's propagated layout in its type; replicated values and values inside
    regions print unannotated. ``ValueError`` for an executable compiled for one device."""
    _check_executable(executable, "partitioned_graph")
    if executable.mesh is None:
        raise ValueError(
            f"@{executable.graph.name} is compiled for one device; the partitioned stage needs a mesh "
            "(kn.jit(..., mesh=...), train.make(..., mesh=...) or sharding constraints)"
        )
    graph = executable.graph
    text = lower(
        graph,
        mesh=executable.mesh,
        in_specs=executable.in_specs,
        out_specs=executable.out_specs,
        node_tags=True,
    )
    found = propagated_shardings(text, NODE_TAG)
    inputs_found = found["inputs"] + [None] * (len(graph.inputs) - len(found["inputs"]))
    inputs = Graph.arguments([_typed(v.type, layout) for v, layout in zip(graph.inputs, inputs_found)])
    env = {id(old): new for old, new in zip(graph.inputs, inputs)}
    nodes = []
    for i, node in enumerate(graph.nodes):
        layouts = list(found["ops"].get(f"{NODE_TAG}{i}") or [])
        if len(layouts) != len(node.outputs):  # the node's last op is not the one giving its results
            layouts = [None] * len(node.outputs)
        types = [_typed(v.type, layout) for v, layout in zip(node.outputs, layouts)]
        new = Node(
            node.op,
            [env.get(id(v), v) for v in node.inputs],
            node.attrs,
            types,
            node.regions,
            path=node.path,
            source=node.source,
            provenance=node.provenance,
        )
        env.update({id(old): out for old, out in zip(node.outputs, new.outputs)})
        nodes.append(new)
    return Graph(inputs, [env[id(v)] for v in graph.outputs], nodes, graph.name, graph.input_names)


def comm_table(executable, link_gbps: float | None = None) -> str:
    """The collectives of a compiled executable's partitioned HLO per layer
    (:func:`kaun_ir.runtime.collectives.collectives_by_layer`) as a text table, with the time
    each takes on a link of ``link_gbps`` Gbit/s when given (a finite number > 0)."""
    _check_executable(executable, "comm_table")
    if link_gbps is not None:  # before the HLO is read
        collectives.check_link_gbps(link_gbps)
    rows = collectives.collectives_by_layer(executable.hlo_text())
    return collectives.format_comm_table(rows, link_gbps)
