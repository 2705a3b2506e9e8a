"""IREE's compiler and runtime behind three functions and a class: :func:`available`,
:func:`version`, :func:`compile_program` (StableHLO text -> a loaded :class:`Program`, cached in the
process and on disk; ``program(arrays)`` takes and returns NumPy arrays)."""

from __future__ import annotations

import functools
import hashlib
import os
import time
from dataclasses import dataclass

import numpy as np

from kaun_ir.errors import BackendError, CompileError
from kaun_ir.fileio import write_repro
from kaun_ir.runtime import disk_cache, stages
from kaun_ir.runtime.iree import IREE_BACKENDS

__all__ = [
    "FLAGS_ENV",
    "IreeDevice",
    "Program",
    "available",
    "check_device",
    "compile_program",
    "flags",
    "version",
]

#: extra IREE compiler flags (space-separated), part of every cache key
FLAGS_ENV = "KAUN_IR_IREE_FLAGS"
#: target flags per compiler target: CPU code is generated for the host's own features (the disk
#: cache key records the host CPU, so a shared cache never serves code for another CPU)
_TARGET_FLAGS = {"llvm-cpu": ("--iree-llvmcpu-target-cpu=host", "--iree-input-demote-f64-to-f32=false")}
_INSTALL = "install the optional extra: pip install 'kaun-ir[iree]'"


@functools.cache
def available() -> bool:
    """Whether IREE's compiler and runtime can be imported."""
    try:
        import iree.compiler  # noqa: F401, PLC0415 - IREE is optional, loaded on first use
        import iree.runtime  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


@functools.cache
def version() -> str:
    """The installed IREE compiler and runtime versions, e.g. ``"3.13.0/3.13.0"``."""
    from importlib import metadata  # noqa: PLC0415 - only asked when IREE is used

    parts = []
    for package in ("iree-base-compiler", "iree-base-runtime"):
        try:
            parts.append(metadata.version(package))
        except metadata.PackageNotFoundError:
            parts.append("?")
    return "/".join(parts)


def _require(backend: str) -> None:
    if not available():
        raise BackendError(f"backend={backend!r} needs IREE, which is not installed: {_INSTALL}")


@dataclass(frozen=True)
class IreeDevice:
    """The device an IREE program runs on, as the cache key and error messages see it."""

    platform: str  # the backend name, e.g. "iree-cpu"
    device_kind: str  # the compiler target, e.g. "llvm-cpu"
    id: int = 0

    def __str__(self) -> str:
        return f"{self.platform}:{self.id}"


def flags(backend: str) -> tuple[str, ...]:
    """The compiler flags of ``backend``: its target's, then ``$KAUN_IR_IREE_FLAGS``."""
    target, _ = IREE_BACKENDS[backend]
    return _TARGET_FLAGS.get(target, ()) + tuple(os.environ.get(FLAGS_ENV, "").split())


@functools.cache
def _config(driver: str, backend: str):
    """The runtime configuration of ``driver`` (one per process), or a BackendError naming the
    backend when the driver finds no device."""
    _require(backend)
    import iree.runtime as ireert  # noqa: PLC0415 - IREE is optional, loaded on first use

    try:
        found = ireert.get_driver(driver).query_available_devices()
    except Exception as err:  # the driver's own error (no libcuda, no Vulkan loader)
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise BackendError(
            f"backend={backend!r}: IREE's {driver} driver is not usable here ({first})"
        ) from None
    if not found:
        raise BackendError(f"backend={backend!r}: IREE's {driver} driver finds no device on this machine")
    return ireert.Config(driver)


def check_device(backend: str) -> None:
    """``BackendError`` when IREE is missing or ``backend``'s driver finds no device."""
    _config(IREE_BACKENDS[backend][1], backend)


class Program:
    """A compiled IREE program, loaded: ``program(arrays) -> list`` of NumPy arrays.
    ``vmfb``: the VM flatbuffer; ``key``: its cache key."""

    def __init__(self, vmfb: bytes, backend: str, key: str):
        import iree.runtime as ireert  # noqa: PLC0415 - IREE is optional, loaded on first use

        self.vmfb, self.backend, self.key = vmfb, backend, key
        context = ireert.SystemContext(config=_config(IREE_BACKENDS[backend][1], backend))
        module = ireert.VmModule.copy_buffer(context.instance, vmfb)
        context.add_vm_module(module)
        self._context = context  # keeps the module alive
        self._main = context.modules[module.name]["main"]

    def __call__(self, arrays: list) -> list:
        outs = self._main(*arrays)
        if outs is None:
            return []
        if not isinstance(outs, tuple | list):
            outs = (outs,)
        return [out.to_host() if hasattr(out, "to_host") else np.asarray(out) for out in outs]


_PROGRAMS: dict[str, Program] = {}


def _key(text: str, backend: str) -> str:
    digest = hashlib.sha256(text.encode())
    for part in (backend, version(), *flags(backend)):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()


def compile_program(text: str, backend: str, pipeline: str = "") -> Program:
    """``text`` (StableHLO) compiled by IREE for ``backend`` and loaded; cached in the process by
    text, backend, IREE version and flags, and on disk by the persistent compilation cache (whose
    key adds the host CPU). ``CompileError`` naming a repro file when IREE refuses the module."""
    _require(backend)
    key = _key(text, backend)
    program = _PROGRAMS.get(key)
    if program is not None:
        return program
    target, driver = IREE_BACKENDS[backend]
    _config(driver, backend)  # no device: fail before compiling
    device = IreeDevice(backend, target)
    options = f"iree|{version()}|{target}|{' '.join(flags(backend))}".encode()
    hits = disk_cache.counters.hits
    start = time.perf_counter()
    vmfb = disk_cache.compile_cached(
        text,
        [device],
        options,
        lambda: _compile(text, backend, target, pipeline, key),
        bytes,
        bytes,
    )
    loaded = "iree-load" if disk_cache.counters.hits > hits else "iree-compile"
    program = _PROGRAMS[key] = Program(vmfb, backend, key)
    stages.add(loaded, time.perf_counter() - start)
    return program


def _compile(text: str, backend: str, target: str, pipeline: str, key: str) -> bytes:
    import iree.compiler as ireec  # noqa: PLC0415 - IREE is optional, loaded on first use

    try:
        return ireec.compile_str(
            text, input_type="stablehlo", target_backends=[target], extra_args=list(flags(backend))
        )
    except ireec.CompilerToolError as err:
        lines = [line for line in str(err).splitlines() if "error:" in line]
        first = lines[0].strip() if lines else (str(err).splitlines() or [type(err).__name__])[0]
        fields = {"pipeline": pipeline or "(none)", "backend": backend, "error": first}
        path = write_repro(f"iree-{key[:16]}.mlir", "kaun_ir IREE compile failure repro", fields, text)
        raise CompileError(
            f"IREE ({backend}) could not compile the module ({first}); StableHLO written to {path}"
        ) from None
