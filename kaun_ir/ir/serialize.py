"""Graphs as plain data and as bytes: what the on-disk caches store and hash.

A graph becomes nested tuples of strings, numbers and bytes (:func:`encode`): values are numbered
in definition order (arguments first), a node refers to its inputs by number. ``repr`` of that
form is a canonical text to hash (cheaper than the printed IR, and it holds the source lines and
provenance the printer leaves out); pickled, it is a cache entry (:func:`to_bytes`), read back by
an unpickler that refuses every class, so bytes from disk cannot run code. Attribute values are
frozen (tuples, never lists or bytes), so a tuple starting with a bytes tag can only be one of
ours: dtypes and arrays.
"""

from __future__ import annotations

import io
import pickle

import numpy as np

from kaun_ir import dtypes
from kaun_ir.ir.core import ArrayAttr, Graph, Node, TensorType, Value
from kaun_ir.ir.provenance import Provenance


def encode(graph: Graph) -> tuple:
    """``graph`` as nested tuples of plain values (see the module docstring)."""
    numbers: dict[int, int] = {}
    for value in graph.inputs:
        numbers[id(value)] = len(numbers)
    nodes = []
    for node in graph.nodes:
        inputs = tuple(numbers[id(v)] for v in node.inputs)
        for value in node.outputs:
            numbers[id(value)] = len(numbers)
        provenance = None if node.provenance is None else (node.provenance.kind, node.provenance.detail)
        nodes.append(
            (
                node.op,
                inputs,
                tuple((name, _encode_attr(value)) for name, value in node.attrs),
                tuple(_encode_type(t) for t in node.types),
                node.path,
                node.source,
                provenance,
                tuple(encode(region) for region in node.regions),
            )
        )
    return (
        graph.name,
        graph.input_names,
        tuple(_encode_type(v.type) for v in graph.inputs),
        tuple(nodes),
        tuple(numbers[id(v)] for v in graph.outputs),
    )


def _encode_type(t: TensorType) -> tuple:
    return (dtypes.short_name(t.dtype), t.shape)


def _encode_attr(value):
    if isinstance(value, tuple):
        return tuple(_encode_attr(v) for v in value)
    if isinstance(value, ArrayAttr):
        array = value.array
        return (b"a", dtypes.short_name(array.dtype), array.shape, array.tobytes())
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    return (b"d", dtypes.short_name(value))  # freeze_attr keeps only dtypes besides the above


#: the slots decode() fills in; a test fails when Node grows a slot this module does not know
NODE_SLOTS = ("op", "inputs", "attrs", "regions", "path", "source", "provenance", "outputs", "_key")


def decode(data: tuple) -> Graph:
    """The graph :func:`encode` turned into ``data``."""
    types: dict[tuple, TensorType] = {}

    def tensor_type(encoded):
        found = types.get(encoded)
        if found is None:
            found = types[encoded] = TensorType(dtypes.from_short_name(encoded[0]), encoded[1])
        return found

    return _decode(data, tensor_type)


def _decode(data: tuple, tensor_type) -> Graph:
    name, input_names, input_types, encoded_nodes, outputs = data
    values: list[Value] = list(Graph.arguments([tensor_type(t) for t in input_types]))
    nodes = []
    for op, inputs, attrs, out_types, path, source, provenance, regions in encoded_nodes:
        # built without Node.__init__: the attributes are already frozen and sorted, and
        # re-freezing them is most of the cost of reading a graph back
        node = Node.__new__(Node)
        node.op = op
        node.inputs = tuple(values[i] for i in inputs)
        node.attrs = tuple((k, _decode_attr(v)) for k, v in attrs)
        node.regions = tuple(_decode(region, tensor_type) for region in regions)
        node.path = path
        node.source = source
        node.provenance = None if provenance is None else Provenance(*provenance)
        node.outputs = tuple(Value(node, i, tensor_type(t)) for i, t in enumerate(out_types))
        node._key = None
        values.extend(node.outputs)
        nodes.append(node)
    return Graph(values[: len(input_types)], [values[i] for i in outputs], nodes, name, input_names)


def _decode_attr(value):
    if isinstance(value, tuple):
        if value and type(value[0]) is bytes:
            if value[0] == b"a":
                _, short, shape, data = value
                array = np.frombuffer(data, dtype=dtypes.from_short_name(short)).reshape(shape)
                return ArrayAttr(array)
            return dtypes.from_short_name(value[1])
        return tuple(_decode_attr(v) for v in value)
    return value


def to_bytes(graph: Graph, header: str) -> bytes:
    """``graph`` as bytes, tagged with ``header`` (a cache's format name): a pickle of plain data."""
    return pickle.dumps((header, encode(graph)), protocol=pickle.HIGHEST_PROTOCOL)


class _PlainUnpickler(pickle.Unpickler):
    """Reads only plain data: any class or function reference in the bytes is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"unexpected object {module}.{name} in serialised graph data")


def from_bytes(data: bytes, header: str) -> Graph:
    """The graph :func:`to_bytes` wrote with the same ``header``. Raises ``ValueError`` for
    another header (checked before the graph is decoded) and ``pickle.UnpicklingError`` (or
    another exception of reading malformed data) for bytes that are not such a graph."""
    found, encoded = _PlainUnpickler(io.BytesIO(data)).load()
    if found != header:
        raise ValueError(f"format {found!r}")
    return decode(encoded)
