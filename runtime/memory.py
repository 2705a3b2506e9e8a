"""Memory explained: live bytes over a compiled program's schedule, and what the peak holds.

Read from what XLA reports about a compiled executable: its optimised, *scheduled* HLO (the
entry computation's instructions are listed in the order they run) and its compiled memory
statistics (``argument``, ``output``, ``temp``, ``alias`` bytes of the buffer assignment).

The timeline replays the schedule: every instruction's result is a buffer from the instruction
that defines it to its last use (``get-tuple-element``, ``bitcast``, ``tuple`` and ``while``
results are views of their operands, not new buffers; constants live in XLA's constant
allocations and are left out); entry parameters (the arguments) are live throughout; a result
that XLA writes in place into a donated argument (``input_output_alias``) takes no new bytes.
Every buffer carries the ``op_name`` metadata kaun_ir's lowering writes (the layer path and the
op, ``"2.linear/dot_general"``), so the buffers live at the peak group by layer.

This is a replay of XLA's schedule, not of its heap simulation: XLA may also reuse an operand's
buffer for a fusion's result (in-place element-wise updates) and packs buffers with offsets in
one temporary allocation, so the replayed peak is an upper estimate of the live bytes at that
point, and XLA's ``temp`` (the size of the allocation the heap simulation packed everything
into) bounds the temporaries it can hold. :class:`MemoryReport` keeps both: the replay for *what*
is live, XLA's statistics for *how much* is allocated.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field

from kaun_ir.runtime.collectives import _shape_bytes
from kaun_ir.runtime.memory_advice import advice
from kaun_ir.runtime.memory_fusion import _CALLS, _INSTR, _OP_NAME, fusion_layers, label, layer_of

__all__ = ["Buffer", "MemoryReport", "analyse", "KINDS", "fusion_layers", "layer_of"]

#: the kinds of bytes a report sorts the peak into
KINDS = (
    "parameters",
    "optimiser state",
    "layer state",
    "inputs",
    "activations saved for backward",
    "temporaries",
)

_SUBCOMP = re.compile(r"(?:calls|to_apply|body|condition|branch_computations)=\{?[^,}]*\}?")
_OPERAND = re.compile(r"%([\w.\-]+)")
_PARAM = re.compile(r"parameter\((\d+)\)")
_ALIAS = re.compile(r"\{(\d*)\}:\s*\((\d+),")
_NOT_LAYERS = ("loss", "optimizer", "rng", "(other)")
_VIEWS = ("get-tuple-element", "bitcast", "tuple", "while", "opt-barrier")


@dataclass
class Buffer:
    """One buffer of the replayed schedule: the instruction defining it, its bytes, its live
    range (``start``/``end`` positions in the schedule), its ``op_name`` and ``kind``."""

    name: str
    bytes: int
    start: int
    end: int
    op_name: str
    kind: str = "temporaries"
    parameter: int | None = None
    #: the top-level layers whose ops a fusion computing this buffer holds (empty: not a fusion)
    fused: tuple = ()


@dataclass
class MemoryReport:
    """What :func:`analyse` found: ``stats`` (XLA's compiled memory statistics), ``timeline``
    (live bytes after every scheduled instruction, arguments included), ``peak_bytes`` and
    ``peak_position`` of the replay, ``peak`` (``[(layer, kind, bytes)]`` live at the peak, largest
    first), ``by_kind`` (bytes per kind at the peak) and ``remat`` (``[(policy, stats, peak)]``
    of the rematerialisation policies measured by compiling them, filled in by
    ``kn.memory_report``)."""

    stats: dict
    timeline: list
    peak_bytes: int
    peak_position: int
    peak_instruction: str
    peak: list
    by_kind: dict
    buffers: list = field(repr=False, default_factory=list)
    remat: list = field(default_factory=list)
    #: a training step (``analyse`` was told where its loss is): the advice speaks of a backward pass
    training: bool = False

    def text(self, rows: int = 12) -> str:
        """The report as a table (MiB), as ``kaun-ir memory`` prints it, with at most ``rows``
        layer rows (an int >= 0)."""
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise ValueError(f"MemoryReport.text: rows must be an int >= 0, got {rows!r}")
        mib = 1 << 20
        s = self.stats
        lines = [
            "XLA's buffer assignment: arguments {:.2f} MiB, outputs {:.2f} MiB (aliasing arguments: "
            "{:.2f}), temporaries {:.2f} MiB, total {:.2f} MiB".format(
                s["argument"] / mib,
                s["output"] / mib,
                s["alias"] / mib,
                s["temp"] / mib,
                s["total_bytes"] / mib,
            ),
            f"schedule: {len(self.timeline)} instructions; peak {self.peak_bytes / mib:.2f} MiB live after "
            f"instruction {self.peak_position} ({self.peak_instruction})",
            "",
            "at the peak, by kind:",
        ]
        for kind in KINDS:
            if self.by_kind.get(kind):
                lines.append(f"  {kind:<32} {self.by_kind[kind] / mib:10.3f} MiB")
        width = max([28] + [len(layer) for layer, _, _ in self.peak[:rows]])
        lines += ["", "at the peak, by layer:", f"  {'layer':<{width}} {'kind':<32} {'MiB':>10}"]
        for layer, kind, size in self.peak[:rows]:
            lines.append(f"  {layer:<{width}} {kind:<32} {size / mib:10.3f}")
        if len(self.peak) > rows:
            rest = sum(size for _, _, size in self.peak[rows:])
            lines.append(f"  {'(' + str(len(self.peak) - rows) + ' more)':<{width + 33}} {rest / mib:10.3f}")
        if self.remat:
            lines += ["", "rematerialisation, measured by compiling each policy:"]
            lines.append(
                f"  {'remat=':<12} {'temporaries MiB':>16} {'vs now':>8} "
                f"{'replayed peak MiB':>18} {'vs now':>8}"
            )
            lines.append(
                f"  {'none':<12} {s['temp'] / mib:16.2f} {1:8.2f} {self.peak_bytes / mib:18.2f} {1:8.2f}"
            )
            for policy, stats, peak in self.remat:
                lines.append(
                    f"  {policy!r:<12} {stats['temp'] / mib:16.2f} {stats['temp'] / max(s['temp'], 1):8.2f} "
                    f"{peak / mib:18.2f} {peak / max(self.peak_bytes, 1):8.2f}"
                )
        lines += ["", "advice:"]
        lines += [
            textwrap.fill(
                sentence, 100, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False
            )
            for sentence in self.advice()
        ]
        return "\n".join(lines)

    def advice(self) -> list[str]:
        """What to try, in words: what the peak is made of, and whether rematerialisation helps
        (from the measured ``remat`` rows) or why it cannot."""
        return advice(self)

    def __str__(self) -> str:
        return self.text()


def _entry(hlo_text: str) -> tuple[str, list[str]]:
    lines = hlo_text.splitlines()
    header = lines[0] if lines else ""
    for i, line in enumerate(lines):
        if line.startswith("ENTRY"):
            body = []
            for inner in lines[i + 1 :]:
                if inner.startswith("}"):
                    break
                body.append(inner)
            return header, body
    raise ValueError("memory report: the HLO text has no ENTRY computation")


def analyse(
    hlo_text: str,
    stats: dict,
    argument_kinds: list | None = None,
    argument_layers: list | None = None,
    loss_output: int | None = None,
) -> MemoryReport:
    """The :class:`MemoryReport` of an executable's optimised HLO text and memory statistics.

    ``argument_kinds[k]`` / ``argument_layers[k]`` name the kind (``"parameters"`` ...) and the
    layer of entry parameter ``k`` (default: ``"inputs"``, ``"(inputs)"``). With
    ``loss_output`` (the index of the loss among the outputs of a training step), a buffer made
    before the instruction that computes the loss and still live after it is an activation
    saved for the backward pass when it is made by a layer's op (not the loss, the optimiser
    or the rng) and read after that instruction; a buffer without ``op_name`` (a copy XLA
    added) is named after the first operand that has one."""
    header, body = _entry(hlo_text)
    buffers, owner, order, root_operands = _buffers(body, argument_kinds, argument_layers)
    fusions = fusion_layers(hlo_text)
    for b in buffers.values():
        b.fused = fusions.get(b.fused[0], ()) if b.fused else ()
    n = len(body)
    loss_at = None
    if loss_output is not None and loss_output < len(root_operands):
        # the forward pass ends where the loss (output ``loss_output``) is computed
        made = [buffers[b].start for b in owner.get(root_operands[loss_output], ())]
        loss_at = max(made) if made else None
    aliased_outputs = _aliased_outputs(header)
    for k, operand in enumerate(root_operands):
        for b in owner.get(operand, ()):
            if buffers[b].parameter is None:
                if k in aliased_outputs:  # written in place into a donated argument's buffer
                    buffers[b].bytes = 0
                buffers[b].end = n
    timeline = _timeline(buffers.values(), n)
    peak_pos = max(range(n), key=timeline.__getitem__) if n else 0
    at_peak = [b for b in buffers.values() if b.bytes and max(b.start, 0) <= peak_pos <= b.end]
    peak, by_kind = _group(at_peak, order, loss_at, fusions)
    return MemoryReport(
        stats=dict(stats),
        timeline=timeline,
        peak_bytes=timeline[peak_pos] if n else 0,
        peak_position=peak_pos,
        peak_instruction=order[peak_pos][0] if order and peak_pos < len(order) else "",
        peak=peak,
        by_kind=by_kind,
        buffers=list(buffers.values()),
        training=loss_output is not None,
    )


def _aliased_outputs(header: str) -> set[int]:
    """The output indices the entry computation's ``input_output_alias`` writes into arguments."""
    if "input_output_alias=" not in header:
        return set()
    aliases = header.split("input_output_alias=", 1)[-1].split("entry_computation_layout")[0]
    return {int(k) for k, _ in _ALIAS.findall(aliases)}


