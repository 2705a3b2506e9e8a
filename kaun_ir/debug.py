"""Debugging aids: ``kn.debug.check_finite`` finds the first op that produces a NaN or an Inf;
``kn.debug.diff_backends`` runs a function on two compilers (XLA and IREE) and names the first op
whose value differs.

``check_finite(f)`` compiles ``f`` with a probe on every floating-point value (the
``check-finite`` pass) and raises :class:`kaun_ir.NonFiniteError` naming the first op whose
result is NaN/Inf while its operands are finite: the op, forward or backward pass (and which
forward op a backward node differentiates), the layer path and the user's source line. Setting
the environment variable ``KAUN_IR_CHECK_FINITE=1`` does the same for every program the process
compiles (``kn.jit``, ``train.step``, eager ops). Off by default: the probes cost time (see
docs/debugging.md for measurements).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from kaun_ir.errors import NonFiniteError
from kaun_ir.ir.builder import current_builder
from kaun_ir.names import public_dir
from kaun_ir.runtime import finite, jit
from kaun_ir.runtime.diff_backends import BackendDiff, diff_graph

__all__ = ["check_finite", "checking", "diff_backends", "BackendDiff", "NonFiniteError", "ENV"]


ENV = "KAUN_IR_CHECK_FINITE"


def checking(on: bool = True):
    """Context manager: programs compiled inside the block are checked (``on=False``: not checked,
    whatever ``KAUN_IR_CHECK_FINITE`` says). Executables compiled earlier keep how they were built."""
    return finite.forced(on)


def check_finite(f: Callable, donate_argnums: Sequence[int] = ()) -> Callable:
    """``f`` compiled with NaN/Inf checks: like ``kn.jit(f)``, but a call whose computation makes a
    NaN or an Inf raises :class:`NonFiniteError` naming the first op that did (see the module
    docstring). Inside a trace the checks are the enclosing program's business: ``f`` is called
    as it is."""
    compiled = jit(f, donate_argnums=donate_argnums)

    @functools.wraps(f)
    def checked(*args, **kwargs):
        if current_builder() is not None:
            return f(*args, **kwargs)
        with finite.forced(True):
            return compiled(*args, **kwargs)

    return checked


def diff_backends(
    f: Callable,
    *args,
    backends: Sequence[str] = ("xla", "iree"),
    rtol: float = 1e-4,
    atol: float = 1e-5,
    pipeline=None,
    **kwargs,
) -> BackendDiff:
    """Run ``f(*args, **kwargs)`` compiled by two backends (default XLA and IREE on this CPU) and
    compare: a :class:`BackendDiff` with each output's max absolute / relative difference
    (``.table()`` prints them) and, when an output differs beyond ``atol + rtol * |x|``, the first
    op whose value does (``.first_divergence``). Both compile the same graph: ``f`` traced and
    optimised by ``pipeline`` (default: ``kn.jit``'s for the first backend)."""
    traced = jit(f, pipeline=pipeline, backend=backends[0])
    route, arrays = traced.route(*args, **kwargs)
    if route is None:
        raise ValueError("kn.debug.diff_backends: called inside a trace; call it on concrete arrays")
    return diff_graph(route.executable.graph, arrays, backends, rtol, atol)


__dir__ = public_dir(__all__)
