"""The pass manager: pipelines with per-pass options, instrumentation, verification, reproducers.

Shaped after MLIR's and LLVM's pass managers (see docs/passes.md):

- :class:`Pipeline` is the parsed form of a pipeline string such as
  ``"layout{prefer=nhwc},cse,dce"``; ``str(Pipeline.parse(text)) == text`` for canonical text.
- :class:`PassManager` runs a pipeline over a graph, calling :class:`Instrumentation` hooks
  before and after each pass, optionally verifying after each pass and stopping after the N-th.
- When a pass crashes (raises anything but a :class:`kaun_ir.errors.KaunError` diagnostic), its
  input IR and the rest of the pipeline are written to a ``.kir`` reproducer and a
  :class:`PassCrash` names the pass and the file.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kaun_ir.errors import IRError, KaunError
from kaun_ir.fileio import atomic_write, repro_dir
from kaun_ir.ir.core import Graph

from . import registry
from .registry import REGISTRY, PassInfo

# --- pipelines --------------------------------------------------------------------------------

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
        """Every declared option: the given value or the default."""
        values = {name: opt.default for name, opt in self.info.options.items()}
        values.update(self.options)
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


class PipelineError(ValueError):
    """A malformed pipeline string, an unknown pass or option, or a badly typed option value."""


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
    parts = [f"{o.name} ({o.type.__name__}, default {o.spell(o.default)})" for o in info.options.values()]
    return "its options: " + ", ".join(parts)


# --- instrumentation --------------------------------------------------------------------------


@dataclass
class PassRun:
    """One pass being run by a :class:`PassManager`: what instrumentation hooks receive.

    ``index`` is 1-based within the pipeline; ``options`` are all option values in effect
    (defaults filled in); ``counters`` collects what the pass reported with
    :func:`kaun_ir.passes.statistic`.
    """

    index: int
    step: PassStep
    options: dict[str, Any]
    counters: dict[str, int | float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.step.name

    def __str__(self) -> str:
        return f"{self.step} (#{self.index})"


class Instrumentation:
    """Hooks around every pass. Subclass and override what you need; all default to doing nothing.

    The manager calls each hook on every instrumentation in the order they were given.
    """

    def before(self, pass_: PassRun, graph: Graph) -> None:
        """Called with the pass's input graph, before it runs."""

    def after(self, pass_: PassRun, graph: Graph, result: Graph, seconds: float) -> None:
        """Called after a pass succeeded: input ``graph``, output ``result``, wall time."""

    def failed(self, pass_: PassRun, graph: Graph, error: BaseException) -> None:
        """Called when a pass raised or its result failed verification."""

    def finish(self) -> None:
        """Called once when the pipeline ends (normally or not)."""


def _header(what: str) -> str:
    return f"// -----// IR Dump {what} //----- //\n"


class PrintAfterAll(Instrumentation):
    """Print the IR after every pass (``kaun-ir opt --print-ir-after-all``)."""

    def __init__(self, stream=None):
        self.stream = stream

    def after(self, pass_, graph, result, seconds):
        out = self.stream or _stderr()
        out.write(_header(f"After {pass_}") + result.text())
        out.flush()


class PrintAfterChange(Instrumentation):
    """After each pass that changed the textual IR, print a unified diff of it
    (``--print-ir-after-change``)."""

    def __init__(self, stream=None, context: int = 3):
        self.stream, self.context = stream, context

    def after(self, pass_, graph, result, seconds):
        import difflib

        before, after = graph.text(), result.text()
        if before == after:
            return
        diff = difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            f"before {pass_}",
            f"after {pass_}",
            n=self.context,
        )
        out = self.stream or _stderr()
        out.write(_header(f"After {pass_} (changed)") + "".join(diff))
        out.flush()


class Timing(Instrumentation):
    """Wall time per pass; ``report()`` formats it (``kaun-ir opt --timing``)."""

    def __init__(self):
        self.times: list[tuple[str, float]] = []

    def after(self, pass_, graph, result, seconds):
        self.times.append((str(pass_), seconds))

    def report(self) -> str:
        total = sum(s for _, s in self.times)
        lines = [
            _rule("Execution time report"),
            f"  Total Execution Time: {total:.4f} seconds",
            "",
            "  ----Wall Time----  ----Name----",
        ]
        for name, seconds in self.times + [("Total", total)]:
            share = 100.0 * seconds / total if total > 0 else 100.0
            lines.append(f"  {seconds:8.4f} ({share:5.1f}%)  {name}")
        return "\n".join(lines) + "\n"


@dataclass
class PassStatistics:
    """What :class:`Statistics` records about one pass run."""

    name: str
    nodes_before: int
    nodes_after: int
    ops_added: dict[str, int]
    ops_removed: dict[str, int]
    counters: dict[str, int | float]


