"""Kernels of our own for XLA's CPU backend, built on first use and registered through XLA's FFI.

The C++ sources ship in this folder; the system C++ compiler builds them into one library,
whose handlers become typed-FFI custom-call targets.

Ops that have a kernel (``fused_attention``) call it from the StableHLO the runtime lowers for a
CPU executable; everywhere else (no compiler, a failed build, ``KAUN_IR_KERNELS=0``, another
platform, exported or portable modules) they lower to their plain StableHLO decomposition. A
missing or failing kernel is never an error for the user: :func:`status` says why none is used.

The library is cached per user (``KAUN_IR_KERNEL_CACHE``, default
``$XDG_CACHE_HOME/kaun_ir/kernels``) under a key hashing the sources, the flags, the compiler's
version and jaxlib's; the key is part of every target name, so a compiled program (in memory or
in the disk cache) only ever names a target of the library registered in this process.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

from kaun_ir.ops.attention import BACKWARD_KERNEL, FORWARD_KERNEL

ENV = "KAUN_IR_KERNELS"
CACHE_ENV = "KAUN_IR_KERNEL_CACHE"
SOURCES = (Path(__file__).with_name("attention.cc"),)
FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-std=c++17")
#: kernel name (what ops ask the emitter for) -> the handler symbol of the library
HANDLERS = {FORWARD_KERNEL: "kaun_ir_attention_forward", BACKWARD_KERNEL: "kaun_ir_attention_backward"}

_lock = threading.Lock()
_loaded: dict[str, str] | None = None  # kernel name -> registered target, once tried
_reason = "not tried yet"
_registered: set[str] = set()


def enabled() -> bool:
    """Whether kernels may be used: ``KAUN_IR_KERNELS`` is not ``0`` / ``false`` / ``no`` / ``off``."""
    return os.environ.get(ENV, "").strip().lower() not in ("0", "false", "no", "off")


def compiler() -> str | None:
    """The C++ compiler to build with: ``$CXX``, else ``c++``, ``g++`` or ``clang++`` on the PATH."""
    wanted = os.environ.get("CXX", "").strip()
    if wanted:
        return shutil.which(wanted)
    return next((found for name in ("c++", "g++", "clang++") if (found := shutil.which(name))), None)


def cache_dir() -> Path:
    """Where built libraries are kept (``KAUN_IR_KERNEL_CACHE``, else the user's cache folder)."""
    configured = os.environ.get(CACHE_ENV, "").strip()
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kaun_ir" / "kernels"


def library_key(cxx: str) -> str:
    """The hash naming a build: sources, flags, the compiler's version text and jaxlib's version."""
    from kaun_ir.runtime.xla import backend  # noqa: PLC0415 - jaxlib loads only when a kernel is built

    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update(source.read_bytes())
    version = subprocess.run([cxx, "--version"], capture_output=True, timeout=60, check=False).stdout
    for part in (" ".join(FLAGS).encode(), cxx.encode(), version, backend.jaxlib_version().encode()):
        digest.update(b"\0" + part)
    return digest.hexdigest()[:16]


def _build(cxx: str, path: Path) -> None:
    """Compile the sources into ``path`` (written under a temporary name, then renamed)."""
    from kaun_ir.runtime.xla import ffi  # noqa: PLC0415 - jaxlib loads only when a kernel is built

    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    command = [cxx, *FLAGS, "-I", ffi.include_dir(), *map(str, SOURCES), "-o", str(temporary)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise OSError(f"{cxx} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _load(path: Path) -> ctypes.CDLL:
    library = ctypes.CDLL(str(path))
    for symbol in HANDLERS.values():
        getattr(library, symbol)  # AttributeError: not our library
    return library


def _open() -> dict[str, str]:
    """Build (or find) the library, load it and register its handlers; the targets by kernel."""
    from kaun_ir.runtime.xla import ffi  # noqa: PLC0415 - jaxlib loads only when a kernel is built

    global _reason
    cxx = compiler()
    if cxx is None:
        _reason = "no C++ compiler found ($CXX, c++, g++, clang++)"
        return {}
    key = library_key(cxx)
    path = cache_dir() / f"kaun_ir_kernels-{key}.so"
    try:
        if not path.exists():
            _build(cxx, path)
        try:
            library = _load(path)
        except (OSError, AttributeError):  # a truncated or foreign file: build it again, once
            path.unlink(missing_ok=True)
            _build(cxx, path)
            library = _load(path)
        targets = {}
        for kernel, symbol in HANDLERS.items():
            target = f"kaun_ir_{kernel}_{key}"
            if target not in _registered:
                ffi.register_cpu_target(target, getattr(library, symbol))
                _registered.add(target)
            targets[kernel] = target
    except Exception as err:  # any failure means the plain StableHLO, never an error for the user
        _reason = f"kernel library unavailable: {type(err).__name__}: {err}"
        return {}
    _reason = f"loaded {path}"
    return targets


def targets(platform: str) -> dict[str, str]:
    """Kernel name -> registered custom-call target, for a module compiled for ``platform``
    (empty off the CPU, with ``KAUN_IR_KERNELS=0``, or when the library cannot be had)."""
    global _loaded, _reason
    if platform != "cpu":
        return {}
    if not enabled():
        _reason = f"{ENV}={os.environ.get(ENV)!r} turns kernels off"
        return {}
    if _loaded is None:
        with _lock:
            if _loaded is None:
                _loaded = _open()
    return dict(_loaded)


def status() -> str:
    """Why kernels are (or are not) in use, after the last :func:`targets` call."""
    return _reason


def reset() -> None:
    """Forget the outcome of the last attempt, so the next :func:`targets` call tries again
    (after changing the compiler or the cache folder; registered targets stay registered)."""
    global _loaded, _reason
    with _lock:
        _loaded = None
        _reason = "not tried yet"
