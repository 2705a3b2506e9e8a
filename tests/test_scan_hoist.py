"""Reverse mode through ``scan`` recomputes cheap element-wise residuals in the backward body, and
computes a const's cotangent terms that contract two per-iteration values (``h_t^T @ dpre_t``)
and sums of stacked values after the loop, as one contraction over the iterations too; the rest
stay summed in the loop. Values against ``jax.lax.scan`` + ``jax.grad``
in float64 (the reordered sums agree to rounding)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn

RNG = np.random.default_rng(11)
B, H, T = 2, 3, 5
W = RNG.standard_normal((H, H)) * 0.5
U = RNG.standard_normal((H, H)) * 0.5
BIAS = RNG.standard_normal(H) * 0.1
XS = RNG.standard_normal((T, B, H))
H0 = RNG.standard_normal((B, H))


def _loss(np_mod, scan, reverse):
    def loss(w, u, b, xs):
        def step(h, x):
            # w: a hoisted contraction and a per-iteration term that stays in the loop (w[0] * h);
            # u: a contraction with the x slice itself; b: a sum over the batch (hoisted when
            # its operand is stacked anyway)
            pre = h @ w + x @ u + b + h * w[0]
            h = np_mod.tanh(pre)
            return h, h * h

        h, ys = scan(step, H0, xs, reverse=reverse)
        return np_mod.sum(h) + np_mod.sum(ys * 0.5)

    return loss


@pytest.mark.parametrize("reverse", [False, True])
def test_hoisted_cotangents_match_jax(reverse):
    args = (W, U, BIAS, XS)
    with jax.enable_x64(True):
        want = jax.grad(_loss(jnp, jax.lax.scan, reverse), argnums=(0, 1, 2, 3))(*args)
    got = kn.grad(_loss(kn, kn.scan, reverse), argnums=(0, 1, 2, 3))(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-10, atol=1e-12)


def _scans(graph):
    return [node for node in graph.nodes if node.op == "scan"]


def test_the_weight_gradient_leaves_the_loop():
    """The backward scan carries only the carry's cotangent and the part of ``w``'s cotangent that
    cannot be hoisted; its body has no ``[H, H]`` contraction, one ``dot_general`` after the loop
    contracts the iterations and the batch of the stacked operands."""
    graph = kn.trace(kn.grad(_loss(kn, kn.scan, False), argnums=(0, 1, 2)), W, U, BIAS, XS)
    _, backward = _scans(graph)
    (body,) = backward.regions
    in_loop = [n for n in body.nodes if n.op == "dot_general" and n.outputs[0].type.shape == (H, H)]
    assert in_loop == []
    carried = [t.shape for t in backward.types[: backward.attr("num_carry")]]
    assert carried == [(B, H), (H, H)]  # the carry's cotangent; w[0] * h's part of w's
    after = [
        n
        for n in graph.nodes
        if n.op == "dot_general" and n.attr("lhs_contracting") == (0, 1) and n.outputs[0].type.shape == (H, H)
    ]
    assert len(after) == 2  # w's and u's


def _lstm_loss(np_mod, scan, sigmoid, reverse=False):
    """The LSTM loss; scanned in reverse, the final ``c`` is part of the loss too."""

    def loss(w, xs):
        def step(carry, x):
            h, c = carry
            z = x + h @ w
            i, f, g, o = (z[:, k * H : (k + 1) * H] for k in range(4))
            c = sigmoid(f) * c + sigmoid(i) * np_mod.tanh(g)
            h = sigmoid(o) * np_mod.tanh(c)
            return (h, c), h

        (_, c), ys = scan(step, (H0, H0 * 0.5), xs, reverse=reverse)
        return np_mod.sum(ys * ys) + np_mod.sum(c) if reverse else np_mod.sum(ys * ys)

    return loss


def test_elementwise_residuals_are_recomputed():
    """An LSTM body saves the carried ``h, c`` and its four gates; ``tanh(c')`` and the gates'
    derivative factors (``1 - s``, ``1 - t*t``) are recomputed from them in the backward body.
    Gradients equal JAX's."""
    w = RNG.standard_normal((H, 4 * H)) * 0.5
    xs = RNG.standard_normal((T, B, 4 * H))
    with jax.enable_x64(True):
        want = jax.grad(_lstm_loss(jnp, jax.lax.scan, jax.nn.sigmoid), argnums=(0, 1))(w, xs)
    mine = _lstm_loss(kn, kn.scan, kn.sigmoid)
    got = kn.grad(mine, argnums=(0, 1))(w, xs)
    for g, e in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-10, atol=1e-12)
    forward, _ = _scans(kn.trace(kn.grad(mine), w, xs))
    stacked = forward.types[forward.attr("num_carry") :]
    # ys (h after each step), then c and the gates i, f, g, o: h as it enters each step is the
    # stack of ys moved by one step, not stacked again
    assert len(stacked) == 1 + 5


def _rnn_loss(np_mod, scan, reverse, xs):
    def loss(w, h0):
        def step(h, x):
            h = np_mod.tanh(x + h @ w)
            return h, h

        h, ys = scan(step, h0, xs, reverse=reverse)
        return np_mod.sum(h * h) + np_mod.sum(ys * xs)

    return loss


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("steps", [1, T])
def test_residuals_read_from_the_ys(reverse, steps):
    """An Elman body ``h = tanh(x + h @ w)`` returning ``h`` as its ``y``: the ``tanh``
    derivative's ``h`` and the weight gradient's ``h`` entering each step are both read from the
    stacked ys (the latter moved by one step, the initial carry first, or last when reversed), so
    the forward scan stacks nothing besides the ys. Gradients (the initial carry's included)
    equal JAX's."""
    xs = XS[:steps]
    with jax.enable_x64(True):
        want = jax.grad(_rnn_loss(jnp, jax.lax.scan, reverse, xs), argnums=(0, 1))(W, H0)
    mine = _rnn_loss(kn, kn.scan, reverse, xs)
    got = kn.grad(mine, argnums=(0, 1))(W, H0)
    for g, e in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-10, atol=1e-12)
    forward, _ = _scans(kn.trace(kn.grad(mine, argnums=(0, 1)), W, H0))
    assert len(forward.types) == 2  # the final h and the ys


def test_lstm_reversed_matches_jax():
    """The LSTM body scanned in reverse: its entering ``h`` comes from the ys moved the other way."""
    w = RNG.standard_normal((H, 4 * H)) * 0.5
    xs = RNG.standard_normal((T, B, 4 * H))

    with jax.enable_x64(True):
        want = jax.grad(_lstm_loss(jnp, jax.lax.scan, jax.nn.sigmoid, True), argnums=(0, 1))(w, xs)
    got = kn.grad(_lstm_loss(kn, kn.scan, kn.sigmoid, True), argnums=(0, 1))(w, xs)
    for g, e in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-10, atol=1e-12)
