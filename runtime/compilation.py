"""The one home of compilation and dispatch: every cache from a Python function (or a single op)
to a running XLA executable, device placement, and the steps between.

A compilation runs: trace (``kaun_ir.surface.trace``) -> pass pipeline (``runtime.pipelines`` picks the
per-backend default) -> lowering to StableHLO (``runtime.lower``) -> XLA compile (through the
persistent ``runtime.disk_cache`` when it is on) -> a :class:`~kaun_ir.runtime.dispatch.Route`
that places the arguments on the device and runs. Each step reports to ``runtime.stages``.
With an IREE backend (``backend="iree"``, ``KAUN_IR_BACKEND=iree-cpu``: ``runtime.backends``) the
last steps are IREE's instead (``runtime.iree``: its compile, cached in the process and in the
same persistent cache, and its runtime), behind the same route.

The caches, and what keys them (a key holds everything that changes the compiled result, so a
hit is never stale):

- XLA executables (:func:`compile_mlir`, kept in ``runtime.xla_cache``, one per process):
  SHA-256 of the StableHLO text (which already holds the pipeline's work, donation, shardings
  and the finite-check probe), whether the program is partitioned, and platform and id of every
  device it runs on;
- the persistent cache on disk (``runtime.disk_cache``, on unless ``KAUN_IR_CACHE_DIR=off``):
  the same, plus the serialised compile options, device kinds, the host CPU, jaxlib / XLA
  versions and ``XLA_FLAGS``;
- per ``kn.jit`` function, a :class:`FunctionCache`: routes by call signature (tree structure,
  shape and dtype of every array leaf, value of every static leaf, layout on the mesh), and
  its ``routes`` (a ``RouteCache``) by the keys of the fast paths (``kn.jit``'s
  ``(type, shape, dtype)`` per argument, ``train``'s state token and batch signature);
- single ops run outside a trace (``kn.add(x, y)`` on arrays), :func:`run_op`: op, attributes,
  operand types, regions, device and whether finite checking is on;
- :func:`shared`: the ``kn.jit`` functions the library itself keeps for the whole process
  (``optim.step`` / ``optim.update`` on arrays, text generation), by a key the caller names.

``kn.train`` keeps its compiled steps per trainer (``train.TrainerCache``), as ``kn.jit``
functions whose routes live in their :class:`FunctionCache`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from kaun_ir import passes
from kaun_ir.ir.builder import infer_or_raise
from kaun_ir.ir.core import Graph, Node
from kaun_ir.runtime import backends, finite, gc_pause, graph_cache, stages
from kaun_ir.runtime.dispatch import Route, RouteCache
from kaun_ir.runtime.executable import Executable
from kaun_ir.runtime.mesh import use
from kaun_ir.runtime.xla import backend, transfer
from kaun_ir.runtime.xla_cache import compile_mlir, fingerprint, stats
from kaun_ir.surface.tensor import type_of
from kaun_ir.surface.trace import trace_flat

__all__ = [
    "FunctionCache",
    "array_types",
    "compile_graph",
    "compile_function",
    "compile_mlir",
    "default_device",
    "fingerprint",
    "is_device_array",
    "put",
    "run_op",
    "shared",
    "stats",
]


def compile_graph(
    graph,
    device=None,
    donate: Sequence[int] = (),
    pipeline: str = "",
    mesh=None,
    in_specs: Sequence | None = None,
    out_specs: Sequence | None = None,
    backend: str | None = None,
):
    """Lower and XLA-compile ``graph`` into an :class:`~kaun_ir.runtime.Executable` (the XLA
    program is shared by every graph with the same StableHLO and devices).

    ``device``: the device to run on (default: the first). ``mesh`` (a ``kn.sharding.mesh``):
    partition over the mesh instead, with ``in_specs`` / ``out_specs`` one partition spec (or
    None) per graph input / output: inputs default to replicated, outputs to XLA's choice.
    ``backend``: ``"xla"``, ``"iree"``, ``"iree-cpu"``... (``kaun_ir.runtime.backends``; None:
    ``$KAUN_IR_BACKEND``, else XLA); an IREE backend gives an ``IreeExecutable``."""
    backend = backends.resolve(backend)
    if backends.is_iree(backend):
        from kaun_ir.runtime.iree.executable import IreeExecutable  # noqa: PLC0415 - IREE is optional

        return IreeExecutable(graph, backend, donate=donate, pipeline=pipeline, mesh=mesh)
    return Executable(
        graph,
        device=device,
        donate=donate,
        pipeline=pipeline,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
    )


# ---------------------------------------------------------------------------- device placement


def default_device():
    """The device computations run on when none is named (the first this process drives)."""
    return backend.default_device()


def array_types() -> tuple[type, ...]:
    """The array classes a route takes as they are: (``np.ndarray``, the device array class)."""
    return transfer.array_types()


def is_device_array(x: Any) -> bool:
    """Whether ``x`` is already a device array (``jax.Array``)."""
    return transfer.is_device_array(x)


def put(x: Any, dtype, device=None):
    """``x`` as a device array of ``dtype`` on ``device`` (default: a device array stays on its
    own device, anything else goes to :func:`default_device`)."""
    if device is None:
        device = next(iter(x.devices())) if transfer.is_device_array(x) else backend.default_device()
    return transfer.to_device(x, dtype, device)


# ------------------------------------------------------------------ functions (``kn.jit``)


class FunctionCache:
    """The compiled routes of one function, by call signature, each compiled by exactly one
    thread (other signatures compile in parallel; callers of a signature being compiled wait).

    ``routes`` is the function's :class:`RouteCache` of fast-path keys; ``trace_count`` counts
    traces (one per compiled signature)."""

    __slots__ = ("by_signature", "routes", "trace_count", "_lock", "_compiling")

    def __init__(self):
        self.by_signature: dict[Any, Route] = {}
        self.routes = RouteCache()
        self.trace_count = 0
        self._lock = threading.Lock()
        self._compiling: dict[Any, threading.Lock] = {}

    def get(self, key: Any) -> Route | None:
        """The route cached for ``key``, or None."""
        return self.by_signature.get(key)

    def entry(self, key: Any, build: Callable[[], Route]) -> Route:
        """The route of ``key``, made by ``build()`` the first time."""
        route = self.by_signature.get(key)
        if route is not None:
            return route
        with self._lock:
            lock = self._compiling.setdefault(key, threading.Lock())
        try:
            with lock:
                route = self.by_signature.get(key)
                if route is None:
                    route = self.by_signature[key] = build()
        finally:
            with self._lock:
                self._compiling.pop(key, None)
        return route

    def count_trace(self) -> None:
        """One more trace of the function (called once its trace has finished)."""
        with self._lock:
            self.trace_count += 1

    def signatures(self) -> list:
        """The signatures compiled so far, oldest first."""
        return list(self.by_signature)

    def values(self) -> list[Route]:
        """The routes compiled so far, oldest first."""
        return list(self.by_signature.values())


def compile_function(
    f: Callable,
    args: tuple,
    kwargs: dict,
    pipeline,
    *,
    device=None,
    mesh=None,
    donated_positions: Callable[[list], list[int]] | None = None,
    shardings: Callable[[Any, int, int], dict] | None = None,
    cache: FunctionCache | None = None,
    backend: str | None = None,
) -> Route:
    """Trace ``f(*args, **kwargs)``, run ``pipeline`` (a ``kn.passes.Pipeline`` or its text) on
    the graph, lower, compile: the route of this call signature. ``donated_positions(array
    positions) -> flat input indices`` picks the inputs XLA may reuse; ``shardings(traced,
    n_inputs, n_outputs)`` gives the partition specs of the graph's inputs and outputs on
    ``mesh``; ``cache`` (the function's) counts the trace; ``backend``: see :func:`compile_graph`."""
    parsed = passes.Pipeline.parse(pipeline)  # unknown passes fail before tracing
    # the collector's sweeps of the growing graphs cost more the larger the model (gc_pause)
    with gc_pause.paused():
        with use(mesh), stages.stage("trace") as nodes:  # constraints refer to the mesh compiled for
            traced = trace_flat(f, args, kwargs)
            nodes[0] = len(traced.graph.nodes)
        if cache is not None:
            cache.count_trace()
        # the passes' result comes from disk when the persistent cache holds it (graph_cache)
        instrumentations = stages.pass_instrumentations()
        graph = graph_cache.run_pipeline(traced.graph, parsed, instrumentations) if parsed else traced.graph
        donate = donated_positions(traced.array_positions) if donated_positions else []
        specs = shardings(traced, len(graph.inputs), len(graph.outputs)) if mesh is not None else {}
        exe = compile_graph(
            graph, device=device, donate=donate, pipeline=str(parsed), mesh=mesh, backend=backend, **specs
        )
    return Route(exe, traced.out_treedef, [v.type.dtype for v in graph.inputs])


# --------------------------------------------------------------- single ops outside a trace

_OPS: dict[tuple, Any] = {}


def run_op(opdef, operands: Sequence, attrs: dict, regions: tuple) -> list:
    """Run one primitive on concrete operands (the eager path of ``kaun_ir.surface.tensor.apply``),
    compiled once per op signature; returns device arrays."""
    types = [type_of(x) for x in operands]
    attrs = opdef.check_attrs(attrs)
    checked = finite.enabled()
    device = backend.default_device()
    key = (
        opdef.name,
        tuple(sorted(attrs.items())),
        tuple(types),
        tuple(r.text() for r in regions),
        device,
        checked,
    )
    exe = _OPS.get(key)
    if exe is None:
        out_types = infer_or_raise(opdef, types, attrs, "", regions)
        args = Graph.arguments(types)
        node = Node(opdef.name, args, attrs, out_types, regions)
        exe = compile_graph(Graph(args, node.outputs, [node], name=opdef.name), device=device)
        _OPS[key] = exe
    return list(exe(*operands))


# ------------------------------------------------------- the library's own compiled functions

_SHARED: dict[Any, Any] = {}
_SHARED_LOCK = threading.Lock()


def shared(key: Any, make: Callable[[], Any]) -> Any:
    """The process-wide compiled function(s) the library files under ``key`` (a tuple whose first
    element names the caller, e.g. ``("optim", "step")``), made by ``make()`` on first use."""
    found = _SHARED.get(key)
    if found is None:
        with _SHARED_LOCK:
            found = _SHARED.get(key)
            if found is None:
                found = _SHARED[key] = make()
    return found


def shared_items(owner: str) -> list[tuple[Any, Any]]:
    """``(key, functions)`` of every entry :func:`shared` holds for ``owner``."""
    return [(key, value) for key, value in list(_SHARED.items()) if key[0] == owner]
