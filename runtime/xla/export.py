"""The ``jax.export.Exported`` record: how JAX's own export API holds a compiled-later program,
built here from kaun_ir's types and a portable StableHLO artifact."""

from __future__ import annotations

import inspect
from collections.abc import Sequence


def exported(
    name: str,
    in_types: Sequence[tuple],
    out_types: Sequence[tuple],
    platform: str,
    artifact: bytes,
    get_vjp=None,
):
    """``jax.export.Exported`` of a function ``name`` taking one flat tuple of arrays of
    ``in_types`` and returning a tuple of ``out_types`` (``(shape, dtype)`` pairs), unsharded on
    one device of ``platform`` (jax's name: cpu/cuda/rocm/tpu); ``artifact`` is the program as a
    portable StableHLO artifact. The artifact is compiled only when JAX calls it. ``get_vjp``:
    ``Exported -> Exported`` of the VJP (``Exported.vjp()``), or None."""
    import jax  # noqa: PLC0415 - jax loads only when a program compiles or compares
    from jax import export as jax_export  # noqa: PLC0415 - jax loads only when a program compiles or compares
    from jax.core import ShapedArray  # noqa: PLC0415 - jax loads only when a program compiles or compares

    in_avals = tuple(ShapedArray(tuple(shape), dtype) for shape, dtype in in_types)
    out_avals = tuple(ShapedArray(tuple(shape), dtype) for shape, dtype in out_types)
    fields = {
        "fun_name": name,
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
        "mlir_module_serialized": artifact,
        "calling_convention_version": jax_export.minimum_supported_calling_convention_version,
        "module_kept_var_idx": tuple(range(len(in_avals))),
        "uses_global_constants": False,
        "_get_vjp": get_vjp,
    }
    # the record's private fields differ between jax releases: pass those this one declares
    accepted = inspect.signature(jax_export.Exported).parameters
    missing = [field for field in accepted if field not in fields]
    if missing:
        raise RuntimeError(f"this jax's Exported needs fields kaun_ir does not know: {', '.join(missing)}")
    return jax_export.Exported(**{k: v for k, v in fields.items() if k in accepted})
