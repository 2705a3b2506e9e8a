"""A persistent compilation cache: XLA executables kept on disk across processes.

The cache is on by default. Every XLA compilation is looked up in the cache directory first; a
miss compiles as usual and stores the serialised executable. A second process that compiles the
same module for the same device skips XLA's compiler and only deserialises.

The directory (:func:`directory`): ``KAUN_IR_CACHE_DIR`` when it is set; otherwise the per-user
cache folder: ``$XDG_CACHE_HOME/kaun_ir/compiled`` or ``~/.cache/kaun_ir/compiled`` (Linux and
other Unix systems), ``~/Library/Caches/kaun_ir/compiled`` (macOS) or
``%LOCALAPPDATA%\\kaun_ir\\compiled`` (Windows); the ``compiled`` folder keeps the cache apart
from the data sets kept in ``kaun_ir``. Setting ``KAUN_IR_CACHE_DIR=off`` (or to an empty
string) turns the cache off.

The key is a SHA-256 of everything that can change the compiled code:

- the StableHLO text (which already holds every pass and pipeline decision);
- the platform, the device kind and the ids of the devices the executable runs on;
- the host CPU (:func:`host_identity`: the machine type, the CPU model and a hash of its feature
  flags), since XLA's CPU backend generates code for the features of the host it runs on: a home
  directory shared between hosts never loads code built for instructions the host lacks;
- XLA's compile options as serialised by jaxlib (partitioning, device assignment, ...);
- the jaxlib version and XLA's C API version, and ``XLA_FLAGS`` / ``TF_XLA_FLAGS`` /
  ``LIBTPU_INIT_ARGS``;
- every part registered with :func:`register_key_part` (a custom-call library's hash, say);
- the format version of this cache.

The cache is bounded (:func:`max_bytes`): ``KAUN_IR_CACHE_MAX_BYTES`` (default 1 GiB; ``0`` for
no bound). When a store may have passed the bound (:func:`after_store`: a process counts the
directory at its first store, then adds what it stores), the least recently used entries (a hit
touches its entry) are removed until the cache holds 90% of the bound (:func:`evict`); a file
another process removed meanwhile is simply skipped. Lookups never scan the directory.

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
else may write, is not trusted: the cache is off for this process (the computation itself
compiles as usual). A directory named by ``KAUN_IR_CACHE_DIR`` gets one warning naming it and the
reason; the default directory, which the user never asked for, is skipped silently.

Where the cache lives and whether it is trusted: :mod:`kaun_ir.runtime.cache_directory`; what the
key holds: :mod:`kaun_ir.runtime.cache_key`; entries, loads, stores and eviction: here.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from typing import TypeVar

from kaun_ir.fileio import atomic_write

# where the cache lives and the key of an entry have modules of their own; their public names are
# this module's too (``disk_cache.directory()``, ``disk_cache.key(...)``)
from kaun_ir.runtime.cache_directory import (
    DEFAULT_MAX_BYTES,
    ENV,
    MAX_BYTES_ENV,
    OFF_VALUES,
    default_directory,
    directory,
    explicit,
    max_bytes,
    trusted_directory,
    untrusted_reason,
    warn_once,
)
from kaun_ir.runtime.cache_key import host_identity, key, key_parts, register_key_part

__all__ = [
    "DEFAULT_MAX_BYTES",
    "ENV",
    "GRAPH_SUFFIX",
    "MAX_BYTES_ENV",
    "OFF_VALUES",
    "Counters",
    "after_store",
    "clear",
    "compile_cached",
    "counters",
    "default_directory",
    "directory",
    "evict",
    "explicit",
    "host_identity",
    "key",
    "key_parts",
    "max_bytes",
    "register_key_part",
    "seal",
    "touch",
    "trusted_directory",
    "unseal",
    "untrusted_reason",
]

Loaded = TypeVar("Loaded")  # the loaded executable of whichever jaxlib compiled it

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
    (the jaxlib adapter passes its client's methods). With the cache off (``KAUN_IR_CACHE_DIR=off``)
    or its directory unusable this is just ``compile_fn()``."""
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
        data = seal(cache_key, save(executable))
        atomic_write(path, data)
    except Exception as err:  # a full disk or a read-only directory must not fail a compilation
        counters.errors += 1
        warn_once(
            "store",
            f"kaun_ir: could not store a compiled executable in the compilation cache {root} "
            f"({type(err).__name__}: {err}); running without the cache for it ({ENV}=off turns it off)",
        )
    else:
        after_store(root, len(data))
    return executable


