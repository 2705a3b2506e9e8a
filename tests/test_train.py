"""Tests of ``kn.train`` (API §7): accuracy on digits, the one-executable-per-signature step,
donation, in-graph schedules, dropout, batch norm, resuming, ``fit`` and its errors, the IR
of the step.

Oracles: jax.numpy forward passes, a jax.grad + optax reference loop, NumPy batch statistics,
and bit-for-bit comparisons between runs. Compile counts use shapes no other test uses, so the
process-wide executable cache (keyed by the StableHLO text) cannot hide a compilation.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import kaun_ir as kn
from kaun_ir import data, datasets, layer, optim, rng, train, tree
from kaun_ir.ir.interp import interpret
from kaun_ir.nn import loss, metric
from kaun_ir.tools import demo

# ------------------------------------------------------------------------------ helpers


def _ce(labels):
    """A loss closing over ``labels``; every call gives a new closure of the same code."""
    return lambda logits: loss.cross_entropy_sparse(logits, labels)


def _mse(targets):
    return lambda predictions: loss.mse(predictions, targets)


def _leaves(t) -> list:
    return tree.flatten(t)[0]


def _state_leaves(st: train.State) -> list:
    """Every array of a training state: params, layer state, optimiser count and trees."""
    return _leaves((st.vars.params, st.vars.state, tuple(st.opt_state)))


def _host(t) -> list[np.ndarray]:
    return [np.array(leaf) for leaf in _leaves(t)]


def _host_state(st: train.State) -> list[np.ndarray]:
    return [np.array(leaf) for leaf in _state_leaves(st)] + [np.array(st.key)]


def _classification(seed: int, n: int, features: int, classes: int):
    rs = np.random.default_rng(seed)
    x = rs.normal(size=(n, features)).astype(np.float32)
    y = rs.integers(0, classes, size=n).astype(np.int32)
    return x, y


def _oracle_ce(logits, labels) -> float:
    logits = jnp.asarray(logits, jnp.float32)
    picked = jnp.take_along_axis(logits, jnp.asarray(labels)[:, None], axis=1)[:, 0]
    return float(jnp.mean(jax.nn.logsumexp(logits, axis=1) - picked))


def _init(trainer, seed: int) -> train.State:
    with rng.scope(seed):
        return train.init(trainer)


# ------------------------------------------------------------------------------ digits


def _digit_batches(x, y, seed):
    def pair(batch):
        images, labels = batch
        return images, lambda logits: loss.cross_entropy_sparse(logits, labels)

    return data.map(pair, data.prepare((x, y), 32, shuffle=True, seed=seed))


def _train_digits(build, splits, seed=1, epochs=25):
    """The demo's model and hyper-parameters (adam 3e-3, batch 32), fixed seeds."""
    (x_train, y_train), (x_test, y_test) = splits
    trainer = train.make(build(), optim.adam(3e-3))
    st = _init(trainer, seed)
    for epoch in range(1, epochs + 1):
        st = train.fit(trainer, st, _digit_batches(x_train, y_train, seed * 1000 + epoch))
    accuracy = metric.accuracy(np.asarray(train.predict(trainer, st, x_test)), y_test)
    return trainer, st, accuracy


@pytest.fixture(scope="module")
def digits():
    return datasets.digits(seed=0)


@pytest.fixture(scope="module")
def trained_mlp(digits):
    return _train_digits(demo.mlp, digits)


@pytest.fixture(scope="module")
def trained_cnn(digits):
    return _train_digits(demo.cnn, digits)


