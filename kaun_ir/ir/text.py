"""The textual IR: a printer and a parser that are exact inverses (grammar in docs/ir.md).

This module prints graphs and parses graphs and nodes; tokens and literals (types, attribute
values) are read by :mod:`kaun_ir.ir.tokens`.

graph @main(%0: f32[2,3] "x", %1: f32[3]) -> (f32[2,3]) {
  %2 = broadcast_in_dim %1 {broadcast_dimensions = [1], shape = [2, 3]} : f32[2,3]
  %3 = add %0, %2 : f32[2,3] loc("1.linear")
  return %3
}
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.ir import optable
from kaun_ir.ir.core import ArrayAttr, Graph, Node, TensorType, Value
from kaun_ir.ir.provenance import KINDS, Provenance
from kaun_ir.ir.tokens import MAX_REGION_DEPTH, Tokens, parse_attr, string, tensor_type

_INLINE_LIMIT = 32  # constants with more elements are printed as hex bytes


# ------------------------------------------------------------------------------------- printer


def format_scalar(value, dtype) -> str:
    """A scalar of ``dtype`` as the textual IR writes it (``true``, ``3``, ``1.5``, ``inf``)."""
    if np.dtype(dtype) == dtypes.bool_:
        return "true" if bool(value) else "false"
    if np.dtype(dtype) in dtypes.INTEGERS:
        return str(int(value))
    return repr(float(value))


def format_attr(value: Any) -> str:
    """An attribute value as the textual IR writes it (the inverse of the parser's attribute rule)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, np.dtype):
        return dtypes.short_name(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(format_attr(v) for v in value) + "]"
    if isinstance(value, ArrayAttr):
        arr = value.array
        head = f"dense<{TensorType(arr.dtype, arr.shape)}>"
        if arr.size <= _INLINE_LIMIT:
            return head + "[" + ", ".join(format_scalar(x, arr.dtype) for x in arr.reshape(-1)) + "]"
        raw = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False)
        return head + '"0x' + raw.tobytes().hex() + '"'
    raise TypeError(f"cannot print attribute {value!r}")


def print_graph(graph: Graph, debug: bool = False) -> str:
    """Textual form of ``graph``; ``debug`` adds each node's user source line to its location."""
    lines: list[str] = []
    counter = [0]
    _print_into(graph, lines, 0, counter, debug)
    return "\n".join(lines) + "\n"


def _print_into(graph: Graph, lines: list[str], indent: int, counter: list[int], debug: bool) -> None:
    names: dict[int, str] = {}

    def fresh(value: Value) -> str:
        name = f"%{counter[0]}"
        counter[0] += 1
        names[id(value)] = name
        return name

    def ref(value: Value) -> str:
        try:
            return names[id(value)]
        except KeyError:
            return f"%<undefined {value!r}>"

    pad = " " * indent
    args = []
    for i, value in enumerate(graph.inputs):
        label = ""
        if graph.input_names is not None and graph.input_names[i]:
            label = " " + json.dumps(graph.input_names[i])
        args.append(f"{fresh(value)}: {value.type}{label}")
    outs = ", ".join(str(v.type) for v in graph.outputs)
    lines.append(f"{pad}graph @{graph.name}({', '.join(args)}) -> ({outs}) {{")
    for node in graph.nodes:
        results = ", ".join(fresh(v) for v in node.outputs)
        operands = ", ".join(ref(v) for v in node.inputs)
        text = f"{pad}  {results} = {node.op}"
        if operands:
            text += f" {operands}"
        if node.attrs:
            text += " {" + ", ".join(f"{k} = {format_attr(v)}" for k, v in node.attrs) + "}"
        text += " : " + ", ".join(str(t) for t in node.types)
        if node.path or (debug and (node.source or node.provenance is not None)):
            text += f" loc({_location(node, debug)})"
        if node.regions:
            lines.append(text + " regions {")
            for region in node.regions:
                _print_into(region, lines, indent + 4, counter, debug)
            lines.append(f"{pad}  }}")
        else:
            lines.append(text)
    returned = ", ".join(ref(v) for v in graph.outputs)
    lines.append(f"{pad}  return {returned}" if returned else f"{pad}  return")
    lines.append(f"{pad}}}")


def _location(node: Node, debug: bool) -> str:
    """What goes inside ``loc(...)``: the layer path, and in debug text the source line and the
    provenance (``"1.linear" at "model.py:12" from backward "sqrt"``)."""
    loc = json.dumps(node.path)
    if debug and node.source:
        loc += f" at {json.dumps(node.source)}"
    if debug and node.provenance is not None:
        loc += f" from {node.provenance.kind}"
        if node.provenance.detail:
            loc += f" {json.dumps(node.provenance.detail)}"
    return loc


# -------------------------------------------------------------------------------------- parser


def parse(text: str) -> Graph:
    """Read a graph from its textual form; raises :class:`kaun_ir.ParseError` with line/column.

    Unknown ops and type mismatches are reported by ``graph.verify()``, which this calls.
    """
    if not isinstance(text, str):
        hint = " (decode the bytes first)" if isinstance(text, (bytes, bytearray)) else ""
        # an argument of the wrong kind is a TypeError, as everywhere (docs/errors.md)
        raise TypeError(f"parse takes the textual IR as a str, got {type(text).__name__}{hint}")
    toks = Tokens(text)
    graph = _parse_graph(toks)
    if toks.peek()[0] != "eof":
        raise toks.error("expected end of input after the graph")
    graph.verify()
    return graph


def _parse_graph(toks: Tokens, depth: int = 0) -> Graph:
    ops = optable.table()

    if depth > MAX_REGION_DEPTH:
        raise toks.error(f"regions nested deeper than {MAX_REGION_DEPTH} levels")
    toks.expect("graph")
    name = toks.expect_kind("symbol", "a graph name such as @main")[1:]
    env: dict[str, Value] = {}
    inputs, input_names = _parse_arguments(toks, env)
    toks.expect("->")
    out_types = _parse_list(toks, lambda: tensor_type(toks, "a tensor type"))
    toks.expect("{")
    nodes: list[Node] = []
    while True:
        tok = toks.peek()
        if tok[1] == "return" and tok[0] == "ident":
            toks.next()
            outputs = []
            if toks.peek()[0] == "value":
                outputs.append(_lookup(toks, env))
                while toks.accept(","):
                    outputs.append(_lookup(toks, env))
            toks.expect("}")
            break
        nodes.append(_parse_node(toks, env, ops, depth))
    for i, (value, ttype) in enumerate(zip(outputs, out_types)):
        if value.type != ttype:
            raise toks.error(f"output {i} has type {value.type} but the signature says {ttype}")
    if len(outputs) != len(out_types):
        raise toks.error(f"graph returns {len(outputs)} value(s) but the signature lists {len(out_types)}")
    names = input_names if any(input_names) else None
    return Graph(inputs, outputs, nodes, name, names)


def _parse_list(toks: Tokens, item) -> list:
    """``( item, item, ... )``: the items ``item()`` reads, in order (none for ``()``)."""
    toks.expect("(")
    items: list = []
    if not toks.accept(")"):
        while True:
            items.append(item())
            if toks.accept(")"):
                break
            toks.expect(",")
    return items


def _parse_arguments(toks: Tokens, env: dict[str, Value]) -> tuple[list[Value], list[str]]:
    """A graph's ``(%0: f32[2] "label", ...)``: its input values (entered in ``env``) and labels."""
    inputs: list[Value] = []
    labels: list[str] = []

    def argument():
        tok = toks.peek()
        vname = toks.expect_kind("value", "an argument name such as %0")
        toks.expect(":")
        ttype = tensor_type(toks, "a tensor type such as f32[2,3]")
        if vname in env:
            raise toks.error(f"argument {vname} defined twice", tok)
        labels.append(string(toks, toks.next()) if toks.peek()[0] == "string" else "")
        value = Value(None, len(inputs), ttype)
        env[vname] = value
        inputs.append(value)

    _parse_list(toks, argument)
    return inputs, labels


def _lookup(toks: Tokens, env: dict[str, Value]) -> Value:
    tok = toks.peek()
    name = toks.expect_kind("value", "a value name such as %3")
    if name not in env:
        raise toks.error(f"use of undefined value {name}", tok)
    return env[name]


def _parse_node(toks: Tokens, env: dict[str, Value], table, depth: int = 0) -> Node:
    start = toks.peek()
    results = [toks.expect_kind("value", "a result name such as %3 or 'return'")]
    while toks.accept(","):
        results.append(toks.expect_kind("value", "a result name"))
    toks.expect("=")
    op_tok = toks.peek()
    op = toks.expect_kind("ident", "an op name")
    if op not in table:
        raise toks.error(f"unknown op {op!r}", op_tok)
    inputs: list[Value] = []
    if toks.peek()[0] == "value":
        inputs.append(_lookup(toks, env))
        while toks.accept(","):
            inputs.append(_lookup(toks, env))
    attrs = _parse_attributes(toks) if toks.accept("{") else {}
    toks.expect(":")
    types = [tensor_type(toks, "a result type")]
    while toks.accept(","):
        types.append(tensor_type(toks, "a result type"))
    if len(types) != len(results):
        raise toks.error(f"{len(results)} result name(s) but {len(types)} result type(s)", start)
    path, source, provenance = _parse_location(toks) if toks.accept("loc") else ("", "", None)
    regions: list[Graph] = []
    if toks.accept("regions"):
        toks.expect("{")
        while not toks.accept("}"):
            regions.append(_parse_graph(toks, depth + 1))
    node = Node(op, inputs, attrs, types, regions, path=path, source=source, provenance=provenance)
    for name, value in zip(results, node.outputs):
        if name in env:
            raise toks.error(f"value {name} defined twice", start)
        env[name] = value
    return node


def _parse_attributes(toks: Tokens) -> dict[str, Any]:
    """``name = value, ...}`` after a node's ``{``."""
    attrs: dict[str, Any] = {}
    if toks.accept("}"):
        return attrs
    while True:
        key_tok = toks.peek()
        key = toks.expect_kind("ident", "an attribute name")
        if key in attrs:
            raise toks.error(f"attribute {key!r} given twice", key_tok)
        toks.expect("=")
        attrs[key] = parse_attr(toks)
        if toks.accept("}"):
            return attrs
        toks.expect(",")


def _parse_location(toks: Tokens) -> tuple[str, str, Provenance | None]:
    """``("path" at "file:line" from kind "detail")`` after ``loc``: the layer path, the source
    line and the provenance (the last two optional)."""
    toks.expect("(")
    tok = toks.peek()
    toks.expect_kind("string", "a layer path string")
    path = string(toks, tok)
    source = ""
    if toks.accept("at"):
        tok = toks.peek()
        toks.expect_kind("string", "a source location string")
        source = string(toks, tok)
    provenance = None
    if toks.accept("from"):
        tok = toks.peek()
        kind = toks.expect_kind("ident", "a provenance kind (" + ", ".join(KINDS) + ")")
        if kind not in KINDS:
            raise toks.error("expected a provenance kind (" + ", ".join(KINDS) + ")", tok)
        detail = string(toks, toks.next()) if toks.peek()[0] == "string" else ""
        provenance = Provenance(kind, detail)
    toks.expect(")")
    return path, source, provenance
