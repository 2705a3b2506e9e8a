"""The ``fuse-optimizer`` pass: the optimiser update of a training step, made cheap for XLA.

A training step (``kn.train.step``) is one graph: forward, backward and the optimiser update.
The update is many small elementwise chains, one per parameter (Adam: about a dozen ops per
parameter), plus a little per-step scalar work (learning rate, bias corrections). With many
small parameters XLA launches a kernel per chain. This pass does three things:

1. **Checks** that the update is in the graph (nodes on the layer path ``optimizer``, which
   ``kn.optim.update`` sets while tracing) and that every parameter / optimiser-state input it
   reads is paired with an output of the same type, so that donation (``tf.aliasing_output``,
   paired the way ``runtime/lower.py`` pairs them) lets XLA update those buffers in place.
   Counters: ``optimizer nodes``, ``donatable buffers`` and, when some input the update reads
   has no output of its type left, ``optimizer inputs without an output of their type`` (in a
   training step those are only inputs that are not state, e.g. a learning rate passed in).
   Nothing is changed by this step (outputs cannot be added without changing the signature).
2. **Hoists scalar work out of per-element work** (everywhere in the graph): an elementwise op
   whose operands are all broadcasts of scalars (``broadcast_in_dim`` of a 0-d value, an
   all-equal constant, or a 0-d operand of ``select``/``clamp``) becomes the op on the scalars
   and one broadcast: ``broadcast(s1) * broadcast(s2) -> broadcast(s1 * s2)``. Exact: an
   elementwise op computes every element from the same scalars, so each element is the scalar
   result bit for bit. Counter: ``scalar ops hoisted``.
3. With ``horizontal=true``, **horizontal fusion**: the per-parameter update chains that are
   isomorphic — the same ops with the same attributes in the same order, the same scalar
   operands (the same scalar value, or constants with the same bits), the same dtypes, only
   the tensor shapes differ — are replaced by one chain on flat vectors: every tensor operand
   is reshaped to 1-d and the operands of all chains concatenated, the chain runs once on the
   concatenation, and each chain's results are sliced out and reshaped back. Elementwise ops
   compute each element from the elements at the same position only, so every result is bit
   for bit what the unfused chain computes. Counters: ``chains fused`` and ``fused groups``.

A *chain* (``passes/optimizer_chains.py`` finds them) is a connected set of elementwise nodes
on the ``optimizer`` layer path (top level, not inside regions) whose results all have one
shape; its operands are tensors of that shape (parameters, gradients, optimiser state),
broadcasts of scalars, or 0-d values. Chains that depend on each other's results are never
fused together. ``max_group`` bounds how many chains one fused chain covers (0: no bound).
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from kaun_ir.ir.builder import infer_or_raise
from kaun_ir.ir.clone import with_inputs
from kaun_ir.ir.core import Graph, Node, Value
from kaun_ir.ops import get
from kaun_ir.passes.optimizer_chains import ELEMENTWISE, Chain, find_chains, independent, on_optimizer_path
from kaun_ir.passes.registry import Option, register, statistic
from kaun_ir.passes.rewrite import Rewriter, RuleTable, apply_rules, splat_of

# ----------------------------------------------------------------------------- 1. donation


def _donation_counts(graph: Graph) -> tuple[int, int]:
    """``(donatable, undonatable)`` over the inputs the optimiser update reads.

    Pairs inputs with outputs the way the lowering does: each input, in order, takes the first
    output of its type that no earlier input took.
    """
    read = set()
    for node in graph.nodes:
        if on_optimizer_path(node):
            read.update(id(v) for v in node.inputs if v.node is None)
    taken: set[int] = set()
    donatable = undonatable = 0
    for value in graph.inputs:
        if id(value) not in read:
            continue
        for j, out in enumerate(graph.outputs):
            if j not in taken and out.type == value.type:
                taken.add(j)
                donatable += 1
                break
        else:
            undonatable += 1
    return donatable, undonatable


# ----------------------------------------------------------------------------- 2. hoisting

HOIST = RuleTable()


def _scalar_operand(value: Value, rw: Rewriter) -> Value | None:
    """The 0-d value that ``value`` broadcasts (building a scalar constant if needed), or None."""
    if value.type.ndim == 0:
        return value
    node = value.node
    if node is None:
        return None
    if node.op == "broadcast_in_dim" and node.inputs[0].type.ndim == 0:
        return node.inputs[0]
    if node.op == "constant":
        scalar = splat_of(node.attr("value").array)
        return None if scalar is None else rw.constant(scalar)
    return None


@HOIST.rule("hoist-scalar-op", *sorted(ELEMENTWISE))
def _hoist_scalar_op(node: Node, rw: Rewriter):
    """op(broadcast(s1), broadcast(s2), ...) -> broadcast(op(s1, s2, ...)) for elementwise ops."""
    result = node.types[0]
    if result.ndim == 0 or result.size == 0:
        return None
    if all(v.type.ndim == 0 or (v.node is not None and v.node.op == "constant") for v in node.inputs):
        return None  # only constants: constant folding's business, not ours
    scalars = []
    for value in node.inputs:
        scalar = _scalar_operand(value, rw)
        if scalar is None:
            return None
        scalars.append(scalar)
    scalar_result = rw.emit(node.op, *scalars, **dict(node.attrs))
    return rw.emit("broadcast_in_dim", scalar_result, shape=result.shape, broadcast_dimensions=())


# ----------------------------------------------------------------------------- 3. horizontal


def _horizontal(graph: Graph, max_group: int) -> Graph:
    by_signature: dict[tuple, list[Chain]] = {}
    for chain in find_chains(graph):
        by_signature.setdefault(chain.signature, []).append(chain)
    groups = []
    for chains in by_signature.values():
        chains = independent(chains, graph) if len(chains) > 1 else chains
        step = max_group if max_group > 0 else len(chains)
        groups += [chains[i : i + step] for i in range(0, len(chains), step) if len(chains[i : i + step]) > 1]
    if not groups:
        return graph

    position = {id(n): i for i, n in enumerate(graph.nodes)}
    removed: set[int] = set()
    replacement: dict[int, Value] = {}
    added: list[tuple[int, list[Node]]] = []  # (priority, new nodes) per fused group
    for chains in groups:
        new_nodes = _fuse(chains, replacement)
        removed.update(id(n) for c in chains for n in c.nodes)
        added.append((max(position[id(n)] for c in chains for n in c.nodes), new_nodes))
        statistic("chains fused", len(chains))
        statistic("fused groups")
    return _rebuild(graph, removed, replacement, added)


class _Emitter:
    """Builds the nodes of one fused chain, each typed by its op's shape rule and recorded with the
    layer path and source of the original node it stands for (``like``, default ``template``)."""

    def __init__(self, template: Node):
        self.template = template
        self.nodes: list[Node] = []

    def __call__(self, op: str, inputs: list[Value], attrs: dict, like: Node | None = None) -> Value:
        like = self.template if like is None else like
        opdef = get(op)
        attrs = opdef.check_attrs(attrs)
        types = infer_or_raise(opdef, [v.type for v in inputs], attrs, like.path)
        node = Node(op, inputs, attrs, types, path=like.path, source=like.source, provenance=like.provenance)
        self.nodes.append(node)
        return node.outputs[0]

    def flat(self, value: Value) -> Value:
        """``value`` as a vector."""
        if value.type.shape == (value.type.size,):
            return value
        return self("reshape", [value], {"shape": (value.type.size,)})


class _Scalars:
    """The fused chain's scalar operands (the first chain's, which all chains share), each made
    once: as it is (``raw``) or broadcast to the concatenated length."""

    def __init__(self, chain: Chain, emit: _Emitter, length: int):
        self.chain, self.emit, self.length = chain, emit, length
        self.raw: dict[Any, Value] = {}
        self.broadcasts: dict[Any, Value] = {}

    def scalar(self, key) -> Value:
        if key not in self.raw:
            source = self.chain.scalars[key]
            if isinstance(source, Value):
                self.raw[key] = source
            else:
                self.raw[key] = self.emit("constant", [], {"value": np.asarray(source)})
        return self.raw[key]

    def broadcast(self, key) -> Value:
        if key not in self.broadcasts:
            self.broadcasts[key] = self.emit(
                "broadcast_in_dim", [self.scalar(key)], {"shape": (self.length,), "broadcast_dimensions": ()}
            )
        return self.broadcasts[key]


def _fuse(chains: list[Chain], replacement: dict[int, Value]) -> list[Node]:
    """One chain over the concatenation of ``chains``' operands; maps their results to slices."""
    first = chains[0]
    emit = _Emitter(first.nodes[0])
    tensors = [
        emit("concatenate", [emit.flat(c.externals[k]) for c in chains], {"dimension": 0})
        for k in range(len(first.externals))
    ]
    scalars = _Scalars(first, emit, sum(c.size for c in chains))
    results: list[Value] = []

    def operand(kind: str, key) -> Value:
        if kind == "chain":
            return results[key]
        if kind == "tensor":
            return tensors[key]
        return scalars.scalar(key) if kind == "raw" else scalars.broadcast(key)

    for (op, attrs, _, operands), node in zip(first.signature[0], first.nodes):
        results.append(emit(op, [operand(o[0], o[1]) for o in operands], dict(attrs), node))
    for escaping_index in first.signature[1]:
        _split_result(emit, chains, escaping_index, results[escaping_index], replacement)
    return emit.nodes


