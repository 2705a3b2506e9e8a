"""The IR core: types, values, nodes, graphs, the textual form, verification, interpretation."""

from kaun_ir.errors import TorchImportError
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


def from_torch(exported_program, name="main"):
    """Import a ``torch.export.ExportedProgram`` as a :class:`Graph`; see
    ``kaun_ir.runtime.interop.torch_import``.

    Inputs: the program's parameters, buffers and constants in ``graph_signature`` order, then its
    user inputs; :func:`torch_inputs` gives the arrays. An ATen op with no mapping raises
    :class:`TorchImportError` naming the op and the module path.
    """
    # the converter sits with the other importers in the runtime layer (an allowed upward import)
    from kaun_ir.runtime.interop.torch_import import from_torch as _import  # noqa: PLC0415

    return _import(exported_program, name)


def torch_inputs(exported_program, *args):
    """The flat list of arrays to call :func:`from_torch`'s graph with (parameters, buffers and
    constants of the program, then ``args`` flattened)."""
    from kaun_ir.runtime.interop.torch_import import torch_inputs as _inputs  # noqa: PLC0415 - as from_torch

    return _inputs(exported_program, *args)


__all__ = [
    "ArrayAttr",
    "from_stablehlo",
    "from_torch",
    "torch_inputs",
    "TorchImportError",
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
