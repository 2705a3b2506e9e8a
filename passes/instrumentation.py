"""Pass instrumentation: hooks the pass manager calls around every pass.

:class:`Instrumentation` is the base class; the built-in ones print the IR after every pass
(:class:`PrintAfterAll`) or after those that changed it (:class:`PrintAfterChange`), time each
pass (:class:`Timing`) and count what each pass added and removed (:class:`Statistics`). These
are what ``kaun-ir opt --print-ir-after-all / --print-ir-after-change / --timing / --stats`` use.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass, field
from typing import Any

from kaun_ir.ir.core import Graph
from kaun_ir.passes.pipeline import PassStep


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
        """Print the IR the pass produced, under a header naming the pass."""
        out = self.stream or _stderr()
        out.write(_header(f"After {pass_}") + result.text())
        out.flush()


class PrintAfterChange(Instrumentation):
    """After each pass that changed the textual IR, print a unified diff of it
    (``--print-ir-after-change``)."""

    def __init__(self, stream=None, context: int = 3):
        self.stream, self.context = stream, context

    def after(self, pass_, graph, result, seconds):
        """Print a unified diff of the IR before and after the pass, if the pass changed it."""
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
        """Record the pass's wall time."""
        self.times.append((str(pass_), seconds))

    def report(self) -> str:
        """The wall time of each pass and the total, as a table (like MLIR's ``-mlir-timing``)."""
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
        """Remember the op counts of the graph the pass receives."""
        self._before = graph.op_counts()

    def after(self, pass_, graph, result, seconds):
        """Record the node counts before and after the pass, the ops it added or removed and its
        counters."""
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
        """Every recorded pass with its node counts, op changes and counters, as text."""
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
    return sys.stderr
