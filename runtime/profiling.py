"""``kn.profile``: a profile of what ran on the device, with the kernels named by the layer paths
of the model, and a per-layer time table.

jaxlib's profiler records the kernels of every XLA executable that runs, named by their HLO
instruction (``fusion.3``). kaun_ir's lowering gives every op a ``loc`` holding its layer path
(``2.linear/dot_general``), which XLA keeps as each instruction's ``metadata.op_name``; after the
trace stops, :func:`profile` reads the optimised HLO of the live executables to map each kernel
to that name, writes a copy of the trace whose kernel rows are named by it, and sums the kernel
time per layer.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from kaun_ir.errors import ProfilerError
from kaun_ir.fileio import atomic_write
from kaun_ir.runtime.executable import live_executables
from kaun_ir.runtime.xla import profiler

__all__ = ["profile", "Profile", "layer_of", "hlo_op_names"]

_MODULE = re.compile(r"^HloModule\s+([\w.\-]+)", re.MULTILINE)
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?metadata=\{[^}]*op_name=\"([^\"]*)\"", re.MULTILINE
)


def hlo_op_names(hlo_text: str) -> tuple[str, dict[str, str]]:
    """The module name of an HLO text and ``{instruction: metadata op_name}``."""
    module = _MODULE.search(hlo_text)
    return (module.group(1) if module else ""), dict(_INSTRUCTION.findall(hlo_text))


def layer_of(op_name: str) -> str:
    """The layer path of an op name: ``"2.linear/dot_general"`` -> ``"2.linear"`` (an op outside
    any layer is named by itself)."""
    return op_name.rsplit("/", 1)[0] if "/" in op_name else op_name


#: the row of kernels whose HLO instruction carries no layer path (copies XLA added, say)
NO_LAYER = "(no layer path)"


@dataclass
class Profile:
    """What :func:`profile` recorded: ``logdir``, ``trace`` (the trace-event file with kernel
    rows named by layer paths, which Perfetto opens; None until the profile ends), ``raw_trace``
    (the profiler's own file; TensorBoard's profiler plugin reads ``logdir`` too), ``steps`` (how
    many steps the figures cover), ``executions`` (``{HLO module: times it ran}`` inside the
    window) and ``layers``: rows ``{"layer", "kernels", "ms", "percent", "kernels_per_step",
    "ms_per_step"}`` sorted by time. Kernels without a layer path form the row
    ``"(no layer path)"``.

    ``steps`` may be set inside the ``with`` block (``prof.steps = 5``); left at None, it
    becomes the number of times the executable with the most kernel time ran. ``span`` names the
    steps for the table's heading (``train.fit`` sets ``"steps 3-5"``)."""

    logdir: str
    trace: str | None = None
    raw_trace: str | None = None
    layers: list[dict] = field(default_factory=list)
    steps: int | None = None
    span: str = ""
    executions: dict[str, int] = field(default_factory=dict)

    def heading(self) -> str:
        """The table's first line: how many steps the figures cover, and what ran."""
        steps = self.steps or 1
        span = f" ({self.span})" if self.span else ""
        ran = ", ".join(f"{module} x{count}" for module, count in sorted(self.executions.items()))
        ran = f"; ran {ran}" if ran else ""
        return f"kn.profile: per step, over {steps} step{'s' if steps != 1 else ''}{span}{ran}"

    def table(self, limit: int = 20) -> str:
        """The per-layer table as text (the ``limit`` slowest layers), per step."""
        if not self.layers:
            return "kn.profile: no kernels were recorded"
        width = max(12, *(len(row["layer"]) for row in self.layers[:limit]))
        lines = [self.heading(), f"{'layer':<{width}}  {'kernels':>7}  {'ms':>9}  {'%':>5}"]
        for row in self.layers[:limit]:
            kernels = row["kernels_per_step"]
            count = f"{kernels:.0f}" if float(kernels).is_integer() else f"{kernels:.1f}"
            lines.append(
                f"{row['layer']:<{width}}  {count:>7}  {row['ms_per_step']:>9.3f}  {row['percent']:>5.1f}"
            )
        if len(self.layers) > limit:
            lines.append(f"... {len(self.layers) - limit} more layers")
        return "\n".join(lines)


def _kernel_names() -> dict[tuple[str, str], str]:
    names: dict[tuple[str, str], str] = {}
    for exe in live_executables():
        try:
            module, ops = hlo_op_names(exe.hlo_text())
        except Exception:  # noqa: BLE001, S112 - an executable without HLO text names nothing
            continue
        for op, op_name in ops.items():
            names[(module, op)] = op_name
    return names


