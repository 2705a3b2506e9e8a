"""Where the persistent compilation cache lives, how large it may grow, and whether its directory
can be trusted (see :mod:`kaun_ir.runtime.disk_cache` for the cache itself and its trust model)."""

from __future__ import annotations

import os
import stat
import sys
import warnings

ENV = "KAUN_IR_CACHE_DIR"
MAX_BYTES_ENV = "KAUN_IR_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB
OFF_VALUES = (
    "",
    "off",
    "0",
)  # KAUN_IR_CACHE_DIR values that turn the cache off (like KAUN_IR_MALLOC_TUNING=0)


def directory() -> str | None:
    """The cache directory, or None when the cache is off: ``KAUN_IR_CACHE_DIR`` when it is set
    (``off``, ``0`` or an empty string: off), else :func:`default_directory`."""
    value = os.environ.get(ENV)
    if value is None:
        return default_directory()
    path = value.strip()
    if path.lower() in OFF_VALUES:
        return None
    return os.path.abspath(os.path.expanduser(path))


def explicit() -> bool:
    """Whether ``KAUN_IR_CACHE_DIR`` names the directory (rather than the default being used)."""
    return os.environ.get(ENV) is not None


def default_directory() -> str | None:
    """The per-user cache folder of this system plus ``kaun_ir/compiled`` (None without a home)."""
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA", "").strip()
        return os.path.join(base, "kaun_ir", "compiled") if base else None
    home = os.path.expanduser("~")
    if sys.platform == "darwin":
        return os.path.join(home, "Library", "Caches", "kaun_ir", "compiled") if os.path.isabs(home) else None
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    if xdg and os.path.isabs(xdg):  # the XDG spec: a relative value is invalid and ignored
        return os.path.join(xdg, "kaun_ir", "compiled")
    return os.path.join(home, ".cache", "kaun_ir", "compiled") if os.path.isabs(home) else None


def max_bytes() -> int:
    """The size bound of the cache in bytes: ``KAUN_IR_CACHE_MAX_BYTES`` (an integer, or with a
    ``K``/``M``/``G`` suffix for KiB/MiB/GiB; ``0``: no bound), default 1 GiB. A value that cannot
    be read gives one warning and the default."""
    text = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1].upper(), 1)
    try:
        value = int(text[:-1] if scale > 1 else text) * scale
        if value < 0:
            raise ValueError(text)
    except ValueError:
        warn_once(
            "max-bytes",
            f"kaun_ir: cannot read {MAX_BYTES_ENV}={text!r} (bytes, e.g. 500M or 2G; 0: no bound); "
            f"using {DEFAULT_MAX_BYTES >> 30} GiB",
        )
        return DEFAULT_MAX_BYTES
    return value


def _uid() -> int | None:
    getuid = getattr(os, "getuid", None)  # not on Windows, where modes mean little anyway
    return getuid() if getuid is not None else None


def untrusted_reason(root: str) -> str | None:
    """Why the existing directory ``root`` cannot hold a cache (None when it can): it is not a
    directory, another user owns it, or its group or others may write it."""
    try:
        info = os.stat(root)
    except OSError as err:
        return f"cannot stat it ({err.strerror or err})"
    if not stat.S_ISDIR(info.st_mode):
        return "it is not a directory"
    uid = _uid()
    if uid is not None and info.st_uid != uid:
        return f"it is owned by user id {info.st_uid}, not by this user ({uid})"
    if uid is not None and info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"its group or other users may write it (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def trusted_directory() -> str | None:
    """The cache directory when the cache is on and the directory can be trusted, else None.

    A missing directory is created private to the user (mode 0700); an existing one must pass
    :func:`untrusted_reason`, else the cache stays off in this process: with one warning when
    ``KAUN_IR_CACHE_DIR`` names the directory, silently for the default directory."""
    root = directory()
    if root is None:
        return None
    loud = explicit()
    if not os.path.exists(root):
        try:
            os.makedirs(root, mode=0o700, exist_ok=True)
        except OSError as err:
            if loud:
                warn_once("mkdir", f"kaun_ir: cannot create {ENV}={root} ({err}); running without the cache")
            return None
    reason = untrusted_reason(root)
    if reason is None and not os.access(root, os.W_OK | os.X_OK):
        reason = "it is not writable"
    if reason is not None:
        if loud:
            warn_once(
                "untrusted:" + root,
                f"kaun_ir: not using the compilation cache {ENV}={root}: {reason}. Loading a cached "
                "executable can run code, so the directory must be writable by you alone "
                "(chmod 700 it, or point the variable at a new directory)",
            )
        return None
    return root


_warned: set[str] = set()  # the kinds of warning given so far (one each per process)


def warn_once(kind: str, message: str) -> None:
    """``message`` as a RuntimeWarning, the first time a warning of ``kind`` is given."""
    if kind not in _warned:
        _warned.add(kind)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
