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

When every input and output is floating-point the ``Exported`` also carries its VJP, built by
kaun_ir's own autodiff (``gradient_graph`` with the output cotangents as inputs) and exported
the same way on demand, so ``jax.grad`` / ``jax.vjp`` of ``exported.call`` work (to any order:
the VJP's export carries its own VJP). A graph with integer inputs or outputs has none (JAX
would need ``float0`` cotangents); differentiate it in kaun_ir, or export the gradient graph.
"""

from __future__ import annotations

from kaun_ir import dtypes
from kaun_ir.ir.core import Graph
from kaun_ir.runtime.lower import lower
from kaun_ir.runtime.xla import backend, export, mlir
from kaun_ir.transforms.autodiff import gradient_graph

# jax.export names for the platforms of kaun_ir's backends
_PLATFORMS = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda", "rocm": "rocm", "tpu": "tpu"}


def to_jax_export(graph: Graph, platform: str | None = None):
    """``jax.export.Exported`` of ``graph`` for ``platform`` (cpu/cuda/rocm/tpu; default: the
    backend in use). The artifact is compiled only when JAX calls it. With only floating-point
    inputs and outputs it carries its VJP (``jax.grad`` of ``exported.call`` works)."""
    platform = _PLATFORMS.get(platform or backend.backend_name(), platform)
    values = [*graph.inputs, *graph.outputs]
    get_vjp = None
    if graph.inputs and graph.outputs and all(dtypes.is_float(v.type.dtype) for v in values):

        def get_vjp(_exported):
            return to_jax_export(vjp_graph(graph), platform)

    return export.exported(
        graph.name,
        [(v.type.shape, v.type.dtype) for v in graph.inputs],
        [(v.type.shape, v.type.dtype) for v in graph.outputs],
        platform,
        mlir.serialize_portable(lower(graph)),
        get_vjp=get_vjp,
    )


def vjp_graph(graph: Graph) -> Graph:
    """The VJP of ``graph`` in ``jax.export``'s convention: inputs are ``graph``'s inputs then one
    cotangent per output, outputs one cotangent per input."""
    return gradient_graph(
        graph,
        wrt=range(len(graph.inputs)),
        of=range(len(graph.outputs)),
        seed_inputs=True,
        keep_outputs=False,
    )
