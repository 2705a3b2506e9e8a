"""User-defined primitives: registered from Python, used by every transformation, emitted inline
or as a stablehlo.composite, and checked by ``kn.testing.check_op`` (which must catch bad rules)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.errors import PrimitiveError
from kaun_ir.ops import OpDef, Sample
from kaun_ir.ops.batching import elementwise
from kaun_ir.surface.primitives import call, emit_from, register, unregister


def _softplus_beta(x, beta):
    return kn.log1p(kn.exp(x * beta)) / beta


def _reference(x, beta):
    return (np.logaddexp(0.0, x.astype(np.float64) * beta) / beta).astype(x.dtype)


def _samples(rng):
    yield Sample((rng.standard_normal((3, 4)),), {"beta": 2.0})
    yield Sample((rng.standard_normal((5,)).astype(np.float32),), {"beta": 0.5})


def _declare(name, vjp, composite="example.softplus_beta"):
    return OpDef(
        name=name,
        arity=1,
        attrs=("beta",),
        infer=lambda x, beta: x,
        reference=_reference,
        emit=emit_from(_softplus_beta, composite=composite),
        samples=_samples,
        vjp=vjp,
        batch=elementwise(name),
        doc="softplus(beta x) / beta, elementwise.",
    )


@pytest.fixture
def user_op():
    register(_declare("softplus_beta", lambda ct, y, x, beta: (ct * kn.sigmoid(x * beta),)))
    yield "softplus_beta"
    unregister("softplus_beta")


def test_check_op_runs_the_generated_tests(user_op):
    report = kn.testing.check_op(user_op)
    assert report["samples"] == 2
    assert {
        "type rule",
        "text round trip",
        "XLA vs reference",
        "VJP vs finite differences",
        "JVP vs finite differences",
        "batching vs reference per example",
    } <= set(report["checks"])
    with jax.enable_x64(True):
        jax_fn = lambda x, beta: jax.numpy.logaddexp(0.0, x * beta) / beta  # noqa: E731
        report = kn.testing.check_op(user_op, jax_fn=jax_fn)
    assert "VJP vs jax" in report["checks"]


def test_check_op_catches_a_wrong_rule():
    register(_declare("softplus_wrong", lambda ct, y, x, beta: (ct * kn.sigmoid(x),)))  # beta forgotten
    try:
        with pytest.raises(AssertionError, match="softplus_wrong sample 0: VJP"):
            kn.testing.check_op("softplus_wrong")
    finally:
        unregister("softplus_wrong")


def test_a_user_op_in_every_transformation(user_op):
    x = np.array([-1.0, 0.0, 3.0])
    f = lambda v: call(user_op, v, beta=2.0)  # noqa: E731
    np.testing.assert_allclose(np.asarray(kn.jit(f)(x)), np.logaddexp(0, 2 * x) / 2, rtol=1e-14)
    sigmoid = 1 / (1 + np.exp(-2 * x))
    np.testing.assert_allclose(np.asarray(kn.grad(lambda v: kn.sum(f(v)))(x)), sigmoid, rtol=1e-14)
    np.testing.assert_allclose(np.asarray(kn.jvp(f, (x,), (np.ones(3),))[1]), sigmoid, rtol=1e-14)
    np.testing.assert_allclose(
        np.asarray(kn.vmap(f)(np.stack([x, 2 * x])))[1], np.logaddexp(0, 4 * x) / 2, rtol=1e-14
    )
    graph = kn.trace(f, kn.ShapeDtype((3,), kn.float64))
    mlir = kn.runtime.lower(graph)
    assert 'stablehlo.composite"' in mlir and 'name = "example.softplus_beta"' in mlir
    assert "composite_attributes = {beta = 2.0 : f64}" in mlir
    assert kn.ir.parse(graph.text()).text() == graph.text()


def test_registration_errors(user_op):
    with pytest.raises(PrimitiveError, match="already exists"):
        register(_declare(user_op, lambda ct, y, x, beta: (ct,)))
    with pytest.raises(PrimitiveError, match="a built-in op"):
        register(_declare("add", lambda ct, y, x, beta: (ct,)))
    incomplete = OpDef(
        name="incomplete",
        arity=1,
        infer=lambda x: x,
        reference=lambda x: x,
        emit=emit_from(lambda x: x),
        samples=_samples,
        doc="identity",
    )
    with pytest.raises(PrimitiveError, match="vjp=.*nondiff=.*batch=.*nobatch="):
        register(incomplete)
    with pytest.raises(PrimitiveError, match="not a registered user primitive"):
        unregister("add")
