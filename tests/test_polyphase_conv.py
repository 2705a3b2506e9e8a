"""The ``polyphase-conv`` pass: convolutions with input dilation as one plain convolution per
output phase.

The phases' convolutions add their products in their own order, so results are compared with a
float64 ``jax.lax`` convolution (the oracle) within a bound relative to the same convolution over
absolute values.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax

import kaun_ir as kn
from kaun_ir import passes
from kaun_ir.passes.polyphase_conv import axis_phases
from kaun_ir.runtime import pipelines
from kaun_ir.surface.tensor import apply

F32 = np.float32
NCHW = (0, 1, 2, 3)
NHWC, HWIO = (0, 3, 1, 2), (3, 2, 0, 1)
NUMBERS = {NCHW: ("NCHW", "OIHW", "NCHW"), NHWC: ("NHWC", "HWIO", "NHWC")}


def dilated(spec, kspec, dilation, padding):
    def f(x, w):
        return apply(
            "convolution",
            x,
            w,
            window_strides=(1, 1),
            padding=padding,
            lhs_dilation=dilation,
            rhs_dilation=(1, 1),
            lhs_spec=spec,
            rhs_spec=kspec,
            out_spec=spec,
        )

    return f


def _ref(x, w, spec, dilation, padding):
    return lax.conv_general_dilated(
        x, w, (1, 1), padding, lhs_dilation=dilation, dimension_numbers=NUMBERS[spec]
    )


def test_axis_phases():
    # 1x1 kernel, stride 2, the input gradient of 32 -> 16 (padding (0, 1)): one phase, even outputs
    assert axis_phases(16, 2, 0, 1, 32) == [(0, (0, 0), (0, 1))]
    # 3x3 kernel, stride 2, padding (1, 2): taps 0 and 2 on odd outputs, tap 1 on even ones
    assert axis_phases(16, 2, 1, 3, 32) == [(0, (0, 1), (1, 0)), (1, (0, 0), (0, 1))]


CASES = {
    # (x shape, w shape, spec, kernel spec, lhs dilation, padding)
    "1x1-stride2-nhwc": ((2, 5, 5, 3), (1, 1, 3, 4), NHWC, HWIO, (2, 2), ((0, 1), (0, 1))),
    "3x3-stride2-nhwc": ((2, 5, 5, 3), (3, 3, 3, 4), NHWC, HWIO, (2, 2), ((1, 2), (1, 2))),
    "3x3-stride3-nchw": ((2, 3, 4, 5), (4, 3, 3, 3), NCHW, NCHW, (3, 3), ((2, 2), (0, 1))),
    "5x2-mixed": ((1, 2, 6, 4), (3, 2, 5, 2), NCHW, NCHW, (2, 1), ((3, 0), (1, 1))),
    "negative-padding": ((2, 2, 5, 5), (2, 2, 3, 3), NCHW, NCHW, (2, 2), ((-1, 1), (2, -2))),
    # a dilation above the kernel size: some output phases take no tap and stay zero
    "stride3-kernel2": ((1, 2, 4, 5), (3, 2, 2, 2), NCHW, NCHW, (3, 3), ((1, 1), (0, 2))),
    "stride4-kernel1-negative": ((1, 1, 6, 6), (2, 1, 1, 1), NCHW, NCHW, (4, 4), ((-3, -2), (-1, 3))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_phases_match_a_float64_convolution(case):
    xs, ws, spec, kspec, dilation, padding = CASES[case]
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal(xs).astype(F32), rng.standard_normal(ws).astype(F32)
    f = dilated(spec, kspec, dilation, padding)
    graph = kn.jit(f, pipeline="").graph(x, w)
    stats = passes.Statistics()
    out = passes.run(graph, "polyphase-conv,cse,dce", instrumentations=[stats], verify_each=True)
    assert stats.records[0].counters["dilated convolutions split into phases"] == 1
    assert all(all(d == 1 for d in n.attr_dict["lhs_dilation"]) for n in out.walk() if n.op == "convolution")
    got = np.asarray(kn.jit(f, pipeline="polyphase-conv,cse,dce")(x, w), np.float64)
    with jax.enable_x64(True):
        want = np.asarray(_ref(x.astype(np.float64), w.astype(np.float64), spec, dilation, padding))
        scale = np.asarray(
            _ref(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), spec, dilation, padding)
        )
    assert got.shape == want.shape
    assert np.all(np.abs(got - want) <= 1e-6 * scale + 1e-30)


def test_strided_convolution_gradients():
    """The input gradient of a strided convolution (what autodiff dilates) in the CPU defaults."""
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((2, 3, 8, 8)).astype(F32), rng.standard_normal((4, 3, 3, 3)).astype(F32)
    numbers = ("NCHW", "OIHW", "NCHW")

    def ref(x, w):
        return lax.conv_general_dilated(x, w, (2, 2), ((1, 1), (1, 1)), dimension_numbers=numbers)

    ct = rng.standard_normal(ref(x, w).shape).astype(F32)

    def f(x, w):
        y = apply(
            "convolution",
            x,
            w,
            window_strides=(2, 2),
            padding=((1, 1), (1, 1)),
            lhs_dilation=(1, 1),
            rhs_dilation=(1, 1),
            lhs_spec=NCHW,
            rhs_spec=NCHW,
            out_spec=NCHW,
        )
        return (y * ct).sum()

    grad = kn.grad(f, argnums=0)
    pipeline = pipelines.default_jit_pipeline("cpu")
    graph = passes.run(kn.jit(grad, pipeline="canonicalize,cse,dce").graph(x, w), pipeline)
    assert not any(
        any(d != 1 for d in n.attr_dict["lhs_dilation"]) for n in graph.walk() if n.op == "convolution"
    )
    got = np.asarray(kn.jit(grad, pipeline=pipeline)(x, w), np.float64)
    with jax.enable_x64(True):

        def linear(x, w, ct):
            return (ref(x, w) * ct).sum()

        args = [a.astype(np.float64) for a in (x, w, ct)]
        want = np.asarray(jax.grad(linear)(*args))
        scale = np.asarray(jax.grad(linear)(*[np.abs(a) for a in args]))
    assert np.all(np.abs(got - want) <= 1e-6 * scale)


def test_undilated_convolutions_are_left_alone():
    x, w = np.zeros((2, 3, 6, 6), F32), np.zeros((4, 3, 3, 3), F32)
    forward = kn.jit(dilated(NCHW, NCHW, (1, 1), ((1, 1), (1, 1))), pipeline="").graph(x, w)
    assert passes.run(forward, "polyphase-conv").op_counts() == forward.op_counts()


def test_in_the_cpu_defaults():
    assert "polyphase-conv" in pipelines.default_train_pipeline("cpu")
    assert "polyphase-conv" in pipelines.default_jit_pipeline("cpu")
    assert "polyphase-conv" not in pipelines.default_train_pipeline("gpu")
