"""The run-time side of ``kn.debug.check_finite`` and of ``KAUN_IR_CHECK_FINITE=1``.

When checking is on, :class:`~kaun_ir.runtime.Executable` compiles the graph with one extra
output, "every floating-point output is finite" (``check_finite.probe_outputs``), and reads it
after each call. Only when it is false does it compile (once) and run the fully instrumented
graph (the ``check-finite`` pass) on the same arguments, to raise
:class:`kaun_ir.NonFiniteError` naming the first op that produced a NaN or an Inf. The common,
finite case costs one reduction per output and one synchronisation. Checked executables donate
no buffers, so that the arguments are still there for the second run.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
from collections.abc import Callable

import numpy as np

from kaun_ir.errors import NonFiniteError
from kaun_ir.passes.check_finite import instrument, probe_outputs

#: set to 1 to check every compiled program of the process (off by default: it costs time)
ENV = "KAUN_IR_CHECK_FINITE"
_FORCED: contextvars.ContextVar = contextvars.ContextVar("kaun_ir_check_finite", default=None)


def enabled() -> bool:
    """Whether executables compiled now are checked (``KAUN_IR_CHECK_FINITE`` or :func:`forced`)."""
    forced_value = _FORCED.get()
    if forced_value is not None:
        return forced_value
    return os.environ.get(ENV, "").strip().lower() not in ("", "0", "false", "no")


@contextlib.contextmanager
def forced(on: bool = True):
    """Within the block, executables compiled are checked (``on=True``) or not, whatever the env."""
    token = _FORCED.set(bool(on))
    try:
        yield
    finally:
        _FORCED.reset(token)


def checked_graph(graph):
    """The graph an Executable compiles when checking: ``graph`` plus the all-finite flag."""
    return probe_outputs(graph)


def checked_run(run: Callable, graph, build: Callable) -> Callable:
    """``run`` (of :func:`checked_graph`) that drops the flag output; when it is false, locates
    the culprit with the instrumented graph, compiled by ``build(graph) -> run``, and raises."""
    located: list = []

    def checked(arrays):
        outs = run(arrays)
        if bool(np.asarray(outs[-1])):
            return outs[:-1]
        if not located:
            full, sites = instrument(graph)
            located.append((build(full), sites))
        full_run, sites = located[0]
        outs = full_run(arrays)
        index = int(np.asarray(outs[-2]))
        bad = [
            k
            for k, v in enumerate(outs[:-2])
            if np.asarray(v).dtype.kind == "f" and not np.isfinite(np.asarray(v)).all()
        ]
        if index < 0:
            raise NonFiniteError(
                f"output(s) {bad} of @{graph.name} are not finite, but the instrumented "
                "run found no op that made a NaN or Inf (a nondeterministic computation?)"
            )
        probe = float(np.asarray(outs[-1]))
        kind = "NaN" if math.isnan(probe) else "Inf"
        raise NonFiniteError(
            f"{kind} first produced by {sites[index].describe()} (while running @{graph.name})"
        )

    return checked
