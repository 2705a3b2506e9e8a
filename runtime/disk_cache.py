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
wins with identical content. An entry that cannot be read back (truncated by a full disk, written
by another jaxlib build) is removed and recompiled, with one warning. The directory is created
private to the user (mode 0700): loading a serialised executable can run code, so the directory
must be one that only you can write (jaxlib gives the same warning for its own cache).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable, Sequence
from typing import TypeVar

from kaun_ir.fileio import atomic_write
from kaun_ir.runtime.xla import backend

Loaded = TypeVar("Loaded")  # the loaded executable of whichever jaxlib compiled it

ENV = "KAUN_IR_CACHE_DIR"
_FORMAT = "kaun_ir-xla-cache-1"
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
    root = directory()
    if root is None:
        return compile_fn()
    path = _entry(root, key(module, list(devices), options))
    loaded = _load(path, load)
    if loaded is not None:
        counters.hits += 1
        return loaded
    executable = compile_fn()
    counters.misses += 1
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        atomic_write(path, save(executable))
    except Exception as err:  # a full disk or a read-only directory must not fail a compilation
        counters.errors += 1
        _warn_once(
            "store",
            f"kaun_ir: could not store a compiled executable in {ENV}={root} "
            f"({type(err).__name__}: {err}); running without the cache for it",
        )
    return executable


def _load(path: str, load: Callable[[bytes], Loaded]) -> Loaded | None:
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
        return load(data)
    except Exception as err:  # jaxlib's own error types for foreign or truncated entries
        counters.errors += 1
        _warn_once(
            "corrupt",
            f"kaun_ir: removed an unreadable compilation cache entry {path} "
            f"({type(err).__name__}); compiling instead",
        )
        try:
            os.unlink(path)
        except OSError:
            pass
        return None


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