def test_mlp_reaches_95_percent(trained_mlp, digits):
    trainer, st, accuracy = trained_mlp
    (x_train, _), _ = digits
    assert accuracy >= 0.95, accuracy
    assert st.step == 25 * (len(x_train) // 32)
    # every batch has one shape (prepare drops the last partial batch): one trace
    assert trainer.cache.step.trace_count == 1


def test_cnn_reaches_97_percent(trained_cnn):
    trainer, st, accuracy = trained_cnn
    assert accuracy >= 0.97, accuracy
    assert trainer.cache.step.trace_count == 1


def test_predict_matches_apply_and_a_jax_forward(trained_mlp, digits):
    trainer, st, _ = trained_mlp
    _, (x_test, _) = digits
    predicted = np.asarray(train.predict(trainer, st, x_test))
    applied, vars2 = layer.apply(trainer.model, st.vars, x_test, training=False)
    assert np.array_equal(predicted, np.asarray(applied))
    assert vars2.state == st.vars.state  # the MLP has no layer state; nothing changes
    # oracle: flatten -> linear -> relu -> linear in jax.numpy
    p = st.vars.params
    h = jnp.maximum(jnp.asarray(x_test).reshape(len(x_test), 64) @ p[1]["weight"] + p[1]["bias"], 0.0)
    expected = h @ p[3]["weight"] + p[3]["bias"]
    np.testing.assert_allclose(predicted, np.asarray(expected), rtol=1e-5, atol=1e-5)


def test_predict_of_cnn_matches_apply(trained_cnn, digits):
    trainer, st, _ = trained_cnn
    _, (x_test, _) = digits
    applied = layer.apply(trainer.model, st.vars, x_test[:50], training=False)[0]
    assert np.array_equal(np.asarray(train.predict(trainer, st, x_test[:50])), np.asarray(applied))


# ------------------------------------------------------------------------------ early stop


def test_early_stop_ends_at_the_raising_step_and_returns_that_state():
    model = layer.linear(5, 3)
    trainer = train.make(model, optim.adam(1e-2))
    x, y = _classification(0, 40, 5, 3)
    batches = [(x[i : i + 4], _ce(y[i : i + 4])) for i in range(0, 40, 4)]  # 10 steps
    seen = []

    def report(step, loss, state):
        seen.append((step, loss, state))
        if step == 4:
            raise train.EarlyStop

    st = train.fit(trainer, _init(trainer, 0), batches, report=report)
    assert [s for s, _, _ in seen] == [1, 2, 3, 4]
    # the loss arrives as a 0-d device array: fit itself never waits for it
    assert all(np.ndim(value) == 0 and not isinstance(value, float) for _, value, _ in seen)
    assert st is seen[-1][2]
    assert st.step == 4
    assert not any(leaf.is_deleted() for leaf in _state_leaves(st))  # live, usable
    # the same as four steps by hand from the same initialisation
    by_hand = _init(trainer, 0)
    for i, (xb, loss_fn) in enumerate(batches[:4]):
        value, by_hand = train.step(trainer, by_hand, xb, loss_fn)
        assert float(value) == seen[i][1]
    for a, b in zip(_host_state(st), _host_state(by_hand)):
        assert np.array_equal(a, b)
    assert train.predict(trainer, st, x).shape == (40, 3)


def test_other_exceptions_in_report_propagate():
    trainer = train.make(layer.linear(5, 3), optim.sgd(0.1))
    x, y = _classification(1, 8, 5, 3)

    def report(step, loss, state):
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        train.fit(trainer, _init(trainer, 0), [(x, _ce(y))], report=report)


# ------------------------------------------------------------------------------ one executable


def test_same_shape_batches_reuse_one_executable_other_shapes_compile():
    # shapes (11 -> 5, batches of 6 and 9) are used by no other test
    trainer = train.make(layer.linear(11, 5), optim.adam(1e-2))
    st = _init(trainer, 0)
    compiles = kn.runtime.stats.compiles
    # (batch size, traces and compiles expected after the step): a new lambda over new labels
    # each time; one new signature for batches of 9; back to 6 is cached
    plan = [(6, 1), (6, 1), (6, 1), (6, 1), (9, 2), (6, 2), (9, 2)]
    for i, (n, expected) in enumerate(plan):
        x, y = _classification(10 + i, n, 11, 5)
        value, st = train.step(trainer, st, x, lambda logits: loss.cross_entropy_sparse(logits, y))  # noqa: B023 - train.step calls it now
        assert np.isfinite(float(value))
        assert trainer.cache.step.trace_count == expected, i
        assert kn.runtime.stats.compiles - compiles == expected, i
    assert st.step == len(plan)


def test_fit_compiles_once_per_distinct_batch_shape():
    # 23 examples in batches of 8 with drop_last=False: 8, 8, 7 -> two signatures
    trainer = train.make(layer.linear(9, 6), optim.adam(1e-2))
    x, y = _classification(3, 23, 9, 6)
    pipeline = data.map(lambda b: (b[0], _ce(b[1])), data.prepare((x, y), 8, drop_last=False))
    st = _init(trainer, 0)
    compiles = kn.runtime.stats.compiles
    st = train.fit(trainer, st, pipeline)
    assert st.step == 3
    assert trainer.cache.step.trace_count == 2
    assert kn.runtime.stats.compiles - compiles == 2
    st = train.fit(trainer, st, pipeline)  # a second epoch: nothing new
    assert st.step == 6
    assert trainer.cache.step.trace_count == 2
    assert kn.runtime.stats.compiles - compiles == 2


def test_captured_labels_are_inputs_of_the_executable():
    trainer = train.make(layer.linear(7, 4), optim.sgd(0.1))
    x, y1 = _classification(4, 12, 7, 4)
    y2 = (y1 + 1) % 4
    st_a, st_b = _init(trainer, 3), _init(trainer, 3)
    p = {k: np.array(v) for k, v in st_a.vars.params.items()}
    logits = x @ p["weight"] + p["bias"]
    loss_a, _ = train.step(trainer, st_a, x, _ce(y1))
    loss_b, _ = train.step(trainer, st_b, x, _ce(y2))  # same executable, other labels
    assert trainer.cache.step.trace_count == 1
    assert float(loss_a) != float(loss_b)
    np.testing.assert_allclose(float(loss_a), _oracle_ce(logits, y1), rtol=1e-5)
    np.testing.assert_allclose(float(loss_b), _oracle_ce(logits, y2), rtol=1e-5)


def test_captured_python_numbers_are_static_and_retrace():
    trainer = train.make(layer.linear(7, 4), optim.sgd(0.0))
    x, y = _classification(5, 12, 7, 4)

    def weighted(scale):
        return lambda logits: scale * loss.cross_entropy_sparse(logits, y)

    st = _init(trainer, 0)
    one, st = train.step(trainer, st, x, weighted(1.0))
    three, st = train.step(trainer, st, x, weighted(3.0))  # lr 0: the same parameters
    assert trainer.cache.step.trace_count == 2  # a static value is part of the signature, never stale
    np.testing.assert_allclose(float(three), 3.0 * float(one), rtol=1e-6)


def test_parameters_layer_state_and_optimiser_state_are_donated():
    model = layer.sequential([layer.linear(6, 8), layer.batch_norm(8), layer.relu(), layer.linear(8, 3)])
    trainer = train.make(model, optim.adam(1e-2))
    st = _init(trainer, 0)
    x, y = _classification(6, 10, 6, 3)
    old = _state_leaves(st)
    # 6 parameter arrays, the 2 batch-norm statistics, the step count, adam's mu and nu
    assert len(old) == 6 + 2 + 1 + 2 * 6
    _, new = train.step(trainer, st, x, _ce(y))
    assert all(leaf.is_deleted() for leaf in old)
    assert not st.key.is_deleted()  # the base key is reused by every step, never donated
    assert not any(leaf.is_deleted() for leaf in _state_leaves(new))
    assert new.step == st.step + 1


def test_updates_follow_the_backward_pass_so_xla_keeps_no_copy_of_a_donated_parameter():
    # above ORDER_UPDATES_MIN_BYTES of parameters every update reads a -0.0 that exists only
    # once all gradients do: the values are optax's, and XLA's program copies no parameter
    import re

    from kaun_ir.train.step_memory import ORDER_UPDATES_MIN_BYTES

    model = layer.sequential([layer.linear(256, 640), layer.gelu(), layer.linear(640, 256)])
    trainer = train.make(model, optim.adamw(1e-2, weight_decay=0.01), loss=loss.mse)
    st = _init(trainer, 0)
    params0 = kn.ptree.map(np.array, st.vars.params)
    assert sum(p.nbytes for p in tree.flatten(params0)[0]) >= ORDER_UPDATES_MIN_BYTES
    rs = np.random.default_rng(3)
    batches = [(rs.normal(size=(16, 256)).astype(np.float32),) * 2 for _ in range(3)]
    for x, t in batches:
        _, st = train.step(trainer, st, x, t)
    hlo = trainer.cache.step.executables()[0].hlo_text()
    assert not re.search(r"= f32\[[0-9,]+\]\{[0-9,]*\} copy\(%Arg", hlo)

    def objective(p, x, t):
        h = jax.nn.gelu(x @ p[0]["weight"] + p[0]["bias"], approximate=False)
        return jnp.mean((h @ p[2]["weight"] + p[2]["bias"] - t) ** 2)

    opt = optax.adamw(1e-2, weight_decay=0.01)
    p = kn.ptree.map(jnp.asarray, params0)
    opt_state = opt.init(p)
    for x, t in batches:
        grads = jax.grad(objective)(p, x, t)
        updates, opt_state = opt.update(grads, opt_state, p)
        p = optax.apply_updates(p, updates)
    for got, want in zip(tree.flatten(st.vars.params)[0], tree.flatten(p)[0]):
        # Adam's first steps divide by tiny second moments: rounding shows at ~1e-5
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=5e-5)


