"""A kaun_ir graph as a ``jax.export.Exported``: JAX itself can call, ``jax.jit``, serialise and
reload a kaun_ir model (the interchange object of JAX's own export API).

    exported = kn.runtime.to_jax_export(graph)
    exported.call(x, y)                    # inside or outside jax.jit
    blob = exported.serialize()            # needs the `flatbuffers` package
    jax.export.deserialize(blob).call(x, y)

The ``Exported`` carries the graph as a portable StableHLO artifact (CHLO legalised, see
:func:`kaun_ir.runtime.xla.mlir.serialize_portable`); its arguments are the graph's inputs in
order, as one flat tuple, and its results the graph's outputs as a tuple. The record itself is
built by the jaxlib adapter (:mod:`kaun_ir.runtime.xla.export`).
"""

from __future__ import annotations

from kaun_ir.ir.core import Graph
from kaun_ir.runtime.lower import lower
from kaun_ir.runtime.xla import backend, export, mlir

# jax.export names for the platforms of kaun_ir's backends
_PLATFORMS = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda", "rocm": "rocm", "tpu": "tpu"}


def to_jax_export(graph: Graph, platform: str | None = None):
    """``jax.export.Exported`` of ``graph`` for ``platform`` (cpu/cuda/rocm/tpu; default: the
    backend in use). The artifact is compiled only when JAX calls it."""
    platform = _PLATFORMS.get(platform or backend.backend_name(), platform)
    return export.exported(
        graph.name,
        [(v.type.shape, v.type.dtype) for v in graph.inputs],
        [(v.type.shape, v.type.dtype) for v in graph.outputs],
        platform,
        mlir.serialize_portable(lower(graph)),
    )
