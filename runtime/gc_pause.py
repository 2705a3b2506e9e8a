"""Python's cyclic garbage collector paused while a compilation builds graphs.

Tracing and every pass build tens of thousands of IR nodes, each in a reference cycle with its
output values. While the heap grows, the collector keeps sweeping it, and its full collections
look at every object built so far: for the 24-block bench transformer a third of the CPU time
of tracing, the passes and lowering went to the collector, and the share grew with the model
(the superlinear part of tracing). :func:`paused` switches the collector off for the duration
of a compilation; the garbage of the intermediate graphs (a few tens of MB at 24 blocks) is
collected by the first collection after it. Nested and concurrent compilations share one pause
that ends with the last of them, and a collector the user switched off stays off.
"""

from __future__ import annotations

import contextlib
import gc
import threading

_LOCK = threading.Lock()
_DEPTH = [0]
_RESUME = [False]  # whether the outermost pause found the collector on (and must switch it back)


@contextlib.contextmanager
def paused():
    """Run the block with the cyclic garbage collector off (see the module docstring)."""
    with _LOCK:
        if _DEPTH[0] == 0:
            _RESUME[0] = gc.isenabled()
            gc.disable()
        _DEPTH[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0 and _RESUME[0]:
                gc.enable()