def test_frozen_parameters_are_left_out_of_the_update_ordering():
    # the ordering reads one gradient element per *updated* leaf: a frozen leaf's gradient, which
    # nothing else needs, is never computed for it (a LoRA base would pay its whole backward)
    model = layer.sequential([layer.linear(256, 640), layer.gelu(), layer.linear(640, 256)])
    frozen = optim.freeze(optim.adam(1e-2), lambda path: path.startswith("0."))
    trainer = train.make(model, frozen, loss=loss.mse)
    st = _init(trainer, 0)
    before = kn.ptree.map(np.array, st.vars.params)
    x = np.random.default_rng(4).normal(size=(16, 256)).astype(np.float32)
    graph = train.step_executable(trainer, st, x, x).graph
    joins = [n for n in graph.nodes if n.op == "concatenate" and n.path.startswith("optimizer")]
    assert [len(n.inputs) for n in joins] == [2]  # the second linear's weight and bias
    _, st = train.step(trainer, st, x, x)
    np.testing.assert_array_equal(np.asarray(st.vars.params[0]["weight"]), before[0]["weight"])
    assert not np.array_equal(np.asarray(st.vars.params[2]["weight"]), before[2]["weight"])


# ------------------------------------------------------------------------------ schedules


def test_adam_with_warmup_schedule_matches_a_jax_optax_reference():
    lr = optim.schedule.warmup_linear(0.0, 0.05, 4)
    trainer = train.make(layer.linear(3, 2), optim.adam(lr))
    st = _init(trainer, 0)
    params0 = {k: np.array(v) for k, v in st.vars.params.items()}
    rs = np.random.default_rng(7)
    batches = [
        (rs.normal(size=(5, 3)).astype(np.float32), rs.normal(size=(5, 2)).astype(np.float32))
        for _ in range(7)
    ]
    ours = []
    for x, t in batches:
        value, st = train.step(trainer, st, x, _mse(t))
        ours.append((float(value), {k: np.array(v) for k, v in st.vars.params.items()}))
    assert trainer.cache.step.trace_count == 1  # the step number is an input: the schedule is in-graph

    def reference(schedule):
        def objective(p, x, t):
            return jnp.mean((x @ p["weight"] + p["bias"] - t) ** 2)

        opt = optax.adam(schedule)

        @jax.jit  # one compilation instead of one per jax primitive
        def update(p, opt_state, x, t):
            value, grads = jax.value_and_grad(objective)(p, x, t)
            updates, opt_state = opt.update(grads, opt_state, p)
            return value, optax.apply_updates(p, updates), opt_state

        p = {k: jnp.asarray(v) for k, v in params0.items()}
        opt_state = opt.init(p)
        out = []
        for x, t in batches:
            value, p, opt_state = update(p, opt_state, x, t)
            out.append((float(value), {k: np.asarray(v) for k, v in p.items()}))
        return out

    # optax counts updates from 0, kaun_ir's schedules see the 1-based step
    expected = reference(lambda count: optax.linear_schedule(0.0, 0.05, 4)(count + 1))
    for (value, params), (ref_value, ref_params) in zip(ours, expected):
        np.testing.assert_allclose(value, ref_value, rtol=1e-5, atol=1e-7)
        for k in params:
            np.testing.assert_allclose(params[k], ref_params[k], rtol=1e-5, atol=1e-6)
    # the schedule matters: a constant peak rate gives another trajectory after step 1
    constant = reference(0.05)
    assert not np.allclose(ours[0][1]["weight"], constant[0][1]["weight"], rtol=1e-3, atol=0)


