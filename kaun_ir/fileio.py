"""Atomic file writes (checkpoints, exports, dumps, reproducers): never a half-written file."""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
import uuid
from collections.abc import Callable
from typing import IO

# Temporary files are named ".<basename>.<pid>.<random>.tmp": the pid tells a later write of the
# same path whether the writer is gone (killed mid-write), so its leftover can be removed.
_TMP = re.compile(r"^\.(?P<base>.+)\.(?P<pid>\d+)\.[0-9a-f]{32}\.tmp$")


def _is_special(path: str | os.PathLike) -> bool:
    """Whether ``path`` exists and is neither a regular file nor a directory."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _write_whole(handle: IO[bytes], data: bytes) -> None:
    handle.write(data)


def atomic_write(
    path: str | os.PathLike, data: str | bytes, writer: Callable[[IO[bytes], bytes], None] = _write_whole
) -> None:
    """Write ``data`` to ``path`` atomically.

    The bytes go to a temporary file in the same directory, which is flushed and fsync-ed, then
    renamed over ``path`` (and the directory fsync-ed). If anything fails midway the temporary
    file is removed and whatever was at ``path`` before is untouched. ``writer(handle, data)``
    writes the bytes (tests substitute one that fails half way). A ``path`` that is a device,
    pipe or socket (``/dev/null``, ``/dev/stdout``) is written to directly, never replaced.
    """
    payload = data.encode() if isinstance(data, str) else bytes(data)
    directory = os.path.dirname(os.path.abspath(path))
    # errors that name the path the caller gave, not the temporary file
    if not os.path.isdir(directory):
        raise FileNotFoundError(errno.ENOENT, "no such directory", directory)
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "is a directory", os.fspath(path))
    if _is_special(path):
        # a device, pipe or socket (``-o /dev/null``, ``-o /dev/stdout``): renaming a file over it
        # would replace the device itself (as root, /dev/null would become a plain file), and
        # atomicity means nothing for a stream, so the bytes are written through
        with open(path, "wb") as handle:
            writer(handle, payload)
        return
    remove_stale_temporaries(path)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
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


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # another thread of this process may be writing it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists (someone else's) or cannot tell: leave it
    return True


def remove_stale_temporaries(path: str | os.PathLike) -> list[str]:
    """Remove the temporary files that writes of ``path`` by processes no longer running left
    behind (a save killed mid-write); returns the removed paths. Files of live writers stay."""
    path = os.path.abspath(os.fspath(path))
    directory, base = os.path.split(path)
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        match = _TMP.match(name)
        if match is None or match.group("base") != base or _alive(int(match.group("pid"))):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(os.path.join(directory, name))
        except OSError:
            pass
    return removed


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
    path = (
        configured
        or os.environ.get("KAUN_IR_REPRO_DIR")
        or os.path.join(tempfile.gettempdir(), "kaun_ir_repro")
    )
    os.makedirs(path, exist_ok=True)
    return path
