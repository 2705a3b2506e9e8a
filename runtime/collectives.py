"""Collective operations in XLA's partitioned HLO: how many, and how many bytes each moves.

Read from the optimised HLO text of a compiled executable (``Executable.hlo_text()``). The
bytes of a collective are those of its result on one device (all-reduce: the reduced buffer;
all-gather: the gathered buffer; reduce-scatter: the scattered piece), a common first-order
measure of traffic per device. A collective inside a loop body is counted once.
"""

from __future__ import annotations

import re

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