# ------------------------------------------------------------------------------ dropout


def _dropout_model():
    return layer.sequential([layer.linear(6, 32), layer.relu(), layer.dropout(0.5), layer.linear(32, 3)])


def test_dropout_draws_new_masks_every_step():
    trainer = train.make(_dropout_model(), optim.sgd(0.0))  # lr 0: parameters never change
    st = _init(trainer, 0)
    x, y = _classification(8, 16, 6, 3)
    losses = []
    for _ in range(4):
        value, st = train.step(trainer, st, x, _ce(y))
        losses.append(float(value))
    assert len(set(losses)) == 4, losses
    # without dropout the same batch gives the same loss every step
    evaluation = []
    for _ in range(2):
        value, st = train.step(trainer, st, x, _ce(y), training=False)
        evaluation.append(float(value))
    assert evaluation[0] == evaluation[1]
    assert evaluation[0] not in losses
    assert trainer.cache.step.trace_count == 2  # training=True and training=False


def _dropout_run(seed: int, key_seed: int | None = None, steps: int = 5):
    trainer = train.make(_dropout_model(), optim.adam(1e-2))
    if key_seed is None:
        st = _init(trainer, seed)
    else:  # the same parameters, another per-step key
        with rng.scope(seed):
            vars_ = layer.init(trainer.model)
        with rng.scope(key_seed):
            st = train.make_state(trainer, vars_)
    losses = []
    for i in range(steps):
        x, y = _classification(100 + i, 16, 6, 3)
        value, st = train.step(trainer, st, x, _ce(y))
        losses.append(float(value))
    return losses, _host_state(st)