@dataclass
class _Tally:
    """Kernels and milliseconds per layer, and the executions (run ids) and time per module."""

    layers: dict[str, list] = field(default_factory=dict)
    runs: dict[str, set] = field(default_factory=dict)
    module_ms: dict[str, float] = field(default_factory=dict)

    def add(self, layer: str, module: str, run_id: object, ms: float) -> None:
        row = self.layers.setdefault(layer, [0, 0.0])
        row[0] += 1
        row[1] += ms
        self.runs.setdefault(module, set()).add(run_id)
        self.module_ms[module] = self.module_ms.get(module, 0.0) + ms


def _rename(raw: str, out: str) -> _Tally:
    """Write ``out``: the trace ``raw`` with kernel rows named by layer paths; returns the tally
    of its kernels."""
    with gzip.open(raw, "rt", encoding="utf-8") as handle:
        trace = json.load(handle)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = _kernel_names()
    tally = _Tally()
    for event in events:
        args = event.get("args") or {}
        if event.get("ph") != "X" or "hlo_op" not in args:
            continue
        module = args.get("hlo_module", "")
        op_name = names.get((module, args["hlo_op"]))
        if op_name:
            event["name"] = f"{op_name} ({args['hlo_op']})"
            args["kaun_ir.op_name"] = op_name
        ms = float(event.get("dur", 0.0)) / 1000.0  # microseconds -> ms
        tally.add(layer_of(op_name) if op_name else NO_LAYER, module, args.get("run_id"), ms)
    atomic_write(out, gzip.compress(json.dumps(trace).encode()))
    return tally


def _fill(result: Profile, tally: _Tally) -> None:
    """Set ``result``'s executions, steps (when the caller left them unset) and per-step rows."""
    result.executions = {module: len(ids) for module, ids in tally.runs.items()}
    if result.steps is None:
        busiest = max(tally.module_ms, key=tally.module_ms.get, default=None)
        result.steps = result.executions.get(busiest, 1) if busiest is not None else 1
    steps = max(result.steps, 1)
    total = sum(ms for _, ms in tally.layers.values()) or 1.0
    rows = [
        {
            "layer": name,
            "kernels": count,
            "ms": ms,
            "percent": 100.0 * ms / total,
            "kernels_per_step": count / steps,
            "ms_per_step": ms / steps,
        }
        for name, (count, ms) in tally.layers.items()
    ]
    result.layers = sorted(rows, key=lambda row: -row["ms"])


@contextlib.contextmanager
def profile(
    logdir: str | os.PathLike, print_table: bool = True, steps: int | None = None
) -> Iterator[Profile]:
    """Record a profile of what runs inside the ``with`` block into ``logdir``::

        with kn.profile("runs/profile", steps=5) as prof:
            for _ in range(5):
                loss, st = train.step(trainer, st, x, y)
        print(prof.trace)                   # open it in https://ui.perfetto.dev

    The window holds exactly the work of the block: the device finishes what was queued before
    the block ran before the trace starts, and finishes the block's own work before it stops,
    so no earlier step leaks in and no step of the block is cut off (compiling records no
    kernels). Writes jaxlib's trace under ``logdir/plugins/profile/`` (``tensorboard --logdir
    LOGDIR`` shows it in the profiler tab) and ``logdir/kaun_ir.trace.json.gz``, the same trace
    with every kernel row named by the layer path of the op it computes (``"2.linear/dot_general
    (fusion.3)"``), and prints the per-layer table per step (``print_table=False`` keeps quiet;
    :meth:`Profile.table` returns it). ``steps``: how many steps the block runs (the table
    divides by it); by default the number of times the busiest executable ran.
    """
    if not isinstance(logdir, str | os.PathLike):
        raise TypeError(f"kn.profile: logdir must be a directory path (str or os.PathLike), got {logdir!r}")
    if not isinstance(print_table, bool):
        raise TypeError(f"kn.profile: print_table must be True or False, got {print_table!r}")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValueError(f"kn.profile: steps must be a positive int (steps the block runs), got {steps!r}")
    logdir = os.fspath(logdir)
    if os.path.exists(logdir) and not os.path.isdir(logdir):
        raise NotADirectoryError(f"kn.profile: logdir {logdir!r} exists and is not a directory")
    os.makedirs(logdir, exist_ok=True)
    result = Profile(logdir, steps=steps)
    before = set(profiler.trace_files(logdir))
    profiler.wait_for_device()  # work queued before the block stays out of the trace
    try:
        profiler.start(logdir)
    except RuntimeError as err:  # jaxlib's: one profile at a time
        raise ProfilerError(f"kn.profile({logdir!r}): cannot start the profiler: {err}") from None
    try:
        yield result
    finally:
        profiler.wait_for_device()  # the block's last step finishes inside the trace
        profiler.stop()
        new = [path for path in profiler.trace_files(logdir) if path not in before]
        if new:
            result.raw_trace = new[-1]
            result.trace = os.path.join(logdir, "kaun_ir.trace.json.gz")
            _fill(result, _rename(result.raw_trace, result.trace))
            if print_table:
                print(result.table())
