"""``kn.data``: constructors, transformers, consumers, single-pass/reset semantics, shuffling
reproducibility, ``prepare`` and the device prefetcher. NumPy slicing is the oracle."""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kaun_ir import data


def xy(n=10):
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    y = np.arange(n, dtype=np.int32) * 10
    return x, y


# -- constructors and single-pass semantics -------------------------------------------------------


def test_of_array_is_single_pass_until_reset():
    d = data.of_array(["a", "b", "c"])
    assert len(d) == 3
    assert list(d) == ["a", "b", "c"]
    assert list(d) == []  # consumed
    d.reset()
    assert next(d) == "a"
    assert list(d) == ["b", "c"]  # continues from the position
    d.reset()
    assert data.to_array(d) == ["a", "b", "c"]


def test_of_tensor_slices_first_axis():
    x = np.arange(12).reshape(4, 3)
    got = data.to_array(data.of_tensor(x))
    assert len(got) == 4
    for i, row in enumerate(got):
        np.testing.assert_array_equal(row, x[i])
    one_d = data.to_array(data.of_tensor(np.arange(3)))
    assert all(isinstance(e, np.ndarray) and e.shape == () for e in one_d)
    assert [int(e) for e in one_d] == [0, 1, 2]
    with pytest.raises(ValueError, match="0-d"):
        data.of_tensor(np.float32(1))


def test_of_tensor_copies_jax_arrays_to_host():
    d = data.of_tensor(jnp.arange(6.0).reshape(3, 2))
    first = next(d)
    assert isinstance(first, np.ndarray)
    np.testing.assert_array_equal(first, [0.0, 1.0])


def test_of_tensors_pairs_and_trees():
    x, y = xy(5)
    elems = data.to_array(data.of_tensors((x, y)))
    assert len(elems) == 5
    for i, (a, b) in enumerate(elems):
        np.testing.assert_array_equal(a, x[i])
        assert int(b) == y[i]
    d = data.of_tensors({"img": x, "label": y})
    e = next(d)
    assert set(e) == {"img", "label"}
    np.testing.assert_array_equal(e["img"], x[0])


def test_of_tensors_rejects_mismatched_first_dimensions():
    with pytest.raises(ValueError, match=r"different first dimensions \(0: 4, 1: 5\)"):
        data.of_tensors((np.zeros((4, 2)), np.zeros(5)))
    with pytest.raises(ValueError, match="0-d"):
        data.of_tensors((np.zeros(4), np.float32(1)))


def test_of_fn_and_repeat():
    calls = []

    def f(i):
        calls.append(i)
        return i * i

    d = data.of_fn(4, f)
    assert calls == []  # lazy
    assert next(d) == 0 and calls == [0]
    assert list(d) == [1, 4, 9]
    assert len(d) == 4
    r = data.repeat(3, ("x", "loss"))
    assert list(r) == [("x", "loss")] * 3 and len(r) == 3
    assert list(data.repeat(0, 1)) == []
    for bad in (lambda: data.of_fn(-1, f), lambda: data.repeat(-2, 0)):
        with pytest.raises(ValueError, match=">= 0"):
            bad()
    with pytest.raises(TypeError, match="must be an int"):
        data.of_fn(2.5, f)


def test_of_iterable_and_unknown_length():
    class Stream:  # re-iterable, without __len__
        def __iter__(self):
            return iter(range(3))

    d = data.of_iterable(Stream())
    with pytest.raises(TypeError, match="no known length"):
        len(d)
    assert data.length(d) is None
    assert list(d) == [0, 1, 2] and list(d) == []
    d.reset()
    assert list(d) == [0, 1, 2]
    assert len(data.of_iterable(range(7))) == 7
    assert data.length(data.of_iterable(range(7))) == 7
    with pytest.raises(TypeError, match="no known length"):
        len(data.map(lambda v: v, data.of_iterable(Stream())))


def test_constructors_reject_bad_input():
    with pytest.raises(TypeError, match="sequence"):
        data.of_array({"a": 1})
    with pytest.raises(TypeError, match="sequence"):
        data.of_array(x for x in range(3))
    with pytest.raises(TypeError, match="kn.data pipeline"):
        data.map(lambda v: v, [1, 2, 3])


# -- transformers -------------------------------------------------------------------------------


def test_map_is_lazy_and_shares_position_with_source():
    src = data.of_array([1, 2, 3, 4])
    d = data.map(lambda v: v * 10, src)
    assert len(d) == 4
    assert next(d) == 10
    assert next(src) == 2  # one position, shared
    assert list(d) == [30, 40]
    d.reset()  # resets the source too
    assert next(src) == 1