class Statistics(Instrumentation):
    """Per pass: node counts before/after, ops added/removed per op name, the pass's own counters.

    ``records`` is a list of :class:`PassStatistics`; ``report()`` formats it (``--stats``).
    """

    def __init__(self):
        self.records: list[PassStatistics] = []
        self._before: dict[str, int] = {}

    def before(self, pass_, graph):
        self._before = graph.op_counts()

    def after(self, pass_, graph, result, seconds):
        before, after = self._before, result.op_counts()
        added = {op: after.get(op, 0) - before.get(op, 0) for op in sorted(set(after) | set(before))}
        self.records.append(
            PassStatistics(
                str(pass_),
                sum(before.values()),
                sum(after.values()),
                {op: n for op, n in added.items() if n > 0},
                {op: -n for op, n in added.items() if n < 0},
                dict(pass_.counters),
            )
        )

    def report(self) -> str:
        lines = [_rule("Pass statistics report")]
        for rec in self.records:
            lines.append(f"{rec.name}")
            lines.append(
                f"  nodes: {rec.nodes_before} -> {rec.nodes_after} ({rec.nodes_after - rec.nodes_before:+d})"
            )
            for op, n in rec.ops_added.items():
                lines.append(f"  +{n} {op}")
            for op, n in rec.ops_removed.items():
                lines.append(f"  -{n} {op}")
            for counter, n in rec.counters.items():
                lines.append(f"  {n} {counter}")
        return "\n".join(lines) + "\n"


def _rule(title: str) -> str:
    bar = "===" + "-" * 72 + "==="
    return f"{bar}\n{('... ' + title + ' ...').center(len(bar)).rstrip()}\n{bar}"


def _stderr():
    import sys

    return sys.stderr


# --- errors -----------------------------------------------------------------------------------


class PassCrash(KaunError):
    """A pass raised an unexpected exception; ``reproducer`` is the ``.kir`` file written for it."""

    def __init__(self, message: str, pass_name: str, index: int, reproducer: str | None):
        super().__init__(message)
        self.pass_name, self.index, self.reproducer = pass_name, index, reproducer


class PassVerificationError(IRError):
    """The IR failed ``Graph.verify()`` after a pass (``verify_each``); names the pass."""

    def __init__(self, message: str, pass_name: str | None, index: int):
        super().__init__(message)
        self.pass_name, self.index = pass_name, index


# --- the manager ------------------------------------------------------------------------------


class PassManager:
    """Runs a :class:`Pipeline` over graphs.

    ``instrumentations``: :class:`Instrumentation` objects whose hooks run around each pass.
    ``verify_each``: verify the input and the result of every pass (``Graph.verify()``); a
    failure raises :class:`PassVerificationError` naming the pass that broke the IR.
    ``stop_after``: run only the first N passes (bisecting a miscompile).
    ``reproducer_dir``: where crash reproducers go (default ``$KAUN_IR_REPRO_DIR`` or the temp
    dir); ``False`` disables them.
    """

    def __init__(
        self,
        pipeline: str | Pipeline,
        instrumentations: Iterable[Instrumentation] = (),
        verify_each: bool = False,
        stop_after: int | None = None,
        reproducer_dir: str | None | bool = None,
    ):
        self.pipeline = Pipeline.parse(pipeline)
        self.instrumentations = list(instrumentations)
        self.verify_each = verify_each
        if stop_after is not None and (not isinstance(stop_after, int) or stop_after < 0):
            raise ValueError(f"stop_after must be a non-negative int, got {stop_after!r}")
        self.stop_after = stop_after
        self.reproducer_dir = reproducer_dir

    def run(self, graph: Graph) -> Graph:
        """The graph after the pipeline; ``graph`` itself is not modified."""
        try:
            if self.verify_each:
                self._verify(graph, None, 0)
            steps = self.pipeline.steps
            if self.stop_after is not None:
                steps = steps[: self.stop_after]
            for index, step in enumerate(steps, start=1):
                graph = self._run_one(graph, index, step)
        finally:
            for inst in self.instrumentations:
                inst.finish()
        return graph

    def _run_one(self, graph: Graph, index: int, step: PassStep) -> Graph:
        info = REGISTRY[step.name]
        run = PassRun(index, step, step.resolved_options())
        for inst in self.instrumentations:
            inst.before(run, graph)
        token = registry.collecting(run.counters)
        start = time.perf_counter()
        try:
            result = info.fn(graph, **run.options)
            if not isinstance(result, Graph):
                raise TypeError(f"a pass must return a Graph, got {type(result).__name__}")
        except KaunError as err:  # a diagnostic about the input (e.g. "cannot differentiate ...")
            err.add_note(f"in pass {run} of pipeline '{self.pipeline}'")
            self._failed(run, graph, err)
            raise
        except Exception as err:  # a crash: a bug in the pass
            self._failed(run, graph, err)
            path = self._write_reproducer(graph, index, err)
            where = f"; reproducer written to {path}" if path else ""
            raise PassCrash(
                f"pass {run} crashed: {type(err).__name__}: {err}{where}", step.name, index, path
            ) from err
        finally:
            registry.stop_collecting(token)
        seconds = time.perf_counter() - start
        if self.verify_each:
            try:
                self._verify(result, run, index)
            except PassVerificationError as err:
                self._failed(run, graph, err)
                raise
        for inst in self.instrumentations:
            inst.after(run, graph, result, seconds)
        return result

    def _failed(self, run: PassRun, graph: Graph, err: BaseException) -> None:
        for inst in self.instrumentations:
            inst.failed(run, graph, err)

    def _verify(self, graph: Graph, run: PassRun | None, index: int) -> None:
        try:
            graph.verify()
        except Exception as err:
            what = f"the IR produced by pass {run}" if run else "the input IR (before any pass)"
            raise PassVerificationError(
                f"{what} is invalid: {err}", run.name if run else None, index
            ) from err

    # -- crash reproducers

    def _write_reproducer(self, graph: Graph, index: int, err: BaseException) -> str | None:
        if self.reproducer_dir is False:
            return None
        remaining = Pipeline(self.pipeline.steps[index - 1 :])
        try:
            text = reproducer_text(graph, remaining, err)
            digest = hashlib.sha256(text.encode()).hexdigest()[:12]
            path = os.path.join(repro_dir(self.reproducer_dir), f"{remaining.steps[0].name}-{digest}.kir")
            atomic_write(path, text)
        except Exception:  # a failing reproducer must not hide the crash itself
            return None
        return path


