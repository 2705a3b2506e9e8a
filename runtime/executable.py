"""Compiled executables: compile a graph once per (StableHLO text, device), run it on arrays."""

from __future__ import annotations

import hashlib
import os
from typing import Sequence

from kaun_ir.errors import CompileError
from kaun_ir.fileio import atomic_write, repro_dir
from kaun_ir.ir.core import Graph

from . import xla
from .lower import lower

_CACHE: dict[str, object] = {}


class Stats:
    """Counters for tests and benchmarks: how many XLA compilations happened in this process."""

    compiles = 0
    cache_hits = 0


stats = Stats()


def fingerprint(mlir_text: str, device) -> str:
    digest = hashlib.sha256(mlir_text.encode())
    digest.update(f"|{device.platform}:{device.id}".encode())
    return digest.hexdigest()


def compile_mlir(mlir_text: str, device, pipeline: str = "") -> object:
    """XLA-compile StableHLO text for ``device``, cached by fingerprint; CompileError on failure."""
    key = fingerprint(mlir_text, device)
    loaded = _CACHE.get(key)
    if loaded is not None:
        stats.cache_hits += 1
        return loaded
    try:
        loaded = xla.compile(mlir_text, device)
    except Exception as err:  # jaxlib raises its own XlaRuntimeError / ValueError types
        path = os.path.join(repro_dir(), f"{key[:16]}.mlir")
        header = f"// kaun_ir compile failure repro\n// pipeline: {pipeline or '(none)'}\n" \
                 f"// device: {device.platform}\n// error: {str(err).splitlines()[0] if str(err) else err!r}\n"
        atomic_write(path, header + mlir_text)
        raise CompileError(f"XLA could not compile the module ({type(err).__name__}: "
                           f"{str(err).splitlines()[0] if str(err) else ''}); "
                           f"StableHLO written to {path}") from None
    stats.compiles += 1
    _CACHE[key] = loaded
    return loaded


class Executable:
    """A graph compiled for one device. ``exe(*arrays)`` returns a tuple of ``jax.Array``.

    Attributes: ``graph``, ``mlir`` (StableHLO text), ``device``, ``donate`` (donated input
    indices), ``pipeline`` (the pass pipeline that produced ``graph``, if any).
    """

    def __init__(self, graph: Graph, device=None, donate: Sequence[int] = (), pipeline: str = ""):
        self.graph = graph
        self.device = device if device is not None else xla.default_device()
        self.donate = tuple(sorted(set(donate)))
        self.pipeline = pipeline
        self.mlir = lower(graph, donate=self.donate)
        self.loaded = compile_mlir(self.mlir, self.device, pipeline)
        self._types = [(v.type.shape, v.type.dtype) for v in graph.inputs]
        #: ``run(device_arrays) -> list``: the dispatch path, built once (see :func:`xla.executor`)
        self.run = xla.executor(self.loaded, [(v.type.shape, v.type.dtype) for v in graph.outputs],
                                self.device)

    def __call__(self, *arrays) -> tuple:
        if len(arrays) != len(self._types):
            raise TypeError(f"executable for @{self.graph.name} takes {len(self._types)} "
                            f"argument(s), got {len(arrays)}")
        device_arrays = []
        for i, (array, (shape, dtype)) in enumerate(zip(arrays, self._types)):
            got = getattr(array, "shape", None)
            if got is None:
                import numpy as np

                got = np.shape(array)
            if tuple(got) != shape:
                raise TypeError(f"argument {i}: expected shape {shape} ({self.graph.inputs[i].type}), "
                                f"got {tuple(got)}")
            device_arrays.append(xla.to_device(array, dtype, self.device))
        return tuple(self.run(device_arrays))

    def hlo_text(self) -> str:
        """XLA's optimised HLO of this executable."""
        return xla.hlo_text(self.loaded)

    def memory_analysis(self) -> dict | None:
        """XLA's memory estimate in bytes (``argument``, ``output``, ``temp``, ``alias``,
        ``total_bytes``); None where the platform keeps none."""
        return xla.memory_analysis(self.loaded)

    def cost_analysis(self) -> dict:
        """XLA's cost estimate (``flops``, ``bytes accessed``, ...)."""
        return xla.cost_analysis(self.loaded)


def compile(graph: Graph, device=None, donate: Sequence[int] = (), pipeline: str = "") -> Executable:
    """Lower and XLA-compile ``graph`` (cached by StableHLO fingerprint + device)."""
    return Executable(graph, device=device, donate=donate, pipeline=pipeline)