def test_batch_stacks_and_counts():
    x, y = xy(10)
    b = data.batch(4, data.of_tensors((x, y)))
    assert len(b) == 3
    batches = list(b)
    assert [bx.shape for bx, _ in batches] == [(4, 3), (4, 3), (2, 3)]
    np.testing.assert_array_equal(np.concatenate([bx for bx, _ in batches]), x)
    np.testing.assert_array_equal(np.concatenate([by for _, by in batches]), y)
    assert batches[0][1].dtype == np.int32
    dropped = data.batch(4, data.of_tensors((x, y)), drop_last=True)
    assert len(dropped) == 2 and len(list(dropped)) == 2
    exact = data.batch(5, data.of_tensor(x), drop_last=True)
    assert len(exact) == 2 and [a.shape for a in exact] == [(5, 3), (5, 3)]


def test_batch_of_scalars_and_dicts():
    b = list(data.batch(2, data.of_array([1.5, 2.5, 3.5])))
    np.testing.assert_array_equal(b[0], [1.5, 2.5])
    np.testing.assert_array_equal(b[1], [3.5])
    d = data.of_fn(3, lambda i: {"a": np.full(2, i), "b": i})
    got = next(data.batch(3, d))
    np.testing.assert_array_equal(got["a"], [[0, 0], [1, 1], [2, 2]])
    np.testing.assert_array_equal(got["b"], [0, 1, 2])


def test_batch_errors():
    for n in (0, -3):
        with pytest.raises(ValueError, match=">= 1"):
            data.batch(n, data.of_array([1]))
    with pytest.raises(ValueError, match=">= 1"):
        data.map_batch(0, list, data.of_array([1]))
    funcs = data.batch(2, data.of_array([(np.zeros(1), abs), (np.ones(1), abs)]))
    with pytest.raises(TypeError, match=r"at '1'.*map_batch"):
        next(funcs)
    ragged = data.batch(2, data.of_array([np.zeros(2), np.zeros(3)]))
    with pytest.raises(ValueError, match="different shapes"):
        next(ragged)
    mixed = data.batch(2, data.of_array([(1, 2), [1, 2]]))
    with pytest.raises(ValueError, match="different structures"):
        next(mixed)


def test_map_batch_gets_the_list_of_elements():
    seen = []

    def collate(items):
        seen.append(list(items))
        return sum(items)

    d = data.map_batch(3, collate, data.of_array([1, 2, 3, 4, 5]))
    assert len(d) == 2
    assert list(d) == [6, 9]
    assert seen == [[1, 2, 3], [4, 5]]
    d2 = data.map_batch(3, collate, data.of_array([1, 2, 3, 4, 5]), drop_last=True)
    assert len(d2) == 1 and list(d2) == [6]


# -- shuffling ----------------------------------------------------------------------------------


def epochs(d, count):
    out = []
    for _ in range(count):
        out.append([int(v) for v in d])
        d.reset()
    return out


def test_shuffle_is_a_permutation_reproducible_and_new_each_epoch():
    d = data.shuffle(data.of_array(list(range(50))), seed=7)
    runs = epochs(d, 3)
    for run in runs:
        assert sorted(run) == list(range(50))
    assert runs[0] != runs[1] != runs[2] and runs[0] != runs[2]
    assert runs[0] != list(range(50))
    again = epochs(data.shuffle(data.of_array(list(range(50))), seed=7), 3)
    assert again == runs  # same seed, same sequence of epochs
    other = epochs(data.shuffle(data.of_array(list(range(50))), seed=8), 1)
    assert other[0] != runs[0]


def test_shuffle_reset_before_reading_keeps_the_epoch():
    a = data.shuffle(data.of_fn(20, lambda i: i), seed=1)
    b = data.shuffle(data.of_fn(20, lambda i: i), seed=1)
    a.reset()
    a.reset()
    assert list(a) == list(b)


def test_shuffle_reads_random_access_sources_out_of_order_and_buffers_others():
    calls = []
    d = data.shuffle(data.of_fn(10, lambda i: calls.append(i) or i), seed=0)
    first = next(d)
    assert calls == [first]  # nothing read ahead
    stream = data.shuffle(data.of_iterable(range(10)), seed=0)
    assert len(list(stream)) == 10
    assert sorted(epochs(stream, 1)[0]) == []  # consumed; reset happens after reading
    stream.reset()
    assert sorted(list(stream)) == list(range(10))


