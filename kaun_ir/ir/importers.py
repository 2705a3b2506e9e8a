"""Programs of other systems read as a :class:`~kaun_ir.ir.core.Graph`: StableHLO and PyTorch.

The readers live with the runtime (``kaun_ir.runtime.interop``): MLIR needs jaxlib's bindings,
which only the runtime touches, and the PyTorch converter sits beside it. The IR never imports
them; the composition root installs them here (:func:`install`), on first use.
"""

from __future__ import annotations

from collections.abc import Callable

from kaun_ir import hooks

_READERS: dict[str, Callable] = {}


def install(**readers: Callable) -> None:
    """Called by the composition root: ``from_stablehlo``, ``from_torch``, ``torch_inputs``."""
    _READERS.update(readers)


def _reader(name: str) -> Callable:
    if name not in _READERS:
        hooks.ensure_installed()
    return _READERS[name]


def from_stablehlo(module, name=None):
    """Import a StableHLO module (MLIR text, bytecode or a portable ``.mlirbc`` artifact, e.g.
    ``jax.jit(f).lower(x).as_text()``) as a :class:`Graph`; see ``kaun_ir.runtime.interop.stablehlo_import``.

    ``name`` picks the function (default ``main``). Unsupported ops raise
    ``StableHLOImportError`` naming the op and its MLIR location, as does a module that does not
    parse, damaged bytecode or a recursive call (see docs/errors.md: the module is untrusted).
    """
    return _reader("from_stablehlo")(module, name)


def from_torch(exported_program, name="main"):
    """Import a ``torch.export.ExportedProgram`` as a :class:`Graph`; see
    ``kaun_ir.runtime.interop.torch_import``.

    Inputs: the program's parameters, buffers and constants in ``graph_signature`` order, then its
    user inputs; :func:`torch_inputs` gives the arrays. An ATen op with no mapping raises
    :class:`TorchImportError` naming the op and the module path.
    """
    return _reader("from_torch")(exported_program, name)


def torch_inputs(exported_program, *args):
    """The flat list of arrays to call :func:`from_torch`'s graph with (parameters, buffers and
    constants of the program, then ``args`` flattened)."""
    return _reader("torch_inputs")(exported_program, *args)


__all__ = ["from_stablehlo", "from_torch", "install", "torch_inputs"]
