"""``kn.debug.check_finite`` and ``KAUN_IR_CHECK_FINITE``: the first op that makes a NaN/Inf is named."""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

import kaun_ir as kn

HERE = os.path.basename(__file__)


def _line_of(marker: str) -> int:
    source, start = inspect.getsourcelines(_model)
    return start + next(k for k, text in enumerate(source) if marker in text)


def _model(x, w):
    with kn.ir.scope("encoder"):
        with kn.ir.scope("0.linear"):
            h = x @ w
        with kn.ir.scope("1.norm"):
            r = kn.sqrt(h)  # marker: sqrt
        with kn.ir.scope("2.log"):
            z = kn.log(r + 1.0)
    return kn.sum(z)


W = np.eye(3, dtype=np.float32)


def test_clean_run_matches_plain_jit():
    x = np.array([[1.0, 2.0, 3.0]], np.float32)
    got = kn.debug.check_finite(_model)(x, W)
    assert float(got) == float(kn.jit(_model)(x, W))


def test_forward_nan_names_op_layer_and_line():
    x = np.array([[1.0, -2.0, 3.0]], np.float32)
    with pytest.raises(kn.NonFiniteError) as info:
        kn.debug.check_finite(_model)(x, W)
    message = str(info.value)
    assert message.startswith("NaN first produced by sqrt (in the forward pass) at layer encoder.1.norm")
    assert f"{HERE}:{_line_of('marker: sqrt')}" in message
    assert isinstance(info.value, FloatingPointError)


def test_backward_inf_names_the_derivative_of_sqrt_at_zero():
    x = np.array([[1.0, 0.0, 3.0]], np.float32)
    grad = kn.debug.check_finite(kn.grad(_model, argnums=1))
    with pytest.raises(kn.NonFiniteError) as info:
        grad(x, W)
    message = str(info.value)
    assert "Inf first produced by" in message
    assert "in the backward pass, derivative of sqrt) at layer encoder.1.norm" in message
    assert f"{HERE}:{_line_of('marker: sqrt')}" in message
    # without the check the NaN just flows into the gradient
    assert not np.isfinite(np.asarray(kn.jit(kn.grad(_model, argnums=1))(x, W))).all()


def test_nan_argument_and_deliberate_infinities():
    with pytest.raises(kn.NonFiniteError, match="NaN first produced by argument 0"):
        kn.debug.check_finite(lambda a: a * 2.0)(np.array([np.nan], np.float32))

    def masked_softmax(scores):  # a -inf mask is written on purpose: no report
        keep = np.tril(np.ones((3, 3), bool))
        return kn.softmax(kn.where(keep, scores, -np.inf), axis=-1)

    scores = np.arange(9, dtype=np.float32).reshape(3, 3)
    got = kn.debug.check_finite(masked_softmax)(scores)
    np.testing.assert_allclose(np.asarray(got), np.asarray(kn.jit(masked_softmax)(scores)))


def test_nan_that_never_reaches_an_output_is_not_reported():
    def safe_sqrt(x):  # sqrt(-1) is NaN inside, but where() discards it
        return kn.where(x > 0.0, kn.sqrt(x), 0.0)

    got = kn.debug.check_finite(safe_sqrt)(np.array([4.0, -1.0], np.float32))
    np.testing.assert_array_equal(np.asarray(got), [2.0, 0.0])


def test_nan_inside_a_loop_names_the_loop():
    def f(x):
        with kn.ir.scope("rnn"):
            return kn.scan(lambda h, x: (kn.log(h + x), None), np.float32(1.0), x)[0]

    with pytest.raises(kn.NonFiniteError, match="by scan .* at layer rnn"):
        kn.debug.check_finite(f)(np.array([0.5, -3.0], np.float32))


def test_environment_switch_checks_every_compiled_program(monkeypatch):
    def f(x):
        return kn.log(x) * 3.0  # a fresh function: compiled while the switch is on

    monkeypatch.setenv(kn.debug.ENV, "1")
    with pytest.raises(kn.NonFiniteError, match="by log"):
        kn.jit(f)(np.array([-1.0], np.float32))
    monkeypatch.setenv(kn.debug.ENV, "0")
    assert np.isnan(np.asarray(kn.jit(lambda x: kn.log(x) * 3.0)(np.array([-1.0], np.float32)))).all()
