"""The lexical level of the textual IR: tokens, and the literals built from them (tensor types,
attribute values, dense arrays). :mod:`kaun_ir.ir.text` parses graphs and nodes on top of it;
the grammar is in docs/ir.md."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ParseError
from kaun_ir.ir.core import ArrayAttr, TensorType

_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t\r]+|//[^\n]*)
  | (?P<nl>\n)
  | (?P<value>%[A-Za-z0-9_.$#-]+)
  | (?P<symbol>@[A-Za-z0-9_.$-]+)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<type>(?:f16|bf16|f32|f64|i8|i16|i32|i64|u8|u16|u32|u64|bool)
             \[(?:[0-9, ]|@[A-Za-z_][A-Za-z0-9_]*|@\([A-Za-z0-9_, ]*\))*\])
  | (?P<number>-?(?:(?:inf|nan)\b|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.-]*)
  | (?P<arrow>->)
  | (?P<punct>[(){}\[\]<>=:,])
    """,
    re.VERBOSE,
)


class Tokens:
    """The tokens of a text, with a cursor; errors name the line and column of a token."""

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
        """The token at the cursor: ``(kind, text, line, column)``."""
        return self.tokens[self.pos]

    def next(self) -> tuple[str, str, int, int]:
        """The token at the cursor, moving past it."""
        tok = self.tokens[self.pos]
        self.pos += 1
        return tok

    def error(self, message: str, tok=None) -> ParseError:
        """A ParseError at ``tok`` (default: the cursor) saying what was expected and what was found."""
        kind, text, line, col = tok or self.peek()
        found = "end of input" if kind == "eof" else repr(text)
        src = self.lines[line - 1] if line - 1 < len(self.lines) else ""
        return ParseError(f"{message}, found {found}", line, col, src)

    def expect(self, text: str) -> None:
        """Move past the token ``text``; ParseError when another comes."""
        tok = self.next()
        if tok[1] != text:
            raise self.error(f"expected {text!r}", tok)

    def expect_kind(self, kind: str, what: str) -> str:
        """The text of the next token, which must be of ``kind`` (``what`` names it in errors)."""
        tok = self.next()
        if tok[0] != kind:
            raise self.error(f"expected {what}", tok)
        return tok[1]

    def accept(self, text: str) -> bool:
        """Move past the token ``text`` if it comes next (a STRING never matches a keyword)."""
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


def string(toks: Tokens, tok) -> str:
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


def tensor_type(toks: Tokens, what: str) -> TensorType:
    """The next token as a TensorType; ParseError at the token if its shape is malformed."""
    tok = toks.peek()
    text = toks.expect_kind("type", what)
    try:
        return parse_type(text)
    except ValueError as err:
        raise toks.error(f"malformed tensor type {text!r} ({err})", tok) from None


_SHARDED_DIM = re.compile(r"(\d+)(?:@([A-Za-z_][A-Za-z0-9_]*)|@\(([A-Za-z0-9_,]*)\))?")
_AXIS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_type(text: str) -> TensorType:
    """A TYPE token's text (``"f32[2,3]"``, sharded ``"f32[8@data,16@(x,y)]"``) as a
    TensorType; ValueError when it is malformed or out of limits."""
    name, dims = text.split("[", 1)
    dims = dims[: dims.rindex("]")].replace(" ", "")
    if "@" not in dims:
        shape = tuple(int(d) for d in dims.split(",")) if dims else ()
        sharding = None
    else:
        shape, layout = [], []
        for entry in re.split(r",(?![^(]*\))", dims):  # commas outside @( ... )
            match = _SHARDED_DIM.fullmatch(entry)
            if match is None:
                raise ValueError(f"malformed dimension {entry!r}")
            shape.append(int(match.group(1)))
            axes = (match.group(2),) if match.group(2) else ()
            if match.group(3) is not None:
                axes = tuple(match.group(3).split(","))
                if not all(_AXIS.fullmatch(a) for a in axes):
                    raise ValueError(f"malformed mesh axes in {entry!r}")
            if len(set(axes)) != len(axes) or any(a in (x for s in layout for x in s) for a in axes):
                raise ValueError(f"a mesh axis splits more than one dimension in {text!r}")
            layout.append(axes)
        shape, sharding = tuple(shape), tuple(layout)
    if any(d > MAX_DIM for d in shape):
        raise ValueError(f"dimensions are limited to {MAX_DIM}")
    if math.prod(shape) > MAX_ELEMENTS:
        raise ValueError(f"element counts are limited to {MAX_ELEMENTS}")
    return TensorType(dtypes.from_short_name(name), shape, sharding)


def parse_number(text: str) -> int | float:
    """A NUMBER token's text as an int, or a float when it has a point, an exponent, inf or nan."""
    if any(c in text for c in ".eEn"):  # 'n' catches inf / nan
        return float(text)
    return int(text)


def parse_attr(toks: Tokens, depth: int = 0) -> Any:
    """The attribute value at the cursor (``attr-value`` in docs/ir.md), frozen as nodes hold it."""
    kind, text, line, col = toks.peek()
    if depth > MAX_ATTR_DEPTH:
        raise toks.error(f"attribute lists nested deeper than {MAX_ATTR_DEPTH} levels")
    if kind == "number":
        toks.next()
        return parse_number(text)
    if kind == "string":
        return string(toks, toks.next())
    if text == "[":
        toks.next()
        items = []
        if not toks.accept("]"):
            while True:
                items.append(parse_attr(toks, depth + 1))
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
            return parse_dense(toks)
        try:
            return dtypes.from_short_name(text)
        except KeyError:
            raise toks.error("expected an attribute value", (kind, text, line, col)) from None
    raise toks.error("expected an attribute value")


def parse_dense(toks: Tokens) -> ArrayAttr:
    """The rest of a ``dense<TYPE>[...]`` or ``dense<TYPE>"0x..."`` value, after ``dense``."""
    toks.expect("<")
    ttype = tensor_type(toks, "a tensor type such as f32[2,3]")
    toks.expect(">")
    if toks.peek()[0] == "string":
        tok = toks.next()
        raw = string(toks, tok)
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
    values = parse_attr(toks)
    if not isinstance(values, tuple) or len(values) != ttype.size:
        raise toks.error(f"expected a flat list of {ttype.size} elements for {ttype}", start)
    if not all(isinstance(v, (bool, int, float)) for v in values):
        raise toks.error(f"expected numbers or true/false as elements of {ttype}", start)
    try:
        array = np.array(values, dtype=ttype.dtype)
    except (OverflowError, ValueError) as err:
        raise toks.error(f"elements do not fit {ttype} ({err})", start) from None
    return ArrayAttr(array.reshape(ttype.shape))
