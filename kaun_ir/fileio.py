"""Atomic file writes (checkpoints, exports, dumps, reproducers): never a half-written file."""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import stat
import sys
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


def write_repro(name: str, title: str, fields: dict, text: str) -> str:
    """A compiler's failing input written atomically to ``name`` in :func:`repro_dir`, under
    ``// title`` and one ``// key: value`` line per field; returns the file's path."""
    path = os.path.join(repro_dir(), name)
    header = "".join(f"// {k}: {v}\n" for k, v in fields.items())
    atomic_write(path, f"// {title}\n{header}{text}")
    return path


# -- directories written as a whole ----------------------------------------------------------------
# A directory that must change all at once (a sharded checkpoint) lives in a hidden sibling
# ``.<name>.<pid>.<token>.dir``, and ``<name>`` itself is a symbolic link to it. A save builds a
# new sibling, makes a link ``.<name>.<pid>.<token>.link`` to it and renames that link over
# ``<name>``: rename(2) replaces a link atomically, so ``<name>`` names the old complete directory
# until that instant and the new one after it, whatever moment a process dies at. The replaced
# directory is removed afterwards; siblings left by savers that are no longer running (killed
# before their rename, or between the rename and the removal) are removed by the next save.
_DIR = re.compile(r"^\.(?P<base>.+)\.(?P<pid>\d+)\.(?P<token>[0-9a-f]+)\.(?P<kind>dir|link|old)$")


class AtomicDirectory:
    """A directory at ``path`` replaced as a whole: files go into :attr:`staging`, and
    :meth:`commit` makes ``path`` name it in one atomic step (see the scheme above).

    ``path`` may be missing, a link made by an earlier commit, an empty directory or a directory
    holding ``marker`` (a directory of this kind written before ``path`` was a link: the switch
    from it is atomic where the system can exchange two names, Linux, and otherwise leaves a
    window where ``path`` is missing and :func:`resolve_directory` finds it). Anything else at
    ``path`` (a regular file, a directory of other files) raises ``FileExistsError`` naming it:
    a save never replaces what it did not write. A link at ``path`` to somewhere else is
    followed: the directory it points to is the one replaced.

    ``owner`` and ``token`` name the staging directory; every process of a distributed save
    passes the same pair (those of the process that commits) so all of them write into one.
    """

    def __init__(
        self, path: str | os.PathLike, marker: str, owner: int | None = None, token: str | None = None
    ):
        path = os.path.abspath(os.fspath(path))
        # a link that is not ours (the user pointed ``path`` at another disk): replace its target
        if os.path.islink(path) and _own_link(path) is None:
            path = os.path.realpath(path)
        self.path, self.marker = path, marker
        self.parent, self.name = os.path.split(path)
        if not os.path.isdir(self.parent):
            raise FileNotFoundError(errno.ENOENT, "no such directory", self.parent)
        _check_replaceable(path, marker)
        self.owner = os.getpid() if owner is None else int(owner)
        self.token = uuid.uuid4().hex if token is None else str(token)
        self.staging = self._sibling("dir")

    def _sibling(self, kind: str) -> str:
        return os.path.join(self.parent, f".{self.name}.{self.owner}.{self.token}.{kind}")

    def _siblings(self) -> set[str]:
        return {os.path.basename(self._sibling(kind)) for kind in ("dir", "link", "old")}

    def create(self) -> str:
        """Make the (empty) staging directory; returns its path."""
        _IN_PROGRESS.update(self._siblings())
        os.makedirs(self.staging, exist_ok=True)
        return self.staging

    def commit(self) -> None:
        """Make ``path`` name the staging directory, then remove the directory it replaced."""
        _fsync_directory(self.staging)
        link = self._sibling("link")
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(os.path.basename(self.staging), link)
        previous = _own_link(self.path)
        if os.path.isdir(self.path) and not os.path.islink(self.path):
            self._replace_real_directory(link)
        else:
            os.replace(link, self.path)  # the atomic step
        _fsync_directory(self.parent)
        if previous is not None and previous != os.path.basename(self.staging):
            shutil.rmtree(os.path.join(self.parent, previous), ignore_errors=True)
        self.release()

    def _replace_real_directory(self, link: str) -> None:
        """``path`` is a directory (not a link): swap it with the link in one step where the
        system can, else rename it aside first (the window :func:`resolve_directory` covers)."""
        _check_replaceable(self.path, self.marker)
        if _exchange(link, self.path):
            shutil.rmtree(link, ignore_errors=True)  # the link's name now holds the old directory
            return
        aside = self._sibling("old")
        os.rename(self.path, aside)
        os.replace(link, self.path)
        shutil.rmtree(aside, ignore_errors=True)

    def abort(self) -> None:
        """Remove the staging directory (a save that failed); ``path`` is untouched."""
        shutil.rmtree(self.staging, ignore_errors=True)
        try:
            os.unlink(self._sibling("link"))
        except OSError:
            pass
        self.release()

    def release(self) -> None:
        """This process is done with the save (committed, aborted, or another process commits):
        from now on its siblings are stale for :func:`remove_stale_directories` unless live."""
        _IN_PROGRESS.difference_update(self._siblings())

    def remove_stale(self) -> list[str]:
        """Remove the siblings of ``path`` that saves no longer running left behind; returns them."""
        return remove_stale_directories(self.path)


