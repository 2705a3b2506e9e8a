"""TensorBoard event files written without TensorFlow: TFRecord framing, CRC-32C and the few
protobuf fields of a scalar ``Event``.

An event file is a sequence of records, each ``length`` (uint64, little-endian), the masked
CRC-32C of those 8 bytes (uint32), ``length`` bytes of a serialised ``tensorflow.Event``, and
the masked CRC-32C of the data. The first event holds ``file_version = "brain.Event:2"``; every
other one a ``Summary`` of ``(tag, simple_value)`` pairs at a ``step``. Only these fields are
encoded, by hand (field numbers from TensorBoard's ``event.proto`` and ``summary.proto``).
"""

from __future__ import annotations

import os
import socket
import struct
import time

__all__ = ["crc32c", "masked_crc32c", "record", "scalar_event", "version_event", "EventFile"]


def _table() -> list[int]:
    poly = 0x82F63B78  # CRC-32C (Castagnoli), reflected
    rows = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ poly if crc & 1 else crc >> 1
        rows.append(crc)
    return rows


_TABLE = _table()


def crc32c(data: bytes) -> int:
    """The CRC-32C (Castagnoli) checksum of ``data``."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC: the CRC-32C rotated right by 15 bits plus ``0xA282EAD8``."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(payload: bytes) -> bytes:
    """One TFRecord: length, its masked CRC, the payload, the payload's masked CRC."""
    header = struct.pack("<Q", len(payload))
    return (
        header
        + struct.pack("<I", masked_crc32c(header))
        + payload
        + struct.pack("<I", masked_crc32c(payload))
    )


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1  # int64 fields: two's complement
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _bytes_field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _event(wall_time: float, step: int, body: bytes) -> bytes:
    # Event: wall_time = 1 (double), step = 2 (int64), then the oneof (file_version or summary)
    return _varint(1 << 3 | 1) + struct.pack("<d", wall_time) + _varint(2 << 3) + _varint(step) + body


def version_event(wall_time: float) -> bytes:
    """The serialised first ``Event`` of a file (``file_version = "brain.Event:2"``)."""
    return _event(wall_time, 0, _bytes_field(3, b"brain.Event:2"))


def scalar_event(wall_time: float, step: int, scalars: dict[str, float]) -> bytes:
    """A serialised ``Event`` with a ``Summary`` of one ``simple_value`` per tag."""
    values = b""
    for tag, value in scalars.items():
        # Summary.Value: tag = 1 (string), simple_value = 2 (float)
        entry = _bytes_field(1, str(tag).encode()) + _varint(2 << 3 | 5) + struct.pack("<f", float(value))
        values += _bytes_field(1, entry)  # Summary: repeated Value value = 1
    return _event(wall_time, step, _bytes_field(5, values))  # Event.summary = 5


class EventFile:
    """An ``events.out.tfevents.*`` file in ``logdir``, appended to and flushed per write."""

    def __init__(self, logdir: str | os.PathLike):
        os.makedirs(logdir, exist_ok=True)
        now = time.time()
        name = f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}.kaun_ir"
        self.path = os.path.join(os.fspath(logdir), name)
        self._handle = open(self.path, "ab")  # noqa: SIM115 - kept open across writes, closed by close()
        self._handle.write(record(version_event(now)))
        self._handle.flush()

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """Append one event with ``scalars`` at ``step``."""
        self._handle.write(record(scalar_event(time.time(), int(step), scalars)))
        self._handle.flush()

    def close(self) -> None:
        """Close the file."""
        if not self._handle.closed:
            self._handle.close()
