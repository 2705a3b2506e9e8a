"""The capture matrix: however a loss reaches its labels, a step with new labels never runs an
executable built for old ones.

Each capture style is run three times on the same fresh state — labels A, labels B (same
shape, different data), labels A again — and every loss is checked against a NumPy reference
computed from the initial parameters. Styles whose arrays can be lifted to inputs must not warn
or retrace; the others must warn once (naming the explicit form) and still be right.
"""

from __future__ import annotations

import functools
import types
import warnings

import numpy as np
import pytest

from kaun_ir import layer, optim, rng, train
from kaun_ir.nn import loss

X = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)
LABELS_A = np.array([0, 1, 2, 0], np.int32)
LABELS_B = np.array([2, 2, 1, 1], np.int32)

_GLOBAL_LABELS = LABELS_A
_HELPER_LABELS = LABELS_A


def _ce(logits, labels):
    return loss.cross_entropy_sparse(logits, labels)


def _reference(st: train.State, labels) -> float:
    """NumPy cross-entropy of the linear model's logits under the state's parameters."""
    params = st.vars.params
    logits = X.astype(np.float64) @ np.asarray(params["weight"], np.float64) + np.asarray(params["bias"])
    top = logits.max(axis=1, keepdims=True)
    log_z = (top + np.log(np.exp(logits - top).sum(axis=1, keepdims=True)))[:, 0]
    return float(np.mean(log_z - logits[np.arange(len(labels)), labels]))


# ------------------------------------------------------------------ the capture styles
# each builds a loss_fn reading `labels`; `reuse` keeps state between the calls of one style


def _cell(labels, reuse):
    return lambda logits: _ce(logits, labels)


def _rebound_cell(labels, reuse):
    # one function object whose closure variable is rebound between the calls
    if "fn" not in reuse:
        current = labels

        def set_labels(new):
            nonlocal current
            current = new

        reuse["fn"] = lambda logits: _ce(logits, current)
        reuse["set"] = set_labels
    reuse["set"](labels)
    return reuse["fn"]


def _module_global(labels, reuse):
    global _GLOBAL_LABELS
    _GLOBAL_LABELS = labels
    return _global_loss


def _global_loss(logits):
    return _ce(logits, _GLOBAL_LABELS)


def _default(labels, reuse):
    return lambda logits, y=labels: _ce(logits, y)


def _kw_default(labels, reuse):
    return lambda logits, *, y=labels: _ce(logits, y)


def _partial(labels, reuse):
    return functools.partial(_ce, labels=labels)


def _dict_item(labels, reuse):
    batch = {"labels": labels, "tag": "train"}
    return lambda logits: _ce(logits, batch["labels"])


def _list_item(labels, reuse):
    ys = [labels]
    return lambda logits: _ce(logits, ys[0])


class _Box:
    pass


def _attribute(labels, reuse):
    # the example: one object, its attribute reassigned between steps
    box = reuse.setdefault("box", _Box())
    box.y = labels
    return lambda logits: _ce(logits, box.y)


class _Criterion:
    def __init__(self, labels):
        self.labels = labels

    def loss(self, logits):
        return _ce(logits, self.labels)

    def __call__(self, logits):
        return _ce(logits, self.labels)


def _bound_method(labels, reuse):
    return _Criterion(labels).loss


def _callable_object(labels, reuse):
    return _Criterion(labels)


def _nested_closure(labels, reuse):
    def make_inner(y):
        return lambda logits: _ce(logits, y)

    inner = make_inner(labels)
    return lambda logits: inner(logits)


def _helper(logits):
    return _ce(logits, _HELPER_LABELS)


def _helper_global(labels, reuse):
    global _HELPER_LABELS
    _HELPER_LABELS = labels
    return lambda logits: _helper(logits)


def _user_module(labels, reuse):
    module = reuse.setdefault("module", types.ModuleType("user_data"))
    module.y = labels
    return lambda logits: _ce(logits, module.y)


class _Holder:
    y = LABELS_A


def _class_attribute(labels, reuse):
    # reached through a class: nothing to inspect, found while the step is traced
    _Holder.y = labels
    return lambda logits: _ce(logits, _Holder.y)


LIFTED = [_cell, _rebound_cell, _module_global, _default, _kw_default, _partial, _dict_item, _list_item]
PROBED = [
    _attribute,
    _bound_method,
    _callable_object,
    _nested_closure,
    _helper_global,
    _user_module,
    _class_attribute,
]


def _run(style):
    trainer = train.make(layer.linear(5, 3), optim.sgd(0.1))
    reuse: dict = {}
    results = []
    for labels in (LABELS_A, LABELS_B, LABELS_A):
        with rng.scope(0):
            st = train.init(trainer)
        want = _reference(st, labels)
        value, _ = train.step(trainer, st, X, style(labels, reuse))
        results.append((float(value), want))
    return trainer, results


@pytest.mark.parametrize("style", LIFTED + PROBED, ids=lambda f: f.__name__.strip("_"))
def test_every_capture_style_trains_on_the_data_of_its_own_call(style):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, results = _run(style)
    for got, want in results:
        np.testing.assert_allclose(got, want, rtol=1e-5)
    assert abs(results[0][1] - results[1][1]) > 0.1  # the two label sets really give other losses
    ours = [w for w in caught if "train: the loss function reads data" in str(w.message)]
    if style in LIFTED:
        assert not ours, [str(w.message) for w in ours]
        assert trainer.cache.step.trace_count == 1  # new data of the same shapes: no retrace
    else:
        assert ours and "loss=fn" in str(ours[0].message)
        # the executable is keyed by the probed loss graph: new labels of one shape share it
        assert trainer.cache.step.trace_count <= 2


