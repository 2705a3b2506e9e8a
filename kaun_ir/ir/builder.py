"""Graph construction while tracing: the active builder, layer-path scopes, source lines."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import Graph, Node, TensorType, Value
from kaun_ir.ir.provenance import Provenance


class _State(threading.local):
    def __init__(self):
        self.builders: list[Builder] = []
        self.path: list[str] = []
        self.source: str | None = None  # when set, every new node records this source instead
        self.provenance: Provenance | None = None  # recorded by every new node


_STATE = _State()
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIP_DIRS = (_PACKAGE_DIR + os.sep,)


@contextlib.contextmanager
def scope(name: str):
    """Push a layer-path component: every node created inside records ``outer.name``.

    ``with kn.ir.scope("1.linear"): ...`` makes nodes whose path is ``"1.linear"`` (nested
    scopes join with ``.``, e.g. ``"encoder.0.attn"``).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"scope name must be a non-empty string, got {name!r}")
    _STATE.path.append(name)
    try:
        yield
    finally:
        _STATE.path.pop()


class _Unset:
    """The default of :func:`location`'s arguments: keep what the enclosing code records."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@contextlib.contextmanager
def location(path: str | None = UNSET, source: str | None = UNSET, provenance: Provenance | None = UNSET):
    """Nodes created inside record exactly this layer path, source line and provenance.

    ``path`` replaces the path of the enclosing scopes (``kn.ir.scope`` inside still nests
    under it); ``source`` replaces the user's ``file:line`` that nodes would record;
    ``provenance`` (:mod:`kaun_ir.ir.provenance`, None for none) is recorded by every node. An
    argument left out keeps what the enclosing code records. Transformations use it to build a
    node's replacement where the node was built (see :func:`at`).
    """
    saved = _STATE.path, _STATE.source, _STATE.provenance
    if path is not UNSET:
        _STATE.path = [path] if path else []
    if source is not UNSET:
        _STATE.source = source
    if provenance is not UNSET:
        _STATE.provenance = provenance
    try:
        yield
    finally:
        _STATE.path, _STATE.source, _STATE.provenance = saved


def at(node: Node, provenance: Provenance | None = UNSET):
    """``with at(node):`` nodes created inside record ``node``'s layer path, source line and
    provenance (or ``provenance`` when given), so what a pass or transformation builds in place
    of ``node`` reads as part of the same layer: reverse mode builds an op's backward nodes
    ``at(node, provenance=backward_of(node.op))``."""
    chosen = node.provenance if provenance is UNSET else provenance
    return location(path=node.path, source=node.source, provenance=chosen)


def current_path() -> str:
    """The layer path of the innermost scopes, ``""`` outside every scope."""
    return ".".join(_STATE.path)


def current_builder() -> Builder | None:
    """The builder of the innermost active trace, or None outside tracing."""
    return _STATE.builders[-1] if _STATE.builders else None


def is_active(builder: Builder) -> bool:
    """Whether ``builder`` belongs to a trace still running on this thread (the innermost or an
    enclosing one): its values may still be captured by an inner trace."""
    return any(active is builder for active in _STATE.builders)


def _user_source() -> str:
    """``file:line`` of the innermost frame outside the kaun_ir package."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_SKIP_DIRS):
        frame = frame.f_back
    if frame is None:
        return ""
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def describe_operands(types: Sequence[TensorType]) -> str:
    """Operand types for an error message: ``a and b`` for two, ``a, b, c`` otherwise."""
    return " and ".join(map(str, types)) if len(types) == 2 else ", ".join(map(str, types))


def infer_or_raise(
    opdef, types: Sequence[TensorType], attrs: dict[str, Any], path: str = "", regions: Sequence[Graph] = ()
) -> tuple:
    """Run an op's type rule; re-raise its complaint naming the layer path, op and operand types."""
    try:
        return opdef.infer_types(types, attrs, regions)
    except (ShapeError, TypeError, ValueError) as err:
        where = f"{path}: " if path else ""
        cls = TypeError if isinstance(err, TypeError) and not isinstance(err, ShapeError) else ShapeError
        raise cls(f"{where}{opdef.name} of {describe_operands(types)}: {err}") from None


class Builder:
    """Accumulates the nodes of one trace; ``Graph`` is made by :meth:`finish`."""

    def __init__(self, record_source: bool = True):
        self.nodes: list[Node] = []
        self.inputs: list[Value] = []
        self.record_source = record_source
        # Tensors of enclosing traces used inside this one become extra inputs ("captures").
        self.captures: list = []
        self._captured: dict[int, Value] = {}
        self._counts: dict[str, int] = {}

    def __enter__(self) -> Builder:
        _STATE.builders.append(self)
        return self

    def __exit__(self, *exc) -> None:
        popped = _STATE.builders.pop()
        assert popped is self, "trace builders were exited out of order"

    def add_input(self, type: TensorType) -> Value:
        """A new graph input of ``type``, appended after the existing ones."""
        value = Value(None, len(self.inputs), type)
        self.inputs.append(value)
        return value

    def capture(self, outer) -> Value:
        """The input standing for ``outer`` (a Tensor of an enclosing trace), made on first use."""
        value = self._captured.get(id(outer.value))
        if value is None:
            value = self.add_input(outer.value.type)
            self._captured[id(outer.value)] = value
            self.captures.append(outer)
        return value

    def next_count(self, kind: str) -> int:
        """0, 1, 2 ... on successive calls with the same ``kind``: numbers things made during
        this trace (``kn.remat`` numbers its segments with it)."""
        count = self._counts.get(kind, 0)
        self._counts[kind] = count + 1
        return count

    def append(self, node: Node) -> tuple[Value, ...]:
        """Append a node built elsewhere (a copy, already type-checked); returns its outputs."""
        self.nodes.append(node)
        return node.outputs

    def add(
        self, opdef, inputs: Sequence[Value], attrs: dict[str, Any], regions: Sequence[Graph] = ()
    ) -> tuple[Value, ...]:
        """Type-check and append one node; returns its outputs."""
        attrs = opdef.check_attrs(attrs)
        path = current_path()
        types = infer_or_raise(opdef, [v.type for v in inputs], attrs, path, regions)
        if _STATE.source is not None:
            source = _STATE.source
        else:
            source = _user_source() if self.record_source else ""
        node = Node(
            opdef.name, inputs, attrs, types, regions, path=path, source=source, provenance=_STATE.provenance
        )
        self.nodes.append(node)
        return node.outputs

    def finish(
        self, outputs: Sequence[Value], name: str = "main", input_names: Sequence[str] | None = None
    ) -> Graph:
        """The traced graph; dead nodes are kept (the ``dce`` pass removes them)."""
        return Graph(self.inputs, outputs, self.nodes, name, input_names)