def _load(path: str, cache_key: str, load: Callable[[bytes], Loaded]) -> Loaded | None:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None
    except OSError as err:
        counters.errors += 1
        warn_once(
            "read", f"kaun_ir: cannot read the compilation cache entry {path} ({err}); compiling instead"
        )
        return None
    try:
        payload = unseal(cache_key, data)
    except ValueError as err:  # never hand jaxlib bytes that are not this key's executable
        counters.errors += 1
        warn_once(
            "damaged",
            f"kaun_ir: removed an unreadable compilation cache entry {path} ({err}); compiling instead",
        )
        _remove(path)
        return None
    try:
        loaded = load(payload)
    except Exception as err:  # jaxlib's own error types for foreign or truncated entries
        counters.errors += 1
        warn_once(
            "corrupt",
            f"kaun_ir: removed an unreadable compilation cache entry {path} "
            f"({type(err).__name__}); compiling instead",
        )
        _remove(path)
        return None
    touch(path)
    return loaded


def touch(path: str) -> None:
    """Mark the entry ``path`` as just used (its modification time), for :func:`evict`."""
    try:
        os.utime(path)
    except OSError:  # removed by another process meanwhile, or a read-only directory: no matter
        pass


def evict(root: str, limit: int | None = None) -> int:
    """Remove the least recently used entries of the cache ``root`` (XLA executables and optimised
    graphs) while they hold more than ``limit`` bytes (default :func:`max_bytes`; 0: no bound), down
    to 90% of it; returns how many were removed. Files that vanish meanwhile (another process
    evicting too) are skipped."""
    limit = max_bytes() if limit is None else limit
    return _scan_and_evict(root, limit)[0] if limit > 0 else 0


_BELIEVED: dict[str, int] = {}  # cache directory -> the bytes this process believes it holds


def after_store(root: str, nbytes: int) -> int:
    """Keep the cache ``root`` within its bound after an entry of ``nbytes`` was stored; returns how
    many entries were evicted. Cheap: a process counts the directory at its first store, then adds
    what it stores, and counts (and evicts) again only when that sum passes the bound."""
    limit = max_bytes()
    if limit <= 0:
        return 0
    believed = _BELIEVED.get(root)
    if believed is not None and believed + nbytes <= limit:
        _BELIEVED[root] = believed + nbytes
        return 0
    removed, _BELIEVED[root] = _scan_and_evict(root, limit)
    return removed


def _scan_and_evict(root: str, limit: int) -> tuple[int, int]:
    """:func:`evict` with a positive ``limit``: (entries removed, bytes left)."""
    entries = []
    total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith((_SUFFIX, GRAPH_SUFFIX)):
                path = os.path.join(folder, name)
                try:
                    info = os.stat(path)
                except OSError:
                    continue
                entries.append((info.st_mtime, path, info.st_size))
                total += info.st_size
    if total <= limit:
        return 0, total
    removed = 0
    target = limit * 9 // 10
    for _, path, size in sorted(entries):
        if total <= target:
            break
        try:
            os.unlink(path)
            removed += 1
        except OSError:  # gone already: counted as freed all the same
            pass
        total -= size
    return removed, total


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def clear() -> int:
    """Remove every entry of the cache directory (when the cache is on), the optimised graphs of
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
