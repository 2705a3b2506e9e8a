"""The spec grammar of :func:`kaun_ir.surface.ein` (OCANNL's generalized einsum notation), parsed into
rows of axis items that keep their character position for error messages.

Grammar::

    spec    := operand (";" operand)* "=>" row-spec
    operand := row-spec
    row-spec:= [batch "|"] [input "->"] output      (each part a row; all may be empty)
    row     := items, in one of two modes chosen for the whole spec:
               single-character mode (no ',' '+' '*' anywhere): every letter is an axis, spaces ignored
               multi-character mode (otherwise): comma-separated identifiers
    item    := axis name | "..." | ".." name ".." | "0" (result only)
               | affine index: sum of "c*axis" terms, c an int or a named constant (operands only)

``...`` is the anonymous row variable *of the part it is written in* (the batch ``...`` and
the output ``...`` are two different variables); ``..name..`` is one variable wherever it is
written. Every row holds at most one row variable.

The axes of an operand or of the result are laid out batch part, then output part, then input
part — ``"b | q, k -> h"`` is an array ``[b, h, q, k]``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kaun_ir.errors import EinSpecError
from kaun_ir.ir.builder import current_path

__all__ = ["spec_error", "Axis", "RowVar", "Fixed", "Affine", "RowSpec", "Spec", "parse", "pointer"]

KINDS = ("batch", "output", "input")  # the layout order of the parts of a row-spec
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAMED_ROW = re.compile(r"\.\.([A-Za-z_][A-Za-z0-9_]*)\.\.")


def pointer(message: str, spec: str, position: int) -> str:
    """``message`` followed by the spec and a caret under ``position`` (like the IR parser)."""
    return f"{message}\n  {spec}\n  {' ' * max(position, 0)}^"


def spec_error(message: str, spec: str, position: int) -> EinSpecError:
    """The :class:`~kaun_ir.errors.EinSpecError` for the item at ``position`` of ``spec``, naming
    the layer path when the spec is used inside a model."""
    return EinSpecError(message, spec, position, current_path())


@dataclass(frozen=True)
class Axis:
    """A named axis (its size is shared wherever the name occurs)."""

    name: str
    pos: int


@dataclass(frozen=True)
class RowVar:
    """A row variable: any number of axes. ``name`` is ``"..name.."`` or ``"...<kind>"``."""

    name: str
    pos: int


@dataclass(frozen=True)
class Fixed:
    """A fixed index ``0`` in the result: a size-1 axis (the reduced axis kept)."""

    value: int
    pos: int


@dataclass(frozen=True)
class Affine:
    """An affine index ``c1*a1 + c2*a2`` over axis names; coefficients are ints or names of
    constants bound by the caller (``stride=2``)."""

    terms: tuple[tuple[int | str, str, int], ...]  # (coefficient, name, position)
    pos: int


@dataclass(frozen=True)
class RowSpec:
    """One operand's (or the result's) items per kind (``parts``), and its start position."""

    parts: dict
    pos: int

    @property
    def items(self) -> list:
        """The items in layout order: batch, output, input."""
        return [item for kind in KINDS for item in self.parts[kind]]


@dataclass(frozen=True)
class Spec:
    """A parsed spec: its text, the operands' row-specs and the result's."""

    text: str
    operands: tuple[RowSpec, ...]
    result: RowSpec
    multi_char: bool


def parse(text: str) -> Spec:
    """Parse a spec, raising :class:`~kaun_ir.errors.EinSpecError` at the first offending position."""
    if not isinstance(text, str):
        raise TypeError(f"ein: the spec must be a string, got {type(text).__name__}")
    arrow = text.find("=>")
    if arrow < 0:
        raise spec_error("a spec needs '=>' before the result (e.g. 'i, j; j, k => i, k')", text, len(text))
    if text.find("=>", arrow + 2) >= 0:
        raise spec_error("more than one '=>'", text, text.find("=>", arrow + 2))
    multi = any(mark in text for mark in ",+*")  # an affine index is written with multi-char names
    operands, start = [], 0
    lhs = text[:arrow]
    for piece in lhs.split(";"):
        operands.append(_row_spec(text, start, start + len(piece), multi, is_result=False))
        start += len(piece) + 1
    result = _row_spec(text, arrow + 2, len(text), multi, is_result=True)
    return Spec(text, tuple(operands), result, multi)


def _row_spec(text: str, start: int, end: int, multi: bool, is_result: bool) -> RowSpec:
    segment = text[start:end]
    bar = segment.find("|")
    if bar >= 0 and segment.find("|", bar + 1) >= 0:
        raise spec_error("more than one '|' in one operand", text, start + segment.find("|", bar + 1))
    arrow = segment.find("->")
    if arrow >= 0 and segment.find("->", arrow + 2) >= 0:
        raise spec_error("more than one '->' in one operand", text, start + segment.find("->", arrow + 2))
    if bar >= 0 and 0 <= arrow < bar:
        raise spec_error("'->' must come after '|' (batch | input -> output)", text, start + arrow)
    out_start = start
    parts = {"batch": [], "input": [], "output": []}
    if bar >= 0:
        parts["batch"] = _row(text, start, start + bar, multi, is_result, "batch")
        out_start = start + bar + 1
    if arrow >= 0:
        parts["input"] = _row(text, out_start, start + arrow, multi, is_result, "input")
        out_start = start + arrow + 2
    parts["output"] = _row(text, out_start, end, multi, is_result, "output")
    stripped = len(segment) - len(segment.lstrip())
    return RowSpec(parts, start + stripped)


def _row(text: str, start: int, end: int, multi: bool, is_result: bool, kind: str) -> list:
    items = (
        _multi_items(text, start, end, is_result, kind)
        if multi
        else _single_items(text, start, end, is_result, kind)
    )
    rows = [item for item in items if isinstance(item, RowVar)]
    if len(rows) > 1:
        raise spec_error(f"the {kind} part may hold only one row variable", text, rows[1].pos)
    return items


def _row_var(token: str, pos: int, kind: str, text: str) -> RowVar:
    if token == "...":
        return RowVar(f"...{kind}", pos)
    match = _NAMED_ROW.fullmatch(token)
    if not match:
        raise spec_error(f"{token!r} is neither '...' nor a named row variable '..name..'", text, pos)
    return RowVar(f"..{match.group(1)}..", pos)


def _single_items(text: str, start: int, end: int, is_result: bool, kind: str) -> list:
    items, i = [], start
    while i < end:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch == ".":
            if text.startswith("...", i):
                items.append(RowVar(f"...{kind}", i))
                i += 3
                continue
            match = _NAMED_ROW.match(text, i, end)
            if not match:
                raise spec_error("expected '...' or a named row variable '..name..'", text, i)
            items.append(RowVar(f"..{match.group(1)}..", i))
            i = match.end()
        elif ch.isalpha() or ch == "_":
            items.append(Axis(ch, i))
            i += 1
        elif ch.isdigit():
            items.append(_fixed(ch, i, is_result, text))
            i += 1
        else:
            raise spec_error(f"unexpected character {ch!r}", text, i)
    return items


def _multi_items(text: str, start: int, end: int, is_result: bool, kind: str) -> list:
    items, pos = [], start
    pieces = text[start:end].split(",")
    for index, piece in enumerate(pieces):
        token = piece.strip()
        at = pos + (len(piece) - len(piece.lstrip()))
        pos += len(piece) + 1
        if not token:
            if index == len(pieces) - 1 and index > 0 or len(pieces) == 1:
                continue  # a trailing comma, or an empty part ("=> ... | " with no output axes)
            raise spec_error("empty axis between commas", text, at)
        if token.startswith("."):
            items.append(_row_var(token, at, kind, text))
        elif token.isdigit():
            items.append(_fixed(token, at, is_result, text))
        elif _IDENT.fullmatch(token):
            items.append(Axis(token, at))
        elif "+" in token or "*" in token:
            if is_result:
                raise spec_error("affine indices are allowed in operands only", text, at)
            items.append(_affine(token, at, text))
        else:
            bad = next((k for k, c in enumerate(token) if not (c.isalnum() or c == "_")), 0)
            raise spec_error(f"{token!r} is not an axis name", text, at + bad)
    return items


def _fixed(token: str, pos: int, is_result: bool, text: str) -> Fixed:
    if not is_result:
        raise spec_error(
            "a fixed index is allowed only in the result (0 keeps a reduced axis as size 1)", text, pos
        )
    if int(token) != 0:
        raise spec_error(
            f"only the fixed index 0 (a size-1 axis) is supported in the result, got {token}", text, pos
        )
    return Fixed(0, pos)


def _affine(token: str, pos: int, text: str) -> Affine:
    """``c*a + d*b`` (spaces allowed, factors in either order); at most one factor of a term may
    be an axis, so a product of two axes is refused."""
    terms, offset = [], 0
    for term in token.split("+"):
        here = pos + offset + (len(term) - len(term.lstrip()))
        offset += len(term) + 1
        factors = [f.strip() for f in term.split("*")]
        if any(not f for f in factors):
            raise spec_error("malformed affine index (an empty term or factor)", text, here)
        if len(factors) > 2:
            raise spec_error(
                "an affine term is 'coefficient*axis'; this term multiplies more than two factors", text, here
            )
        numbers = [f for f in factors if f.isdigit()]
        names = [f for f in factors if not f.isdigit()]
        for name in names:
            if not _IDENT.fullmatch(name):
                raise spec_error(f"{name!r} is not an axis or constant name", text, here)
        if not names:
            raise spec_error(
                "a constant offset is not supported in a convolution index (no padding): write "
                "'stride*o + dilation*k'",
                text,
                here,
            )
        if len(factors) == 1:
            terms.append((1, names[0], here))
        elif numbers:
            terms.append((int(numbers[0]), names[0], here))
        else:
            # two names: the coefficient is the named constant, resolved by the caller; which one
            # is the axis is decided there (a product of two axes is not affine)
            terms.append((names[0], names[1], here))
    return Affine(tuple(terms), pos)
