"""The decorator that makes a kaun_ir function work both while tracing and on concrete arrays,
and the ``kn.jit`` the tracing surface compiles concrete calls with.

The runtime sits a layer above the surface (docs/architecture.md), so the surface does not import
it: ``kaun_ir.runtime`` installs its ``jit`` here when it is imported, which ``import kaun_ir``
does before any user code runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from kaun_ir import hooks
from kaun_ir.ir.builder import current_builder

_installed_jit: Callable | None = None


def install_jit(jit_function: Callable) -> None:
    """Called by ``kaun_ir.runtime`` on import: the ``kn.jit`` that :func:`jit` forwards to."""
    global _installed_jit
    _installed_jit = jit_function


def jit(fn: Callable, **options) -> Callable:
    """``kn.jit(fn, **options)``, for the surface's concrete-array paths (``op_function``,
    ``grad``, ``vjp``, ``jvp`` ... called outside a trace)."""
    if _installed_jit is None:
        hooks.ensure_installed()
    return _installed_jit(fn, **options)


def op_function(fn: Callable) -> Callable:
    """Trace ``fn`` into the active graph; outside a trace compile it with ``kn.jit`` and run it.

    Outside tracing, array arguments are inputs of a cached executable and Python scalars,
    tuples and dtypes are static (part of its cache key), so ``kn.softmax(np_array, axis=1)``
    compiles once per shape and dtype.
    """
    compiled = None

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal compiled
        if current_builder() is not None:
            return fn(*args, **kwargs)
        if compiled is None:
            compiled = jit(fn)
        return compiled(*args, **kwargs)

    wrapper.traced = fn  # the undecorated function, for code that is known to be tracing
    return wrapper
