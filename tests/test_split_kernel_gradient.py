"""The ``split-kernel-gradient`` pass: kernel gradients with a large cotangent as sums over batch chunks.

The chunks' partial gradients are added in another order than one convolution sums, so results
are compared with a float64 jax.lax gradient (the oracle) within a bound relative to the same
sum over absolute values.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax

import kaun_ir as kn
from kaun_ir import passes
from kaun_ir.passes.split_kernel_gradient import chunk_count
from kaun_ir.runtime import pipelines
from kaun_ir.surface.tensor import apply

F32 = np.float32
NCHW = (0, 1, 2, 3)
NHWC, HWIO = (0, 3, 1, 2), (3, 2, 0, 1)


def conv(lhs_spec, rhs_spec, strides=(1, 1)):
    def f(x, w):
        return apply(
            "convolution",
            x,
            w,
            window_strides=strides,
            padding=((1, 1), (1, 1)),
            lhs_dilation=(1, 1),
            rhs_dilation=(1, 1),
            lhs_spec=lhs_spec,
            rhs_spec=rhs_spec,
            out_spec=lhs_spec,
        )

    return f


def test_chunk_count_is_the_smallest_fitting_divisor():
    assert chunk_count(64, 3_211_264, 1 << 20, 16) == 4  # the cnn's second kernel gradient
    assert chunk_count(64, 6_422_528, 1 << 20, 16) == 8  # its first
    assert chunk_count(12, 2_500, 1_000, 16) == 3
    assert chunk_count(7, 2_000, 1_000, 16) == 7  # a prime size: one sample per chunk
    assert chunk_count(13, 2_000, 1_000, 4) is None  # no divisor up to max_chunks


CASES = {
    "nchw": ((8, 3, 6, 6), (4, 3, 3, 3), NCHW, NCHW, (1, 1), ("NCHW", "OIHW", "NCHW")),
    "nhwc-strided": ((6, 7, 7, 3), (3, 3, 3, 4), NHWC, HWIO, (2, 2), ("NHWC", "HWIO", "NHWC")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_split_gradients_match_a_float64_gradient(case):
    jax.config.update("jax_enable_x64", True)
    try:
        xs, ws, lhs_spec, rhs_spec, strides, numbers = CASES[case]
        rng = np.random.default_rng(3)
        x, w = rng.standard_normal(xs).astype(F32), rng.standard_normal(ws).astype(F32)
        f = conv(lhs_spec, rhs_spec, strides)

        def ref(x, w):
            return lax.conv_general_dilated(x, w, strides, ((1, 1), (1, 1)), dimension_numbers=numbers)

        ct = rng.standard_normal(ref(x, w).shape).astype(F32)
        grad = kn.grad(lambda x, w: (f(x, w) * ct).sum(), argnums=(0, 1))
        pipeline = "split-kernel-gradient{max_bytes=1000},cse,dce"
        graph = kn.jit(grad, pipeline="canonicalize,cse,dce").graph(x, w)
        stats = passes.Statistics()
        split = passes.run(graph, pipeline, instrumentations=[stats], verify_each=True)
        assert stats.records[0].counters["kernel gradients split"] == 1
        assert split.op_counts()["convolution"] > graph.op_counts()["convolution"]

        def linear(x, w, ct):
            return (ref(x, w) * ct).sum()

        x64, w64, ct64 = x.astype(np.float64), w.astype(np.float64), ct.astype(np.float64)
        want = jax.grad(linear, argnums=1)(x64, w64, ct64)
        scale = jax.grad(linear, argnums=1)(np.abs(x64), np.abs(w64), np.abs(ct64))
        got = np.asarray(kn.jit(grad, pipeline=pipeline)(x, w)[1], np.float64)
        assert np.all(np.abs(got - want) <= 1e-6 * np.asarray(scale))
    finally:
        jax.config.update("jax_enable_x64", False)


def test_forward_convolutions_and_small_gradients_are_left_alone():
    x, w = np.zeros((8, 3, 6, 6), F32), np.zeros((4, 3, 3, 3), F32)
    forward = kn.jit(conv(NCHW, NCHW), pipeline="").graph(x, w)
    assert passes.run(forward, "split-kernel-gradient{max_bytes=1}").op_counts()["convolution"] == 1
    grads = kn.jit(kn.grad(lambda x, w: conv(NCHW, NCHW)(x, w).sum(), argnums=(0, 1)), pipeline="dce")
    graph = grads.graph(x, w)
    # the default bound (1 MiB) is far above this cotangent
    assert passes.run(graph, "split-kernel-gradient").op_counts()["convolution"] == 2
    with pytest.raises(ValueError, match="max_chunks"):
        passes.run(graph, "split-kernel-gradient{max_chunks=1}")


def test_in_the_cpu_defaults():
    assert "split-kernel-gradient" in pipelines.default_train_pipeline("cpu")
    assert "split-kernel-gradient" in pipelines.default_jit_pipeline("cpu")
    assert "split-kernel-gradient" not in pipelines.default_train_pipeline("gpu")