def test_the_probing_warning_is_given_once_per_loss_code():
    trainer = train.make(layer.linear(5, 3), optim.sgd(0.1))
    with rng.scope(0):
        st = train.init(trainer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for labels in (LABELS_A, LABELS_B, LABELS_A):
            _, st = train.step(trainer, st, X, _Criterion(labels).loss)
    assert sum("reads data" in str(w.message) for w in caught) <= 1


def test_explicit_targets_are_inputs_and_match_the_reference():
    trainer = train.make(layer.linear(5, 3), optim.sgd(0.1), loss=_ce)
    for labels in (LABELS_A, LABELS_B, LABELS_A):
        with rng.scope(0):
            st = train.init(trainer)
        want = _reference(st, labels)
        value, _ = train.step(trainer, st, X, labels)
        np.testing.assert_allclose(float(value), want, rtol=1e-5)
    assert trainer.cache.step.trace_count == 1


def test_explicit_form_with_several_targets_and_a_tree_target():
    def weighted(logits, labels, weights):
        per = loss.cross_entropy_sparse(logits, labels)
        return per * weights["scale"]

    trainer = train.make(layer.linear(5, 3), optim.sgd(0.1), loss=weighted)
    for scale in (1.0, 3.0):
        with rng.scope(0):
            st = train.init(trainer)
        want = scale * _reference(st, LABELS_B)
        value, _ = train.step(trainer, st, X, LABELS_B, {"scale": np.float32(scale)})
        np.testing.assert_allclose(float(value), want, rtol=1e-5)
    assert trainer.cache.step.trace_count == 1


def test_explicit_form_rejects_a_loss_function_and_closure_form_needs_one():
    explicit = train.make(layer.linear(5, 3), optim.sgd(0.1), loss=_ce)
    closure = train.make(layer.linear(5, 3), optim.sgd(0.1))
    with rng.scope(0):
        st = train.init(explicit)
    with pytest.raises(TypeError, match="made with loss="):
        train.step(explicit, st, X, lambda logits: _ce(logits, LABELS_A))
    with pytest.raises(TypeError, match="no loss function"):
        train.step(closure, st, X, LABELS_A)
    with pytest.raises(TypeError, match="loss must be a function"):
        train.make(layer.linear(5, 3), optim.sgd(0.1), loss=3)


# ------------------------------------------------------------------ repeated closures, quickly

_WEIGHT = 1.0


def _sgd_reference(st: train.State, schedule, lr: float = 0.1) -> list:
    """NumPy losses of ``weight * cross_entropy`` SGD steps of the linear model from ``st``."""
    w = np.asarray(st.vars.params["weight"], np.float64)
    b = np.asarray(st.vars.params["bias"], np.float64)
    x = X.astype(np.float64)
    losses = []
    for labels, weight in schedule:
        logits = x @ w + b
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        p = e / e.sum(axis=1, keepdims=True)
        losses.append(weight * float(np.mean(-np.log(p[np.arange(len(labels)), labels]))))
        g = p.copy()
        g[np.arange(len(labels)), labels] -= 1.0
        g *= weight / len(labels)
        w, b = w - lr * x.T @ g, b - lr * g.sum(axis=0)
    return losses


def _weighted(weight, cross_entropy, labels):
    return lambda logits: weight * cross_entropy(logits, labels)


def _global_weighted(labels):
    return lambda logits: _WEIGHT * loss.cross_entropy_sparse(logits, labels)


def _global_weighted_list(held):
    return lambda logits: _WEIGHT * loss.cross_entropy_sparse(logits, held[0])


def _counting_specs(monkeypatch) -> list:
    from kaun_ir.train import capture, dispatch

    made = []

    class Counting(capture.LossSpec):
        def __init__(self, fn):
            made.append(fn)
            super().__init__(fn)

    monkeypatch.setattr(dispatch, "LossSpec", Counting)
    return made


def test_repeated_closures_take_the_quick_key_and_see_changed_cells(monkeypatch):
    made = _counting_specs(monkeypatch)
    trainer = train.make(layer.linear(5, 3), optim.sgd(0.1))
    with rng.scope(0):
        st = train.init(trainer)
    schedule = [(LABELS_A if i % 2 else LABELS_B, 1.0 if i < 5 else 2.5) for i in range(8)]
    want = _sgd_reference(st, schedule)
    got = []
    for labels, weight in schedule:
        value, st = train.step(trainer, st, X, _weighted(weight, loss.cross_entropy_sparse, labels))
        got.append(float(value))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # inspected fully once per key (the weight is part of it), quickly otherwise
    assert len(made) <= 3
    assert trainer.cache.step.trace_count == 2


def test_quick_key_sees_a_rebound_global_and_a_cell_of_another_kind(monkeypatch):
    global _WEIGHT
    made = _counting_specs(monkeypatch)
    trainer = train.make(layer.linear(5, 3), optim.sgd(0.1))
    with rng.scope(0):
        st = train.init(trainer)
    schedule = [(LABELS_A if i % 2 else LABELS_B, 1.0 if i < 4 else 3.0) for i in range(7)]
    want = _sgd_reference(st, schedule)
    got = []
    try:
        for i, (labels, weight) in enumerate(schedule):
            _WEIGHT = weight
            # the last closure holds its labels in a list: not quick, the full inspection
            fn = _global_weighted_list([labels]) if i == 6 else _global_weighted(labels)
            value, st = train.step(trainer, st, X, fn)
            got.append(float(value))
    finally:
        _WEIGHT = 1.0
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert len(made) <= 4
