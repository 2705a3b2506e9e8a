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
"""

from __future__ import annotations

import hashlib
import os
import platform
import stat
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TypeVar

from kaun_ir.fileio import atomic_write
from kaun_ir.runtime.xla import backend

Loaded = TypeVar("Loaded")  # the loaded executable of whichever jaxlib compiled it

ENV = "KAUN_IR_CACHE_DIR"
MAX_BYTES_ENV = "KAUN_IR_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB
OFF_VALUES = (
    "",
    "off",
    "0",
)  # KAUN_IR_CACHE_DIR values that turn the cache off (like KAUN_IR_MALLOC_TUNING=0)
_FORMAT = "kaun_ir-xla-cache-3"  # 2: entries carry a header (magic, key, checksum); 3: host CPU in the key
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
        _warn_once(
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
                _warn_once("mkdir", f"kaun_ir: cannot create {ENV}={root} ({err}); running without the cache")
            return None
    reason = untrusted_reason(root)
    if reason is None and not os.access(root, os.W_OK | os.X_OK):
        reason = "it is not writable"
    if reason is not None:
        if loud:
            _warn_once(
                "untrusted:" + root,
                f"kaun_ir: not using the compilation cache {ENV}={root}: {reason}. Loading a cached "
                "executable can run code, so the directory must be writable by you alone "
                "(chmod 700 it, or point the variable at a new directory)",
            )
        return None
    return root


_KEY_PARTS: dict[str, str] = {}


def register_key_part(name: str, value: str | bytes) -> None:
    """Make ``value`` part of every cache key (of this cache and of
    :mod:`kaun_ir.runtime.graph_cache`) from now on, under ``name``.

    For whatever changes compiled code outside the StableHLO text: a library of custom-call
    kernels registered with XLA registers a hash of its binary here, so that rebuilding it never
    serves executables compiled against the old one. Registering the same name again replaces its
    value."""
    if isinstance(value, bytes):
        value = hashlib.sha256(value).hexdigest()
    _KEY_PARTS[str(name)] = str(value)


def key_parts() -> list[str]:
    """The registered key parts (:func:`register_key_part`) as ``name=value`` strings, sorted."""
    return [f"{name}={value}" for name, value in sorted(_KEY_PARTS.items())]


_HOST: list[str] = []


def host_identity() -> str:
    """The host CPU as the key sees it: the OS, the machine type, the CPU model and a SHA-256 of its
    feature flags (from ``/proc/cpuinfo`` where there is one). Computed once per process."""
    if not _HOST:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError:
            text = ""
        fields: dict[str, str] = {}
        for line in text.splitlines():
            if not line.strip():
                if fields:
                    break  # the first processor is enough: the flags are the same for all
                continue
            name, _, value = line.partition(":")
            fields.setdefault(name.strip().lower(), value.strip())
        # x86: "model name" and "flags"; ARM: "cpu implementer"/"cpu part" and "features"
        ident = [fields.get(k, "") for k in ("vendor_id", "model name", "cpu implementer", "cpu part")]
        # platform.processor() may start a process (uname -p): only without /proc/cpuinfo
        model = "/".join(ident) if any(ident) else platform.processor()
        flags = fields.get("flags") or fields.get("features") or ""
        features = hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:16]
        _HOST.append(f"{platform.system()}/{platform.machine()}/{model}/{features}")
    return _HOST[0]


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
        os.environ.get("TF_XLA_FLAGS", ""),
        os.environ.get("LIBTPU_INIT_ARGS", ""),
        ",".join(f"{d.platform}/{d.device_kind}/{d.id}" for d in devices),
        host_identity(),
        *key_parts(),
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
        _warn_once(
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
        loaded = load(payload)
    except Exception as err:  # jaxlib's own error types for foreign or truncated entries
        counters.errors += 1
        _warn_once(
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


_warned: set[str] = set()


def _warn_once(kind: str, message: str) -> None:
    if kind not in _warned:
        _warned.add(kind)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


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
