"""``kn.custom_vjp`` / ``kn.custom_jvp``: rules used by grad / jvp / vmap, inside a training step,
in the IR (text round trip, passes, the opt tool, the viewer), and clear errors for bad rules."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.tools.cli import main as cli_main
from kaun_ir.tools.viz.svg import render_svg

RNG = np.random.default_rng(7)


@kn.custom_vjp
def clip_gradient(x):
    return x


clip_gradient.defvjp(lambda x: (x, ()), lambda residuals, g: (kn.clip(g, -1.0, 1.0),))


@kn.custom_vjp
def straight_through_round(x):
    return kn.round(x)


straight_through_round.defvjp(lambda x: (kn.round(x), ()), lambda residuals, g: (g,))


@kn.custom_jvp
def softplus(x):
    return kn.log1p(kn.exp(x))


@softplus.defjvp
def _softplus_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return softplus(x), kn.sigmoid(x) * dx


def test_rules_are_used_by_grad_jvp_and_vmap():
    x = np.array([-2.0, 0.3, 4.0])
    np.testing.assert_array_equal(np.asarray(kn.grad(lambda v: kn.sum(clip_gradient(v) * 5.0))(x)), [1, 1, 1])
    np.testing.assert_array_equal(
        np.asarray(kn.grad(lambda v: kn.sum(straight_through_round(v) * v))(x)), np.round(x) + x
    )
    big = np.array([1000.0, 0.0, -30.0])  # exp overflows: the naive derivative is inf / inf = nan
    sigmoid = 1.0 / (1.0 + np.exp(-big))
    np.testing.assert_allclose(np.asarray(kn.grad(lambda v: kn.sum(softplus(v)))(big)), sigmoid, rtol=1e-15)
    _, tangent = kn.jvp(softplus, (big,), (np.ones(3),))
    np.testing.assert_allclose(np.asarray(tangent), sigmoid, rtol=1e-15)
    per_example = kn.vmap(kn.grad(lambda v: kn.sum(clip_gradient(v) * v * 3.0)))(RNG.standard_normal((4, 3)))
    assert np.abs(np.asarray(per_example)).max() > 1.0  # 3 v + clip(3 v): only the custom part is clipped


def _quantized_loss(np_, ste):
    def loss(w, x, y):
        hidden = np_.tanh(x @ ste(w * 4.0) / 4.0)
        return np_.mean((hidden - y) ** 2)

    return loss


def test_custom_vjp_inside_a_training_step_matches_jax():
    @jax.custom_vjp
    def jax_ste(v):
        return jnp.round(v)

    jax_ste.defvjp(lambda v: (jnp.round(v), None), lambda _, g: (g,))
    w = RNG.standard_normal((3, 2))
    x, y = RNG.standard_normal((8, 3)), RNG.standard_normal((8, 2))

    @kn.jit
    def step(w, x, y):
        loss, g = kn.value_and_grad(_quantized_loss(kn, straight_through_round))(w, x, y)
        return w - 0.1 * g, loss

    ours, theirs = w, w
    jax_step = jax.jit(
        lambda w, x, y: (lambda lg: (w - 0.1 * lg[1], lg[0]))(
            jax.value_and_grad(_quantized_loss(jnp, jax_ste))(w, x, y)
        )
    )
    with jax.enable_x64(True):
        for _ in range(5):
            ours, loss = step(ours, x, y)
            theirs, want = jax_step(theirs, x, y)
            np.testing.assert_allclose(np.asarray(loss), np.asarray(want), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-12)
    assert not np.allclose(np.asarray(ours), w)  # the straight-through gradient did train it


def test_custom_nodes_live_in_the_ir(tmp_path):
    graph = kn.trace(lambda v: kn.sum(softplus(clip_gradient(v)) * 2.0), kn.ShapeDtype((3,), kn.float64))
    assert graph.op_counts()["custom_vjp"] == 1 and graph.op_counts()["custom_jvp"] == 1
    text = graph.text()
    assert kn.ir.parse(text).text() == text
    optimised = kn.passes.run(graph, "canonicalize,fold,cse,dce")
    assert {"custom_vjp", "custom_jvp"} <= set(optimised.op_counts())
    x = RNG.standard_normal(3)
    np.testing.assert_allclose(
        np.asarray(kn.runtime.compile(optimised)(x)[0]), np.sum(np.log1p(np.exp(x))) * 2.0, rtol=1e-14
    )
    # the reverse-mode graph differentiates through the rules: the gradient is the custom one
    gradient = kn.passes.run(graph, "autodiff,cse,dce")
    np.testing.assert_allclose(
        np.asarray(kn.runtime.compile(gradient)(x)[1]), np.clip(2.0 / (1.0 + np.exp(-x)), -1, 1), rtol=1e-14
    )
    source = tmp_path / "custom.kir"
    source.write_text(text)
    out = tmp_path / "out.kir"
    assert cli_main(["opt", str(source), "-p", "cse,dce", "-o", str(out)]) == 0
    assert "custom_vjp" in out.read_text() and kn.ir.parse(out.read_text()).text() == out.read_text()
    assert "custom_jvp" in render_svg(graph)


def test_bad_rules_give_clear_errors():
    @kn.custom_vjp
    def no_rules(x):
        return x * 2.0

    with pytest.raises(kn.CustomDerivativeError, match="call no_rules.defvjp"):
        no_rules(np.ones(2))

    @kn.custom_vjp
    def wrong_bwd(x):
        return x * 2.0

    wrong_bwd.defvjp(lambda x: (x * 2.0, ()), lambda r, g: (g[0],))
    with pytest.raises(
        kn.CustomDerivativeError,
        match=r"bwd of wrong_bwd returned f64\[\] for argument 0 "
        r"of type f64\[2\]",
    ):
        wrong_bwd(np.ones(2))

    @kn.custom_vjp
    def wrong_fwd(x):
        return x * 2.0

    wrong_fwd.defvjp(lambda x: (x.sum(), ()), lambda r, g: (g,))
    with pytest.raises(kn.CustomDerivativeError, match="fwd of wrong_fwd returns an output of types"):
        wrong_fwd(np.ones(2))

    def outer(a, b):
        scaled = kn.custom_jvp(lambda x: x * a)  # closes over a value of the trace of outer
        scaled.defjvp(lambda p, t: (p[0] * a, t[0] * a))
        return scaled(b)

    with pytest.raises(kn.CustomDerivativeError, match="pass it as an argument"):
        kn.jit(outer)(np.ones(2), np.ones(2))