def _buffers(body: list[str], argument_kinds, argument_layers):
    """One walk over the entry computation: ``(buffers, owner, order, root_operands)``, the
    buffers by name with their live ranges, the buffers each value reads (a view reads those
    of its operands), ``(name, op_name)`` per line, and the operands of the root."""
    buffers: dict[str, Buffer] = {}
    owner: dict[str, list[str]] = {}  # a view -> the buffers it reads
    order: list[tuple[str, str]] = []
    root_operands: list[str] = []
    for pos, line in enumerate(body):
        m = _INSTR.match(line)
        if m is None:
            order.append(("", ""))
            continue
        name, op, rest = m.group("name"), m.group("op"), m.group("rest")
        op_match = _OP_NAME.search(rest)
        op_name = op_match.group(1) if op_match else ""
        operands = _OPERAND.findall(_SUBCOMP.sub("", rest.split("metadata=")[0]))
        order.append((name, op_name))
        for operand in operands:  # extend the live ranges of what this reads
            for b in owner.get(operand, ()):
                buffers[b].end = max(buffers[b].end, pos)
        if m.group("root"):
            root_operands = operands if op == "tuple" else [name]
        if op in _VIEWS:
            owner[name] = [b for operand in operands for b in owner.get(operand, ())]
            continue
        if op == "constant":
            owner[name] = []
            continue
        if not op_name:  # a copy or transpose XLA added: named after what it reads
            op_name = next(
                (buffers[b].op_name for o in operands for b in owner.get(o, ()) if buffers[b].op_name), ""
            )
        buf = Buffer(name, _shape_bytes(m.group("shape")), pos, pos, op_name)
        called = _CALLS.search(rest) if op == "fusion" else None
        if called:  # the fused computation's name, resolved to its layers by analyse
            buf.fused = (called.group(1),)
        if op == "parameter":
            k = int(_PARAM.search(line).group(1))
            buf.parameter = k
            buf.kind = argument_kinds[k] if argument_kinds and k < len(argument_kinds) else "inputs"
            buf.op_name = argument_layers[k] if argument_layers and k < len(argument_layers) else "(inputs)"
            buf.start, buf.end = -1, len(body)
        buffers[name] = buf
        owner[name] = [name]
    return buffers, owner, order, root_operands


