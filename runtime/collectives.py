"""Collective operations in XLA's partitioned HLO: how many, and how many bytes each moves.

Read from the optimised HLO text of a compiled executable (``Executable.hlo_text()``). The
bytes of a collective are those of its result on one device (all-reduce: the reduced buffer;
all-gather: the gathered buffer; reduce-scatter: the scattered piece), a common first-order
measure of traffic per device. A collective inside a loop body is counted once.
"""

from __future__ import annotations

import math
import numbers
import re
from typing import Any

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
_LINE = re.compile(r"=\s*(?P<shape>\(.*?\)|\S+)\s+(?P<op>" + "|".join(KINDS) + r")(?:-start)?\(")
_ARRAY = re.compile(r"(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\]")


def _shape_bytes(text: str) -> int:
    total = 0
    for match in _ARRAY.finditer(text):
        size = _BYTES.get(match.group("dtype"))
        if size is None:
            continue
        for dim in filter(None, match.group("dims").split(",")):
            size *= int(dim)
        total += size
    return total


def collective_stats(hlo_text: str) -> dict:
    """``{kind: {"count": n, "bytes": b}}`` for every collective kind (zeros included)."""
    stats = {kind: {"count": 0, "bytes": 0} for kind in KINDS}
    for line in hlo_text.splitlines():
        match = _LINE.search(line)
        if match is None or "-done" in line.split("=")[0]:
            continue
        entry = stats[match.group("op")]
        entry["count"] += 1
        entry["bytes"] += _shape_bytes(match.group("shape"))
    return stats


# ----------------------------------------------------------------------- per layer, and time

_GROUPS_IOTA = re.compile(r"replica_groups=\[(?P<dims>[\d,]+)\]<=")
_GROUPS_MESH = re.compile(r"replica_groups=mesh\[(?P<axes>[^\]]*)\]\s*\{(?P<used>[^}]*)\}")
_GROUPS_LIST = re.compile(r"replica_groups=\{\{(?P<first>[\d,]*)\}")
_OP_NAME = re.compile(r'op_name="(?P<name>[^"]*)"')


def group_size(line: str) -> int:
    """How many devices take part in each group of the collective on one HLO line (1 when the
    line does not say)."""
    match = _GROUPS_IOTA.search(line)
    if match:
        dims = [int(d) for d in match.group("dims").split(",") if d]
        return dims[-1] if len(dims) > 1 else dims[0]
    match = _GROUPS_MESH.search(line)
    if match:
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", match.group("axes")))
        used = re.findall(r"'([^']+)'", match.group("used"))
        size = 1
        for axis in used:
            size *= int(sizes.get(axis, 1))
        return size
    match = _GROUPS_LIST.search(line)
    if match:
        return max(1, len([d for d in match.group("first").split(",") if d]))
    if "collective-permute" in line:
        return 2
    return 1


def wire_bytes(kind: str, result_bytes: int, group: int) -> float:
    """Bytes one device sends over its link for one collective, in the ring algorithms' first
    order model: all-reduce ``2 (n-1)/n`` of the buffer, all-gather and all-to-all ``(n-1)/n``
    of the result, reduce-scatter ``n-1`` pieces, collective-permute the whole buffer once."""
    n = max(1, int(group))
    if kind == "all-reduce":
        return 2.0 * (n - 1) / n * result_bytes
    if kind in ("all-gather", "all-to-all"):
        return (n - 1) / n * result_bytes
    if kind == "reduce-scatter":
        return float((n - 1) * result_bytes)
    return float(result_bytes)


def layer_of(op_name: str) -> str:
    """The layer path in an HLO ``op_name`` (``"0.linear/dot_general"`` -> ``"0.linear"``;
    ``"(top)"`` for an op outside every layer)."""
    path = op_name.rpartition("/")[0]
    return path or "(top)"