def _split_result(
    emit: _Emitter, chains: list[Chain], index: int, fused: Value, replacement: dict[int, Value]
) -> None:
    """Map each chain's result ``index`` onto its slice of the fused result (reshaped back)."""
    offset = 0
    for chain in chains:
        part = emit(
            "slice",
            [fused],
            {"start_indices": (offset,), "limit_indices": (offset + chain.size,), "strides": (1,)},
        )
        if chain.shape != (chain.size,):
            part = emit("reshape", [part], {"shape": chain.shape})
        replacement[id(chain.nodes[index].outputs[0])] = part
        offset += chain.size


def _rebuild(
    graph: Graph, removed: set[int], replacement: dict[int, Value], added: list[tuple[int, list[Node]]]
) -> Graph:
    """The graph without the ``removed`` nodes, with the ``added`` ones, in a valid order close to
    the original (each fused block goes where its last original node was, earlier if needed)."""
    env = dict(replacement)
    items: list[tuple[tuple, Node]] = []  # (priority, original node or new node)
    for i, node in enumerate(graph.nodes):
        if id(node) not in removed:
            items.append(((i, 0, 0), node))
    for block, (where, nodes) in enumerate(added):
        items += [((where, 1 + block, k), node) for k, node in enumerate(nodes)]

    # stable topological order (Kahn's algorithm, lowest priority first); operands of original
    # nodes are read through ``env`` so they wait for the fused nodes that now produce them
    def operands(node: Node) -> list[Value]:
        return [env.get(id(v), v) for v in node.inputs]

    order = _stable_order(items, operands)

    # ``env`` maps a value to its replacement, and that replacement may itself be replaced: a
    # fused block's nodes are copied when one of its operands was (an operand computed from
    # another fused block's results), so every value is followed to the end of its chain
    def resolve(value: Value) -> Value:
        while id(value) in env:
            value = env[id(value)]
        return value

    nodes: list[Node] = []
    for k in order:
        node = items[k][1]
        new = with_inputs(node, [resolve(v) for v in node.inputs])
        if new is not node:
            for old, fresh in zip(node.outputs, new.outputs):
                env[id(old)] = fresh
        nodes.append(new)
    outputs = [resolve(v) for v in graph.outputs]
    live = {id(n) for n in Graph.from_outputs(graph.inputs, outputs).nodes}
    nodes = [n for n in nodes if id(n) in live]  # the unfused chains' leftovers (broadcasts)
    return Graph(graph.inputs, outputs, nodes, graph.name, graph.input_names)


