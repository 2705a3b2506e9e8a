"""Atomic file writes (checkpoints, exports, dumps, reproducers): never a half-written file."""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Callable, IO


def _write_whole(handle: IO[bytes], data: bytes) -> None:
    handle.write(data)


def atomic_write(path: str | os.PathLike, data: str | bytes,
                 writer: Callable[[IO[bytes], bytes], None] = _write_whole) -> None:
    """Write ``data`` to ``path`` atomically.

    The bytes go to a temporary file in the same directory, which is flushed and fsync-ed, then
    renamed over ``path`` (and the directory fsync-ed). If anything fails midway the temporary
    file is removed and whatever was at ``path`` before is untouched. ``writer(handle, data)``
    writes the bytes (tests substitute one that fails half way).
    """
    payload = data.encode() if isinstance(data, str) else bytes(data)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    # os.open with 0o666 lets the umask decide the final permissions, as for a plain open()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            writer(handle, payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: str) -> None:
    """Make the rename durable (POSIX); not possible / not needed on every platform."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def repro_dir(configured: str | None = None) -> str:
    """Where crash reproducers go: ``configured``, else ``$KAUN_IR_REPRO_DIR``, else a
    ``kaun_ir_repro`` folder in the system's temporary directory (created if missing)."""
    path = configured or os.environ.get("KAUN_IR_REPRO_DIR") or os.path.join(
        tempfile.gettempdir(), "kaun_ir_repro")
    os.makedirs(path, exist_ok=True)
    return path
