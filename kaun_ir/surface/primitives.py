"""User-defined primitives: add an op to the op table from Python, without editing the package.

A primitive is declared like the built-in ones, as one :class:`kaun_ir.ops.OpDef` (name,
attributes, type rule, NumPy reference, StableHLO emission, samples, and the derivative and
batching rules or the reasons it has none), and registered with :func:`register`::

    my_op = kn.primitives.register(kn.ops.OpDef(name="my_op", ...))
    y = kn.primitives.call("my_op", x, alpha=0.5)

The emission can be written by hand (``em.op(...)``, see ``kaun_ir/ops/emit.py``) or built from
existing ops with :func:`emit_from`: either inlined, or as one ``stablehlo.composite`` whose
decomposition is a private function of the module, so tools downstream still see one op.
``kaun_ir.testing.check_op`` runs the generated op-table tests on a registered op.

Registration is an explicit call that the user makes (typically at import of their own module);
nothing in kaun_ir registers itself on import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kaun_ir.errors import PrimitiveError
from kaun_ir.ir.builder import Builder
from kaun_ir.ir.core import Graph
from kaun_ir.names import public_dir
from kaun_ir.ops import TABLE, OpDef
from kaun_ir.ops.emit import i64_array, scalar_literal
from kaun_ir.surface.tensor import Tensor, apply, to_value


def register(opdef: OpDef, replace: bool = False) -> OpDef:
    """Add ``opdef`` to the op table and return it.

    The declaration must be complete, as for built-in ops: exactly one of ``vjp`` / ``nondiff``
    and one of ``batch`` / ``nobatch``, a ``doc`` and ``samples``. A name that is already taken
    is an error unless ``replace`` is true and the existing op is a user primitive.
    """
    if not isinstance(opdef, OpDef):
        raise PrimitiveError(f"register needs a kn.ops.OpDef, got {type(opdef).__name__}")
    name = opdef.name
    if not isinstance(name, str) or not name.isidentifier():
        raise PrimitiveError(f"op name must be an identifier (it is printed in the text IR), got {name!r}")
    problems = []
    if (opdef.vjp is None) == (opdef.nondiff is None):
        problems.append("declare exactly one of vjp= (the VJP rule) or nondiff= (why it has no derivative)")
    if (opdef.batch is None) == (opdef.nobatch is None):
        problems.append("declare exactly one of batch= (the batching rule) or nobatch= (why it has none)")
    if not opdef.doc:
        problems.append("give it a doc string (doc=)")
    for rule in ("infer", "reference", "emit", "samples"):
        if not callable(getattr(opdef, rule)):
            problems.append(f"{rule}= must be a function")
    if problems:
        raise PrimitiveError(f"op {name!r}: " + "; ".join(problems))
    if name in TABLE:
        if not (replace and name in _USER):
            raise PrimitiveError(
                f"op {name!r} already exists"
                + ("" if name in _USER else " (a built-in op)")
                + ("; pass replace=True to redefine a user primitive" if name in _USER else "")
            )
    TABLE[name] = opdef
    _USER.add(name)
    return opdef


def unregister(name: str) -> None:
    """Remove a user primitive from the op table (built-in ops cannot be removed)."""
    if name not in _USER:
        raise PrimitiveError(f"{name!r} is not a registered user primitive")
    del TABLE[name]
    _USER.discard(name)


def user_primitives() -> list[str]:
    """Names of the registered user primitives."""
    return sorted(_USER)


_USER: set[str] = set()


def call(name: str, *operands: Any, **attrs: Any):
    """Apply op ``name`` (tracing, or eagerly on concrete arrays): ``kaun_ir.surface.tensor.apply``."""
    return apply(name, *operands, **attrs)


def decomposition(fn: Callable, node) -> Graph:
    """``fn(*operands, **attrs)`` traced at the node's operand types: the op written with other ops."""
    with Builder(record_source=False) as builder:
        args = [Tensor(builder.add_input(v.type), builder) for v in node.inputs]
        out = fn(*args, **node.attr_dict)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        values = [to_value(builder, x) for x in outs]
    graph = builder.finish(values, name=f"{node.op}_decomposition")
    if graph.output_types != node.types:
        got = ", ".join(map(str, graph.output_types))
        want = ", ".join(map(str, node.types))
        raise PrimitiveError(
            f"the decomposition of {node.op} returns ({got}) but its type rule says ({want})"
        )
    return graph


def _composite_attr(key: str, value: Any, op: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value} : i64"
    if isinstance(value, float):
        return f"{scalar_literal(value, np.float64)} : f64"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return i64_array(value)
    raise PrimitiveError(
        f"{op}: attribute {key}={value!r} cannot be written as a composite attribute "
        "(ints, floats, bools, strings and tuples of ints can)"
    )


def emit_from(fn: Callable, composite: str | None = None, version: int = 0) -> Callable:
    """An emission for ``OpDef.emit`` built from existing ops: ``fn(*operands, **attrs)``, written
    with kaun_ir functions, is traced at each node's operand types and lowered.

    - ``composite=None``: its StableHLO is inlined where the op is used;
    - ``composite="namespace.name"``: one ``stablehlo.composite`` op with that name, the op's
      attributes as ``composite_attributes`` and the traced function as its ``decomposition``
      (a private function of the module), so downstream tools see one op and XLA runs the
      decomposition.
    """

    def emit(em, node, *operands):
        graph = decomposition(fn, node)
        if composite is None:
            return em.emit_graph(graph, list(operands))
        symbol = em.function(node.op, graph)
        attrs = {key: _composite_attr(key, value, node.op) for key, value in node.attrs}
        body = ", ".join(f"{key} = {text}" for key, text in attrs.items())
        return em.op(
            "stablehlo.composite",
            list(operands),
            [v.type for v in node.inputs],
            node.types,
            {
                "name": f'"{composite}"',
                "composite_attributes": "{" + body + "}",
                "decomposition": f"@{symbol}",
                "version": f"{int(version)} : i32",
            },
        )

    emit.decomposition = fn
    return emit


__all__ = [
    "register",
    "unregister",
    "user_primitives",
    "call",
    "emit_from",
    "decomposition",
    "PrimitiveError",
]

__dir__ = public_dir(__all__)
