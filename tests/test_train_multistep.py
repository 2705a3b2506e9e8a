"""``train.fit(..., steps_per_call=K)``: K steps fused in one executable equal K single steps."""

import dataclasses

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import layer, optim, rng, train, tree
from kaun_ir.nn import loss
from kaun_ir.runtime.xla import transfer


def _model(dropout: bool = False):
    parts = [layer.linear(8, 16), layer.relu()]
    if dropout:
        parts.append(layer.dropout(0.3))
    return layer.sequential(parts + [layer.linear(16, 3)])


def _batches(n: int, batch: int = 4, seed: int = 0):
    r = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = r.standard_normal((batch, 8)).astype(np.float32)
        y = r.integers(0, 3, batch).astype(np.int32)
        out.append((x, (lambda labels: lambda logits: loss.cross_entropy_sparse(logits, labels))(y)))
    return out


def _fresh(dropout=False):
    trainer = train.make(_model(dropout), optim.adam(1e-2))
    with rng.scope(3):
        st = train.init(trainer)
    return trainer, st


def _host(st):
    return [np.asarray(a) for a in tree.flatten(train.state_to_tree(st))[0]]


def _run(k, n, dropout=False, stop_at=None):
    trainer, st = _fresh(dropout)
    seen = []

    def report(step, loss, state):
        seen.append((step, loss))
        if stop_at is not None and step == stop_at:
            raise train.EarlyStop

    st = train.fit(trainer, st, _batches(n), report=report, steps_per_call=k)
    return trainer, st, seen


@pytest.mark.parametrize("dropout", [False, True])
def test_blocks_equal_single_steps_bit_for_bit(dropout):
    _, single, seen1 = _run(1, 10, dropout)
    trainer, fused, seen5 = _run(5, 10, dropout)
    assert [s for s, _ in seen5] == list(range(1, 11))
    assert [s for s, _ in seen1] == [s for s, _ in seen5]
    # bit-for-bit on the XLA CPU backend: same ops per step, same order, same keys
    np.testing.assert_array_equal([loss for _, loss in seen1], [loss for _, loss in seen5])
    assert single.step == fused.step == 10
    for a, b in zip(_host(single), _host(fused)):
        np.testing.assert_array_equal(a, b)
    assert trainer.cache.block.trace_count == 1  # one executable for the block signature
    assert trainer.cache.step is None  # no single steps were needed


def test_final_partial_block_runs_as_single_steps():
    _, single, seen1 = _run(1, 7)
    trainer, fused, seen3 = _run(3, 7)
    assert [s for s, _ in seen3] == list(range(1, 8))
    np.testing.assert_array_equal([loss for _, loss in seen1], [loss for _, loss in seen3])
    for a, b in zip(_host(single), _host(fused)):
        np.testing.assert_array_equal(a, b)
    assert trainer.cache.block.trace_count == 1
    assert trainer.cache.step.trace_count == 1  # the last batch


def test_early_stop_is_honoured_at_block_granularity():
    trainer, st, seen = _run(4, 12, stop_at=2)
    # steps 1..4 ran in one block; the report of step 2 stopped training, 3 and 4 stay applied
    assert [s for s, _ in seen] == [1, 2]
    assert st.step == 4
    _, reference, _ = _run(1, 4)
    for a, b in zip(_host(reference), _host(st)):
        np.testing.assert_array_equal(a, b)


def test_compiles_once_per_block_signature():
    trainer, st = _fresh()
    st = train.fit(trainer, st, _batches(8), steps_per_call=4)
    compiles = kn.runtime.stats.compiles  # (XLA's compile cache is process-wide: count from here)
    st = train.fit(trainer, st, _batches(8, seed=1), steps_per_call=4)
    assert trainer.cache.block.trace_count == 1
    assert kn.runtime.stats.compiles - compiles == 0
    st = train.fit(trainer, st, _batches(4, batch=6), steps_per_call=4)  # new shapes: new block
    assert trainer.cache.block.trace_count == 2


def test_mixed_shapes_in_a_block_fall_back_to_single_steps():
    trainer, st = _fresh()
    data = _batches(2) + _batches(2, batch=5)
    st = train.fit(trainer, st, data, steps_per_call=4)
    assert st.step == 4 and trainer.cache.block is None


def test_bad_steps_per_call():
    trainer, st = _fresh()
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="steps_per_call"):
            train.fit(trainer, st, _batches(1), steps_per_call=bad)


def test_fast_dispatch_of_step_equals_the_general_path():
    from dataclasses import replace

    batches = _batches(6)
    trainer, fast = _fresh()
    _, slow = _fresh()
    for x, fn in batches:
        lf, fast = train.step(trainer, fast, x, fn)  # after the first step: the cached dispatch
        ls, slow = train.step(trainer, replace(slow), x, fn)  # replace() drops the cache
        np.testing.assert_array_equal(np.asarray(lf), np.asarray(ls))
    assert fast.cache.flat is not None
    for a, b in zip(_host(fast), _host(slow)):
        np.testing.assert_array_equal(a, b)
    assert trainer.cache.step.trace_count == 1
    with pytest.raises(ValueError, match="consumed"):
        train.step(trainer, _consumed(trainer, fast), *batches[0])


