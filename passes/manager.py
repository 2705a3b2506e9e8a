"""The pass manager: runs a pipeline over a graph with instrumentation, verification, reproducers.

Shaped after MLIR's and LLVM's pass managers (see docs/passes.md): :class:`PassManager` runs a
:class:`~kaun_ir.passes.pipeline.Pipeline`, calling the
:class:`~kaun_ir.passes.instrumentation.Instrumentation` hooks before and after each pass,
optionally verifying after each pass and stopping after the N-th. When a pass crashes (raises
anything but a :class:`kaun_ir.errors.KaunError` diagnostic), its input IR and the rest of the
pipeline are written to a ``.kir`` reproducer and a :class:`PassCrash` names the pass and the file.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
import time
from collections.abc import Iterable, Sequence
from typing import NoReturn

from kaun_ir.errors import InternalError, KaunError, PassCrash, PassVerificationError
from kaun_ir.fileio import atomic_write, repro_dir
from kaun_ir.ir.core import Graph
from kaun_ir.passes import registry
from kaun_ir.passes.instrumentation import Instrumentation, PassRun
from kaun_ir.passes.pipeline import PassStep, Pipeline
from kaun_ir.passes.registry import REGISTRY

#: Environment variable turning on verification after every pass wherever ``verify_each`` is not
#: given (``kn.jit``, ``kn.train``, ``kn.passes.run``, ``kaun-ir opt``): ``1`` on, ``0`` or unset off.
VERIFY_EACH_ENV = "KAUN_IR_VERIFY_EACH"


def verify_each_default() -> bool:
    """Whether ``$KAUN_IR_VERIFY_EACH`` asks to verify after every pass (read at each call)."""
    value = os.environ.get(VERIFY_EACH_ENV, "").strip().lower()
    if value in ("", "0", "false"):
        return False
    if value in ("1", "true"):
        return True
    raise ValueError(f"{VERIFY_EACH_ENV}={value!r}: expected 1 (verify after every pass) or 0")


# --- the manager ------------------------------------------------------------------------------


class PassManager:
    """Runs a :class:`Pipeline` over graphs.

    ``instrumentations``: :class:`Instrumentation` objects whose hooks run around each pass.
    ``verify_each``: verify the input and the result of every pass (``Graph.verify()``); a
    failure raises :class:`PassVerificationError` naming the pass that broke the IR. None (the
    default): on when ``$KAUN_IR_VERIFY_EACH`` is ``1`` (the test suite turns it on).
    ``stop_after``: run only the first N passes (bisecting a miscompile).
    ``reproducer_dir``: where crash reproducers go (default ``$KAUN_IR_REPRO_DIR`` or the temp
    dir); ``False`` disables them.
    """

    def __init__(
        self,
        pipeline: str | Pipeline,
        instrumentations: Iterable[Instrumentation] = (),
        verify_each: bool | None = None,
        stop_after: int | None = None,
        reproducer_dir: str | None | bool = None,
    ):
        self.pipeline = Pipeline.parse(pipeline)
        self.instrumentations = list(instrumentations)
        self.verify_each = verify_each_default() if verify_each is None else bool(verify_each)
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
        except InternalError as err:  # a KaunError, yet a bug in kaun_ir: a crash
            self._crash(run, graph, index, err)
        except KaunError as err:  # a diagnostic about the input (e.g. "cannot differentiate ...")
            err.add_note(f"in pass {run} of pipeline '{self.pipeline}'")
            self._failed(run, graph, err)
            raise
        except Exception as err:  # a crash: a bug in the pass
            self._crash(run, graph, index, err)
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

    def _crash(self, run: PassRun, graph: Graph, index: int, err: Exception) -> NoReturn:
        """A pass hit a bug: write its input to a reproducer and raise :class:`PassCrash`."""
        self._failed(run, graph, err)
        path = self._write_reproducer(graph, index, err)
        where = f"; reproducer written to {path}" if path else ""
        raise PassCrash(
            f"pass {run} crashed: {type(err).__name__}: {err}{where}", run.step.name, index, path
        ) from err

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


def run(
    graph: Graph,
    pipeline: str | Pipeline,
    instrumentations: Sequence[Instrumentation] = (),
    verify_each: bool | None = None,
    stop_after: int | None = None,
) -> Graph:
    """Run ``pipeline`` over ``graph`` (see :class:`PassManager`); the input is not modified."""
    if not isinstance(graph, Graph):
        raise TypeError(f"kn.passes.run: expected a kn.Graph, got {type(graph).__name__}")
    return PassManager(pipeline, instrumentations, verify_each=verify_each, stop_after=stop_after).run(graph)