def test_shuffle_then_batch_keeps_pairs_aligned():
    x, y = xy(12)
    d = data.batch(5, data.shuffle(data.of_tensors((x, y)), seed=3))
    assert len(d) == 3
    xs, ys = zip(*d)
    bx, by = np.concatenate(xs), np.concatenate(ys)
    np.testing.assert_array_equal(by, bx[:, 0].astype(np.int32) // 3 * 10)
    assert sorted(by.tolist()) == y.tolist()
    assert by.tolist() != y.tolist()


# -- prepare ------------------------------------------------------------------------------------


def test_prepare_in_order():
    x, y = xy(10)
    d = data.prepare((x, y), batch_size=4)
    assert len(d) == 2  # drop_last=True by default
    got = list(d)
    assert len(got) == 2
    np.testing.assert_array_equal(got[0][0], x[:4])
    np.testing.assert_array_equal(got[1][1], y[4:8])
    assert isinstance(got[0], tuple) and isinstance(got[0][0], np.ndarray)
    full = data.prepare((x, y), 4, drop_last=False)
    assert len(full) == 3 and [b[0].shape[0] for b in full] == [4, 4, 2]


def test_prepare_shuffle_visits_every_example_once_per_epoch():
    x, y = xy(23)
    d = data.prepare((x, y), 5, shuffle=True, drop_last=False, seed=11)
    orders = []
    for _ in range(3):
        batches = list(d)
        d.reset()
        bx = np.concatenate([b[0] for b in batches])
        by = np.concatenate([b[1] for b in batches])
        np.testing.assert_array_equal(bx, x[by // 10])  # pairs stay aligned
        assert sorted(by.tolist()) == y.tolist()
        orders.append(by.tolist())
    assert orders[0] != orders[1] != orders[2]
    d2 = data.prepare((x, y), 5, shuffle=True, drop_last=False, seed=11)
    assert [b[1].tolist() for b in d2] == [orders[0][i : i + 5] for i in range(0, 23, 5)]


def test_prepare_accepts_single_arrays_dicts_and_jax_arrays():
    x, _ = xy(8)
    single = list(data.prepare(x, 4))
    np.testing.assert_array_equal(single[1], x[4:])
    d = list(data.prepare({"a": jnp.asarray(x), "b": np.arange(8)}, 8))
    assert isinstance(d[0]["a"], np.ndarray)
    np.testing.assert_array_equal(d[0]["a"], x)


def test_prepare_errors():
    x, y = xy(10)
    with pytest.raises(ValueError, match=r"different first dimensions \(0: 10, 1: 9\)"):
        data.prepare((x, y[:9]), 2)
    for bs in (0, -1):
        with pytest.raises(ValueError, match="batch_size must be >= 1"):
            data.prepare((x, y), bs)


def test_prepare_then_map_attaches_a_function():
    x, y = xy(6)
    d = data.map(lambda b: (b[0], lambda out: float(np.sum(out == b[1]))), data.prepare((x, y), 3))
    pairs = list(d)
    assert len(pairs) == 2
    assert pairs[1][1](y[3:6]) == 3.0


# -- consumers ----------------------------------------------------------------------------------


def test_iter_fold_to_array():
    seen = []
    d = data.of_array([1, 2, 3])
    assert data.iter(seen.append, d) is None and seen == [1, 2, 3]
    d.reset()
    assert data.fold(lambda acc, v: acc * 10 + v, 0, d) == 123
    assert data.fold(lambda acc, v: acc + v, 5, d) == 5  # nothing left
    d.reset()
    next(d)
    assert data.to_array(d) == [2, 3]


# -- prefetch -----------------------------------------------------------------------------------


def test_prefetch_keeps_order_and_moves_arrays_to_device():
    x, y = xy(17)
    loss_marker = object()
    d = data.map(lambda b: (b, loss_marker), data.prepare((x, y), 4, drop_last=False))
    p = data.prefetch(d, size=2)
    assert len(p) == 5
    got = list(p)
    assert len(got) == 5
    for i, ((bx, by), marker) in enumerate(got):
        assert marker is loss_marker
        assert isinstance(bx, jax.Array) and isinstance(by, jax.Array)
        np.testing.assert_array_equal(np.asarray(bx), x[4 * i : 4 * i + 4])
        np.testing.assert_array_equal(np.asarray(by), y[4 * i : 4 * i + 4])
    assert list(p) == []
    p.reset()
    assert len(list(p)) == 5


def test_prefetch_reads_ahead_in_the_background():
    read = threading.Event()

    def produce(i):
        if i == 2:
            read.set()
        return np.full(3, i, np.float32)

    p = data.prefetch(data.of_fn(10, produce), size=2)
    first = next(p)
    np.testing.assert_array_equal(np.asarray(first), 0)
    assert read.wait(timeout=10), "element 2 was not read ahead while element 0 was in use"
    assert [int(np.asarray(e)[0]) for e in p] == list(range(1, 10))


def test_prefetch_reset_midway_loses_and_repeats_nothing():
    slow = data.of_fn(30, lambda i: (time.sleep(0.001), np.array(i))[1])
    p = data.prefetch(data.shuffle(slow, seed=4), size=3)
    head = [int(next(p)) for _ in range(7)]
    p.reset()
    epoch = [int(v) for v in p]
    assert sorted(epoch) == list(range(30))
    assert epoch[:7] != head  # reset started a new epoch (new order)
    p.reset()
    for _ in range(3):  # repeated partial reads and resets do not leak elements
        next(p)
        p.reset()
    assert sorted(int(v) for v in p) == list(range(30))


def test_prefetch_raises_source_errors_in_place():
    def produce(i):
        if i == 3:
            raise KeyError("broken example 3")
        return np.array(i)

    p = data.prefetch(data.of_fn(6, produce))
    assert [int(next(p)) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(KeyError, match="broken example 3"):
        next(p)
    with pytest.raises(StopIteration):
        next(p)
    with pytest.raises(ValueError, match=">= 1"):
        data.prefetch(data.of_array([1]), size=0)
