"""MLIR bytecode's attribute and type table, checked for cycles before MLIR's reader sees it.

Attributes and types are immutable, uniqued values: one can only be made of others that exist
before it, so in a valid module their references never form a cycle. A damaged table can: one
changed byte makes a location's name refer to the location itself. MLIR's bytecode reader does not
finish on such a table (it defers the entry it cannot resolve, then retries it, forever). The
references of the builtin dialect's entries (locations, strings, arrays, dictionaries, tensor and
function types ...) are read here from their documented encodings and a cycle is an error; the
entries of other dialects (VHLO's, in a portable artifact) are not decoded, so a cycle through
them is left to the reading helper's CPU budget (:mod:`~kaun_ir.runtime.xla.mlir_helper`).
"""

from __future__ import annotations

__all__ = ["check_references"]

# What follows each builtin entry's code (its first varint), in order: ``a`` an attribute, ``t`` a
# type, ``v`` a varint, ``A`` / ``T`` / ``N`` a count then that many attributes / types / (name,
# value) attribute pairs, ``S`` a count then that many varints (a shape); ``!`` ends the decoding
# (the rest needs the type's width). The codes are MLIR's builtin dialect bytecode (append-only).
_ATTRIBUTES = {
    0: "A",  # ArrayAttr
    1: "N",  # DictionaryAttr
    2: "v",  # StringAttr
    3: "vt",  # StringAttr with a type
    4: "a",  # FlatSymbolRefAttr
    5: "aA",  # SymbolRefAttr
    6: "t",  # TypeAttr
    7: "",  # UnitAttr
    8: "t!",  # IntegerAttr
    9: "t!",  # FloatAttr
    10: "aa",  # CallSiteLoc
    11: "avv",  # FileLineColLoc
    12: "A",  # FusedLoc
    13: "Aa",  # FusedLoc with metadata
    14: "aa",  # NameLoc
    15: "",  # UnknownLoc
    16: "tv",  # DenseResourceElementsAttr
    17: "t!",  # DenseArrayAttr
    18: "t!",  # DenseIntOrFPElementsAttr
    19: "t!",  # DenseStringElementsAttr
    20: "taa",  # SparseElementsAttr
    21: "a",  # DistinctAttr
}
_TYPES = {
    0: "v",  # IntegerType
    **{code: "" for code in (1, 3, 4, 5, 6, 7, 8, 12)},  # index, the floats, none
    2: "TT",  # FunctionType
    9: "t",  # ComplexType
    10: "Sta",  # MemRefType
    11: "aSta",  # MemRefType with a memory space
    13: "St",  # RankedTensorType
    14: "aSt",  # RankedTensorType with an encoding
    15: "T",  # TupleType
    16: "t",  # UnrankedMemRefType
    17: "at",  # UnrankedMemRefType with a memory space
    18: "t",  # UnrankedTensorType
    19: "St",  # VectorType
}
_KDIALECT_VERSIONING = 1  # the bytecode version from which dialect names carry a version flag


class _Truncated(Exception):
    pass


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    if pos >= len(data):
        raise _Truncated
    first = data[pos]
    extra = 8 if first == 0 else (first & -first).bit_length() - 1
    if pos + 1 + extra > len(data):
        raise _Truncated
    if first == 0:
        return int.from_bytes(data[pos + 1 : pos + 9], "little"), pos + 9
    return int.from_bytes(data[pos : pos + 1 + extra], "little") >> (extra + 1), pos + 1 + extra


def _references(entry: bytes, fields: str) -> list[tuple[str, int]]:
    """The attributes (``("a", i)``) and types (``("t", i)``) an entry refers to, after its code,
    as far as it decodes: MLIR's reader resolves each reference as it reads it, in this order, so
    those before a damaged field are followed even when the entry then fails."""
    refs, pos = [], _varint(entry, 0)[1]
    try:
        for field in fields:
            if field == "!":
                break
            if field in "atv":
                value, pos = _varint(entry, pos)
                if field != "v":
                    refs.append((field, value))
                continue
            count, pos = _varint(entry, pos)
            per = {"A": "a", "T": "t", "N": "aa", "S": "v"}[field]
            for _ in range(min(count, len(entry))):
                for kind in per:
                    value, pos = _varint(entry, pos)
                    if kind != "v":
                        refs.append((kind, value))
    except _Truncated:
        pass
    return refs


def _builtin_index(dialects: bytes, strings: list[bytes], version: int) -> int | None:
    """The position of the builtin dialect in the dialect section, or None."""
    count, pos = _varint(dialects, 0)
    for index in range(count):
        name, pos = _varint(dialects, pos)
        if version >= _KDIALECT_VERSIONING:
            versioned, name = name & 1, name >> 1
            if versioned:
                size, pos = _varint(dialects, pos)
                pos += size
        if name < len(strings) and strings[name] == b"builtin":
            return index
    return None


def _strings(section: bytes) -> list[bytes]:
    count, pos = _varint(section, 0)
    sizes = []
    for _ in range(min(count, len(section))):
        size, pos = _varint(section, pos)
        sizes.append(size)
    found, end = [], len(section)
    for size in sizes:  # the last string first
        found.append(section[end - size : end - 1])
        end -= size
    return found[::-1]


def _table(sections: dict[int, bytes], version: int) -> dict[tuple[str, int], list[tuple[str, int]]]:
    """``{("a" | "t", index): references}`` of the builtin entries that decode."""
    builtin = _builtin_index(sections[1], _strings(sections[0]), version)
    offsets, data = sections[3], sections[2]
    num_attrs, pos = _varint(offsets, 0)
    num_types, pos = _varint(offsets, pos)
    graph, start = {}, 0
    for kind, total, codes in (("a", num_attrs, _ATTRIBUTES), ("t", num_types, _TYPES)):
        index = 0
        while index < total:
            dialect, pos = _varint(offsets, pos)
            count, pos = _varint(offsets, pos)
            for _ in range(min(count, total - index)):
                size_and_custom, pos = _varint(offsets, pos)
                entry = data[start : start + (size_and_custom >> 1)]
                start += size_and_custom >> 1
                if dialect == builtin and size_and_custom & 1 and entry:
                    fields = codes.get(_varint(entry, 0)[0])
                    refs = _references(entry, fields) if fields is not None else []
                    if refs:
                        graph[(kind, index)] = refs
                index += 1
            if count == 0:
                break
    return graph


def _cycle(graph: dict) -> list | None:
    """One cycle of ``graph`` (its nodes in order, the first repeated last), or None."""
    state: dict = {}  # 1: on the current path, 2: done
    for root in graph:
        if state.get(root):
            continue
        path, stack = [root], [iter(graph[root])]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif not state.get(nxt) and nxt in graph:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(graph[nxt]))
    return None


def check_references(sections: dict[int, bytes], version: int, source: str) -> None:
    """``ValueError`` naming ``source`` and the cycle when builtin attributes or types of the
    bytecode's table refer to themselves. A table that does not decode is left to MLIR."""
    if not all(section in sections for section in (0, 1, 2, 3)):
        return
    try:
        graph = _table(sections, version)
    except (_Truncated, IndexError):
        return
    cycle = _cycle(graph)
    if cycle:
        names = " -> ".join(f"{'attribute' if kind == 'a' else 'type'} #{index}" for kind, index in cycle)
        raise ValueError(f"{source}: damaged MLIR bytecode: an entry refers to itself ({names})")
