"""Late binding between the layers: how a lower layer reaches code an upper layer provides.

The layers import downwards only (docs/architecture.md), yet a few lower ones must call code that
sits above them: the IR looks ops up by name in the op table, a primitive on concrete arrays runs
through the runtime, ``kn.ir.from_stablehlo`` reads MLIR with the runtime's importer, a notebook
draws a ``Graph`` with the viewer. None of them imports that code. Each keeps a slot, and the
composition root (:mod:`kaun_ir.wiring`) fills every slot in one call. A lower layer that finds
its slot empty calls :func:`ensure_installed`, which runs the installer that the top of the
package registered here: ``kaun_ir/__init__.py`` does so when it is imported, and Python imports
it before any ``kaun_ir.*`` module, so the installer is always known.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

_LOCK = threading.RLock()
_installer: Callable[[], None] | None = None


def set_installer(installer: Callable[[], None]) -> None:
    """Register the function that fills every slot of the lower layers (called once, by the top)."""
    global _installer
    _installer = installer


def ensure_installed() -> None:
    """Fill the lower layers' slots now (idempotent; cheap after the first call)."""
    if _installer is None:
        raise RuntimeError(
            "kaun_ir's composition root is not registered: the package kaun_ir was not imported "
            "through its __init__ (import kaun_ir, or any kaun_ir.* module, does it)"
        )
    with _LOCK:
        _installer()


__all__ = ["ensure_installed", "set_installer"]
