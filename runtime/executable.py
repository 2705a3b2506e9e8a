"""Compiled executables: a graph lowered and XLA-compiled (through ``xla_cache.compile_mlir``,
which caches the XLA program), run on arrays."""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import CompileError
from kaun_ir.ir.core import Graph, TensorType
from kaun_ir.runtime import finite, malloc_tuning, stages
from kaun_ir.runtime.lower import lower
from kaun_ir.runtime.mesh import REPLICATED, as_spec, check_graph_mesh, constraint_meshes, mesh_of_axes
from kaun_ir.runtime.xla import backend, compiler, shardings, transfer
from kaun_ir.runtime.xla_cache import compile_mlir

# every executable alive, so that a profile can name the kernels of the ones that ran
_LIVE: weakref.WeakSet = weakref.WeakSet()


def live_executables() -> list:
    """The :class:`Executable` objects that exist now (a profile maps its kernels through them)."""
    return list(_LIVE)


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
        self.graph = graph
        self.donate = tuple(sorted(set(donate)))
        self.pipeline = pipeline
        self._types = [(v.type.shape, v.type.dtype) for v in graph.inputs]
        _LIVE.add(self)
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
            self.device = _check_device(device) if device is not None else backend.default_device()
            self.in_specs = self.out_specs = None
            self.sharding = shardings.single_device_sharding(self.device)
            checking = finite.enabled()  # kn.debug.check_finite / KAUN_IR_CHECK_FINITE
            if checking:
                self.donate = ()  # the located re-run needs the arguments intact
                compiled = finite.checked_graph(graph)
                out_types = [(v.type.shape, v.type.dtype) for v in compiled.outputs]
            with stages.stage("lower"):
                self.mlir = lower(compiled if checking else graph, donate=self.donate)
            self.loaded = compile_mlir(self.mlir, self.device, pipeline)
            #: ``run(device_arrays) -> list``: the dispatch path, built once (see :func:`compiler.executor`)
            self.run = _moving_devices(compiler.executor(self.loaded, out_types, self.device), self.device)
            if checking:
                self.run = finite.checked_run(self.run, graph, self._build_unchecked)
            if self.device.platform == "cpu":  # last: a warning raised as an error leaves it whole
                malloc_tuning.note_compiled(self.memory_analysis)
            return
        check_graph_mesh(graph, mesh)
        self.device = mesh.device_list[0]
        self.in_specs = self._checked(in_specs, graph.inputs, "input", REPLICATED)
        asked = self._checked(out_specs, graph.outputs, "output", None)
        with stages.stage("lower"):
            self.mlir = lower(graph, donate=self.donate, mesh=mesh, in_specs=self.in_specs, out_specs=asked)
        self.loaded = compile_mlir(self.mlir, self.device, pipeline, devices=mesh.device_list)
        chosen = shardings.output_specs(self.loaded, mesh, [len(t[0]) for t in out_types])
        for i, (want, got) in enumerate(zip(asked, chosen)):
            if want is None and got is None:
                raise CompileError(
                    f"@{graph.name}: XLA laid out output {i} in a way no partition spec "
                    f"on {mesh} describes; give its out_shardings"
                )
        self.out_specs = [want if want is not None else got for want, got in zip(asked, chosen)]
        self.in_shardings = [shardings.named_sharding(mesh, s) for s in self.in_specs]
        self.out_shardings = [shardings.named_sharding(mesh, s) for s in self.out_specs]
        self.run = compiler.partitioned_executor(self.loaded, out_types, self.out_shardings)

    def _build_unchecked(self, graph: Graph):
        """The run function of another graph compiled for this device (no checks, no donation)."""
        loaded = compile_mlir(lower(graph), self.device, self.pipeline)
        out_types = [(v.type.shape, v.type.dtype) for v in graph.outputs]
        return _moving_devices(compiler.executor(loaded, out_types, self.device), self.device)

    def _checked(self, specs, values, what: str, default) -> list:
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
            return transfer.to_device(array, dtype, self.device)
        return transfer.put_sharded(array, dtype, self.in_shardings[i])

    def hlo_text(self) -> str:
        """XLA's optimised HLO of this executable."""
        return compiler.hlo_text(self.loaded)

    def memory_analysis(self) -> dict | None:
        """XLA's memory estimate in bytes (``argument``, ``output``, ``temp``, ``alias``,
        ``total_bytes``); None where the platform keeps none."""
        return compiler.memory_analysis(self.loaded)

    def cost_analysis(self) -> dict:
        """XLA's cost estimate (``flops``, ``bytes accessed``, ...)."""
        return compiler.cost_analysis(self.loaded)


def _check_device(device):
    """``device`` if it is a device of this process's backend, else a clear error listing the
    devices there are (an int, a string, another backend's device)."""
    local = backend.local_devices()
    if any(device is d or device == d for d in local):
        return device
    names = ", ".join(str(d) for d in local)
    if not hasattr(device, "platform"):
        raise TypeError(
            f"device={device!r} is not a device: pass one of kn.runtime.devices() "
            f"(this process drives {len(local)}: {names}), e.g. device=kn.runtime.devices()[0]"
        )
    raise ValueError(f"device={device} is not one this process drives; the available devices are: {names}")


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
                if not transfer.is_device_array(a) or a.devices() == {device}
                else transfer.to_device(a, a.dtype, device)
                for a in arrays
            ]
            if all(a is b for a, b in zip(moved, arrays)):
                raise
        return run(moved)

    return guarded
