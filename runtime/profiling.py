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


@dataclass
class Profile:
    """What :func:`profile` recorded: ``logdir``, ``trace`` (the trace-event file with kernel
    rows named by layer paths, which Perfetto opens; None until the profile ends), ``raw_trace``
    (the profiler's own file; TensorBoard's profiler plugin reads ``logdir`` too) and ``layers``:
    rows ``{"layer", "kernels", "ms", "percent"}`` sorted by time, over the kernels whose
    instruction carries a layer path."""

    logdir: str
    trace: str | None = None
    raw_trace: str | None = None
    layers: list[dict] = field(default_factory=list)

    def table(self, limit: int = 20) -> str:
        """The per-layer time table as text (the ``limit`` slowest layers)."""
        if not self.layers:
            return "kn.profile: no kernels with layer paths were recorded"
        width = max(12, *(len(row["layer"]) for row in self.layers[:limit]))
        lines = [f"{'layer':<{width}}  {'kernels':>7}  {'ms':>9}  {'%':>5}"]
        for row in self.layers[:limit]:
            lines.append(
                f"{row['layer']:<{width}}  {row['kernels']:>7}  {row['ms']:>9.3f}  {row['percent']:>5.1f}"
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


def _rename(raw: str, out: str) -> list[dict]:
    """Write ``out``: the trace ``raw`` with kernel rows named by layer paths; returns the
    per-layer table."""
    with gzip.open(raw, "rt", encoding="utf-8") as handle:
        trace = json.load(handle)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = _kernel_names()
    totals: dict[str, list] = {}
    for event in events:
        args = event.get("args") or {}
        if event.get("ph") != "X" or "hlo_op" not in args:
            continue
        op_name = names.get((args.get("hlo_module", ""), args["hlo_op"]))
        if not op_name:
            continue
        event["name"] = f"{op_name} ({args['hlo_op']})"
        args["kaun_ir.op_name"] = op_name
        row = totals.setdefault(layer_of(op_name), [0, 0.0])
        row[0] += 1
        row[1] += float(event.get("dur", 0.0)) / 1000.0  # microseconds -> ms
    atomic_write(out, gzip.compress(json.dumps(trace).encode()))
    total = sum(ms for _, ms in totals.values()) or 1.0
    rows = [
        {"layer": name, "kernels": count, "ms": ms, "percent": 100.0 * ms / total}
        for name, (count, ms) in totals.items()
    ]
    return sorted(rows, key=lambda row: -row["ms"])


@contextlib.contextmanager
def profile(logdir: str | os.PathLike, print_table: bool = True) -> Iterator[Profile]:
    """Record a profile of what runs inside the ``with`` block into ``logdir``::

        with kn.profile("runs/profile") as prof:
            for _ in range(5):
                loss, st = train.step(trainer, st, x, y)
            float(loss)                     # wait for the device before the trace stops
        print(prof.trace)                   # open it in https://ui.perfetto.dev

    Writes jaxlib's trace under ``logdir/plugins/profile/`` (``tensorboard --logdir LOGDIR``
    shows it in the profiler tab) and ``logdir/kaun_ir.trace.json.gz``, the same trace with
    every kernel row named by the layer path of the op it computes (``"2.linear/dot_general
    (fusion.3)"``), and prints the per-layer time table (``print_table=False`` keeps quiet;
    :meth:`Profile.table` returns it). The work must finish inside the block: results read
    after it are not in the trace.
    """
    if not isinstance(logdir, str | os.PathLike):
        raise TypeError(f"kn.profile: logdir must be a directory path (str or os.PathLike), got {logdir!r}")
    if not isinstance(print_table, bool):
        raise TypeError(f"kn.profile: print_table must be True or False, got {print_table!r}")
    logdir = os.fspath(logdir)
    if os.path.exists(logdir) and not os.path.isdir(logdir):
        raise NotADirectoryError(f"kn.profile: logdir {logdir!r} exists and is not a directory")
    os.makedirs(logdir, exist_ok=True)
    result = Profile(logdir)
    before = set(profiler.trace_files(logdir))
    try:
        profiler.start(logdir)
    except RuntimeError as err:  # jaxlib's: one profile at a time
        raise ProfilerError(f"kn.profile({logdir!r}): cannot start the profiler: {err}") from None
    try:
        yield result
    finally:
        profiler.stop()
        new = [path for path in profiler.trace_files(logdir) if path not in before]
        if new:
            result.raw_trace = new[-1]
            result.trace = os.path.join(logdir, "kaun_ir.trace.json.gz")
            result.layers = _rename(result.raw_trace, result.trace)
            if print_table:
                print(result.table())
