"""kn.optim.schedule against optax's schedules (the oracle), on Python ints and on a traced int32
step. Both evaluate the same function of n; kaun_ir's optimisers call it with the 1-based step,
optax's with the 0-based count (tests/test_optim.py checks that shift on whole trajectories).
"""

from __future__ import annotations

import math

import jax
import numpy as np
import optax
import pytest

import kaun_ir as kn
from kaun_ir.optim import schedule

STEPS = np.concatenate([np.arange(0, 64), [1000, 10**6]]).astype(np.int32)


def reference(theirs, steps=STEPS):
    """optax's schedule on an array of steps, in one call (constant_schedule gives a scalar)."""
    return np.broadcast_to(np.asarray(theirs(steps)), steps.shape)


@pytest.fixture(autouse=True)
def _jax_default_precision():
    with jax.enable_x64(False):
        yield


def _cosine_warmup_reference(init, peak, warmup):
    """Kaun's warmup_cosine from optax pieces: peak - cosine_decay(peak - init)."""
    decay = optax.cosine_decay_schedule(peak - init, warmup)
    return lambda n: peak - decay(n)


CASES = {
    "constant": (schedule.constant(0.3), optax.constant_schedule(0.3)),
    "cosine_decay": (schedule.cosine_decay(0.1, 40), optax.cosine_decay_schedule(0.1, 40)),
    "cosine_decay_alpha": (
        schedule.cosine_decay(2.0, 25, alpha=0.1),
        optax.cosine_decay_schedule(2.0, 25, alpha=0.1),
    ),
    "warmup_cosine_kaun": (schedule.warmup_cosine(0.0, 1e-3, 10), _cosine_warmup_reference(0.0, 1e-3, 10)),
    "warmup_cosine_kaun_from_nonzero": (
        schedule.warmup_cosine(0.5, 0.1, 7),
        _cosine_warmup_reference(0.5, 0.1, 7),
    ),
    "warmup_cosine_decay": (
        schedule.warmup_cosine(0.0, 1.0, 10, decay_steps=50, end_value=0.05),
        optax.warmup_cosine_decay_schedule(0.0, 1.0, 10, 50, end_value=0.05),
    ),
    "warmup_cosine_decay_no_warmup": (
        schedule.warmup_cosine(0.0, 0.5, 0, decay_steps=30),
        optax.warmup_cosine_decay_schedule(0.0, 0.5, 0, 30),
    ),
    "warmup_linear": (schedule.warmup_linear(0.01, 0.5, 12), optax.linear_schedule(0.01, 0.5, 12)),
    "warmup_linear_zero": (schedule.warmup_linear(0.0, 0.5, 0), optax.constant_schedule(0.5)),
    "linear": (schedule.linear(1.0, 0.1, 30), optax.linear_schedule(1.0, 0.1, 30)),
    "exponential_decay": (schedule.exponential_decay(0.1, 0.9, 5), optax.exponential_decay(0.1, 5, 0.9)),
    "exponential_decay_staircase": (
        schedule.exponential_decay(0.1, 0.5, 8, staircase=True),
        optax.exponential_decay(0.1, 8, 0.5, staircase=True),
    ),
    "piecewise_constant": (
        schedule.piecewise_constant([10, 20, 45], [1.0, 0.5, 0.25, 0.125]),
        optax.piecewise_constant_schedule(1.0, {10: 0.5, 20: 0.5, 45: 0.5}),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_optax_on_host_ints(name):
    ours, theirs = CASES[name]
    expected = reference(theirs)
    for i in (0, 1, 2, 5, 9, 10, 11, 24, 25, 40, 63, 64, 65):
        value = ours(int(STEPS[i]))
        assert isinstance(value, float)
        np.testing.assert_allclose(value, expected[i], rtol=2e-6, atol=1e-7, err_msg=f"step {STEPS[i]}")
    np.testing.assert_allclose(ours(STEPS), expected, rtol=2e-6, atol=1e-7)
    assert ours(np.int64(3)) == ours(3)


def test_traced_steps_match_optax():
    """Every schedule on a traced int32 step: one compiled function evaluates them all."""
    names = list(CASES)

    def all_schedules(step):
        return [CASES[name][0](step) for name in names]

    scalar = kn.jit(all_schedules)
    references = {name: reference(CASES[name][1]) for name in names}
    for i in (1, 10, 37):
        for name, value in zip(names, scalar(STEPS[i])):
            assert value.dtype == np.float32 and value.shape == ()
            np.testing.assert_allclose(
                np.asarray(value),
                references[name][i],
                rtol=2e-6,
                atol=1e-7,
                err_msg=f"{name} at step {STEPS[i]}",
            )
    assert scalar.trace_count == 1  # a new step value is a new input, not a new trace
    # an array of steps goes through the same elementwise formulas
    for name, value in zip(names, kn.jit(all_schedules)(STEPS)):
        np.testing.assert_allclose(np.asarray(value), references[name], rtol=2e-6, atol=1e-7, err_msg=name)


def test_kaun_shapes():
    """The documented landmarks, independent of optax."""
    assert schedule.cosine_decay(1.0, 100)(100) == 0.0
    assert schedule.cosine_decay(1.0, 100, alpha=0.2)(500) == pytest.approx(0.2)
    assert schedule.cosine_decay(1.0, 100)(50) == pytest.approx(0.5)
    warm = schedule.warmup_cosine(0.0, 1.0, 10)
    assert warm(5) == pytest.approx(0.5) and warm(10) == pytest.approx(1.0)
    assert warm(1000) == pytest.approx(1.0)
    assert warm(1) == pytest.approx(0.5 * (1 - math.cos(math.pi / 10)))
    assert schedule.warmup_linear(0.0, 1.0, 10)(3) == pytest.approx(0.3)
    full = schedule.warmup_cosine(0.0, 1.0, 10, decay_steps=110, end_value=0.1)
    assert full(10) == pytest.approx(1.0) and full(60) == pytest.approx(0.55)
    assert full(500) == pytest.approx(0.1)
    piecewise = schedule.piecewise_constant([100, 200], [1e-2, 1e-3, 1e-4])
    assert [piecewise(n) for n in (1, 99, 100, 199, 200, 10**6)] == [1e-2, 1e-2, 1e-3, 1e-3, 1e-4, 1e-4]
    assert schedule.exponential_decay(1.0, 0.5, 10)(20) == pytest.approx(0.25)
    assert schedule.linear(1.0, 0.0, 4)(1) == pytest.approx(0.75)


def test_repr_and_errors():
    expected = "schedule.cosine_decay(init_value=0.1, decay_steps=40, alpha=0.0)"
    assert repr(schedule.cosine_decay(0.1, 40)) == expected
    with pytest.raises(ValueError, match="decay_steps must be > 0"):
        schedule.cosine_decay(0.1, 0)
    with pytest.raises(TypeError, match="decay_steps must be an int"):
        schedule.cosine_decay(0.1, 10.5)
    with pytest.raises(ValueError, match="greater than warmup_steps"):
        schedule.warmup_cosine(0.0, 1.0, 10, decay_steps=10)
    with pytest.raises(ValueError, match="3 values"):
        schedule.piecewise_constant([1, 2], [1.0, 2.0])
    with pytest.raises(ValueError, match="strictly increasing"):
        schedule.piecewise_constant([5, 2], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="decay_rate"):
        schedule.exponential_decay(1.0, 0.0, 10)
    with pytest.raises(TypeError, match="must be a number"):
        schedule.constant("fast")
    with pytest.raises(TypeError, match="integer"):
        schedule.constant(1.0)("three")
    with pytest.raises(TypeError, match="integer scalar"):
        kn.trace(lambda s: schedule.constant(1.0)(s), np.asarray(True))