def reproducer_text(graph: Graph, remaining: Pipeline, err: BaseException) -> str:
    """A ``.kir`` file: a RUN line re-running ``remaining`` on ``graph``, the error, the IR."""
    loads = _modules_to_load(remaining)
    command = ["kaun-ir", "opt", "%s"] + [w for m in loads for w in ("--load", m)] + ["-p", str(remaining)]
    first_line = str(err).splitlines()[0] if str(err) else ""
    return (
        f"// RUN: {' '.join(shlex.quote(w) if w != '%s' else w for w in command)}\n"
        f"// kaun_ir pass crash reproducer: pass {remaining.steps[0].name!r} raised\n"
        f"// {type(err).__name__}: {first_line}\n" + graph.text()
    )


def _modules_to_load(pipeline: Pipeline) -> list[str]:
    """Modules (paths where known) defining passes that are not built in, for ``--load``."""
    import sys

    loads: list[str] = []
    for step in pipeline.steps:
        module_name = getattr(REGISTRY[step.name].fn, "__module__", "") or ""
        if module_name.startswith("kaun_ir.") or module_name == "__main__":
            continue
        module = sys.modules.get(module_name)
        where = getattr(module, "__file__", None) or module_name
        where = os.path.abspath(where) if where.endswith(".py") else where
        if where and where not in loads:
            loads.append(where)
    return loads


# --- loading passes from user modules -----------------------------------------------------------


def load_module(spec: str):
    """Import ``spec`` — a module name (``mypkg.passes``) or a path to a ``.py`` file — so the
    passes it registers become available. Returns the module."""
    import importlib.util
    import sys

    if spec.endswith(".py") or os.sep in spec or (os.altsep and os.altsep in spec):
        path = os.path.abspath(spec)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"--load: no such file: {spec}")
        name = os.path.splitext(os.path.basename(path))[0]
        existing = sys.modules.get(name)
        if existing is not None and os.path.abspath(getattr(existing, "__file__", "") or "") == path:
            return existing
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # so the passes' __module__ resolves (reproducers, pickling)
        try:
            module_spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module
    return importlib.import_module(spec)


def run(
    graph: Graph,
    pipeline: str | Pipeline,
    instrumentations: Sequence[Instrumentation] = (),
    verify_each: bool = False,
    stop_after: int | None = None,
) -> Graph:
    """Run ``pipeline`` over ``graph`` (see :class:`PassManager`); the input is not modified."""
    if not isinstance(graph, Graph):
        raise TypeError(f"kn.passes.run: expected a kn.Graph, got {type(graph).__name__}")
    return PassManager(pipeline, instrumentations, verify_each=verify_each, stop_after=stop_after).run(graph)
