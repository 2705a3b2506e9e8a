"""The IR core: types, values, nodes, graphs, the textual form, verification, interpretation."""

from .builder import Builder, current_builder, current_path, scope
from .core import ArrayAttr, Graph, Node, TensorType, Value
from .interp import interpret
from .text import parse, print_graph

__all__ = ["ArrayAttr", "Builder", "Graph", "Node", "TensorType", "Value", "current_builder",
           "current_path", "interpret", "parse", "print_graph", "scope"]
