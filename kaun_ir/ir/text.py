"""The textual IR: a printer and a parser that are exact inverses (grammar in docs/ir.md).

graph @main(%0: f32[2,3] "x", %1: f32[3]) -> (f32[2,3]) {
  %2 = broadcast_in_dim %1 {broadcast_dimensions = [1], shape = [2, 3]} : f32[2,3]
  %3 = add %0, %2 : f32[2,3] loc("1.linear")
  return %3
}
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ParseError
from kaun_ir.ir import optable
from kaun_ir.ir.core import ArrayAttr, Graph, Node, TensorType, Value

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
        if node.path or (debug and node.source):
            loc = json.dumps(node.path)
            if debug and node.source:
                loc += f" at {json.dumps(node.source)}"
            text += f" loc({loc})"
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


# -------------------------------------------------------------------------------------- parser

_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t\r]+|//[^\n]*)
  | (?P<nl>\n)
  | (?P<value>%[A-Za-z0-9_.$#-]+)
  | (?P<symbol>@[A-Za-z0-9_.$-]+)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<type>(?:f16|bf16|f32|f64|i8|i16|i32|i64|u8|u16|u32|u64|bool)\[[0-9, ]*\])
  | (?P<number>-?(?:(?:inf|nan)\b|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.-]*)
  | (?P<arrow>->)
  | (?P<punct>[(){}\[\]<>=:,])
    """,
    re.VERBOSE,
)


class _Tokens:
    def __init__(self, text: str):
        self.text = text
        self.lines = text.split("\n")
        self.tokens: list[tuple[str, str, int, int]] = []
        line, col, pos = 1, 1, 0
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None:
                raise ParseError(f"unexpected character {text[pos]!r}", line, col, self.lines[line - 1])
            kind = match.lastgroup
            tok = match.group()
            if kind == "nl":
                line, col = line + 1, 1
            else:
                if kind != "ws":
                    self.tokens.append((kind, tok, line, col))
                col += len(tok)
            pos = match.end()
        self.tokens.append(("eof", "", line, col))
        self.pos = 0

    def peek(self) -> tuple[str, str, int, int]:
        return self.tokens[self.pos]

    def next(self) -> tuple[str, str, int, int]:
        tok = self.tokens[self.pos]
        self.pos += 1
        return tok

    def error(self, message: str, tok=None) -> ParseError:
        kind, text, line, col = tok or self.peek()
        found = "end of input" if kind == "eof" else repr(text)
        src = self.lines[line - 1] if line - 1 < len(self.lines) else ""
        return ParseError(f"{message}, found {found}", line, col, src)

    def expect(self, text: str) -> None:
        tok = self.next()
        if tok[1] != text:
            raise self.error(f"expected {text!r}", tok)

    def expect_kind(self, kind: str, what: str) -> str:
        tok = self.next()
        if tok[0] != kind:
            raise self.error(f"expected {what}", tok)
        return tok[1]

    def accept(self, text: str) -> bool:
        if self.peek()[1] == text and self.peek()[0] != "string":
            self.pos += 1
            return True
        return False


# Input-controlled nesting is bounded so that no text reaches Python's recursion limit in the
# parser, the verifier, the printer or the lowering (each walks nested lists and regions).
MAX_ATTR_DEPTH = 32
MAX_REGION_DEPTH = 16
# Dimensions and element counts beyond these cannot be lowered (MLIR and XLA use int64 sizes).
MAX_DIM = 2**40
MAX_ELEMENTS = 2**48


def _string(toks: _Tokens, tok) -> str:
    """The decoded content of a STRING token; ParseError at the token if it is malformed."""
    try:
        value = json.loads(tok[1])
    except json.JSONDecodeError as err:
        raise toks.error(f"malformed string literal ({err.msg})", tok) from None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise toks.error("string literal holds a lone surrogate escape (not valid Unicode)", tok) from None
    return value


def _type(toks: _Tokens, what: str) -> TensorType:
    """The next token as a TensorType; ParseError at the token if its shape is malformed."""
    tok = toks.peek()
    text = toks.expect_kind("type", what)
    try:
        return _parse_type(text)
    except ValueError as err:
        raise toks.error(f"malformed tensor type {text!r} ({err})", tok) from None


def _parse_type(text: str) -> TensorType:
    name, dims = text.split("[", 1)
    dims = dims.rstrip("]").replace(" ", "")
    shape = tuple(int(d) for d in dims.split(",")) if dims else ()
    if any(d > MAX_DIM for d in shape):
        raise ValueError(f"dimensions are limited to {MAX_DIM}")
    if math.prod(shape) > MAX_ELEMENTS:
        raise ValueError(f"element counts are limited to {MAX_ELEMENTS}")
    return TensorType(dtypes.from_short_name(name), shape)


def _parse_number(text: str):
    if any(c in text for c in ".eEn"):  # 'n' catches inf / nan
        return float(text)
    return int(text)


def _parse_attr(toks: _Tokens, depth: int = 0) -> Any:
    kind, text, line, col = toks.peek()
    if depth > MAX_ATTR_DEPTH:
        raise toks.error(f"attribute lists nested deeper than {MAX_ATTR_DEPTH} levels")
    if kind == "number":
        toks.next()
        return _parse_number(text)
    if kind == "string":
        return _string(toks, toks.next())
    if text == "[":
        toks.next()
        items = []
        if not toks.accept("]"):
            while True:
                items.append(_parse_attr(toks, depth + 1))
                if toks.accept("]"):
                    break
                toks.expect(",")
        return tuple(items)
    if kind == "ident":
        toks.next()
        if text in ("true", "false"):
            return text == "true"
        if text == "none":
            return None
        if text == "dense":
            return _parse_dense(toks)
        try:
            return dtypes.from_short_name(text)
        except KeyError:
            raise toks.error("expected an attribute value", (kind, text, line, col)) from None
    raise toks.error("expected an attribute value")