def collective_entries(hlo_text: str) -> list[dict]:
    """Every collective of XLA's partitioned HLO as ``{"op_name", "kind", "bytes", "wire_bytes",
    "count"}``: ``op_name`` is the ``"layer/op"`` XLA keeps from the lowering's locations,
    ``bytes`` the result bytes per device (as :func:`collective_stats`) and ``wire_bytes`` what
    one device sends (:func:`wire_bytes`). A collective XLA combined from several (a tuple
    all-reduce of many gradients) gives one entry per element, each with its own op name and
    ``count`` ``1/k`` of the ``k`` elements."""
    entries = []
    for line in hlo_text.splitlines():
        match = _LINE.search(line)
        if match is None or "-done" in line.split("=")[0]:
            continue
        kind = match.group("op")
        shape = match.group("shape")
        group = group_size(line)
        named = _OP_NAME.search(line)
        name = named.group("name") if named else ""
        names = name[1:-1].split(":") if name.startswith("(") and name.endswith(")") else [name]
        pieces = [_shape_bytes(m.group()) for m in _ARRAY.finditer(shape)] if shape.startswith("(") else []
        if len(names) > 1 and len(pieces) == len(names):
            parts = list(zip(names, pieces))
        else:
            parts = [(names[0] if len(names) == 1 else "", _shape_bytes(shape))]
        for part, nbytes in parts:
            entries.append(
                {
                    "op_name": part,
                    "kind": kind,
                    "bytes": nbytes,
                    "wire_bytes": wire_bytes(kind, nbytes, group),
                    "count": 1 / len(parts),
                }
            )
    return entries


def collectives_by_layer(hlo_text: str) -> list[dict]:
    """The collectives of :func:`collective_entries` summed per ``(layer, kind)``: rows of
    ``{"layer", "kind", "count", "bytes", "wire_bytes"}``, largest wire bytes first (a combined
    collective counts ``1/k`` towards each of the ``k`` layers it serves)."""
    rows: dict[tuple[str, str], dict] = {}
    for entry in collective_entries(hlo_text):
        layer = layer_of(entry["op_name"]) if entry["op_name"] else "(combined)"
        row = rows.setdefault(
            (layer, entry["kind"]),
            {"layer": layer, "kind": entry["kind"], "count": 0.0, "bytes": 0, "wire_bytes": 0.0},
        )
        row["count"] += entry["count"]
        row["bytes"] += entry["bytes"]
        row["wire_bytes"] += entry["wire_bytes"]
    return sorted(rows.values(), key=lambda r: (-r["wire_bytes"], r["layer"], r["kind"]))


def check_link_gbps(link_gbps: Any) -> float:
    """``link_gbps`` as a float, or ``ValueError``: a link's bandwidth is a finite number of
    Gbit/s > 0 (not a bool, not a string)."""
    real = isinstance(link_gbps, numbers.Real) and not isinstance(link_gbps, bool)
    if not (real and math.isfinite(link_gbps) and link_gbps > 0):
        raise ValueError(f"link_gbps must be a finite, positive number of Gbit/s, got {link_gbps!r}")
    return float(link_gbps)


def comm_seconds(wire: float, link_gbps: float) -> float:
    """Seconds to send ``wire`` bytes over a link of ``link_gbps`` gigabits per second (no
    latency term, no overlap with compute: a lower bound of the time the collectives take)."""
    return float(wire) * 8 / (check_link_gbps(link_gbps) * 1e9)


def format_comm_table(rows: list[dict], link_gbps: float | None = None) -> str:
    """The per-layer collectives as an aligned text table (with a time column for a link of
    ``link_gbps`` Gbit/s), and a total line."""
    if link_gbps is not None:
        link_gbps = check_link_gbps(link_gbps)
    head = f"{'layer':24s} {'collective':20s} {'count':>6s} {'bytes/device':>14s} {'wire bytes':>14s}"
    if link_gbps:
        head += f" {'time @ ' + format(link_gbps, 'g') + ' Gbit/s':>20s}"
    lines = [head]
    for row in rows:
        line = (
            f"{row['layer']:24s} {row['kind']:20s} {row['count']:>6.3g} {row['bytes']:>14,d} "
            f"{row['wire_bytes']:>14,.0f}"
        )
        if link_gbps:
            line += f" {comm_seconds(row['wire_bytes'], link_gbps) * 1e6:>17,.3f} us"
        lines.append(line)
    total_wire = sum(r["wire_bytes"] for r in rows)
    count, nbytes = sum(r["count"] for r in rows), sum(r["bytes"] for r in rows)
    total = f"{'total':24s} {'':20s} {round(count, 6):>6g} {nbytes:>14,d} {total_wire:>14,.0f}"
    if link_gbps:
        total += f" {comm_seconds(total_wire, link_gbps) * 1e6:>17,.3f} us"
    lines.append(total)
    return "\n".join(lines) + "\n"
