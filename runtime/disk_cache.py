"""A persistent compilation cache: XLA executables kept on disk across processes.

Set ``KAUN_IR_CACHE_DIR`` to a directory and every XLA compilation is looked up there first; a
miss compiles as usual and stores the serialised executable. A second process that compiles the
same module for the same device skips XLA's compiler and only deserialises.

The key is a SHA-256 of everything that can change the compiled code:

- the StableHLO text (which already holds every pass and pipeline decision);
- the platform, the device kind and the ids of the devices the executable runs on;
- XLA's compile options as serialised by jaxlib (partitioning, device assignment, ...);
- the jaxlib version and XLA's C API version, and ``XLA_FLAGS`` / ``LIBTPU_INIT_ARGS``;
- the format version of this cache.

Entries are written atomically (temporary file, fsync, rename), so processes sharing one directory
never see a half-written entry; two processes that miss together both compile and the last rename
wins with identical content.

Every entry starts with a header: a magic string, the key it was stored under and a SHA-256 of
the serialised executable after it. A load checks all three before jaxlib sees a byte, so an entry
that was damaged (a flipped byte, a truncated copy), swapped with another entry or copied under
another key is never run as the wrong program: it is treated as a miss, removed, recompiled and
stored again, with one warning. An entry jaxlib itself cannot read back (another jaxlib build)
is handled the same way.

The trust model: the checksum catches accidents, not an attacker who can write the directory
(such a user can write a matching header too), and loading a serialised executable can run code.
So the directory must be one that only you can write. It is created private to the user (mode
0700); an existing directory that is not owned by the current user, or that its group or anyone
else may write, is not trusted: the cache is off for this process, with one warning naming the
directory and the reason (the computation itself compiles as usual).
"""

from __future__ import annotations

import hashlib
import os
import stat
import warnings
from collections.abc import Callable, Sequence
from typing import TypeVar

from kaun_ir.fileio import atomic_write
from kaun_ir.runtime.xla import backend

Loaded = TypeVar("Loaded")  # the loaded executable of whichever jaxlib compiled it

ENV = "KAUN_IR_CACHE_DIR"
_FORMAT = "kaun_ir-xla-cache-2"  # 2: entries carry a header (magic, key, checksum)
_MAGIC = b"KAUN-IR-XLA-CACHE-2\n"
_HEADER = len(_MAGIC) + 64  # the magic, then the key and the payload's SHA-256 (32 bytes each)
_SUFFIX = ".xlaexe"
GRAPH_SUFFIX = ".kirgraph"  # the pass pipeline's results (kaun_ir.runtime.graph_cache)


class Counters:
    """How the cache answered in this process: ``hits`` (loaded from disk), ``misses`` (compiled and
    stored), ``errors`` (unreadable entries removed, or stores that failed)."""

    hits = 0
    misses = 0
    errors = 0


counters = Counters()


def directory() -> str | None:
    """The cache directory from ``KAUN_IR_CACHE_DIR``, or None when the cache is off."""
    path = os.environ.get(ENV, "").strip()
    return os.path.abspath(os.path.expanduser(path)) if path else None


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
    :func:`untrusted_reason`, else the cache stays off in this process, with one warning."""
    root = directory()
    if root is None:
        return None
    if not os.path.exists(root):
        try:
            os.makedirs(root, mode=0o700, exist_ok=True)
        except OSError as err:
            _warn_once("mkdir", f"kaun_ir: cannot create {ENV}={root} ({err}); running without the cache")
            return None
    reason = untrusted_reason(root)
    if reason is not None:
        _warn_once(
            "untrusted:" + root,
            f"kaun_ir: not using the compilation cache {ENV}={root}: {reason}. Loading a cached "
            "executable can run code, so the directory must be writable by you alone "
            "(chmod 700 it, or point the variable at a new directory)",
        )
        return None
    return root


def seal(cache_key: str, payload: bytes) -> bytes:
    """An entry's bytes: the header (magic, ``cache_key``, SHA-256 of ``payload``), then ``payload``."""
    return _MAGIC + bytes.fromhex(cache_key) + hashlib.sha256(payload).digest() + payload