def _parse_dense(toks: _Tokens) -> ArrayAttr:
    toks.expect("<")
    ttype = _type(toks, "a tensor type such as f32[2,3]")
    toks.expect(">")
    if toks.peek()[0] == "string":
        tok = toks.next()
        raw = _string(toks, tok)
        if not raw.startswith("0x"):
            raise toks.error('expected hex bytes "0x..."', tok)
        try:
            data = bytes.fromhex(raw[2:])
        except ValueError:
            raise toks.error('expected hex bytes "0x..."', tok) from None
        if len(data) != ttype.nbytes:
            raise toks.error(f"expected {ttype.nbytes} bytes for {ttype}, got {len(data)}", tok)
        arr = np.frombuffer(data, dtype=ttype.dtype.newbyteorder("<")).astype(ttype.dtype)
        return ArrayAttr(arr.reshape(ttype.shape))
    start = toks.peek()
    values = _parse_attr(toks)
    if not isinstance(values, tuple) or len(values) != ttype.size:
        raise toks.error(f"expected a flat list of {ttype.size} elements for {ttype}", start)
    if not all(isinstance(v, (bool, int, float)) for v in values):
        raise toks.error(f"expected numbers or true/false as elements of {ttype}", start)
    try:
        array = np.array(values, dtype=ttype.dtype)
    except (OverflowError, ValueError) as err:
        raise toks.error(f"elements do not fit {ttype} ({err})", start) from None
    return ArrayAttr(array.reshape(ttype.shape))


def parse(text: str) -> Graph:
    """Read a graph from its textual form; raises :class:`kaun_ir.ParseError` with line/column.

    Unknown ops and type mismatches are reported by ``graph.verify()``, which this calls.
    """
    toks = _Tokens(text)
    graph = _parse_graph(toks)
    if toks.peek()[0] != "eof":
        raise toks.error("expected end of input after the graph")
    graph.verify()
    return graph


def _parse_graph(toks: _Tokens, depth: int = 0) -> Graph:
    ops = optable.table()

    if depth > MAX_REGION_DEPTH:
        raise toks.error(f"regions nested deeper than {MAX_REGION_DEPTH} levels")
    toks.expect("graph")
    name = toks.expect_kind("symbol", "a graph name such as @main")[1:]
    toks.expect("(")
    env: dict[str, Value] = {}
    inputs: list[Value] = []
    input_names: list[str] = []
    if not toks.accept(")"):
        while True:
            tok = toks.peek()
            vname = toks.expect_kind("value", "an argument name such as %0")
            toks.expect(":")
            ttype = _type(toks, "a tensor type such as f32[2,3]")
            if vname in env:
                raise toks.error(f"argument {vname} defined twice", tok)
            label = _string(toks, toks.next()) if toks.peek()[0] == "string" else ""
            value = Value(None, len(inputs), ttype)
            env[vname] = value
            inputs.append(value)
            input_names.append(label)
            if toks.accept(")"):
                break
            toks.expect(",")
    toks.expect("->")
    toks.expect("(")
    out_types: list[TensorType] = []
    if not toks.accept(")"):
        while True:
            out_types.append(_type(toks, "a tensor type"))
            if toks.accept(")"):
                break
            toks.expect(",")
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


def _lookup(toks: _Tokens, env: dict[str, Value]) -> Value:
    tok = toks.peek()
    name = toks.expect_kind("value", "a value name such as %3")
    if name not in env:
        raise toks.error(f"use of undefined value {name}", tok)
    return env[name]


def _parse_node(toks: _Tokens, env: dict[str, Value], table, depth: int = 0) -> Node:
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
    attrs: dict[str, Any] = {}
    if toks.accept("{"):
        if not toks.accept("}"):
            while True:
                key_tok = toks.peek()
                key = toks.expect_kind("ident", "an attribute name")
                if key in attrs:
                    raise toks.error(f"attribute {key!r} given twice", key_tok)
                toks.expect("=")
                attrs[key] = _parse_attr(toks)
                if toks.accept("}"):
                    break
                toks.expect(",")
    toks.expect(":")
    types = [_type(toks, "a result type")]
    while toks.accept(","):
        types.append(_type(toks, "a result type"))
    if len(types) != len(results):
        raise toks.error(f"{len(results)} result name(s) but {len(types)} result type(s)", start)
    path = source = ""
    if toks.accept("loc"):
        toks.expect("(")
        tok = toks.peek()
        toks.expect_kind("string", "a layer path string")
        path = _string(toks, tok)
        if toks.accept("at"):
            tok = toks.peek()
            toks.expect_kind("string", "a source location string")
            source = _string(toks, tok)
        toks.expect(")")
    regions: list[Graph] = []
    if toks.accept("regions"):
        toks.expect("{")
        while not toks.accept("}"):
            regions.append(_parse_graph(toks, depth + 1))
    node = Node(op, inputs, attrs, types, regions, path=path, source=source)
    for name, value in zip(results, node.outputs):
        if name in env:
            raise toks.error(f"value {name} defined twice", start)
        env[name] = value
    return node
