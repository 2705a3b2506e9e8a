"""XLA executables compiled from StableHLO text, one per program and device set per process.

:func:`compile_mlir` is the step every compilation ends with (``runtime.compilation`` for graphs
and functions, ``runtime.executable`` for an :class:`~kaun_ir.runtime.Executable`): keyed by
:func:`fingerprint`, it compiles through the persistent ``runtime.disk_cache`` when that is on
and writes a repro file when XLA refuses the module.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Sequence

from kaun_ir.errors import CompileError
from kaun_ir.fileio import write_repro
from kaun_ir.runtime import disk_cache, stages
from kaun_ir.runtime.xla import compiler

__all__ = ["Stats", "compile_mlir", "fingerprint", "stats"]


class Stats:
    """Counters for tests and benchmarks: how many XLA compilations happened in this process
    (``compiles``) and how many were answered by the in-process cache (``cache_hits``)."""

    compiles = 0
    cache_hits = 0


stats = Stats()

_EXECUTABLES: dict[str, object] = {}


def fingerprint(mlir_text: str, device, devices: Sequence = ()) -> str:
    """The in-process key of compiling ``mlir_text`` for ``device`` (or partitioned over ``devices``)."""
    digest = hashlib.sha256(mlir_text.encode())
    digest.update(b"|partitioned" if devices else b"|single")
    for d in devices or (device,):
        digest.update(f"|{d.platform}:{d.id}".encode())
    return digest.hexdigest()


_MODULE_NAME = re.compile(r"^module @([\w$.-]+)", re.MULTILINE)


def _unique_module_name(mlir_text: str, key: str) -> str:
    """``mlir_text`` with its module renamed ``@<name>_<key prefix>``. XLA names the compiled
    module, and every kernel event a profile records, by it: with one name per program text a
    profile maps each kernel to the executable it came from (see ``runtime/profiling.py``)
    instead of to whichever program of the same name is alive."""
    return _MODULE_NAME.sub(lambda m: f"module @{m.group(1)}_{key[:12]}", mlir_text, count=1)


def compile_mlir(mlir_text: str, device, pipeline: str = "", devices: Sequence = ()) -> object:
    """XLA-compile StableHLO text for ``device`` (or, partitioned, for ``devices`` in mesh order),
    cached by :func:`fingerprint`; ``CompileError`` naming a repro file on failure."""
    key = fingerprint(mlir_text, device, devices)
    loaded = _EXECUTABLES.get(key)
    if loaded is not None:
        stats.cache_hits += 1
        return loaded
    named = _unique_module_name(mlir_text, key)
    hits = disk_cache.counters.hits
    start = time.perf_counter()
    try:
        loaded = compiler.compile_partitioned(named, devices) if devices else compiler.compile(named, device)
    except Exception as err:  # jaxlib raises its own XlaRuntimeError / ValueError types
        first_line = str(err).splitlines()[0] if str(err) else ""
        fields = {
            "pipeline": pipeline or "(none)",
            "device": device.platform,
            "error": first_line or repr(err),
        }
        path = write_repro(f"{key[:16]}.mlir", "kaun_ir compile failure repro", fields, mlir_text)
        raise CompileError(
            f"XLA could not compile the module ({type(err).__name__}: {first_line}); "
            f"StableHLO written to {path}"
        ) from None
    stages.add("xla-load" if disk_cache.counters.hits > hits else "xla-compile", time.perf_counter() - start)
    stats.compiles += 1
    _EXECUTABLES[key] = loaded
    return loaded
