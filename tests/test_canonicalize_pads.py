"""``canonicalize``: a sum of zero-padded pieces placed side by side along one axis (what reverse
mode makes of the cotangents of an LSTM's four gate slices) becomes one ``concatenate``. The
NumPy interpreter gives bit-identical results before and after on inputs full of -0.0, NaN and
infinities (the zeros are still added, so -0.0 turns +0.0 as in the sum)."""

from __future__ import annotations

import numpy as np
import pytest
from passutil import assert_bit_identical, random_inputs, splat

import kaun_ir as kn
from kaun_ir.ir import interpret
from kaun_ir.passes.canonicalize import canonicalize
from kaun_ir.passes.rewrite import last_statistics
from kaun_ir.surface.tensor import apply

F32 = np.float32
S = kn.ShapeDtype


def _canonical(fn, *specs):
    graph = kn.trace(fn, *specs)
    out = canonicalize(graph).verify()
    rng = np.random.default_rng(0)
    for special in (True, 0.6, "zeros"):
        args = random_inputs(graph, rng, special)
        with np.errstate(all="ignore"):
            for got, want in zip(interpret(out, *args), interpret(graph, *args)):
                assert_bit_identical(got, want)
    return out


def _pad(x, low, high, value=0.0):
    return apply("pad", x, splat(value, ()), low=(0, low), high=(0, high), interior=(0, 0))


@pytest.mark.parametrize("order", [(0, 1, 2, 3), (3, 2, 1, 0), (2, 0, 3, 1)])
def test_four_adjacent_pads_become_one_concatenate(order):
    def fn(a, b, c, d):
        pieces = [_pad(a, 0, 6), _pad(b, 2, 4), _pad(c, 4, 2), _pad(d, 6, 0)]
        total = pieces[order[0]]
        for k in order[1:]:
            total = total + pieces[k]
        return total

    out = _canonical(fn, *[S((3, 2), F32)] * 4)
    counts = out.op_counts()
    assert "pad" not in counts and counts["concatenate"] == 1
    (cat,) = [n for n in out.nodes if n.op == "concatenate"]
    assert cat.outputs[0].type.shape == (3, 8)
    assert last_statistics().get("add-adjacent-zero-pads", 0) >= 1


def test_pieces_with_a_gap_or_a_nonzero_padding_stay():
    def gap(a, b):
        return _pad(a, 0, 6) + _pad(b, 4, 2)

    def nonzero(a, b):
        return _pad(a, 0, 2, 1.0) + _pad(b, 2, 0)

    for fn in (gap, nonzero):
        out = _canonical(fn, S((3, 2), F32), S((3, 2), F32))
        assert "concatenate" not in out.op_counts() and out.op_counts()["pad"] == 2


def test_the_gradient_of_gate_slices_is_one_concatenate():
    def loss(z):
        i, f, g, o = (z[:, k * 2 : (k + 1) * 2] for k in range(4))
        return kn.sum(kn.sigmoid(i) * kn.tanh(g) + kn.sigmoid(f) * kn.sigmoid(o))

    out = _canonical(kn.grad(loss), S((3, 8), F32))
    assert "pad" not in out.op_counts() and out.op_counts()["concatenate"] == 1


@pytest.mark.parametrize("inner, outer", [(-0.0, 0.0), (0.0, -0.0), (-0.0, -0.0), (0.0, 0.0)])
def test_two_zero_additions_keep_the_sign_of_zero(inner, outer):
    """(x + z1) + z2 simplified keeps IEEE results on x = -0.0 (NumPy interpreter, bit-exact):
    (-0.0 + -0.0) + 0.0 is +0.0, so that pair must not lose its second sum."""
    x = np.array([-0.0, 0.0, 1.5, np.nan], np.float32)
    f = lambda x: (x + np.float32(inner)) + np.float32(outer)  # noqa: E731
    graph = kn.jit(f, pipeline="").graph(x)
    assert_bit_identical(interpret(canonicalize(graph), x)[0], (x + np.float32(inner)) + np.float32(outer))
