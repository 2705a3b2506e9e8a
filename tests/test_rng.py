"""kn.rng: the implicit key scope — determinism, nesting, errors, traced roots."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import layer, rng


def _draw(n):
    return [np.asarray(rng.next_key()) for _ in range(n)]


def test_same_seed_same_keys_and_matches_fold_in():
    with rng.scope(7):
        first = _draw(3)
    second = rng.run(7, lambda: _draw(3))
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    # key i is fold_in(key(seed), i), the same as jax's
    root = jax.random.PRNGKey(7)
    for i, k in enumerate(first):
        np.testing.assert_array_equal(k, np.asarray(jax.random.fold_in(root, i)))
    assert first[0].dtype == np.uint32 and first[0].shape == (2,)


def test_keys_differ_within_a_scope_and_across_seeds():
    a = rng.run(0, lambda: _draw(4))
    b = rng.run(1, lambda: _draw(4))
    assert len({k.tobytes() for k in a}) == 4
    assert not any(np.array_equal(x, y) for x, y in zip(a, b))


def test_nested_scopes_use_the_innermost_and_restore_the_outer():
    with rng.scope(0):
        outer_first = np.asarray(rng.next_key())
        with rng.scope(5):
            inner = np.asarray(rng.next_key())
        outer_second = np.asarray(rng.next_key())
    np.testing.assert_array_equal(inner, rng.run(5, lambda: np.asarray(rng.next_key())))
    reference = rng.run(0, lambda: _draw(2))
    np.testing.assert_array_equal(outer_first, reference[0])
    np.testing.assert_array_equal(outer_second, reference[1])  # the inner scope did not advance it


def test_outside_a_scope_raises_a_helpful_error():
    assert not rng.in_scope()
    with pytest.raises(rng.NoScopeError, match=r"rng\.scope\(seed\)"):
        rng.next_key()
    with rng.scope(0):
        assert rng.in_scope()
    assert not rng.in_scope()


def test_scope_is_popped_when_the_body_raises():
    with pytest.raises(KeyError):
        with rng.scope(0):
            raise KeyError("boom")
    assert not rng.in_scope()


def test_scope_accepts_a_key_and_rejects_bad_seeds():
    key = kn.random.key(3)
    a = rng.run(key, lambda: _draw(2))
    b = rng.run(3, lambda: _draw(2))
    np.testing.assert_array_equal(np.stack(a), np.stack(b))
    for bad in (1.5, True, np.zeros(3, np.uint32), "seed"):
        with pytest.raises(TypeError, match="seed"):
            with rng.scope(bad):
                pass


def test_traced_root_key_inside_jit():
    """A scope opened on a traced key draws traced keys: fresh values per call, one compile."""

    def f(key):
        with rng.scope(key):
            return rng.next_key(), rng.next_key()

    jitted = kn.jit(f)
    for seed in (0, 1):
        got = jitted(kn.random.key(seed))
        want = rng.run(seed, lambda: _draw(2))
        np.testing.assert_array_equal(np.asarray(got[0]), want[0])
        np.testing.assert_array_equal(np.asarray(got[1]), want[1])
    assert jitted.trace_count == 1


def test_scopes_are_thread_local():
    seen = {}

    def worker():
        seen["in_scope"] = rng.in_scope()

    with rng.scope(0):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    assert seen["in_scope"] is False


def test_layer_init_is_deterministic_per_seed():
    model = layer.sequential([layer.linear(3, 4), layer.relu(), layer.linear(4, 2)])
    a = rng.run(11, lambda: layer.init(model))
    b = rng.run(11, lambda: layer.init(model))
    c = rng.run(12, lambda: layer.init(model))
    for (path, x), (_, y), (_, z) in zip(
        kn.ptree.flatten_with_paths(a.params),
        kn.ptree.flatten_with_paths(b.params),
        kn.ptree.flatten_with_paths(c.params),
    ):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=path)
        if path.endswith("weight"):
            assert not np.array_equal(np.asarray(x), np.asarray(z)), path
    with pytest.raises(rng.NoScopeError):
        layer.init(model)