def _stable_order(items: list[tuple[tuple, Node]], operands) -> list[int]:
    """The indices of ``items`` in a topological order of their nodes (``operands(node)``: the
    values a node reads), lowest priority first among the ready ones (Kahn's algorithm)."""
    producer_item = {}
    for k, (_, node) in enumerate(items):
        for out in node.outputs:
            producer_item[id(out)] = k
    waiting = [0] * len(items)
    consumers: dict[int, list[int]] = {}
    for k, (_, node) in enumerate(items):
        deps = {producer_item[id(v)] for v in operands(node) if id(v) in producer_item}
        waiting[k] = len(deps)
        for d in deps:
            consumers.setdefault(d, []).append(k)
    ready = [(items[k][0], k) for k in range(len(items)) if waiting[k] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, k = heapq.heappop(ready)
        order.append(k)
        for c in consumers.get(k, ()):
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(ready, (items[c][0], c))
    if len(order) != len(items):  # excluded by independent; a bug if it happens
        raise RuntimeError("fuse-optimizer: the fused graph has a cycle")
    return order


# ----------------------------------------------------------------------------- the pass


@register(
    "fuse-optimizer",
    options={
        "horizontal": (
            bool,
            False,
            "fuse the isomorphic per-parameter update chains into one chain on concatenated flat vectors",
        ),
        "max_group": Option(int, 0, "at most this many chains per fused chain (0: no limit)", min=0),
    },
)
def fuse_optimizer(graph: Graph, horizontal: bool, max_group: int) -> Graph:
    """Check donation of the optimiser update, hoist scalar work, optionally fuse horizontally."""
    statistic("optimizer nodes", sum(1 for n in graph.nodes if on_optimizer_path(n)))
    donatable, undonatable = _donation_counts(graph)
    statistic("donatable buffers", donatable)
    if undonatable:
        statistic("optimizer inputs without an output of their type", undonatable)
    result = apply_rules(graph, HOIST, label="fuse-optimizer")
    statistic("scalar ops hoisted", result.total)
    graph = result.graph
    if horizontal:
        graph = _horizontal(graph, max_group)
    return graph
