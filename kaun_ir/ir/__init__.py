"""The IR core: types, values, nodes, graphs, the textual form, verification, interpretation."""

from kaun_ir.ir.builder import Builder, current_builder, current_path, scope
from kaun_ir.ir.core import ArrayAttr, Graph, Node, TensorType, Value
from kaun_ir.ir.interp import interpret
from kaun_ir.ir.text import parse, print_graph


def from_stablehlo(module, name=None):
    """Import a StableHLO module (MLIR text, bytecode or a portable ``.mlirbc`` artifact, e.g.
    ``jax.jit(f).lower(x).as_text()``) as a :class:`Graph`; see ``kaun_ir.runtime.interop.stablehlo_import``.

    ``name`` picks the function (default ``main``). Unsupported ops raise
    ``StableHLOImportError`` naming the op and its MLIR location, as does a module that does not
    parse, damaged bytecode or a recursive call (see docs/errors.md: the module is untrusted).
    """
    # Reading MLIR needs jaxlib's bindings, which only the runtime layer touches; the import is
    # deferred so the IR core itself stays free of jaxlib (an allowed upward import).
    from kaun_ir.runtime.interop.stablehlo_import import from_stablehlo as _import  # noqa: PLC0415

    return _import(module, name)


__all__ = [
    "ArrayAttr",
    "from_stablehlo",
    "Builder",
    "Graph",
    "Node",
    "TensorType",
    "Value",
    "current_builder",
    "current_path",
    "interpret",
    "parse",
    "print_graph",
    "scope",
]