def unseal(cache_key: str, data: bytes) -> bytes:
    """The payload of an entry stored under ``cache_key``; ``ValueError`` saying what is wrong when
    the header is missing, names another key, or the checksum does not match (damaged)."""
    if len(data) < _HEADER or not data.startswith(_MAGIC):
        raise ValueError("no cache header (damaged, or written by another version)")
    stored_key = data[len(_MAGIC) : len(_MAGIC) + 32]
    digest = data[len(_MAGIC) + 32 : _HEADER]
    payload = data[_HEADER:]
    if stored_key != bytes.fromhex(cache_key):
        raise ValueError(f"stored under another key ({stored_key.hex()[:16]}...): a moved or swapped entry")
    if hashlib.sha256(payload).digest() != digest:
        raise ValueError("checksum mismatch: the entry is damaged")
    return payload


def key(module: str | bytes, devices, options_bytes: bytes) -> str:
    """The hex cache key of compiling ``module`` for ``devices`` with serialised compile options."""
    digest = hashlib.sha256()
    for part in (
        _FORMAT,
        backend.jaxlib_version(),
        backend.xla_extension_version(),
        os.environ.get("XLA_FLAGS", ""),
        os.environ.get("LIBTPU_INIT_ARGS", ""),
        ",".join(f"{d.platform}/{d.device_kind}/{d.id}" for d in devices),
    ):
        digest.update(str(part).encode())
        digest.update(b"\0")
    digest.update(options_bytes)
    digest.update(b"\0")
    digest.update(module.encode() if isinstance(module, str) else bytes(module))
    return digest.hexdigest()


def _entry(root: str, cache_key: str) -> str:
    return os.path.join(root, cache_key[:2], cache_key + _SUFFIX)


def compile_cached(
    module: str | bytes,
    devices: Sequence,
    options: bytes,
    compile_fn: Callable[[], Loaded],
    save: Callable[[Loaded], bytes],
    load: Callable[[bytes], Loaded],
) -> Loaded:
    """``compile_fn()`` (a loaded executable) through the on-disk cache when it is on.

    ``devices`` are the executable's devices and ``options`` its serialised compile options
    (both part of the key); ``save`` turns an executable into bytes and ``load`` turns them back
    (the jaxlib adapter passes its client's methods). Without ``KAUN_IR_CACHE_DIR`` this is just
    ``compile_fn()``."""
    root = trusted_directory()
    if root is None:
        return compile_fn()
    cache_key = key(module, list(devices), options)
    path = _entry(root, cache_key)
    loaded = _load(path, cache_key, load)
    if loaded is not None:
        counters.hits += 1
        return loaded
    executable = compile_fn()
    counters.misses += 1
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        atomic_write(path, seal(cache_key, save(executable)))
    except Exception as err:  # a full disk or a read-only directory must not fail a compilation
        counters.errors += 1
        _warn_once(
            "store",
            f"kaun_ir: could not store a compiled executable in {ENV}={root} "
            f"({type(err).__name__}: {err}); running without the cache for it",
        )
    return executable


def _load(path: str, cache_key: str, load: Callable[[bytes], Loaded]) -> Loaded | None:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None
    except OSError as err:
        counters.errors += 1
        _warn_once(
            "read", f"kaun_ir: cannot read the compilation cache entry {path} ({err}); compiling instead"
        )
        return None
    try:
        payload = unseal(cache_key, data)
    except ValueError as err:  # never hand jaxlib bytes that are not this key's executable
        counters.errors += 1
        _warn_once(
            "damaged",
            f"kaun_ir: removed an unreadable compilation cache entry {path} ({err}); compiling instead",
        )
        _remove(path)
        return None
    try:
        return load(payload)
    except Exception as err:  # jaxlib's own error types for foreign or truncated entries
        counters.errors += 1
        _warn_once(
            "corrupt",
            f"kaun_ir: removed an unreadable compilation cache entry {path} "
            f"({type(err).__name__}); compiling instead",
        )
        _remove(path)
        return None


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


_warned: set[str] = set()


def _warn_once(kind: str, message: str) -> None:
    if kind not in _warned:
        _warned.add(kind)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def clear() -> int:
    """Remove every entry of the cache directory (if set), the optimised graphs of
    :mod:`kaun_ir.runtime.graph_cache` included; returns how many files were removed."""
    root = directory()
    removed = 0
    if root is None or not os.path.isdir(root):
        return 0
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith((_SUFFIX, GRAPH_SUFFIX, ".tmp")):
                os.unlink(os.path.join(folder, name))
                removed += 1
    return removed
