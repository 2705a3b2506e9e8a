"""Which compiler turns a lowered program into machine code: XLA (the default) or IREE.

The IR, the passes and the lowering to StableHLO are the same for both; only the last step
differs. ``kn.jit(f, backend=...)``, ``train.make(..., backend=...)`` and the environment variable
``KAUN_IR_BACKEND`` choose (read when a function is compiled, like ``KAUN_IR_PIPELINE``):

- ``"xla"`` (or ``None`` with the variable unset, or set to ``cpu`` / ``gpu`` / ``tpu``, which pick
  XLA's platform): XLA through PJRT;
- ``"iree"`` / ``"iree-cpu"``: IREE's ``llvm-cpu`` target for this host, run by its ``local-task``
  driver; ``"iree-vulkan"`` / ``"iree-cuda"``: IREE on a Vulkan or CUDA device, when the runtime
  finds one (otherwise :class:`kaun_ir.errors.BackendError` names the backend). IREE comes from the
  optional extra ``iree`` (``pip install 'kaun-ir[iree]'``).
"""

from __future__ import annotations

import os

from kaun_ir.errors import BackendError
from kaun_ir.runtime.iree import IREE_BACKENDS

__all__ = ["ENV", "IREE_BACKENDS", "NAMES", "available", "is_iree", "resolve"]

ENV = "KAUN_IR_BACKEND"
#: every name ``backend=`` accepts
NAMES = ("xla", "iree", *IREE_BACKENDS)
_XLA_PLATFORMS = ("cpu", "gpu", "tpu")


def resolve(backend: str | None = None, what: str = "backend") -> str:
    """The canonical backend name (``"xla"`` or a key of :data:`IREE_BACKENDS`) of ``backend``;
    ``None`` reads ``KAUN_IR_BACKEND`` (unset or an XLA platform: ``"xla"``). ``what`` names the
    argument in the error for an unknown name."""
    if backend is None:
        value = os.environ.get(ENV, "").strip().lower()
        if not value or value in _XLA_PLATFORMS:
            return "xla"
        return resolve(value, f"{ENV}")
    if not isinstance(backend, str):
        raise TypeError(f"{what}={backend!r}: a backend is named by a string, one of {', '.join(NAMES)}")
    name = backend.strip().lower()
    if name == "iree":
        return "iree-cpu"
    if name in NAMES:
        return name
    raise BackendError(f"{what}={backend!r}: unknown backend; expected one of {', '.join(NAMES)}")


def is_iree(backend: str | None) -> bool:
    """Whether the (resolved) backend name is one of IREE's."""
    return backend is not None and backend.startswith("iree")


def available(backend: str) -> bool:
    """Whether ``backend`` can compile here: XLA always; an IREE backend when IREE is installed
    and its runtime driver finds a device."""
    name = resolve(backend)
    if not is_iree(name):
        return True
    from kaun_ir.runtime.iree import compiler  # noqa: PLC0415 - IREE is optional, loaded on first use

    try:
        compiler.check_device(name)
    except BackendError:
        return False
    return True