def _consumed(trainer, st):
    train.step(trainer, st, *_batches(1)[0])
    return st


def test_steps_on_stacked_device_blocks_equals_single_steps():
    """``train.steps`` over a pre-stacked block (labels captured with a leading K axis) gives the
    losses and final state of K single ``train.step`` calls."""
    batches = _batches(6, seed=4)
    trainer, st = _fresh(dropout=True)
    single = []
    for x, fn in batches:
        value, st = train.step(trainer, st, x, fn)
        single.append(float(value))
    xs = np.stack([x for x, _ in batches])
    ys = np.stack([fn.__closure__[0].cell_contents for _, fn in batches])
    trainer2, st2 = _fresh(dropout=True)
    losses, st2 = train.steps(
        trainer2,
        st2,
        transfer.to_device(xs, xs.dtype, kn.runtime.devices()[0]),
        lambda logits: loss.cross_entropy_sparse(logits, ys),
    )
    np.testing.assert_array_equal(np.asarray(losses), np.asarray(single, np.float32))
    assert st2.step == 6
    for a, b in zip(_host(st), _host(st2)):
        np.testing.assert_array_equal(a, b)


def test_steps_rejects_captured_arrays_without_the_block_axis():
    trainer, st = _fresh()
    xs = np.zeros((3, 4, 8), np.float32)
    labels = np.zeros((4,), np.int32)  # one batch's labels, not a block of 3
    with pytest.raises(ValueError, match="leading axis of K = 3"):
        train.steps(trainer, st, xs, lambda logits: loss.cross_entropy_sparse(logits, labels))

    class Loss:  # a callable object: its arrays cannot be found, so they cannot be sliced per step
        def __call__(self, logits):
            return loss.cross_entropy_sparse(logits, np.zeros((3, 4), np.int32)[0])

    with pytest.raises(ValueError, match="plain function or functools.partial"):
        train.steps(trainer, st, xs, Loss())
    with pytest.raises(ValueError, match="leading axis of K >= 1"):
        train.steps(trainer, st, np.float32(1.0), lambda logits: logits.sum())


def _explicit(dropout=False):
    trainer = train.make(_model(dropout), optim.adam(1e-2), loss=loss.cross_entropy_sparse)
    with rng.scope(3):
        st = train.init(trainer)
    return trainer, st


def _tuples(n: int):
    """The batches of ``_batches`` as ``(x, y)`` tuples (the same data)."""
    r = np.random.default_rng(0)
    return [
        (r.standard_normal((4, 8)).astype(np.float32), r.integers(0, 3, 4).astype(np.int32)) for _ in range(n)
    ]


@pytest.mark.parametrize("k", [1, 3])
def test_explicit_fit_over_tuples_equals_the_closure_form(k):
    trainer, st = _explicit(dropout=True)
    seen = []
    st = train.fit(
        trainer, st, _tuples(7), report=lambda step, loss, state: seen.append(loss), steps_per_call=k
    )
    _, closure_st, closure_seen = _run(1, 7, dropout=True)
    np.testing.assert_array_equal(seen, [value for _, value in closure_seen])
    for a, b in zip(_host(st), _host(closure_st)):
        np.testing.assert_array_equal(a, b)
    if k == 3:
        assert trainer.cache.block.trace_count == 1


def test_explicit_steps_on_stacked_targets_equals_single_steps():
    batches = _tuples(4)
    trainer, st = _explicit()
    xs, ys = (np.stack(column) for column in zip(*batches))
    losses, st = train.steps(trainer, st, xs, ys)
    single_trainer, single = _explicit()
    want = []
    for x, y in batches:
        value, single = train.step(single_trainer, single, x, y)
        want.append(float(value))
    np.testing.assert_array_equal(np.asarray(losses), np.asarray(want, np.float32))
    for a, b in zip(_host(st), _host(single)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="every target needs a leading axis of K = 4"):
        train.steps(trainer, st, xs, ys[:2])


def test_explicit_fast_dispatch_equals_the_general_path():
    batches = _tuples(3)
    trainer, fast = _explicit()
    _, general = _explicit()
    for x, y in batches:
        _, fast = train.step(trainer, fast, x, y)
        # a replaced state has an empty cache: the general path runs
        _, general = train.step(trainer, dataclasses.replace(general), x, y)
    assert fast.cache.flat is not None
    assert len(trainer.cache.step.routes) == 1
    for a, b in zip(_host(fast), _host(general)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("k", [1, 2])
def test_report_every_n_steps_and_always_the_last(k):
    trainer, st = _explicit()
    seen = []
    st = train.fit(
        trainer,
        st,
        iter(_tuples(7)),
        steps_per_call=k,
        report_every=3,
        report=lambda step, loss, state: seen.append((step, float(loss))),
    )
    assert [s for s, _ in seen] == [3, 6, 7]  # a generator: the length is unknown until the end
    _, reference = _explicit()
    losses = []
    for x, y in _tuples(7):
        value, reference = train.step(trainer, reference, x, y)
        losses.append(float(value))
    np.testing.assert_array_equal([v for _, v in seen], [losses[2], losses[5], losses[6]])
    with pytest.raises(ValueError, match="report_every"):
        train.fit(trainer, st, [], report_every=0)
