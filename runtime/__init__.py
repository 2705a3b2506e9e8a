"""The runtime: lowering to StableHLO and compiling/running through XLA's PJRT client.

Imported as ``kaun_ir.runtime``; jaxlib is only touched through the ``xla`` adapter module.
"""

from __future__ import annotations

from kaun_ir import _api
from kaun_ir import tensor as _tensor
from kaun_ir.fileio import atomic_write

from . import compilation, disk_cache, dispatch, pipelines, stages, xla
from .compilation import compile_graph as compile
from .compilation import stats
from .dispatch import Route, RouteCache
from .executable import Executable
from .jax_export import to_jax_export
from .jit import Jitted, jit
from .lower import lower
from .mesh import Mesh, Spec
from .xla import backend_name, parse_mlir

# the eager path of ``kaun_ir.tensor.apply`` (a layer below) computes through this runtime
_tensor.install_runtime(compilation.run_op, xla.from_dlpack)
# and the surface's functions and transformations compile concrete calls with this kn.jit
_api.install_jit(jit)


def devices():
    """The XLA devices of the backend in use (``KAUN_IR_BACKEND=cpu|gpu|tpu``, default best)."""
    from . import xla

    return xla.devices()


def export(graph, path: str) -> str:
    """Write ``graph`` as StableHLO: ``.mlir`` (text) or ``.mlirbc`` (portable artifact).

    The write is atomic. Returns ``path``.
    """
    from . import xla

    text = lower(graph)
    if path.endswith(".mlirbc"):
        data = xla.serialize_portable(text)
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
    "compilation",
    "compile",
    "devices",
    "dispatch",
    "disk_cache",
    "export",
    "jit",
    "lower",
    "parse_mlir",
    "pipelines",
    "stages",
    "stats",
    "to_jax_export",
]
