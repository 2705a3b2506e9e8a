""":class:`IreeExecutable`: a graph lowered to StableHLO (as for XLA) and compiled by IREE.

It answers to what :class:`kaun_ir.runtime.dispatch.Route`, ``kn.jit`` and ``kn.train`` ask of an
executable (``run``, ``put``, ``graph``, ``mlir``, ``device``, ``mesh``, ``donate``, ``pipeline``).
Arguments go in as NumPy arrays (device arrays are copied to the host) and results come back as
NumPy arrays. What IREE cannot take is refused before compiling (:func:`check_supported`), with a
:class:`kaun_ir.errors.BackendError` naming the op or feature and the backend.
"""

from __future__ import annotations

import numpy as np

from kaun_ir.errors import BackendError
from kaun_ir.ir.core import Graph
from kaun_ir.ir.provenance import backward_op, describe
from kaun_ir.passes.check_finite import Site
from kaun_ir.runtime import finite, stages
from kaun_ir.runtime.iree import compiler
from kaun_ir.runtime.iree.scatter_guard import guard_scatters
from kaun_ir.runtime.lower import lower

__all__ = ["REFUSED_F64_ON_CPU", "REFUSED_OPS", "IreeExecutable", "check_supported", "describe_node"]

#: ops an IREE program may not hold, with the reason (docs/performance.md, "IREE")
REFUSED_OPS = {
    "sharding_constraint": "sharded programs run on XLA only (kaun_ir partitions through XLA's "
    "SPMD partitioner, which IREE's compiler does not take)",
    "triangular_solve": "IREE 3.13 does not legalise stablehlo.triangular_solve",
    "select_and_scatter_add": "IREE 3.13 does not legalise stablehlo.select_and_scatter "
    "(max-pooling's gradient; the lower-pool pass rewrites pooling without it)",
}
#: ops IREE's CPU target cannot link in float64 (no f64 libm: sin, cos, tanh, atan2, fmod; cbrt
#: is not legalised), with the reason
REFUSED_F64_ON_CPU = {
    **dict.fromkeys(
        ("sine", "cosine", "tan", "tanh", "atan2", "remainder"),
        "IREE's CPU code links no float64 math library (undefined symbol at link time)",
    ),
    "cbrt": "IREE 3.13 does not legalise math.cbrt on float64",
}


def describe_node(node) -> str:
    """``node`` for a message: its op, forward or backward pass, layer path and source line."""
    return Site(node.op, node.path, describe(node) or "", backward_op(node)).describe()


def check_supported(graph: Graph, backend: str, mesh=None) -> None:
    """``BackendError`` naming the first op or feature of ``graph`` IREE cannot run on ``backend``."""
    if mesh is not None:
        raise BackendError(
            f"backend={backend!r}: @{graph.name} is partitioned over a device mesh ({mesh}); "
            "sharded programs run on XLA only: drop mesh= or use backend='xla'"
        )
    for node in graph.walk():
        reason = REFUSED_OPS.get(node.op)
        if reason is None and backend == "iree-cpu" and node.op in REFUSED_F64_ON_CPU:
            if any(np.dtype(v.type.dtype) == np.float64 for v in (*node.inputs, *node.outputs)):
                reason = f"{REFUSED_F64_ON_CPU[node.op]}; compute it in float32"
        if reason is not None:
            raise BackendError(
                f"backend={backend!r}: @{graph.name} holds {describe_node(node)}, "
                f"which IREE cannot run: {reason}; use backend='xla'"
            )


class IreeExecutable:
    """``graph`` compiled by IREE for ``backend`` (``"iree-cpu"``, ...); ``exe(*arrays)`` returns
    a tuple of NumPy arrays. ``donate`` is always empty: IREE gets copies of host arrays, so no
    caller's buffer is ever reused (``donate_argnums`` is accepted and has no effect)."""

    mesh = None
    in_specs = out_specs = None

    def __init__(self, graph: Graph, backend: str, donate=(), pipeline: str = "", mesh=None):
        check_supported(graph, backend, mesh)
        self.graph, self.backend, self.pipeline = graph, backend, pipeline
        self.donate = ()
        self.requested_donate = tuple(sorted(set(donate)))
        self._dtypes = [np.dtype(v.type.dtype) for v in graph.inputs]
        self.device = compiler.IreeDevice(backend, compiler.IREE_BACKENDS[backend][0])
        checking = finite.enabled()
        compiled = guard_scatters(finite.checked_graph(graph) if checking else graph)
        with stages.stage("lower"):
            self.mlir = lower(compiled)
        self.program = compiler.compile_program(self.mlir, backend, pipeline)
        self.run = self.program
        if checking:
            self.run = finite.checked_run(self.run, graph, self._build_unchecked)

    def _build_unchecked(self, graph: Graph):
        return compiler.compile_program(lower(guard_scatters(graph)), self.backend, self.pipeline)

    def put(self, i: int, array) -> np.ndarray:
        """Input ``i`` as the host array IREE takes."""
        return np.asarray(array, dtype=self._dtypes[i])

    def __call__(self, *arrays) -> tuple:
        if len(arrays) != len(self._dtypes):
            raise TypeError(
                f"IREE executable for @{self.graph.name} takes {len(self._dtypes)} argument(s), "
                f"got {len(arrays)}"
            )
        for i, (array, value) in enumerate(zip(arrays, self.graph.inputs)):
            given = getattr(array, "dtype", None)
            if tuple(np.shape(array)) != value.type.shape or (given is not None and given != self._dtypes[i]):
                raise TypeError(
                    f"argument {i}: expected {value.type}, got {getattr(given, 'name', given)} "
                    f"of shape {tuple(np.shape(array))}"
                )
        return tuple(self.run([self.put(i, a) for i, a in enumerate(arrays)]))

    def hlo_text(self) -> str:
        """The StableHLO IREE compiled (IREE keeps no XLA HLO)."""
        return self.mlir

    def memory_analysis(self) -> None:
        """None: IREE keeps no memory statistics kaun_ir can read."""
        return None

    def cost_analysis(self) -> dict:
        """Empty: IREE publishes no cost estimate."""
        return {}
