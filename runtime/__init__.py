"""The runtime: lowering to StableHLO and compiling/running through XLA's PJRT client.

Imported as ``kaun_ir.runtime``; jaxlib is only touched through the adapter package ``kaun_ir.runtime.xla``.
"""

from __future__ import annotations

from kaun_ir.fileio import atomic_write
from kaun_ir.names import public_dir
from kaun_ir.runtime import backends, compilation, disk_cache, dispatch, partitioned, pipelines, stages
from kaun_ir.runtime.compilation import compile_graph as compile
from kaun_ir.runtime.compilation import stats
from kaun_ir.runtime.dispatch import Route, RouteCache
from kaun_ir.runtime.executable import Executable
from kaun_ir.runtime.interop import stablehlo_import  # spelled kn.runtime.stablehlo_import in docs/interop.md
from kaun_ir.runtime.interop.jax_export import to_jax_export
from kaun_ir.runtime.jit import Jitted, jit
from kaun_ir.runtime.lower import lower
from kaun_ir.runtime.malloc_tuning import tune_malloc
from kaun_ir.runtime.mesh import Mesh, Spec
from kaun_ir.runtime.xla import backend, mlir
from kaun_ir.runtime.xla.backend import backend_name
from kaun_ir.runtime.xla.mlir import parse_mlir


def devices():
    """The XLA devices of the backend in use (``KAUN_IR_BACKEND=cpu|gpu|tpu``, default best)."""

    return backend.devices()


def export(graph, path: str) -> str:
    """Write ``graph`` as StableHLO: ``.mlir`` (text) or ``.mlirbc`` (portable artifact).

    The write is atomic. Returns ``path``.
    """

    text = lower(graph)
    if path.endswith(".mlirbc"):
        data = mlir.serialize_portable(text)
    elif path.endswith(".mlir"):
        data = text.encode()
    else:
        raise ValueError(f"export path must end in .mlir or .mlirbc, got {path!r}")
    atomic_write(path, data)
    return path


__all__ = [
    "Executable",
    "Jitted",
    "Mesh",
    "Route",
    "RouteCache",
    "Spec",
    "backend_name",
    "backends",
    "compilation",
    "compile",
    "devices",
    "dispatch",
    "disk_cache",
    "export",
    "jit",
    "lower",
    "parse_mlir",
    "partitioned",
    "pipelines",
    "stablehlo_import",
    "stages",
    "stats",
    "to_jax_export",
    "tune_malloc",
]

__dir__ = public_dir(__all__)
