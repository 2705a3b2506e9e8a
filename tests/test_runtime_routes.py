"""``kaun_ir.runtime.dispatch``: the one cache of repeated-signature routes that ``kn.jit`` and
``kn.train`` share. Oracle: NumPy."""

from __future__ import annotations

import numpy as np

import kaun_ir as kn
from kaun_ir import runtime


def _f(a, b):
    return kn.tanh(a) * b + 1.0


def test_jit_files_a_route_per_plain_array_signature_and_reuses_it():
    f = kn.jit(_f)
    a = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    b = np.arange(6, dtype=np.float32).reshape(2, 3)
    want = np.tanh(a) * b + 1.0
    np.testing.assert_allclose(np.asarray(f(a, b)), want, rtol=1e-6)
    assert isinstance(f.routes, runtime.RouteCache) and len(f.routes) == 1
    np.testing.assert_allclose(np.asarray(f(b, a)), np.tanh(b) * a + 1.0, rtol=1e-6)
    assert len(f.routes) == 1 and f.trace_count == 1  # same signature: the same route
    f(a[:1], b[:1])
    assert len(f.routes) == 2 and f.trace_count == 2
    assert len(f.executables()) == 2


def test_a_caller_files_its_own_route_and_dispatches_through_it():
    f = kn.jit(_f)
    a = np.full((3,), 0.5, np.float32)
    b = np.full((3,), 2.0, np.float32)
    route, arrays = f.route(a, b)
    assert isinstance(route, runtime.Route) and f.trace_count == 1
    f.routes.put(("mine", (3,)), route.with_meta("kept"))
    mine = f.routes.get(("mine", (3,)))
    assert mine.meta == "kept" and mine.executable is route.executable
    np.testing.assert_allclose(np.asarray(mine([a, b])), np.tanh(a) * b + 1.0, rtol=1e-6)
    # place() moves host arrays to the device with the input dtypes (here float64 -> float32)
    placed = mine.place([np.ones(3), np.ones(3)])
    assert all(p.dtype == np.float32 for p in placed)
    f.routes.clear()
    assert len(f.routes) == 0 and f.routes.get(("mine", (3,))) is None