def test_dropout_runs_are_reproducible_from_the_seed():
    losses_a, state_a = _dropout_run(0)
    losses_b, state_b = _dropout_run(0)
    assert losses_a == losses_b
    assert all(np.array_equal(a, b) for a, b in zip(state_a, state_b))
    # only the key differs: other masks, other losses
    losses_c, _ = _dropout_run(0, key_seed=1)
    losses_d, _ = _dropout_run(0, key_seed=2)
    assert losses_c != losses_d


# ------------------------------------------------------------------------------ batch norm


def test_batch_norm_statistics_are_updated_and_used_by_predict():
    momentum, eps = 0.9, 1e-5
    model = layer.sequential(
        [
            layer.linear(5, 4),
            layer.batch_norm(4, momentum=momentum, eps=eps),
            layer.relu(),
            layer.linear(4, 3),
        ]
    )
    trainer = train.make(model, optim.sgd(0.1))
    st = _init(trainer, 0)
    running_mean, running_var = np.zeros(4, np.float32), np.ones(4, np.float32)
    for i in range(2):  # two steps: the state of step 1 feeds step 2
        x, y = _classification(30 + i, 16, 5, 3)
        w, b = np.array(st.vars.params[0]["weight"]), np.array(st.vars.params[0]["bias"])
        h = x.astype(np.float64) @ w + b
        running_mean = momentum * running_mean + (1 - momentum) * h.mean(axis=0)
        running_var = momentum * running_var + (1 - momentum) * h.var(axis=0)
        _, st = train.step(trainer, st, x, _ce(y))
        np.testing.assert_allclose(
            np.array(st.vars.state[1]["running_mean"]), running_mean, rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(
            np.array(st.vars.state[1]["running_var"]), running_var, rtol=1e-5, atol=1e-6
        )
    # predict normalises with the running statistics (NumPy oracle)
    x, _ = _classification(40, 16, 5, 3)
    p = [{k: np.array(v, np.float64) for k, v in entry.items()} for entry in st.vars.params if entry]
    h = x @ p[0]["weight"] + p[0]["bias"]
    h = (h - running_mean) / np.sqrt(running_var + eps) * p[1]["scale"] + p[1]["bias"]
    expected = np.maximum(h, 0.0) @ p[2]["weight"] + p[2]["bias"]
    predicted = np.asarray(train.predict(trainer, st, x))
    np.testing.assert_allclose(predicted, expected, rtol=1e-4, atol=1e-5)
    # ... not the batch's statistics
    training_mode = np.asarray(layer.apply(model, st.vars, x, training=True)[0])
    assert not np.allclose(predicted, training_mode, rtol=1e-3, atol=1e-3)


# ------------------------------------------------------------------------------ resume


def _resume_model():
    return layer.sequential(
        [layer.linear(6, 12), layer.batch_norm(12), layer.relu(), layer.dropout(0.3), layer.linear(12, 3)]
    )


def test_resume_from_a_saved_state_equals_the_uninterrupted_run(tmp_path):
    n, m = 4, 3
    batches = []
    for i in range(n + m):
        x, y = _classification(50 + i, 8, 6, 3)
        batches.append((x, _ce(y)))

    def collect(into):
        return lambda step, loss, state: into.append(loss)

    trainer = train.make(_resume_model(), optim.adam(1e-2))
    full_losses = []
    full = train.fit(trainer, _init(trainer, 0), batches, report=collect(full_losses))

    first = train.make(_resume_model(), optim.adam(1e-2))
    part_losses = []
    st = train.fit(first, _init(first, 0), batches[:n], report=collect(part_losses))
    path = tmp_path / "state.safetensors"
    train.save(str(path), st)

    fresh = train.make(_resume_model(), optim.adam(1e-2))
    like = _init(fresh, 123)  # another seed: everything must come from the file
    resumed = train.load(str(path), fresh, like)
    assert isinstance(resumed, train.State)
    assert resumed.step == n
    resumed = train.fit(fresh, resumed, batches[n:], report=collect(part_losses))

    assert resumed.step == full.step == n + m
    assert part_losses == full_losses
    got, want = _host_state(resumed), _host_state(full)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and np.array_equal(a, b)


# ------------------------------------------------------------------------------ fit and data


def test_fit_resets_a_data_pipeline_each_call():
    trainer = train.make(layer.linear(4, 3), optim.adam(1e-2))
    x, y = _classification(60, 20, 4, 3)
    pipeline = data.map(lambda b: (b[0], _ce(b[1])), data.prepare((x, y), 5))
    steps = []

    def report(step, loss, state):
        steps.append(step)

    st = train.fit(trainer, _init(trainer, 0), pipeline, report=report)
    st = train.fit(trainer, st, pipeline, report=report)
    assert steps == [1, 2, 3, 4, 1, 2, 3, 4]
    assert st.step == 8
    # two epochs by hand over the same (unshuffled) order
    by_hand = _init(trainer, 0)
    for _ in range(2):
        for i in range(0, 20, 5):
            _, by_hand = train.step(trainer, by_hand, x[i : i + 5], _ce(y[i : i + 5]))
    for a, b in zip(_host_state(st), _host_state(by_hand)):
        assert np.array_equal(a, b)
    # a pipeline left half read is rewound too
    pipeline.reset()
    next(pipeline)
    st = train.fit(trainer, st, pipeline)
    assert st.step == 12


def test_fit_accepts_a_generator_and_an_empty_iterable():
    trainer = train.make(layer.linear(4, 3), optim.sgd(0.1))
    x, y = _classification(61, 6, 4, 3)
    st = _init(trainer, 0)
    st = train.fit(trainer, st, ((x, _ce(y)) for _ in range(3)))
    assert st.step == 3
    assert train.fit(trainer, st, []) is st


def test_fit_progress_bar_on_request_only(capsys):
    trainer = train.make(layer.linear(4, 3), optim.sgd(0.1))
    x, y = _classification(66, 6, 4, 3)
    st = train.fit(trainer, _init(trainer, 0), data.repeat(3, (x, _ce(y))), progress=True)
    err = capsys.readouterr().err
    assert "3/3" in err and "loss" in err and err.endswith("\n")
    train.fit(trainer, st, data.repeat(3, (x, _ce(y))), progress=False)
    assert capsys.readouterr().err == ""
    assert train.vars(st) is st.vars


# ------------------------------------------------------------------------------ captured labels
# The ways a user's loss function can carry a batch's labels. Each run uses sgd(0.0), so the
# parameters never change and every loss can be checked against the jax oracle.


def _label_batches(count: int):
    x, _ = _classification(80, 6, 4, 3)
    labels = [np.random.default_rng(81 + i).integers(0, 3, size=6).astype(np.int32) for i in range(count)]
    return x, labels


def _check_losses(trainer, st0_params, x, labels, losses, traces):
    logits = x @ st0_params["weight"] + st0_params["bias"]
    want = [_oracle_ce(logits, y) for y in labels]
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    assert trainer.cache.step.trace_count == traces


_SCRIPT = """
losses = []
for yb in labels:
    value, st = train.step(trainer, st, x, lambda logits: loss.cross_entropy_sparse(logits, yb))
    losses.append(float(value))
"""


def test_labels_of_a_module_level_loop_are_inputs():
    trainer = train.make(layer.linear(4, 3), optim.sgd(0.0))
    st = _init(trainer, 0)
    params = {k: np.array(v) for k, v in st.vars.params.items()}
    x, labels = _label_batches(3)
    namespace = {"train": train, "loss": loss, "trainer": trainer, "st": st, "x": x, "labels": labels}
    exec(compile(_SCRIPT, "<script>", "exec"), namespace)  # the loop runs at module level
    _check_losses(trainer, params, x, labels, namespace["losses"], traces=1)


def test_keyword_only_defaults_of_the_loss_fn_are_not_stale():
    trainer = train.make(layer.linear(4, 3), optim.sgd(0.0))
    x, labels = _label_batches(1)

    def weighted(scale):
        return lambda logits, *, w=scale: w * loss.cross_entropy_sparse(logits, labels[0])

    st = _init(trainer, 0)
    one, st = train.step(trainer, st, x, weighted(1.0))
    three, st = train.step(trainer, st, x, weighted(3.0))
    np.testing.assert_allclose(float(three), 3.0 * float(one), rtol=1e-6)


def test_labels_bound_as_a_default_argument_are_inputs():
    trainer = train.make(layer.linear(4, 3), optim.sgd(0.0))
    st = _init(trainer, 0)
    params = {k: np.array(v) for k, v in st.vars.params.items()}
    x, labels = _label_batches(3)
    losses = []
    for y in labels:
        value, st = train.step(trainer, st, x, lambda logits, y=y: loss.cross_entropy_sparse(logits, y))
        losses.append(float(value))
    _check_losses(trainer, params, x, labels, losses, traces=1)


def test_labels_bound_by_functools_partial_are_inputs():
    trainer = train.make(layer.linear(4, 3), optim.sgd(0.0))
    st = _init(trainer, 0)
    params = {k: np.array(v) for k, v in st.vars.params.items()}
    x, labels = _label_batches(3)
    losses = []
    for y in labels:
        value, st = train.step(trainer, st, x, functools.partial(loss.cross_entropy_sparse, labels=y))
        losses.append(float(value))
    _check_losses(trainer, params, x, labels, losses, traces=1)


def test_closures_over_containers_of_labels_are_inputs():
    trainer = train.make(layer.linear(4, 3), optim.sgd(0.0))
    st = _init(trainer, 0)
    params = {k: np.array(v) for k, v in st.vars.params.items()}
    x, labels = _label_batches(3)
    losses = []
    for y in labels:
        batch = {"labels": y, "name": "train"}  # a dict with an array and a static string
        value, st = train.step(
            trainer,
            st,
            x,
            lambda logits: loss.cross_entropy_sparse(logits, batch["labels"]),  # noqa: B023 - train.step calls it now
        )
        losses.append(float(value))
    _check_losses(trainer, params, x, labels, losses, traces=1)


# ------------------------------------------------------------------------------ errors


def test_non_scalar_loss_is_a_clear_error_and_consumes_nothing():
    trainer = train.make(layer.linear(4, 3), optim.sgd(0.1))
    x, y = _classification(62, 6, 4, 3)
    st = _init(trainer, 0)
    with pytest.raises(ValueError, match=r"loss_fn must return a scalar.*\[6\]"):
        train.step(trainer, st, x, lambda logits: logits.sum(axis=1))
    assert not any(leaf.is_deleted() for leaf in _state_leaves(st))  # still usable
    _, st = train.step(trainer, st, x, _ce(y))
    assert st.step == 1


@pytest.mark.parametrize("bad", [None, (1, 2), "state"])
def test_step_rejects_a_state_that_is_not_a_train_state(bad):
    trainer = train.make(layer.linear(4, 3), optim.sgd(0.1))
    x, y = _classification(63, 6, 4, 3)
    with pytest.raises(TypeError, match="train.State"):
        train.step(trainer, bad, x, _ce(y))


def test_step_rejects_vars_in_place_of_a_state():
    trainer = train.make(layer.linear(4, 3), optim.sgd(0.1))
    x, y = _classification(63, 6, 4, 3)
    st = _init(trainer, 0)
    with pytest.raises(TypeError, match=r"train.State.*Vars"):
        train.step(trainer, st.vars, x, _ce(y))
    with pytest.raises(TypeError, match="train.State"):
        train.fit(trainer, st.vars, [(x, _ce(y))])


def test_other_bad_arguments():
    trainer = train.make(layer.linear(4, 3), optim.sgd(0.1))
    x, y = _classification(64, 6, 4, 3)
    st = _init(trainer, 0)
    with pytest.raises(TypeError, match="callable"):
        train.step(trainer, st, x, 3.0)
    with pytest.raises(TypeError, match="pairs"):
        train.fit(trainer, st, [x])
    with pytest.raises(TypeError, match="Layer"):
        train.make(lambda x: x, optim.sgd(0.1))
    with pytest.raises(TypeError, match="optim"):
        train.make(layer.linear(4, 3), 0.1)


def test_reusing_a_consumed_state_is_a_clear_error():
    trainer = train.make(layer.linear(4, 3), optim.sgd(0.1))
    x, y = _classification(67, 6, 4, 3)
    old = _init(trainer, 0)
    train.step(trainer, old, x, _ce(y))
    with pytest.raises(ValueError, match="consumed"):
        train.step(trainer, old, x, _ce(y))


@pytest.mark.parametrize("call", ["predict", "save", "step_graph", "forward_graph"])
def test_every_entry_point_rejects_vars_in_place_of_a_state(call, tmp_path):
    trainer = train.make(layer.linear(4, 3), optim.sgd(0.1))
    x, y = _classification(65, 6, 4, 3)
    vars_ = _init(trainer, 0).vars
    calls = {
        "predict": lambda: train.predict(trainer, vars_, x),
        "save": lambda: train.save(str(tmp_path / "s.safetensors"), vars_),
        "step_graph": lambda: train.step_graph(trainer, vars_, x, _ce(y)),
        "forward_graph": lambda: train.forward_graph(trainer, vars_, x),
    }
    with pytest.raises(TypeError, match="train.State"):
        calls[call]()


# ------------------------------------------------------------------------------ the IR


def _round_trips(graph) -> None:
    graph.verify()
    text = graph.text()
    assert kn.ir.parse(text).text() == text


def test_step_graph_and_forward_graph_verify_parse_back_and_compute_the_step():
    model = layer.sequential([layer.linear(5, 7), layer.batch_norm(7), layer.relu(), layer.linear(7, 3)])
    trainer = train.make(model, optim.adam(1e-2))
    st = _init(trainer, 0)
    x, y = _classification(70, 8, 5, 3)

    traced = train.step_graph(trainer, st, x, _ce(y))
    optimized = train.step_graph(trainer, st, x, _ce(y), optimized=True)
    forward = train.forward_graph(trainer, st, x)
    for graph in (traced, optimized, forward):
        _round_trips(graph)
    assert len(optimized.nodes) <= len(traced.nodes)
    assert not any(leaf.is_deleted() for leaf in _state_leaves(st))  # nothing consumed

    # the forward graph, run by the NumPy reference interpreter, is predict
    inputs = [np.array(leaf) for leaf in _leaves((st.vars.params, st.vars.state, x))]
    np.testing.assert_allclose(
        interpret(forward, *inputs)[0], np.asarray(train.predict(trainer, st, x)), rtol=1e-5, atol=1e-5
    )
    # the traced step graph, interpreted, gives the loss and parameters of train.step
    # the traced graph's inputs: params, layer state, optimiser state, key, x, the lifted labels
    step_inputs = _host((st.vars.params, st.vars.state, tuple(st.opt_state), st.key, x, y))
    outputs = interpret(traced, *step_inputs)
    value, new = train.step(trainer, st, x, _ce(y))
    np.testing.assert_allclose(outputs[0], float(value), rtol=1e-5)
    new_params = _host(new.vars.params)  # 0.bias, 0.weight, 1.bias, 1.scale, 3.bias, 3.weight
    assert [o.shape for o in outputs[1:7]] == [p.shape for p in new_params]
    # the first layer's gradients are ~0 (batch norm removes them), where Adam's update is
    # rounding noise; compare the layers after it
    for got, want in zip(outputs[3:7], new_params[2:]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
