"""The per-parameter update chains of an optimiser update: found in a graph, described by a
signature, and grouped into those that can run as one (for ``fuse-optimizer{horizontal=true}``).

A *chain* is a connected set of elementwise nodes on the ``optimizer`` layer path (top level,
not inside regions) whose results all have one shape; its operands are tensors of that shape
(parameters, gradients, optimiser state), broadcasts of scalars, or 0-d values. Two chains with
the same :attr:`Chain.signature` are isomorphic: the same ops with the same attributes in the
same order, the same scalar operands and dtypes; only their shapes differ.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kaun_ir.ir.core import Graph, Node, Value
from kaun_ir.ops import with_trait
from kaun_ir.passes.rewrite import splat_of

#: The layer-path component that marks the optimiser update (``kaun_ir/optim/core.py``).
OPTIMIZER_PATH = "optimizer"

#: The ops chains are made of and scalar work is hoisted through (the op table's "elementwise" trait).
ELEMENTWISE = with_trait("elementwise")


def on_optimizer_path(node: Node) -> bool:
    """True for nodes traced inside the optimiser update (layer path component ``optimizer``)."""
    return OPTIMIZER_PATH in node.path.split(".")


class Chain:
    """One per-parameter update chain: its nodes (graph order), operands and escaping results."""

    def __init__(self, nodes: list[Node]):
        self.nodes = nodes
        self.shape = nodes[0].types[0].shape
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.externals: list[Value] = []  # tensor operands of the chain's shape, first use first
        self.scalars: dict[Any, Value | np.ndarray] = {}  # key -> 0-d value or 0-d constant array
        self.escaping: list[Value] = []  # results used outside the chain, in signature order
        self.signature: tuple = ()


def scalar_key(value: Value) -> tuple[Any, Value | np.ndarray] | None:
    """``(key, scalar)`` for a broadcast-of-scalar or 0-d operand; equal keys, equal scalars.

    Constants compare by dtype and bits (a splat constant and a broadcast of a 0-d constant with
    the same bits are the same operand); other scalars by identity of the 0-d value.
    """
    node = value.node
    source = value
    if value.type.ndim > 0:
        if node is not None and node.op == "broadcast_in_dim" and node.inputs[0].type.ndim == 0:
            source = node.inputs[0]
        elif node is not None and node.op == "constant":
            scalar = splat_of(node.attr("value").array)
            if scalar is None:
                return None
            return ("const", scalar.dtype.str, scalar.tobytes()), scalar
        else:
            return None
    if source.node is not None and source.node.op == "constant":
        scalar = np.asarray(source.node.attr("value").array).reshape(())
        return ("const", scalar.dtype.str, scalar.tobytes()), scalar
    return ("value", id(source)), source


def find_chains(graph: Graph) -> list[Chain]:
    """The connected components of elementwise optimiser nodes, those that form a valid chain."""
    members = [
        n
        for n in graph.nodes
        if n.op in ELEMENTWISE
        and on_optimizer_path(n)
        and len(n.outputs) == 1
        and n.types[0].ndim > 0
        and n.types[0].size > 0
    ]
    index = {id(n): i for i, n in enumerate(members)}
    parent = list(range(len(members)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, node in enumerate(members):
        for value in node.inputs:
            j = index.get(id(value.node)) if value.node is not None else None
            if j is not None:
                parent[find(i)] = find(j)
    groups: dict[int, list[Node]] = {}
    for i, node in enumerate(members):
        groups.setdefault(find(i), []).append(node)

    users: dict[int, int] = {}  # id(value) -> number of uses outside its chain (filled below)
    chain_of = {}
    chains = []
    for nodes in groups.values():
        chain = Chain(nodes)
        chains.append(chain)
        for node in nodes:
            chain_of[id(node)] = chain
    for node in graph.nodes:
        mine = chain_of.get(id(node))
        for value in node.inputs:
            owner = chain_of.get(id(value.node)) if value.node is not None else None
            if owner is not None and owner is not mine:
                users[id(value)] = users.get(id(value), 0) + 1
    for value in graph.outputs:
        users[id(value)] = users.get(id(value), 0) + 1
    return [c for c in chains if _describe(c, users)]


def _describe(chain: Chain, escaping_uses: dict[int, int]) -> bool:
    """Fill in the chain's operands and signature; False if it is not a fusable chain."""
    local = {id(n): i for i, n in enumerate(chain.nodes)}
    external_index: dict[int, int] = {}
    ops = []
    for node in chain.nodes:
        if node.types[0].shape != chain.shape:
            return False
        operands = []
        for value in node.inputs:
            if value.node is not None and id(value.node) in local:
                operands.append(("chain", local[id(value.node)]))
                continue
            scalar = scalar_key(value)
            if scalar is not None and (value.type.ndim == 0 or value.type.shape == chain.shape):
                key, source = scalar
                kind = "raw" if value.type.ndim == 0 else "broadcast"
                chain.scalars.setdefault(key, source)
                operands.append((kind, key))
            elif value.type.shape == chain.shape:
                if id(value) not in external_index:
                    external_index[id(value)] = len(chain.externals)
                    chain.externals.append(value)
                operands.append(("tensor", external_index[id(value)], value.type.dtype.str))
            else:
                return False
        ops.append((node.op, node.attrs, node.types[0].dtype.str, tuple(operands)))
    escaping = [i for i, n in enumerate(chain.nodes) if id(n.outputs[0]) in escaping_uses]
    chain.escaping = [chain.nodes[i].outputs[0] for i in escaping]
    chain.signature = (tuple(ops), tuple(escaping))
    return bool(escaping)


def independent(chains: list[Chain], graph: Graph) -> list[Chain]:
    """The chains (in order) that can run as one: none reads another kept chain's results, or
    its own results through nodes outside it (directly or through any number of nodes)."""
    chain_of = {id(n): c for c in chains for n in c.nodes}
    reaches: dict[int, frozenset[int]] = {}  # id(node) -> ids of the chains whose results it reads
    needs: dict[int, set[int]] = {id(c): set() for c in chains}  # chain -> chains it reads
    empty: frozenset[int] = frozenset()
    for node in graph.nodes:
        mine = chain_of.get(id(node))
        found: set[int] = set()
        for value in node.inputs:
            producer = value.node
            if producer is None:
                continue
            upstream = reaches.get(id(producer), empty)
            owner = chain_of.get(id(producer))
            if mine is not None and owner is mine:  # an edge inside the chain
                found |= upstream
                continue
            if mine is not None:
                needs[id(mine)] |= upstream
            found |= upstream
            if owner is not None:
                found.add(id(owner))
        reaches[id(node)] = frozenset(found) if found else empty
    kept: list[Chain] = []
    for chain in chains:
        reads = needs[id(chain)]
        if id(chain) in reads or any(id(k) in reads or id(chain) in needs[id(k)] for k in kept):
            continue
        kept.append(chain)
    return kept
