"""A check of MLIR bytecode's frame, in Python, before any MLIR reader sees the bytes: the magic,
the format version, the producer string, the sections' lengths and alignment, that every string
is UTF-8 (MLIR's readers abort the process on a string that is not), and that no attribute or type
of the builtin dialect refers to itself (MLIR's reader never finishes on such a table)."""

from __future__ import annotations

from kaun_ir.runtime.xla.mlir_bytecode_refs import check_references

__all__ = ["BYTECODE_MAGIC", "bytecode_producer"]

BYTECODE_MAGIC = b"ML\xefR"
_BYTECODE_VERSIONS = range(0, 32)  # MLIR's bytecode format is at version 6 (MLIR rejects newer ones)


def _varint(data: bytes, pos: int, source: str) -> tuple[int, int]:
    """MLIR bytecode's prefix varint at ``pos``: ``(value, next position)``."""
    if pos >= len(data):
        raise ValueError(f"{source}: truncated MLIR bytecode (byte {pos} of {len(data)})")
    first = data[pos]
    extra = 8 if first == 0 else (first & -first).bit_length() - 1  # trailing zero bits
    if pos + 1 + extra > len(data):
        raise ValueError(f"{source}: truncated MLIR bytecode (byte {pos} of {len(data)})")
    if first == 0:
        return int.from_bytes(data[pos + 1 : pos + 9], "little"), pos + 9
    value = int.from_bytes(data[pos : pos + 1 + extra], "little") >> (extra + 1)
    return value, pos + 1 + extra


def bytecode_producer(data: bytes, source: str = "the module") -> str:
    """Check the frame of MLIR bytecode — magic, format version, producer, the sections' lengths
    and that the string section is UTF-8 — and return the producer (``"StableHLO_v1.0.0"`` for a
    portable artifact). Raises ``ValueError`` naming ``source`` and what is wrong."""
    if not data.startswith(BYTECODE_MAGIC):
        raise ValueError(f"{source} is not MLIR bytecode (no 'ML\\xefR' magic)")
    version, pos = _varint(data, len(BYTECODE_MAGIC), source)
    if version not in _BYTECODE_VERSIONS:
        raise ValueError(f"{source}: MLIR bytecode version {version} is not supported")
    end = data.find(b"\0", pos)
    if end < 0:
        raise ValueError(f"{source}: truncated MLIR bytecode (no producer string)")
    try:
        producer = data[pos:end].decode()
    except UnicodeDecodeError:
        raise ValueError(f"{source}: the MLIR bytecode's producer string is not UTF-8") from None
    pos = end + 1
    sections: dict[int, bytes] = {}
    while pos < len(data):
        section = data[pos]
        section_id, aligned = section & 0x7F, section & 0x80
        length, pos = _varint(data, pos + 1, source)
        if aligned:
            alignment, pos = _varint(data, pos, source)
            if alignment == 0 or alignment & (alignment - 1) or alignment > 256:
                raise ValueError(f"{source}: MLIR bytecode section {section_id} has alignment {alignment}")
            while pos % alignment:  # padding up to the alignment, 0xCB bytes
                if pos >= len(data) or data[pos] != 0xCB:
                    raise ValueError(f"{source}: MLIR bytecode section {section_id} is badly padded")
                pos += 1
        if length > len(data) - pos:
            raise ValueError(
                f"{source}: truncated MLIR bytecode (section {section_id} needs {length} bytes, "
                f"{len(data) - pos} left)"
            )
        if section_id == 0:  # the string section: every string must be UTF-8
            _check_strings(data[pos : pos + length], source)
        sections[section_id] = data[pos : pos + length]
        pos += length
    check_references(sections, version, source)
    return producer


def _check_strings(section: bytes, source: str) -> None:
    """The string section: a count, the strings' sizes (last string first), then the strings,
    each ending in a NUL, packed at the end of the section."""
    count, pos = _varint(section, 0, source)
    if count > len(section):
        raise ValueError(f"{source}: MLIR bytecode string section claims {count} strings")
    end = len(section)
    for index in range(count):
        size, pos = _varint(section, pos, source)
        if size < 1 or size > end - pos:
            raise ValueError(f"{source}: MLIR bytecode string section is inconsistent")
        try:
            section[end - size : end - 1].decode()
        except UnicodeDecodeError as err:
            raise ValueError(
                f"{source}: MLIR bytecode string {count - 1 - index} is not UTF-8 ({err.reason})"
            ) from None
        end -= size
