"""A kaun_ir graph as a ``jax.export.Exported``: JAX itself can call, ``jax.jit``, serialise and
reload a kaun_ir model (the interchange object of JAX's own export API).

    exported = kn.runtime.to_jax_export(graph)
    exported.call(x, y)                    # inside or outside jax.jit
    blob = exported.serialize()            # needs the `flatbuffers` package
    jax.export.deserialize(blob).call(x, y)

The ``Exported`` carries the graph as a portable StableHLO artifact (CHLO legalised, see
:func:`kaun_ir.runtime.xla.serialize_portable`); its arguments are the graph's inputs in order,
as one flat tuple, and its results the graph's outputs as a tuple.
"""

from __future__ import annotations

import inspect

from kaun_ir.ir.core import Graph
from kaun_ir.runtime import xla
from kaun_ir.runtime.lower import lower

# jax.export names for the platforms of kaun_ir's backends
_PLATFORMS = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda", "rocm": "rocm", "tpu": "tpu"}


def to_jax_export(graph: Graph, platform: str | None = None):
    """``jax.export.Exported`` of ``graph`` for ``platform`` (cpu/cuda/rocm/tpu; default: the
    backend in use). The artifact is compiled only when JAX calls it."""
    import jax
    from jax import export as jax_export
    from jax.core import ShapedArray

    platform = _PLATFORMS.get(platform or xla.backend_name(), platform)
    in_avals = tuple(ShapedArray(v.type.shape, v.type.dtype) for v in graph.inputs)
    out_avals = tuple(ShapedArray(v.type.shape, v.type.dtype) for v in graph.outputs)
    fields = {
        "fun_name": graph.name,
        "in_tree": jax.tree_util.tree_structure((tuple(range(len(in_avals))), {})),
        "in_avals": in_avals,
        "out_tree": jax.tree_util.tree_structure(tuple(range(len(out_avals)))),
        "out_avals": out_avals,
        "_has_named_shardings": True,  # None everywhere: unsharded, as jax.export writes it
        "_in_named_shardings": (None,) * len(in_avals),
        "_out_named_shardings": (None,) * len(out_avals),
        "in_shardings_hlo": (None,) * len(in_avals),
        "out_shardings_hlo": (None,) * len(out_avals),
        "nr_devices": 1,
        "platforms": (platform,),
        "ordered_effects": (),
        "unordered_effects": (),
        "disabled_safety_checks": (),
        "mlir_module_serialized": xla.serialize_portable(lower(graph)),
        "calling_convention_version": jax_export.minimum_supported_calling_convention_version,
        "module_kept_var_idx": tuple(range(len(in_avals))),
        "uses_global_constants": False,
        "_get_vjp": None,
    }
    # the record's private fields differ between jax releases: pass those this one declares
    accepted = inspect.signature(jax_export.Exported).parameters
    missing = [name for name in accepted if name not in fields]
    if missing:
        raise RuntimeError(f"this jax's Exported needs fields kaun_ir does not know: {', '.join(missing)}")
    return jax_export.Exported(**{k: v for k, v in fields.items() if k in accepted})
