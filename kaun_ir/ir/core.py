"""The IR data structures: tensor types, SSA values, nodes and graphs.

Nodes are immutable once built. A node's ``key`` (op, attributes, identities of its inputs) is
hashable, so common-subexpression elimination is a dictionary lookup. Passes never mutate a
graph: they build a new one.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kaun_ir import dtypes, hooks
from kaun_ir.errors import IRError
from kaun_ir.ir.provenance import Provenance


@dataclass(frozen=True, slots=True)
class TensorType:
    """A static shape and a dtype: ``f32[32,784]``; a scalar is ``f32[]``.

    ``sharding`` (optional, ``None`` for none): the layout of the value over a device mesh, one
    tuple of mesh-axis names per dimension (``()``: that dimension is whole), as the
    partitioned stage shows it: ``f32[8@data,16@model]``, ``f32[8@(data,model),16]``. It is an
    annotation, not part of the type: two types that differ only in it are equal."""

    dtype: np.dtype
    shape: tuple[int, ...]
    sharding: tuple[tuple[str, ...], ...] | None = field(default=None, compare=False)

    def __post_init__(self):
        # a normalisation, not a cache: dataclasses have no converters (tests/test_declared_state.py)
        object.__setattr__(self, "dtype", dtypes.canonical(self.dtype))
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if any(d < 0 for d in self.shape):
            raise IRError(f"negative dimension in shape {self.shape}")
        if self.sharding is not None:
            layout = tuple(tuple(str(a) for a in axes) for axes in self.sharding)
            if len(layout) != len(self.shape):
                raise IRError(f"sharding {layout} has {len(layout)} entries for shape {self.shape}")
            object.__setattr__(self, "sharding", layout if any(layout) else None)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __str__(self) -> str:
        if self.sharding is None:
            return f"{dtypes.short_name(self.dtype)}[{','.join(map(str, self.shape))}]"
        dims = [_sharded_dim(d, axes) for d, axes in zip(self.shape, self.sharding)]
        return f"{dtypes.short_name(self.dtype)}[{','.join(dims)}]"

    __repr__ = __str__


def _sharded_dim(size: int, axes: tuple[str, ...]) -> str:
    """One dimension of a sharded type: ``8``, ``8@data`` or ``8@(data,model)``."""
    if not axes:
        return str(size)
    return f"{size}@{axes[0]}" if len(axes) == 1 else f"{size}@({','.join(axes)})"


class ArrayAttr:
    """An immutable, hashable NumPy array used as an attribute (the payload of ``constant``)."""

    __slots__ = ("array", "_hash")

    def __init__(self, array):
        arr = np.array(array, copy=True)
        arr.flags.writeable = False
        self.array = arr
        self._hash = hash((arr.dtype.str, arr.shape, arr.tobytes()))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return (
            isinstance(other, ArrayAttr)
            and self._hash == other._hash
            and self.array.dtype == other.array.dtype
            and self.array.shape == other.array.shape
            and self.array.tobytes() == other.array.tobytes()
        )

    def __repr__(self):
        return f"ArrayAttr({TensorType(self.array.dtype, self.array.shape)})"


def freeze_attr(value: Any) -> Any:
    """Attribute values become immutable: lists -> tuples, arrays -> ArrayAttr, dtypes kept."""
    if isinstance(value, ArrayAttr):
        return value
    if isinstance(value, np.ndarray):
        return ArrayAttr(value)
    if isinstance(value, (list, tuple)):
        return tuple(freeze_attr(v) for v in value)
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return dtypes.canonical(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise IRError(f"attribute value of unsupported type {type(value).__name__}: {value!r}")


class Value:
    """One SSA value: result ``index`` of ``node``, or graph argument ``index`` when node is None."""

    __slots__ = ("node", "index", "type")

    def __init__(self, node: Node | None, index: int, type: TensorType):
        self.node, self.index, self.type = node, index, type

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> np.dtype:
        return self.type.dtype

    def __repr__(self):
        where = f"{self.node.op}#{self.index}" if self.node is not None else f"arg{self.index}"
        return f"Value({where}: {self.type})"


class Node:
    """One operation: ``op`` applied to ``inputs`` with ``attrs``, producing ``outputs``.

    ``regions`` holds sub-graphs for ops that carry them (``while``); ``path`` is the layer
    path that created the node (``"1.linear"``); ``source`` the user's ``file:line``;
    ``provenance`` the transformation that made it, None for a node of the user's program
    (:class:`kaun_ir.ir.provenance.Provenance`: a backward node, the cotangent seed ...). Like
    the path and the source line it is not part of :attr:`key`: it says where a node comes
    from, not what it computes.
    """

    __slots__ = ("op", "inputs", "attrs", "regions", "path", "source", "provenance", "outputs", "_key")

    def __init__(
        self,
        op: str,
        inputs: Sequence[Value],
        attrs: dict[str, Any] | Iterable[tuple[str, Any]],
        types: Sequence[TensorType],
        regions: Sequence[Graph] = (),
        path: str = "",
        source: str = "",
        provenance: Provenance | None = None,
    ):
        self.op = op
        self.inputs = tuple(inputs)
        items = attrs.items() if isinstance(attrs, dict) else attrs
        self.attrs = tuple(sorted((k, freeze_attr(v)) for k, v in items))
        self.regions = tuple(regions)
        self.path = path
        self.source = source
        self.provenance = provenance
        self.outputs = tuple(Value(self, i, t) for i, t in enumerate(types))
        self._key = None

    @property
    def types(self) -> tuple[TensorType, ...]:
        return tuple(v.type for v in self.outputs)

    @property
    def attr_dict(self) -> dict[str, Any]:
        return dict(self.attrs)

    def attr(self, name: str, default: Any = None) -> Any:
        """The value of attribute ``name``, or ``default`` when the node has none of that name."""
        for key, value in self.attrs:
            if key == name:
                return value
        return default

    @property
    def key(self) -> tuple:
        """Structural identity for CSE: equal keys compute equal results."""
        if self._key is None:
            self._key = (
                self.op,
                self.attrs,
                tuple((id(v.node), v.index) if v.node is not None else ("arg", v.index) for v in self.inputs),
                tuple(r.text() for r in self.regions),
                self.types,
            )
        return self._key

    @property
    def location(self) -> str:
        """What the lowering writes as the MLIR ``loc``: the layers of the path and the op joined
        by ``/`` (``"1.residual/body.mlp/0.linear/dot_general"``), the separator viewers such as
        Model Explorer nest groups by."""
        return "/".join(path_components(self.path) + [self.op])

    def __repr__(self):
        return f"Node({self.op}, {[str(v.type) for v in self.inputs]} -> {list(map(str, self.types))})"


#: combinator prefixes that, with the child's name, form one layer-path component ("0.linear")
_PREFIXES = ("left", "right", "body")


def path_components(path: str) -> list[str]:
    """A node's layer path split into layers: ``"1.residual.body.mlp.0.linear"`` ->
    ``["1.residual", "body.mlp", "0.linear"]``.

    Scopes join with ``.`` and the combinators' scope names contain a dot themselves
    (``sequential``: ``"<index>.<name>"``, ``compose``: ``"left.<name>"``), so an index or a
    combinator prefix is joined with the name after it.
    """
    if not path:
        return []
    tokens = path.split(".")
    parts: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if (token.isdigit() or token in _PREFIXES) and i + 1 < len(tokens) and not tokens[i + 1].isdigit():
            parts.append(f"{token}.{tokens[i + 1]}")
            i += 2
        else:
            parts.append(token)
            i += 1
    return parts


class Graph:
    """An SSA graph: ordered argument values, nodes in a valid execution order, and outputs."""

    __slots__ = ("inputs", "outputs", "nodes", "name", "input_names", "__weakref__")

    def __init__(
        self,
        inputs: Sequence[Value],
        outputs: Sequence[Value],
        nodes: Sequence[Node],
        name: str = "main",
        input_names: Sequence[str] | None = None,
    ):
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.nodes = tuple(nodes)
        self.name = name
        self.input_names = tuple(input_names) if input_names is not None else None

    @staticmethod
    def arguments(types: Sequence[TensorType]) -> tuple[Value, ...]:
        """Fresh argument values for a graph with these input types."""
        return tuple(Value(None, i, t) for i, t in enumerate(types))

    @classmethod
    def from_outputs(
        cls,
        inputs: Sequence[Value],
        outputs: Sequence[Value],
        name: str = "main",
        input_names: Sequence[str] | None = None,
    ) -> Graph:
        """The graph of exactly the nodes that ``outputs`` depend on, in a topological order."""
        order: list[Node] = []
        seen: set[int] = set()
        for out in outputs:
            if out.node is None or id(out.node) in seen:
                continue
            stack = [(out.node, False)]
            while stack:
                node, expanded = stack.pop()
                if expanded:
                    order.append(node)
                    continue
                if id(node) in seen:
                    continue
                seen.add(id(node))
                stack.append((node, True))
                for v in reversed(node.inputs):
                    if v.node is not None and id(v.node) not in seen:
                        stack.append((v.node, False))
        return cls(inputs, outputs, order, name, input_names)

    @property
    def input_types(self) -> tuple[TensorType, ...]:
        return tuple(v.type for v in self.inputs)

    @property
    def output_types(self) -> tuple[TensorType, ...]:
        return tuple(v.type for v in self.outputs)

    def op_counts(self) -> dict[str, int]:
        """Number of nodes per op (regions included)."""
        counts: dict[str, int] = {}
        for node in self.walk():
            counts[node.op] = counts.get(node.op, 0) + 1
        return counts

    def walk(self):
        """Every node, nested regions included, in order."""
        for node in self.nodes:
            yield node
            for region in node.regions:
                yield from region.walk()

    def text(self, debug: bool = False) -> str:
        """The textual IR (see docs/ir.md); ``debug=True`` adds source lines to locations."""
        return _view("printer")(self, debug=debug)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.input_types))
        outs = ", ".join(map(str, self.output_types))
        return f"<Graph @{self.name} ({ins}) -> ({outs}), {len(self.nodes)} nodes>"

    def verify(self) -> Graph:
        """Re-derive every type from the op table and check SSA order; raises IRError."""
        _view("verifier")(self)
        return self

    def to_networkx(self):
        """A ``networkx.MultiDiGraph``: one node per argument, op and output, one edge per operand
        (see :func:`kaun_ir.ir.nx.to_networkx`)."""
        return _view("networkx")(self)

    def _repr_svg_(self) -> str:  # notebooks: the built-in layered drawing (kaun-ir viz)
        return _view("svg")(self)

    def _repr_html_(self) -> str:  # notebooks

        return f"<pre>{html.escape(self.text())}</pre>"


# What Graph's conveniences call: the printer, the verifier and the networkx view are filled by
# the ir package itself (kaun_ir/ir/__init__.py: they are built on this module, which therefore
# cannot import them), the SVG drawing by the composition root (the viewer is a tool).
_VIEWS: dict[str, Callable] = {}


def install_views(**views: Callable) -> None:
    """Fill Graph's conveniences: ``printer(graph, debug=)``, ``verifier(graph)``,
    ``networkx(graph)``, ``svg(graph)``."""
    _VIEWS.update(views)


def _view(name: str) -> Callable:
    if name not in _VIEWS:
        hooks.ensure_installed()
    return _VIEWS[name]
