"""The IR core: types, values, nodes, graphs, the textual form, verification, interpretation."""

from kaun_ir.errors import TorchImportError
from kaun_ir.ir import core as _core
from kaun_ir.ir.builder import Builder, current_builder, current_path, scope
from kaun_ir.ir.core import ArrayAttr, Graph, Node, TensorType, Value
from kaun_ir.ir.importers import from_stablehlo, from_torch, torch_inputs
from kaun_ir.ir.interp import interpret
from kaun_ir.ir.text import parse, print_graph
from kaun_ir.ir.verify import verify as _verify
from kaun_ir.names import public_dir


def _networkx(graph: Graph):
    from kaun_ir.ir.nx import to_networkx  # noqa: PLC0415 - networkx loads when a view is asked for

    return to_networkx(graph)


# Graph's printer, verifier and networkx view are built on Graph, so the package wires them in
# (Python runs this file before any kaun_ir.ir.* module is used)
_core.install_views(printer=print_graph, verifier=_verify, networkx=_networkx)

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

__dir__ = public_dir(__all__)
