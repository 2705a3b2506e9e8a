"""The pass pipeline's results on disk (``kaun_ir.runtime.graph_cache``): a graph read back equals
the one stored, a repeated compilation skips the passes and computes what NumPy computes, and
anything that changes the passes' result (the graph, the pipeline, kaun_ir's code, a user's pass)
changes the key or bypasses the cache; unreadable or foreign entries are never trusted."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import passes
from kaun_ir.ir import serialize
from kaun_ir.ir.core import Node
from kaun_ir.runtime import cache_key, disk_cache, gc_pause, graph_cache


def _model(w, x):
    h = kn.tanh(x @ w).astype(np.float16).astype(np.float32)
    h = h + np.arange(w.shape[1], dtype=np.float32)  # an array constant
    total = kn.fori_loop(0, 3, lambda i, acc: acc * 0.5 + h, h)  # a region
    return total.sum()


W = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
X = np.linspace(0, 2, 6, dtype=np.float32).reshape(2, 3)


def _reference(w, x):
    h = np.tanh(x.astype(np.float64) @ w).astype(np.float16).astype(np.float64) + np.arange(w.shape[1])
    total = h
    for _ in range(3):
        total = total * 0.5 + h
    return total.sum()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(disk_cache.ENV, str(tmp_path / "cache"))
    for name in ("hits", "misses", "errors", "bypassed"):
        monkeypatch.setattr(graph_cache.counters, name, 0)
    return tmp_path / "cache"


def _counts():
    c = graph_cache.counters
    return c.hits, c.misses, c.errors, c.bypassed


def _entries(root):
    return sorted(root.rglob("*" + graph_cache.SUFFIX))


def test_encode_decode_round_trip_keeps_everything():
    traced = kn.trace(kn.grad(_model), W, X)
    optimised = passes.run(traced, "canonicalize,fold,cse,dce")
    for graph in (traced, optimised):
        back = serialize.decode(pickle.loads(pickle.dumps(serialize.encode(graph))))
        assert back.text(debug=True) == graph.text(debug=True)
        back.verify()
        assert [n.key[:2] for n in back.nodes] == [n.key[:2] for n in graph.nodes]
    assert any(node.regions for node in traced.walk())


def test_decode_fills_every_slot_of_a_node():
    # decode() builds nodes without Node.__init__; a new slot must be taught to it
    assert set(Node.__slots__) == set(serialize.NODE_SLOTS)


def test_repeated_compilation_skips_the_passes(cache):
    want = _reference(W, X)
    first = float(kn.jit(_model)(W, X))
    assert _counts() == (0, 1, 0, 0)
    assert len(_entries(cache)) == 1
    second = float(kn.jit(_model)(W, X))  # a new kn.jit traces again: the passes are a hit
    assert _counts() == (1, 1, 0, 0)
    assert first == second
    np.testing.assert_allclose(second, want, rtol=1e-5)


def test_a_hit_is_recorded_as_the_pass_cache_stage(cache):
    from kaun_ir.runtime import stages
    from kaun_ir.tools.bench.compile import format_report, summarise

    with stages.record() as miss:
        kn.jit(_model, pipeline="cse,dce")(W, X)
    with stages.record() as hit:
        kn.jit(_model, pipeline="cse,dce")(W, X)
    assert [name for name, _, _ in miss.stages][:4] == [
        "trace",
        "pass:cse (#1)",
        "pass:dce (#2)",
        "pass-cache",
    ]
    assert [name for name, _, _ in hit.stages][:3] == ["trace", "pass-cache", "lower"]
    assert hit.stages[1][2] == miss.stages[2][2]  # the nodes the passes kept
    ours = {"first_step_s": 2.0, "first_step_cpu_s": 1.0, "stages": hit.stages, "nodes_traced": 10}
    ours |= {"nodes_optimised": 5, "stablehlo_ops": 7}
    theirs = {"first_step_s": 4.0, "first_step_cpu_s": 4.0, "stablehlo_ops": 9}
    row = summarise("case", ours, theirs)
    assert row["ratio_vs_jax"] == 0.5 and row["cpu_ratio_vs_jax"] == 0.25
    assert f"{row['seconds']['pass-cache']:.2f} (cache)" in format_report([row])


def test_anything_that_changes_the_result_misses(cache, monkeypatch):
    kn.jit(_model)(W, X)
    assert _counts() == (0, 1, 0, 0)
    # another pipeline
    kn.jit(_model, pipeline="canonicalize,cse,dce")(W, X)
    assert _counts() == (0, 2, 0, 0)
    # another graph: a different constant in the function
    value = float(kn.jit(lambda w, x: _model(w, x) * 3.0)(W, X))
    assert _counts() == (0, 3, 0, 0)
    np.testing.assert_allclose(value, 3 * _reference(W, X), rtol=1e-5)
    # other shapes
    kn.jit(_model)(W[:, :2].copy(), X)
    assert _counts() == (0, 4, 0, 0)
    # another kaun_ir (an edited pass): the code fingerprint is part of the key
    monkeypatch.setattr(graph_cache, "_CODE", ["another kaun_ir"])
    kn.jit(_model)(W, X)
    assert _counts() == (0, 5, 0, 0)
    assert len(_entries(cache)) == 5


def test_key_covers_source_lines_and_options(cache):
    traced = kn.trace(_model, W, X)
    base = graph_cache.key(traced, "cse,dce")
    assert base == graph_cache.key(kn.trace(_model, W, X), "cse,dce")
    assert base != graph_cache.key(traced, "cse")
    assert graph_cache.key(traced, "layout") != graph_cache.key(traced, "layout{prefer=nchw}")
    # a node's layer path, source line or provenance changed (messages, viewers and remat read them)
    name, names, inputs, nodes, outputs = serialize.encode(traced)
    for field, value in ((4, "other.layer"), (5, "elsewhere.py:1"), (6, ("backward", "add"))):
        edited = list(nodes[0])
        edited[field] = value
        changed = serialize.decode((name, names, inputs, (tuple(edited),) + nodes[1:], outputs))
        assert base != graph_cache.key(changed, "cse,dce")


def test_user_passes_bypass_the_cache(cache):
    @passes.register("t-graph-cache-identity", description="identity (test)")
    def identity(graph):
        return graph

    try:
        kn.jit(_model, pipeline="t-graph-cache-identity,cse")(W, X)
        kn.jit(_model, pipeline="t-graph-cache-identity,cse")(W, X)
        assert _counts() == (0, 0, 0, 2)
        assert _entries(cache) == []
    finally:
        del passes.REGISTRY["t-graph-cache-identity"]


def test_broken_and_foreign_entries_are_removed_not_trusted(cache):
    want = float(kn.jit(_model)(W, X))
    (entry,) = _entries(cache)
    with pytest.warns(RuntimeWarning, match="unreadable graph cache entry"):
        graph_cache._warned.discard("corrupt")
        entry.write_bytes(entry.read_bytes()[:50])  # truncated
        assert float(kn.jit(_model)(W, X)) == want
    assert _counts() == (0, 2, 1, 0)
    # an entry naming a class would run code when unpickled: refused, removed, recomputed
    entry.write_bytes(pickle.dumps(("kaun_ir-graph-cache-1", np.float32(1))))
    graph_cache._warned.discard("corrupt")
    with pytest.warns(RuntimeWarning, match="unreadable graph cache entry"):
        assert float(kn.jit(_model)(W, X)) == want
    assert _counts() == (0, 3, 2, 0)
    assert float(kn.jit(_model)(W, X)) == want
    assert _counts() == (1, 3, 2, 0)


def test_clear_removes_graph_entries(cache):
    kn.jit(_model)(W, X)
    assert len(_entries(cache)) == 1
    assert disk_cache.clear() >= 1
    assert _entries(cache) == []


def test_off_when_switched_off(monkeypatch):
    monkeypatch.setenv(disk_cache.ENV, "off")
    before = _counts()
    kn.jit(_model)(W, X)
    assert _counts() == before


def test_gc_pause_nests_restores_and_respects_a_disabled_collector():
    import gc

    assert gc.isenabled()
    with gc_pause.paused():
        assert not gc.isenabled()
        with gc_pause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ZeroDivisionError), gc_pause.paused():
        raise ZeroDivisionError
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_pause.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_key_holds_the_host_cpu_and_registered_parts(monkeypatch):
    traced = kn.trace(_model, W, X)
    base = graph_cache.key(traced, "cse,dce")
    monkeypatch.setattr(cache_key, "_HOST", ["Linux/aarch64/another CPU/0123"])
    assert graph_cache.key(traced, "cse,dce") != base
    monkeypatch.undo()
    monkeypatch.setattr(cache_key, "_KEY_PARTS", {"custom-calls": "0123abcd"})
    assert graph_cache.key(traced, "cse,dce") != base
