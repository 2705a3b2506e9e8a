"""Where compilation time goes: an opt-in recorder of the stages of each compilation.

    from kaun_ir.runtime import stages

    with stages.record() as rec:
        train.step(trainer, st, x, y)          # the first call traces, optimises, lowers, compiles
    for name, seconds, nodes in rec.stages:
        print(f"{name:24s} {seconds:7.3f} s  {nodes or '':>7}")

Stages are named ``trace``, ``pass:<name>`` (one per pass of the pipeline), ``lower`` and
``xla-compile`` (or ``xla-load`` when the persistent cache answered); ``nodes`` is the size of the
graph the stage produced (None for the XLA stages). Nothing is recorded, and nothing costs more
than a thread-local lookup, outside ``record()``. Nested compilations (a ``kn.jit`` called while
another function compiles) are recorded too, in the order they finish.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

from kaun_ir.passes import Instrumentation

_LOCAL = threading.local()


@dataclass
class Recording:
    """The stages of the compilations that ran inside one :func:`record` block."""

    #: ``(stage name, seconds, nodes after the stage or None)`` in the order they ended
    stages: list[tuple[str, float, int | None]] = field(default_factory=list)

    def total(self, prefix: str = "") -> float:
        """Seconds of the stages whose names start with ``prefix`` (all stages by default)."""
        return sum(seconds for name, seconds, _ in self.stages if name.startswith(prefix))

    def by_name(self) -> dict[str, float]:
        """Seconds per stage name, summed over repeated stages."""
        out: dict[str, float] = {}
        for name, seconds, _ in self.stages:
            out[name] = out.get(name, 0.0) + seconds
        return out


def current() -> Recording | None:
    """The recording of the innermost active :func:`record` block of this thread, if any."""
    return getattr(_LOCAL, "recording", None)


@contextlib.contextmanager
def record():
    """Record the compilation stages that run in this thread inside the block."""
    outer = current()
    recording = Recording()
    _LOCAL.recording = recording
    try:
        yield recording
    finally:
        _LOCAL.recording = outer
        if outer is not None:
            outer.stages.extend(recording.stages)


@contextlib.contextmanager
def stage(name: str):
    """Time the block as stage ``name`` when recording. Yields a one-element list the block may
    set to the number of nodes it produced."""
    recording = current()
    nodes: list = [None]
    if recording is None:
        yield nodes
        return
    start = time.perf_counter()
    try:
        yield nodes
    finally:
        recording.stages.append((name, time.perf_counter() - start, nodes[0]))


def add(name: str, seconds: float, nodes: int | None = None) -> None:
    """Record a stage timed elsewhere (the pass manager times its passes itself)."""
    recording = current()
    if recording is not None:
        recording.stages.append((name, seconds, nodes))


def pass_instrumentations() -> list:
    """``[instrumentation]`` recording each pass as a stage when recording, else ``[]``."""
    if current() is None:
        return []

    class _PassStages(Instrumentation):
        def after(self, pass_, graph, result, seconds):
            add(f"pass:{pass_}", seconds, len(result.nodes))

    return [_PassStages()]
