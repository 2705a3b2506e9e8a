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


def test_place_passes_device_arrays_with_equal_shardings_through_and_remembers_them(monkeypatch):
    import jax  # the oracle's arrays: jax.device_put gives each array a sharding object of its own

    from kaun_ir.runtime import dispatch

    f = kn.jit(_f)
    a = np.linspace(-1, 1, 3, dtype=np.float32)
    route, _ = f.route(a, a)
    monkeypatch.setattr(dispatch, "_MAX_EQUAL", 2)
    arrays = [jax.device_put(np.full(3, i, np.float32)) for i in range(3)]
    for _ in range(2):  # the second time through, answered by the remembered shardings
        placed = route.place(arrays[:2])
        assert all(p is q for p, q in zip(placed, arrays[:2]))
    assert len(route._equal) == 2
    placed = route.place(arrays[2:])  # a third sharding: the memo starts over, never grows past 2
    assert placed[0] is arrays[2] and len(route._equal) == 1
    moved = route.place([np.ones(3, np.float64), jax.device_put(np.ones(3, np.int32))])
    assert [m.dtype for m in moved] == [np.float32, np.float32]  # other dtypes are converted
    np.testing.assert_allclose(np.asarray(route(arrays[1:3])), np.tanh(1.0) * 2.0 + 1.0, rtol=1e-6)
    assert route.with_meta("copy")._equal == {}
