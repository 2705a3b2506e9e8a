"""Pipeline strings: the grammar, its parsed form (:class:`Pipeline` of :class:`PassStep`) and printing.

``str(Pipeline.parse(text)) == text`` for canonical text; names, options and option values are
checked against the pass registry while parsing, so a bad pipeline fails before any pass runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kaun_ir.errors import PassOptionError, PipelineError
from kaun_ir.passes.registry import REGISTRY, PassInfo

_SPECIAL = set(',{}="\\') | {" ", "\t", "\n"}


@dataclass(frozen=True)
class PassStep:
    """One pass of a pipeline: its name and the options set explicitly (in the order written).

    ``options`` holds converted values (bool/int/float/str). Options not given take the
    defaults declared with :func:`kaun_ir.passes.register`; see :meth:`resolved_options`.
    """

    name: str
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def info(self) -> PassInfo:
        return REGISTRY[self.name]

    def resolved_options(self) -> dict[str, Any]:
        """Every declared option: the given value (checked against its declaration, for a step
        built in Python rather than parsed) or the default."""
        info = self.info
        values = {name: opt.default for name, opt in info.options.items()}
        for name, value in self.options:
            if name not in info.options:
                raise PassOptionError(
                    f"unknown option {name!r} of pass {self.name!r}; {describe_options(info)}"
                )
            values[name] = info.options[name].check(value, self.name)
        return values

    def __str__(self) -> str:
        if not self.options:
            return self.name
        declared = REGISTRY[self.name].options if self.name in REGISTRY else {}
        parts = []
        for key, value in self.options:
            text = declared[key].spell(value) if key in declared else str(value)
            parts.append(f"{key}={_quote(text)}")
        return f"{self.name}{{{' '.join(parts)}}}"


def _quote(text: str) -> str:
    """Values with special characters (or empty) are written in double quotes."""
    if text and not (set(text) & _SPECIAL):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class Pipeline:
    """A parsed pipeline: a sequence of :class:`PassStep`.

    Grammar (whitespace is allowed around every token)::

        pipeline := [step ("," step)*]
        step     := pass-name ["{" [option (" " option)*] "}"]
        option   := option-name "=" value
        value    := bare-word | '"' chars with \\" and \\\\ escapes '"'

    e.g. ``layout{prefer=nhwc},fuse-optimizer{horizontal=true},cse,dce``. Bool values are
    ``true``/``false``, ints decimal (or ``0x..``), floats as Python writes them.
    ``Pipeline.parse`` checks pass names, option names and value types against the registry;
    ``str()`` gives the canonical text, which parses back to an equal pipeline.
    """

    steps: tuple[PassStep, ...] = ()

    @classmethod
    def parse(cls, text: str | Pipeline) -> Pipeline:
        """The pipeline a textual description (``"cse,dce"``, ``"fold{max_elements=8},dce"``)
        names; a Pipeline is returned as it is. ``PipelineError`` pointing at the first bad character."""
        if isinstance(text, Pipeline):
            return text
        if not isinstance(text, str):
            raise TypeError(f"a pipeline is a string like 'cse,dce', got {type(text).__name__}")
        return cls(tuple(_Parser(text).parse()))

    @classmethod
    def of(cls, *steps: str | PassStep) -> Pipeline:
        """``Pipeline.of("cse", PassStep("unroll", (("factor", 8),)))`` (validated like parse)."""
        return cls.parse(",".join(str(s) for s in steps))

    def __str__(self) -> str:
        return ",".join(str(step) for step in self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self):
        return iter(self.steps)

    def __bool__(self) -> bool:
        return bool(self.steps)


class _Parser:
    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def error(self, message: str, at: int | None = None) -> PipelineError:
        at = self.pos if at is None else at
        return PipelineError(f"{message}\n  {self.text}\n  {' ' * at}^")

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        self.skip_space()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def word(self, what: str) -> tuple[str, int]:
        self.skip_space()
        start = self.pos
        while self.pos < len(self.text) and (self.text[self.pos].isalnum() or self.text[self.pos] in "-_."):
            self.pos += 1
        if self.pos == start:
            found = repr(self.text[start]) if start < len(self.text) else "the end"
            raise self.error(f"expected {what}, found {found}", start)
        return self.text[start : self.pos], start

    def value(self) -> str:
        self.skip_space()
        if self.peek() != '"':
            start = self.pos
            while self.pos < len(self.text) and self.text[self.pos] not in _SPECIAL:
                self.pos += 1
            if self.pos == start:
                raise self.error('expected an option value (use "" for an empty string)')
            return self.text[start : self.pos]
        start, self.pos, chars = self.pos, self.pos + 1, []
        while self.pos < len(self.text) and self.text[self.pos] != '"':
            if self.text[self.pos] == "\\" and self.pos + 1 < len(self.text):
                self.pos += 1
            chars.append(self.text[self.pos])
            self.pos += 1
        if self.pos >= len(self.text):
            raise self.error("unterminated quoted value", start)
        self.pos += 1
        return "".join(chars)

    def parse(self) -> list[PassStep]:
        steps: list[PassStep] = []
        if not self.peek():
            return steps
        while True:
            steps.append(self.step())
            nxt = self.peek()
            if not nxt:
                return steps
            if nxt != ",":
                raise self.error(f"expected ',' between passes, found {nxt!r}")
            self.pos += 1
            if not self.peek():  # a trailing comma is forgiven, as before
                return steps

    def step(self) -> PassStep:
        name, at = self.word("a pass name")
        info = REGISTRY.get(name)
        if info is None:
            raise PipelineError(f"unknown pass {name!r}; available: {', '.join(sorted(REGISTRY))}")
        options: list[tuple[str, Any]] = []
        if self.peek() != "{":
            return PassStep(name)
        self.pos += 1
        while self.peek() != "}":
            if not self.peek():
                raise self.error(f"missing '}}' after the options of {name!r}")
            key, key_at = self.word(f"an option name of pass {name!r} or '}}'")
            option = info.options.get(key)
            if option is None:
                raise PipelineError(f"unknown option {key!r} of pass {name!r}; {describe_options(info)}")
            if any(key == k for k, _ in options):
                raise self.error(f"option {key!r} of pass {name!r} given twice", key_at)
            if self.peek() != "=":
                raise self.error(f"expected '=' after option {key!r} of pass {name!r}")
            self.pos += 1
            try:
                options.append((key, option.convert(self.value(), name)))
            except PipelineError:
                raise
            except ValueError as err:
                raise PipelineError(str(err)) from None
            if self.peek() == ",":
                raise self.error("options are separated by spaces, passes by ','")
        self.pos += 1
        return PassStep(name, tuple(options))


def describe_options(info: PassInfo) -> str:
    """``"its options: factor (int, default 4), ..."`` or ``"it takes no options"``."""
    if not info.options:
        return "it takes no options"
    parts = [f"{o.name} ({o.allowed()}, default {o.spell(o.default)})" for o in info.options.values()]
    return "its options: " + ", ".join(parts)


def parse_pipeline(pipeline: str) -> list[str]:
    """``"cse, dce"`` -> ``["cse", "dce"]`` (pass names only; options are checked but dropped).

    Unknown names raise ValueError listing the known ones. See :class:`Pipeline` for the
    full form with options.
    """
    return [step.name for step in Pipeline.parse(pipeline).steps]
