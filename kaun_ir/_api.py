"""The decorator that makes a kaun_ir function work both while tracing and on concrete arrays."""

from __future__ import annotations

import functools
from collections.abc import Callable

from .ir.builder import current_builder


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
            from kaun_ir.runtime import jit

            compiled = jit(fn)
        return compiled(*args, **kwargs)

    wrapper.traced = fn  # the undecorated function, for code that is known to be tracing
    return wrapper
