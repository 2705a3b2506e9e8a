"""Lowering: a graph becomes a StableHLO module (MLIR text) with ``loc`` from layer paths."""

from __future__ import annotations

from collections.abc import Sequence

from kaun_ir.ir.core import Graph
from kaun_ir.ops.emit import Emitter, sdy_mesh, sdy_sharding, tensor_type


def lower(
    graph: Graph,
    donate: Sequence[int] = (),
    name: str = "main",
    mesh=None,
    in_specs: Sequence | None = None,
    out_specs: Sequence | None = None,
    node_tags: bool = False,
) -> str:
    """StableHLO text of ``graph`` as ``func.func public @main``.

    ``donate``: indices of inputs whose buffers XLA may reuse for an output of the same type
    (written as ``tf.aliasing_output``); each donated input is paired with the first unclaimed
    output of its type, and inputs with no such output are simply not aliased.

    ``mesh`` (a ``kn.runtime.Mesh``) makes a partitioned module: ``sdy.mesh @mesh`` declares the
    mesh, ``in_specs`` / ``out_specs`` (one ``Spec`` or None per input / output) become
    ``sdy.sharding`` attributes of the arguments and results, and ``mhlo.num_partitions`` is
    the mesh size. A None entry leaves that value to XLA's sharding propagation.

    ``node_tags``: the ops of the graph's ``i``-th node get the location ``"kn.node.i"`` instead
    of the layer path (how the partitioned stage finds each node after sharding propagation).
    """
    aliases = _pair_donations(graph, donate)
    in_specs = list(in_specs or [None] * len(graph.inputs))
    out_specs = list(out_specs or [None] * len(graph.outputs))
    args = []
    for i, value in enumerate(graph.inputs):
        attrs = []
        if i in aliases:
            attrs.append(f"tf.aliasing_output = {aliases[i]} : i32")
        if mesh is not None and in_specs[i] is not None:
            attrs.append(f"sdy.sharding = {sdy_sharding(in_specs[i].dims, len(value.type.shape), '@mesh')}")
        attr = f" {{{', '.join(attrs)}}}" if attrs else ""
        args.append(f"%arg{i}: {tensor_type(value.type)}{attr}")
    results = []
    for value, spec in zip(graph.outputs, out_specs):
        attr = ""
        if mesh is not None and spec is not None:
            attr = f" {{sdy.sharding = {sdy_sharding(spec.dims, len(value.type.shape), '@mesh')}}}"
        results.append(f"{tensor_type(value.type)}{attr}")
    results = ", ".join(results)
    em = Emitter(indent=4)
    if node_tags:
        em.node_locations = {id(node): f"{NODE_TAG}{i}" for i, node in enumerate(graph.nodes)}
    body = em.emit_graph(graph, [f"%arg{i}" for i in range(len(graph.inputs))])
    returned = ", ".join(body)
    return_types = ", ".join(tensor_type(v.type) for v in graph.outputs)
    partitions = 1 if mesh is None else mesh.size
    lines = [
        f"module @{_module_name(graph.name)} attributes {{mhlo.num_partitions = {partitions} : i32, "
        f"mhlo.num_replicas = 1 : i32}} {{",
        *([f"  sdy.mesh @mesh = {sdy_mesh(mesh.axes)}"] if mesh is not None else []),
        f"  func.func public @{name}({', '.join(args)}) -> ({results}) {{",
        *em.lines,
        f'    "func.return"({returned}) : ({return_types}) -> ()',
        "  }",
        *em.functions,  # private functions the body calls (composite decompositions)
        "}",
    ]
    return "\n".join(lines) + "\n"


NODE_TAG = "kn.node."  # the location prefix of :func:`lower`'s ``node_tags``


def _pair_donations(graph: Graph, donate: Sequence[int]) -> dict[int, int]:
    taken: set[int] = set()
    aliases: dict[int, int] = {}
    for i in sorted(set(donate)):
        if not 0 <= i < len(graph.inputs):
            raise IndexError(f"donated input {i} out of range for {len(graph.inputs)} inputs")
        for j, out in enumerate(graph.outputs):
            if j not in taken and out.type == graph.inputs[i].type:
                aliases[i] = j
                taken.add(j)
                break
    return aliases


def _module_name(name: str) -> str:
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name)
    # an MLIR symbol starts with a letter or '_' (graph names like @1x are valid in our IR)
    return cleaned if cleaned and not cleaned[0].isdigit() else f"_{cleaned}" if cleaned else "main"