def _timeline(buffers, n: int) -> list[int]:
    """The live bytes after each of the ``n`` instructions."""
    delta = [0] * (n + 2)
    for b in buffers:
        delta[max(b.start, 0)] += b.bytes
        delta[min(b.end, n) + 1] -= b.bytes
    timeline, live = [], 0
    for pos in range(n):
        live += delta[pos]
        timeline.append(live)
    return timeline


def _group(at_peak: list, order: list, loss_at: int | None, fusions: dict):
    """``(peak, by_kind)``: the bytes live at the peak by (layer, kind), largest first, and by
    kind. Sets each buffer's kind (activations saved for the backward pass: see :func:`analyse`)
    and charges it to a layer (see :func:`label`)."""
    layers_by_index: dict[str, str] = {}
    every = [layer_of(op_name) for _, op_name in order] + [n for f in fusions.values() for n in f]
    for layer in every:
        if layer.split(".")[0].isdigit() and "." in layer:
            layers_by_index.setdefault(layer.split(".")[0], layer)
    groups: dict[tuple[str, str], int] = {}
    by_kind: dict[str, int] = {}
    for b in at_peak:
        if (
            b.parameter is None
            and loss_at is not None
            and b.start < loss_at < b.end
            and layer_of(b.op_name) not in _NOT_LAYERS
        ):
            b.kind = "activations saved for backward"
        layer = label(b, layers_by_index)
        groups[(layer, b.kind)] = groups.get((layer, b.kind), 0) + b.bytes
        by_kind[b.kind] = by_kind.get(b.kind, 0) + b.bytes
    peak = sorted(((layer, kind, size) for (layer, kind), size in groups.items()), key=lambda r: -r[2])
    return peak, by_kind
