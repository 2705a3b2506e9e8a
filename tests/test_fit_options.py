"""train.FitOptions: fit's settings as one record, checked before any step runs."""

from __future__ import annotations

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import layer, loss, optim, train


@pytest.fixture(scope="module")
def setup():
    model = layer.sequential([layer.linear(4, 8), layer.tanh(), layer.linear(8, 1)])
    trainer = train.make(model, optim.sgd(0.1), loss=loss.mse)
    r = np.random.default_rng(0)
    xs = r.standard_normal((32, 4)).astype(np.float32)
    ys = (xs @ r.standard_normal((4, 1))).astype(np.float32)
    batches = [(xs[i : i + 8], ys[i : i + 8]) for i in range(0, 32, 8)]
    return trainer, batches


def _fresh(trainer):
    with kn.rng.scope(0):
        return train.init(trainer)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"epochs": 0}, "epochs must be an int >= 1"),
        ({"report_every": 1.5}, "report_every must be an int >= 1"),
        ({"steps_per_call": True}, "steps_per_call must be an int >= 1"),
        ({"keep_last": -1}, "keep_last must be an int >= 1"),
        ({"checkpoint_every": 2}, "checkpoint_every= needs checkpoint_dir="),
        ({"profile_steps": (1.5, 2.5), "profile_dir": "p"}, "profile_steps must be two integer steps"),
        ({"profile_steps": (3, 2), "profile_dir": "p"}, "1 <= first <= last"),
        ({"profile_steps": 3, "profile_dir": "p"}, "must be a pair"),
        ({"profile_steps": (1, 2)}, "needs profile_dir="),
    ],
)
def test_bad_values_are_refused_before_any_step(setup, options, match):
    trainer, batches = setup
    with pytest.raises(ValueError, match=match):
        train.FitOptions(**options)
    st = _fresh(trainer)
    with pytest.raises(ValueError, match=match):
        train.fit(trainer, st, batches, **options)
    assert st.step == 0


@pytest.mark.parametrize(
    "options, match",
    [
        ({"callbacks": 3}, "callbacks must be a list of train.Callback"),
        ({"callbacks": [print]}, "callbacks must be train.Callback objects"),
        ({"report": "every step"}, "report must be callable"),
        ({"epoch": 2}, "unexpected keyword argument.*epoch.*epochs"),
    ],
)
def test_wrong_kinds_are_type_errors(setup, options, match):
    trainer, batches = setup
    with pytest.raises(TypeError, match=match):
        train.fit(trainer, _fresh(trainer), batches, **options)


def test_options_must_be_a_record(setup):
    trainer, batches = setup
    with pytest.raises(TypeError, match="options must be a train.FitOptions"):
        train.fit(trainer, _fresh(trainer), batches, None, None, {"epochs": 2})


def test_the_record_and_the_keywords_are_one_call(setup):
    trainer, batches = setup
    seen = {"record": [], "keywords": []}
    record = train.FitOptions(
        report=lambda step, loss, state: seen["record"].append((step, float(loss))), epochs=2, report_every=3
    )
    a = train.fit(trainer, _fresh(trainer), batches, options=record)
    b = train.fit(
        trainer,
        _fresh(trainer),
        batches,
        report=lambda step, loss, state: seen["keywords"].append((step, float(loss))),
        epochs=2,
        report_every=3,
    )
    assert a.step == b.step == 8
    assert [s for s, _ in seen["record"]] == [3, 6, 8]
    assert seen["record"] == seen["keywords"]
    for got, want in zip(kn.ptree.flatten(a.vars.params)[0], kn.ptree.flatten(b.vars.params)[0]):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # a keyword laid over the record wins
    c = train.fit(trainer, _fresh(trainer), batches, options=record, epochs=1)
    assert c.step == 4


def test_eval_data_may_not_be_the_training_pipeline(setup):
    trainer, _ = setup
    pipeline = kn.data.prepare((np.zeros((16, 4), np.float32), np.zeros((16, 1), np.float32)), batch_size=8)
    with pytest.raises(ValueError, match="eval_data is the training pipeline"):
        train.fit(trainer, _fresh(trainer), pipeline, eval_data=pipeline, eval_every=1)
