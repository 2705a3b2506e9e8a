"""Compiled executables: compile a graph once per (StableHLO text, device), run it on arrays."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence

from kaun_ir import dtypes
from kaun_ir.errors import CompileError
from kaun_ir.fileio import atomic_write, repro_dir
from kaun_ir.ir.core import Graph, TensorType

from . import disk_cache, finite, stages, xla
from .lower import lower

_CACHE: dict[str, object] = {}


class Stats:
    """Counters for tests and benchmarks: how many XLA compilations happened in this process."""

    compiles = 0
    cache_hits = 0


stats = Stats()


def fingerprint(mlir_text: str, device, devices: Sequence = ()) -> str:
    digest = hashlib.sha256(mlir_text.encode())
    for d in devices or (device,):
        digest.update(f"|{d.platform}:{d.id}".encode())
    return digest.hexdigest()


def compile_mlir(mlir_text: str, device, pipeline: str = "", devices: Sequence = ()) -> object:
    """XLA-compile StableHLO text for ``device`` (or, partitioned, for ``devices`` in mesh order),
    cached by fingerprint; CompileError on failure."""
    key = fingerprint(mlir_text, device, devices)
    loaded = _CACHE.get(key)
    if loaded is not None:
        stats.cache_hits += 1
        return loaded
    hits = disk_cache.counters.hits
    start = time.perf_counter()
    try:
        loaded = xla.compile_partitioned(mlir_text, devices) if devices else xla.compile(mlir_text, device)
    except Exception as err:  # jaxlib raises its own XlaRuntimeError / ValueError types
        path = os.path.join(repro_dir(), f"{key[:16]}.mlir")
        header = (
            f"// kaun_ir compile failure repro\n// pipeline: {pipeline or '(none)'}\n"
            f"// device: {device.platform}\n// error: {str(err).splitlines()[0] if str(err) else err!r}\n"
        )
        atomic_write(path, header + mlir_text)
        raise CompileError(
            f"XLA could not compile the module ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); "
            f"StableHLO written to {path}"
        ) from None
    stages.add("xla-load" if disk_cache.counters.hits > hits else "xla-compile", time.perf_counter() - start)
    stats.compiles += 1
    _CACHE[key] = loaded
    return loaded


class Executable:
    """A graph compiled for one device, or partitioned over a device mesh. ``exe(*arrays)``
    returns a tuple of ``jax.Array`` (global arrays laid out as ``out_specs`` on a mesh).

    Attributes: ``graph``, ``mlir`` (StableHLO text), ``device`` (the first device of the mesh
    when partitioned), ``mesh`` (None for one device), ``in_specs`` / ``out_specs`` (one
    ``Spec`` per input / output when partitioned), ``donate`` (donated input indices),
    ``pipeline`` (the pass pipeline that produced ``graph``, if any).

    A graph holding ``sharding_constraint`` ops and given no mesh is compiled for the mesh its
    constraints name, built from the first devices of the backend.
    """

    def __init__(
        self,
        graph: Graph,
        device=None,
        donate: Sequence[int] = (),
        pipeline: str = "",
        mesh=None,
        in_specs: Sequence | None = None,
        out_specs: Sequence | None = None,
    ):
        from .mesh import REPLICATED, check_graph_mesh, constraint_meshes, mesh_of_axes

        self.graph = graph
        self.donate = tuple(sorted(set(donate)))
        self.pipeline = pipeline
        self._types = [(v.type.shape, v.type.dtype) for v in graph.inputs]
        out_types = [(v.type.shape, v.type.dtype) for v in graph.outputs]
        if mesh is None:
            meshes = constraint_meshes(graph)
            if len(meshes) > 1:
                raise ValueError(
                    f"@{graph.name}: sharding constraints name different meshes "
                    f"{[dict(m) for m in meshes]}; one function is partitioned over one mesh"
                )
            if meshes:
                mesh = mesh_of_axes(next(iter(meshes)))
        if device is not None and mesh is not None:
            raise ValueError("give either device= or mesh=, not both")
        self.mesh = mesh
        if mesh is None:
            self.device = device if device is not None else xla.default_device()
            self.in_specs = self.out_specs = None
            self.sharding = xla.single_device_sharding(self.device)
            checking = finite.enabled()  # kn.debug.check_finite / KAUN_IR_CHECK_FINITE
            if checking:
                self.donate = ()  # the located re-run needs the arguments intact
                compiled = finite.checked_graph(graph)
                out_types = [(v.type.shape, v.type.dtype) for v in compiled.outputs]
            with stages.stage("lower"):
                self.mlir = lower(compiled if checking else graph, donate=self.donate)
            self.loaded = compile_mlir(self.mlir, self.device, pipeline)
            #: ``run(device_arrays) -> list``: the dispatch path, built once (see :func:`xla.executor`)
            self.run = _moving_devices(xla.executor(self.loaded, out_types, self.device), self.device)
            if checking:
                self.run = finite.checked_run(self.run, graph, self._build_unchecked)
            return
        check_graph_mesh(graph, mesh)
        self.device = mesh.device_list[0]
        self.in_specs = self._checked(in_specs, graph.inputs, "input", REPLICATED)
        asked = self._checked(out_specs, graph.outputs, "output", None)
        with stages.stage("lower"):
            self.mlir = lower(graph, donate=self.donate, mesh=mesh, in_specs=self.in_specs, out_specs=asked)
        self.loaded = compile_mlir(self.mlir, self.device, pipeline, devices=mesh.device_list)
        chosen = xla.output_specs(self.loaded, mesh, [len(t[0]) for t in out_types])
        for i, (want, got) in enumerate(zip(asked, chosen)):
            if want is None and got is None:
                raise CompileError(
                    f"@{graph.name}: XLA laid out output {i} in a way no partition spec "
                    f"on {mesh} describes; give its out_shardings"
                )
        self.out_specs = [want if want is not None else got for want, got in zip(asked, chosen)]
        self.in_shardings = [xla.named_sharding(mesh, s) for s in self.in_specs]
        self.out_shardings = [xla.named_sharding(mesh, s) for s in self.out_specs]
        self.run = xla.partitioned_executor(self.loaded, out_types, self.out_shardings)

    def _build_unchecked(self, graph: Graph):
        """The run function of another graph compiled for this device (no checks, no donation)."""
        loaded = compile_mlir(lower(graph), self.device, self.pipeline)
        out_types = [(v.type.shape, v.type.dtype) for v in graph.outputs]
        return _moving_devices(xla.executor(loaded, out_types, self.device), self.device)

    def _checked(self, specs, values, what: str, default) -> list:
        from .mesh import as_spec

        if specs is None:
            return [default] * len(values)
        specs = list(specs)
        if len(specs) != len(values):
            raise ValueError(f"@{self.graph.name}: {len(specs)} {what} shardings for {len(values)} {what}s")
        out = []
        for i, (spec, value) in enumerate(zip(specs, values)):
            spec = default if spec is None else as_spec(spec)
            if spec is not None:
                self.mesh.check(value.type.shape, spec, f"@{self.graph.name} {what} {i} ({value.type})")
            out.append(spec)
        return out

    def __call__(self, *arrays) -> tuple:
        if len(arrays) != len(self._types):
            raise TypeError(
                f"executable for @{self.graph.name} takes {len(self._types)} argument(s), got {len(arrays)}"
            )
        device_arrays = []
        for i, (array, (shape, dtype)) in enumerate(zip(arrays, self._types)):
            got = getattr(array, "shape", None)
            if got is None:
                import numpy as np

                got = np.shape(array)
            if tuple(got) != shape:
                raise TypeError(
                    f"argument {i}: expected shape {shape} ({self.graph.inputs[i].type}), got {tuple(got)}"
                )
            given = getattr(array, "dtype", None)
            if given is not None and given != dtype:  # never a silent conversion, e.g. i32 -> f32
                raise TypeError(
                    f"argument {i}: expected {self.graph.inputs[i].type}, got "
                    f"{TensorType(dtypes.canonical(given), tuple(got))}"
                )
            device_arrays.append(self.put(i, array))
        return tuple(self.run(device_arrays))

    def put(self, i: int, array):
        """Input ``i`` as the device array this executable takes (moved or laid out as needed)."""
        dtype = self._types[i][1]
        if self.mesh is None:
            return xla.to_device(array, dtype, self.device)
        return xla.put_sharded(array, dtype, self.in_shardings[i])

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


def compile(
    graph: Graph,
    device=None,
    donate: Sequence[int] = (),
    pipeline: str = "",
    mesh=None,
    in_specs: Sequence | None = None,
    out_specs: Sequence | None = None,
) -> Executable:
    """Lower and XLA-compile ``graph`` (cached by StableHLO fingerprint + devices).

    ``device``: the device to run on (default: the first). ``mesh`` (a ``kn.sharding.mesh``):
    partition over the mesh instead, with ``in_specs`` / ``out_specs`` one partition spec (or
    None) per graph input / output: inputs default to replicated, outputs to XLA's choice."""
    return Executable(
        graph,
        device=device,
        donate=donate,
        pipeline=pipeline,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
    )


def _moving_devices(run, device):
    """``run`` that, when jaxlib refuses an argument living on another device (or sharded over
    several), moves such arguments to ``device`` and runs again. The check costs nothing on the
    common path: jaxlib rejects the call before executing, so nothing was donated."""

    def guarded(arrays: list) -> list:
        try:
            return run(arrays)
        except Exception:
            moved = [
                a
                if not xla.is_device_array(a) or a.devices() == {device}
                else xla.to_device(a, a.dtype, device)
                for a in arrays
            ]
            if all(a is b for a, b in zip(moved, arrays)):
                raise
        return run(moved)

    return guarded