# The sibling names (staging, link, set-aside) of the AtomicDirectory saves under way in this
# process: its own pid in a name proves nothing (a restarted job, in a container, often gets the
# pid of the one that was killed), so a sibling with this pid is stale unless listed here.
_IN_PROGRESS: set[str] = set()


def _started_at(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch, never later than the truth), or
    None where ``/proc`` cannot say; ``-1.0`` for a zombie (finished, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        with open("/proc/stat", encoding="ascii") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
        if fields[0] == "Z":
            return -1.0
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _writer_may_run(pid: int, sibling: str) -> bool:
    """Whether the save that made ``sibling`` (named with ``pid``) may still be running: not when
    the pid is this process's (its running saves are in ``_IN_PROGRESS``), not when no process
    has the pid, and not when the process that has it started after ``sibling`` last changed
    (the pid was reused)."""
    if pid == os.getpid() or not _alive(pid):
        return False
    started = _started_at(pid)
    if started is None:
        return True  # cannot tell: leave it
    if started < 0:
        return False  # a zombie: finished
    try:
        changed = os.lstat(sibling).st_mtime
    except OSError:
        return False
    return changed >= started


def remove_stale_directories(path: str | os.PathLike) -> list[str]:
    """Remove the staging directories and links of :class:`AtomicDirectory` saves of ``path``
    whose process is gone (a save killed midway), except the one ``path`` links to (and, while
    nothing is at ``path``, the directory set aside that :func:`resolve_directory` finds)."""
    path = os.path.abspath(os.fspath(path))
    parent, base = os.path.split(path)
    current = _own_link(path)
    # with nothing at ``path``, a directory set aside is the checkpoint (resolve_directory): kept
    keep_aside = not os.path.lexists(path)
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        match = _DIR.match(name)
        if match is None or match.group("base") != base or name == current or name in _IN_PROGRESS:
            continue
        if _writer_may_run(int(match.group("pid")), os.path.join(parent, name)):
            continue
        if keep_aside and match.group("kind") == "old":
            continue
        full = os.path.join(parent, name)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full, ignore_errors=True)
        else:
            try:
                os.unlink(full)
            except OSError:
                continue
        removed.append(full)
    return removed


def resolve_directory(path: str | os.PathLike, marker: str) -> str:
    """Where the directory saved at ``path`` is: ``path`` itself, or, in the one state where
    ``path`` is missing (a save replacing a directory by a link, on a system that cannot
    exchange two names, killed between its two renames), the complete directory set aside."""
    path = os.path.abspath(os.fspath(path))
    if os.path.lexists(path):
        return path
    parent, base = os.path.split(path)
    try:
        names = os.listdir(parent)
    except OSError:
        return path
    aside = [
        os.path.join(parent, n)
        for n in names
        if (m := _DIR.match(n)) and m.group("base") == base and m.group("kind") == "old"
    ]
    complete = [d for d in aside if os.path.isfile(os.path.join(d, marker))]
    if not complete:
        return path
    return max(complete, key=lambda d: os.stat(os.path.join(d, marker)).st_mtime_ns)


def _own_link(path: str) -> str | None:
    """The sibling name ``path`` links to when it is a link made by :class:`AtomicDirectory`."""
    try:
        target = os.readlink(path)
    except OSError:
        return None
    match = _DIR.match(target)
    base = os.path.basename(path)
    if os.sep in target or match is None or match.group("base") != base or match.group("kind") != "dir":
        return None
    return target


def _check_replaceable(path: str, marker: str) -> None:
    if not os.path.lexists(path) or _own_link(path) is not None:
        return
    if not os.path.isdir(path):
        raise FileExistsError(errno.EEXIST, "exists and is not a directory (not replaced)", path)
    if os.listdir(path) and not os.path.isfile(os.path.join(path, marker)):
        raise FileExistsError(
            errno.EEXIST, f"is a directory without {marker}, not one written here (not replaced)", path
        )


def _exchange(a: str, b: str) -> bool:
    """Swap the names ``a`` and ``b`` atomically (Linux ``renameat2(RENAME_EXCHANGE)``);
    ``False`` where the system or the file system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    result = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    return result == 0
