"""The ``winograd-conv`` pass: 3x3 stride-1 convolutions as Winograd F(2x2, 3x3).

The rewrite is exact in real arithmetic, not in floating point, so every result is compared with
a float64 convolution from jax.lax (the oracle) within the pass's stated bound: elementwise,
``|got - want| <= TOLERANCE * (the same convolution of |x| and |w|)`` (the size of the sum the
element is made of, so the bound holds for elements that cancel to nearly zero too).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax

import kaun_ir as kn
from kaun_ir import passes
from kaun_ir.runtime import pipelines
from kaun_ir.surface.tensor import apply

TOLERANCE = passes.winograd_conv.TOLERANCE

F32 = np.float32
PIPELINE = "winograd-conv{min_features=1},cse,dce"
NCHW = ((0, 1, 2, 3),) * 3


def conv(specs, padding, strides=(1, 1), rhs_dilation=(1, 1), groups=1):
    lhs_spec, rhs_spec, out_spec = specs

    def f(x, w):
        return apply(
            "convolution",
            x,
            w,
            window_strides=strides,
            padding=padding,
            lhs_dilation=(1, 1),
            rhs_dilation=rhs_dilation,
            lhs_spec=lhs_spec,
            rhs_spec=rhs_spec,
            out_spec=out_spec,
            feature_group_count=groups,
        )

    return f


def oracle(specs, padding):
    """The same convolution in jax.lax, in float64: x and w are transposed to NCHW / OIHW."""
    lhs_spec, rhs_spec, out_spec = specs

    def f(x, w):
        y = lax.conv_general_dilated(
            jax.numpy.transpose(x, lhs_spec),
            jax.numpy.transpose(w, rhs_spec),
            (1, 1),
            padding,
            dimension_numbers=("NCHW", "OIHW", "NCHW"),
        )
        return jax.numpy.transpose(y, np.argsort(out_spec))

    return f


CASES = {
    # name: x shape, w shape, specs (lhs, rhs, out), padding
    "nhwc-hwio-same": (
        (2, 7, 6, 3),
        (3, 3, 3, 5),
        ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2)),
        ((1, 1), (1, 1)),
    ),
    "nchw-valid-odd": ((2, 3, 9, 7), (4, 3, 3, 3), NCHW, ((0, 0), (0, 0))),
    "asymmetric-padding": ((1, 2, 5, 8), (3, 2, 3, 3), NCHW, ((0, 2), (1, 0))),
    "spatial-axes-swapped": ((2, 3, 9, 6), (4, 3, 3, 3), ((0, 1, 3, 2),) * 3, ((1, 1), (0, 0))),
}


def check_within_bound(got, want, scale, what):
    got, want, scale = (np.asarray(a, np.float64) for a in (got, want, scale))
    assert got.shape == want.shape, what
    excess = np.abs(got - want) - TOLERANCE * scale
    assert excess.max() <= 1e-30, f"{what}: error {np.abs(got - want).max():.3g} above the bound"


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_and_gradients_match_a_float64_convolution(case):
    jax.config.update("jax_enable_x64", True)
    try:
        xs, ws, specs, padding = CASES[case]
        rng = np.random.default_rng(len(case))
        x, w = rng.standard_normal(xs).astype(F32), rng.standard_normal(ws).astype(F32)
        f, ref = conv(specs, padding), oracle(specs, padding)
        x64, w64 = x.astype(np.float64), w.astype(np.float64)

        jitted = kn.jit(f, pipeline=PIPELINE)
        assert "convolution" not in jitted.graph(x, w).op_counts()
        check_within_bound(jitted(x, w), ref(x64, w64), ref(np.abs(x64), np.abs(w64)), "forward")

        ct = rng.standard_normal(ref(x64, w64).shape).astype(F32)
        grads = kn.jit(kn.grad(lambda x, w: (f(x, w) * ct).sum(), argnums=(0, 1)), pipeline=PIPELINE)
        graph = grads.graph(x, w)
        # the input gradient is a 3x3 convolution, the kernel gradient one with a 3x3 output
        assert "convolution" not in graph.op_counts()

        def linear(x, w, ct):
            return (ref(x, w) * ct).sum()

        want = jax.grad(linear, argnums=(0, 1))(x64, w64, ct.astype(np.float64))
        scale = jax.grad(linear, argnums=(0, 1))(np.abs(x64), np.abs(w64), np.abs(ct).astype(np.float64))
        for got, expected, size, what in zip(grads(x, w), want, scale, ("input gradient", "kernel gradient")):
            check_within_bound(got, expected, size, what)
    finally:
        jax.config.update("jax_enable_x64", False)


def graph_of(f, *types):
    return kn.jit(f, pipeline="").graph(*[np.zeros(shape, dtype) for shape, dtype in types])


def test_statistics_and_which_convolutions_qualify():
    x, w = ((2, 8, 6, 6), F32), ((8, 8, 3, 3), F32)
    same = ((1, 1), (1, 1))

    def step(x, w):
        return (conv(NCHW, same)(x, w) ** 2).sum()

    graph = kn.jit(kn.grad(step, argnums=(0, 1)), pipeline="canonicalize,cse,dce").graph(
        np.zeros(x[0], F32), np.zeros(w[0], F32)
    )
    assert graph.op_counts()["convolution"] == 3  # forward, input gradient, kernel gradient
    stats = passes.Statistics()
    out = passes.run(graph, "winograd-conv", instrumentations=[stats], verify_each=True)
    counters = stats.records[0].counters
    assert "convolution" not in out.op_counts()
    assert counters["convolutions rewritten (3x3 kernel)"] == 2
    assert counters["convolutions rewritten (3x3 output)"] == 1
    assert passes.run(graph, "winograd-conv{kernel_gradient=false}").op_counts()["convolution"] == 1
    assert passes.run(graph, "winograd-conv{forward=false}").op_counts()["convolution"] == 2
    assert passes.run(graph, "winograd-conv{min_features=9}").op_counts()["convolution"] == 3


@pytest.mark.parametrize(
    "variant",
    [
        {"strides": (2, 1)},
        {"rhs_dilation": (1, 2)},
        {"groups": 2},
        {"padding": ((-1, 1), (1, 1))},
        {"kernel": (8, 8, 5, 5)},
        {"dtype": np.float16},
    ],
    ids=lambda v: next(iter(v)),
)
def test_other_convolutions_are_left_alone(variant):
    kernel = variant.get("kernel", (8, 8 // variant.get("groups", 1), 3, 3))
    dtype = variant.get("dtype", F32)
    f = conv(
        NCHW,
        variant.get("padding", ((1, 1), (1, 1))),
        strides=variant.get("strides", (1, 1)),
        rhs_dilation=variant.get("rhs_dilation", (1, 1)),
        groups=variant.get("groups", 1),
    )
    graph = graph_of(f, ((2, 8, 9, 9), dtype), (kernel, dtype))
    assert passes.run(graph, "winograd-conv{min_features=1}").op_counts()["convolution"] == 1


def test_one_channel_convolutions_stay_direct_by_default():
    graph = graph_of(conv(NCHW, ((1, 1), (1, 1))), ((4, 1, 8, 8), F32), ((8, 1, 3, 3), F32))
    assert passes.run(graph, "winograd-conv").op_counts()["convolution"] == 1
    assert "convolution" not in passes.run(graph, "winograd-conv{min_features=1}").op_counts()


def test_graphs_without_convolutions_are_returned_as_they_are():
    graph = graph_of(lambda a: a * 2, ((3, 4), F32))
    assert passes.run(graph, "winograd-conv") is graph


def test_cnn_training_with_winograd_matches_the_direct_convolutions():
    from kaun_ir import layer, optim, train
    from kaun_ir.nn import loss

    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 1, 8, 8)).astype(F32)
    labels = rng.integers(0, 10, size=4).astype(np.int32)
    model = layer.sequential(
        [
            layer.conv2d(1, 8, 3, padding="same"),
            layer.relu(),
            layer.conv2d(8, 8, 3, padding="same"),
            layer.relu(),
            layer.max_pool2d(2),
            layer.flatten(),
            layer.linear(8 * 4 * 4, 10),
        ]
    )
    cpu = pipelines.default_train_pipeline("cpu")
    losses = {}
    for name, pipeline in (("direct", cpu), ("winograd", f"{cpu},winograd-conv,cse,dce")):
        trainer = train.make(model, optim.adam(1e-2), loss=loss.cross_entropy_sparse, pipeline=pipeline)
        with kn.rng.scope(0):
            st = train.init(trainer)
        if name == "winograd":
            graph = train.step_graph(trainer, st, x, labels, optimized=True)
            # conv2's forward, input and kernel gradients; conv1 (one input channel) stays direct
            assert graph.op_counts()["convolution"] == 2
        values = []
        for _ in range(3):
            value, st = train.step(trainer, st, x, labels)
            values.append(float(value))
        losses[name] = values
    np.testing.assert_allclose(losses["winograd"], losses["direct"], rtol=1e-5)
