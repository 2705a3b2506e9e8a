"""The eager path of ``apply``: how a primitive runs on concrete arrays, filled in from above.

Outside a trace, ``apply`` computes on concrete operands by compiling and running the single op;
that needs the runtime, a layer above the surface. The runtime's entry points are installed here
by :mod:`kaun_ir.wiring` (the composition root) on first need, so the surface never imports it.
"""

from __future__ import annotations

from collections.abc import Callable

from kaun_ir import hooks


class _Runtime:
    """What the runtime (a layer above this module) installs here: ``run_op(opdef, operands,
    attrs, regions) -> list`` runs one primitive on concrete operands (compiled and cached by the
    runtime), ``from_dlpack(x)`` takes a foreign array. Installed by :func:`kaun_ir.wiring.install`."""

    run_op: Callable | None = None
    from_dlpack: Callable | None = None


_RUNTIME = _Runtime()


def install_runtime(run_op: Callable, from_dlpack: Callable) -> None:
    """Called by :func:`kaun_ir.wiring.install`: how concrete operands are computed on."""
    _RUNTIME.run_op = run_op
    _RUNTIME.from_dlpack = from_dlpack


def runtime() -> _Runtime:
    """The installed entry points, installing them on first use."""
    if _RUNTIME.run_op is None:
        hooks.ensure_installed()
    return _RUNTIME
