"""Which layers a buffer of XLA's optimised HLO belongs to: the top-level layer of an ``op_name``,
and, for a fusion, the layers of the ops its fused computation holds (XLA names a fusion after
one of its ops, often of another layer than the bulk of its work)."""

from __future__ import annotations

import re

__all__ = ["layer_of", "fusion_layers", "label"]

_INSTR = re.compile(
    r"^\s*(?P<root>ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*(?P<shape>\(.*?\)|\S+)\s+(?P<op>[\w\-]+)\((?P<rest>.*)$"
)
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
_COMPUTATION = re.compile(r"^%?([\w.\-]+)\s+\(.*\{\s*$")
#: ops that move, reshape or broadcast values without computing: they do not make a layer a part of
#: a fusion's work
_MOVES = frozenset(
    (
        "broadcast",
        "constant",
        "iota",
        "reshape",
        "bitcast",
        "transpose",
        "copy",
        "convert",
        "slice",
        "parameter",
    )
)


def layer_of(op_name: str) -> str:
    """The top-level layer of an ``op_name`` (``"3.decoder_block.attn/dot_general"`` ->
    ``"3.decoder_block"``; ``"optimizer/add"`` -> ``"optimizer"``)."""
    path = op_name.rsplit("/", 1)[0] if "/" in op_name else op_name
    tokens = [t for t in re.split(r"[./]", path) if t]
    if not tokens:
        return "(other)"
    if tokens[0].isdigit() and len(tokens) > 1:
        return f"{tokens[0]}.{tokens[1]}"
    if tokens[0].split("-")[0].isdigit() and len(tokens) > 1:  # "1-8.pipeline"
        return f"{tokens[0]}.{tokens[1]}"
    return tokens[0]


def fusion_layers(hlo_text: str) -> dict[str, tuple]:
    """``{computation: top-level layers of the ops it holds}`` for every computation of an HLO
    text, the computations it calls included, in the order the ops appear: what a fusion made of
    that computation computes, layer by layer (XLA names the fusion itself after one of them).
    Layers that only move or broadcast values in it are left out unless no other layer is in it."""
    ops: dict[str, list] = {}
    calls: dict[str, list] = {}
    current = None
    for line in hlo_text.splitlines():
        head = _COMPUTATION.match(line)
        if head and not line.startswith(" "):
            current = head.group(1)
            ops[current], calls[current] = [], []
            continue
        if current is None or line.startswith("}"):
            current = None
            continue
        op_name = _OP_NAME.search(line)
        if op_name:
            instruction = _INSTR.match(line)
            moves = instruction is not None and instruction.group("op") in _MOVES
            ops[current].append((layer_of(op_name.group(1)), moves))
        calls[current] += _CALLS.findall(line)

    def layers(name: str, seen: frozenset) -> list:
        found = list(ops.get(name, ()))
        for inner in calls.get(name, ()):
            if inner not in seen:
                found += layers(inner, seen | {inner})
        return found

    def computing(name: str) -> tuple:
        found = layers(name, frozenset({name}))
        # a layer whose only ops here move or broadcast values (a constant that common-subexpression
        # elimination shares between layers, named after the first) computes nothing here
        named = [layer for layer, moves in found if not moves] or [layer for layer, _ in found]
        return tuple(dict.fromkeys(named))

    return {name: computing(name) for name in ops}


def _sort_key(layer: str) -> tuple:
    head = layer.split(".")[0]
    return (0, int(head), layer) if head.isdigit() else (1, 0, layer)


def label(b, layers_by_index: dict[str, str]) -> str:
    """The layer a buffer is charged to: its ``op_name``'s top-level layer, a bare index (a
    parameter's path, or a copy XLA made of one) completed to the layer's name (``"3"`` ->
    ``"3.conv2d"``), and a fusion whose ops come from several layers named by all of them
    (``"fused: 3.conv2d + 4.relu + 5.avg_pool2d"``), since XLA names it after one of them."""
    layer = layer_of(b.op_name) if b.parameter is None else b.op_name
    head, _, rest = layer.partition(".")
    if head in layers_by_index and (b.parameter is not None or not rest or rest.split(".")[0].isdigit()):
        layer = layers_by_index[head]  # a parameter path ("3.weight", "1.2.bias") or a copy of one
    fused = sorted({name for name in b.fused if name != "(other)"}, key=_sort_key)
    if len(fused) == 1:
        return fused[0]  # what the fusion computes, whatever op XLA named it after
    if len(fused) > 1:
        shown = " + ".join(fused[:3]) + (f" + {len(fused) - 3} more" if len(fused) > 3 else "")
        return f"fused: {shown}"
    return layer
