"""The ``lower-pool`` and ``lower-conv`` passes and the per-backend default pipelines.

``lower-pool`` must be bit-exact: every lowered ``reduce_window`` / ``select_and_scatter_add``
is compared bit for bit with the same op run by XLA (and with jax.lax / jax's max-pool
gradient), on inputs full of ties, NaNs and signed zeros. ``lower-conv`` is exact up to float
summation order: compared with jax.lax.conv_general_dilated and its gradients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import kaun_ir as kn
from kaun_ir import passes
from kaun_ir.runtime import pipelines
from kaun_ir.surface.tensor import apply

F32 = np.float32
POOL = "lower-pool,cse,dce"
CONV = "lower-conv{max_slices=1000},cse,dce"


def bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def assert_bit_equal(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    differ = np.nonzero(bits(got) != bits(want))
    assert differ[0].size == 0, (
        f"{differ[0].size} elements differ, first at {[int(d[0]) for d in differ]}: "
        f"{got[differ][:4]} vs {want[differ][:4]}"
    )


def ties(rng, shape, dtype=F32, nan: bool = True):
    """Small integers (most windows tie), some windows all equal, signed zeros and NaNs."""
    x = rng.integers(-1, 2, size=shape).astype(dtype)
    if np.dtype(dtype).kind == "f":
        zeros = x == 0
        x[zeros] = np.where(rng.random(zeros.sum()) < 0.5, -0.0, 0.0)
        if nan:
            x.reshape(-1)[rng.integers(0, x.size, size=max(1, x.size // 25))] = np.nan
    x.reshape(-1)[: x.size // 4] = 1  # a run of equal values: whole windows tie
    return x


def lowered(f, pipeline, *args):
    """(kaun_ir result without passes, with ``pipeline``, the optimised graph)."""
    plain = kn.jit(f, pipeline="")(*args)
    jitted = kn.jit(f, pipeline=pipeline)
    return np.asarray(plain), np.asarray(jitted(*args)), jitted.graph(*args)


# --------------------------------------------------------------------------- select_and_scatter_add


def sas(window, init):
    def f(x, source):
        return apply(
            "select_and_scatter_add",
            x,
            source,
            init,
            window_dimensions=window,
            window_strides=window,
            padding=((0, 0),) * len(window),
        )

    return f


SAS_CASES = {
    "nchw-2x2": ((2, 3, 6, 8), (1, 1, 2, 2)),
    "nchw-2x2-remainder": ((2, 3, 7, 5), (1, 1, 2, 2)),
    "nhwc-2x2": ((2, 6, 4, 3), (1, 2, 2, 1)),
    "3x3-stride-3": ((1, 2, 9, 7), (1, 1, 3, 3)),
    "1d-window-4": ((3, 12), (1, 4)),
    "3d-window": ((4, 6, 5), (2, 2, 2)),
}


@pytest.mark.parametrize("case", sorted(SAS_CASES))
def test_select_and_scatter_add_bit_exact_with_ties(case):
    shape, window = SAS_CASES[case]
    rng = np.random.default_rng(abs(hash(case)) % 2**32)
    x = ties(rng, shape)
    windows = tuple(n // w for n, w in zip(shape, window))
    source = rng.standard_normal(windows).astype(F32)
    source.reshape(-1)[::7] = -0.0  # 0.0 + -0.0 is +0.0: the init must really be added
    want, got, graph = lowered(sas(window, F32(0)), POOL, x, source)
    assert "select_and_scatter_add" not in graph.op_counts()
    assert_bit_equal(got, want)
    if not np.isnan(x).any():
        # jax's max-pool gradient is select_and_scatter_add with the same tie rule
        _, vjp = jax.vjp(lambda v: lax.reduce_window(v, -jnp.inf, lax.max, window, window, "VALID"), x)
        assert_bit_equal(got, vjp(source)[0])


def test_select_and_scatter_add_matches_jax_max_pool_gradient_on_ties():
    rng = np.random.default_rng(0)
    x = ties(rng, (4, 3, 8, 10), nan=False)
    source = rng.standard_normal((4, 3, 4, 5)).astype(F32)
    _, got, _ = lowered(sas((1, 1, 2, 2), F32(0)), POOL, x, source)
    _, vjp = jax.vjp(
        lambda v: lax.reduce_window(v, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID"), x
    )
    assert_bit_equal(got, vjp(source)[0])
    # every window routed exactly one source value: the ties went to one element each
    assert np.count_nonzero(got) == np.count_nonzero(source)


@pytest.mark.parametrize("init", [F32(1.5), F32(-0.0), F32(0.0)])
def test_select_and_scatter_add_init_values(init):
    rng = np.random.default_rng(1)
    x = ties(rng, (2, 2, 5, 6))
    source = rng.standard_normal((2, 2, 2, 3)).astype(F32)
    source[0, 0] = -0.0
    want, got, _ = lowered(sas((1, 1, 2, 2), init), POOL, x, source)
    assert_bit_equal(got, want)


def test_select_and_scatter_add_init_as_an_input_and_integers():
    rng = np.random.default_rng(2)
    x = ties(rng, (2, 6, 4))
    source = rng.standard_normal((1, 3, 2)).astype(F32)

    def with_init(x, source, init):
        return sas((2, 2, 2), init)(x, source)

    init = np.array(-0.0, F32)
    want, got, graph = lowered(with_init, POOL, x, source, init)
    assert "select_and_scatter_add" not in graph.op_counts()
    assert_bit_equal(got, want)

    xi = ties(rng, (3, 8), np.int32)
    si = rng.integers(-5, 5, size=(3, 2)).astype(np.int32)
    want, got, _ = lowered(sas((1, 4), np.int32(7)), POOL, xi, si)
    assert_bit_equal(got, want)


# --------------------------------------------------------------------------- reduce_window


def rw(kind, window, init):
    def f(x):
        n = len(window)
        return apply(
            "reduce_window",
            x,
            init,
            kind=kind,
            window_dimensions=window,
            window_strides=window,
            base_dilations=(1,) * n,
            window_dilations=(1,) * n,
            padding=((0, 0),) * n,
        )

    return f


@pytest.mark.parametrize(
    "kind,init,jax_op",
    [("max", -np.inf, lax.max), ("min", np.inf, lax.min), ("sum", 0.0, lax.add), ("max", 0.25, lax.max)],
)
@pytest.mark.parametrize(
    "shape,window", [((2, 3, 7, 6), (1, 1, 2, 2)), ((2, 6, 6, 3), (1, 2, 3, 1)), ((10,), (3,))]
)
def test_reduce_window_bit_exact(kind, init, jax_op, shape, window):
    rng = np.random.default_rng(3)
    x = ties(rng, shape)
    want, got, graph = lowered(rw(kind, window, F32(init)), POOL, x)
    assert "reduce_window" not in graph.op_counts()
    assert_bit_equal(got, want)
    assert_bit_equal(got, lax.reduce_window(x, F32(init), jax_op, window, window, "VALID"))


@pytest.mark.parametrize("init", [0.0, -0.0])
def test_sum_pool_of_negative_zeros_keeps_the_sign_of_the_sum(init):
    """A window of -0.0 summed from +0.0 is +0.0 (the init is really added), from -0.0 is -0.0."""
    x = np.full((2, 3, 4, 4), -0.0, F32)
    want, got, graph = lowered(rw("sum", (1, 1, 2, 2), F32(init)), POOL, x)
    assert "reduce_window" not in graph.op_counts()
    assert_bit_equal(got, want)
    assert np.signbit(np.asarray(got)).all() == (init == 0.0 and np.signbit(F32(init)))


def test_reduce_window_integers():
    x = ties(np.random.default_rng(4), (3, 9), np.int32)
    for kind in ("max", "min", "sum"):
        want, got, _ = lowered(rw(kind, (1, 3), np.int32(-2)), POOL, x)
        assert_bit_equal(got, want)


# --------------------------------------------------------------------------- what is left alone


def graph_of(f, *types):
    """The traced graph of ``f`` over arguments of these (shape, dtype) types, no passes."""
    args = [np.zeros(shape, dtype) for shape, dtype in types]
    return kn.jit(f, pipeline="").graph(*args)


def test_pool_windows_that_do_not_tile_are_left_alone():
    def pools(x, source):
        ninf = F32(-np.inf)
        overlap = apply(
            "reduce_window",
            x,
            ninf,
            kind="max",
            window_dimensions=(1, 3),
            window_strides=(1, 2),
            base_dilations=(1, 1),
            window_dilations=(1, 1),
            padding=((0, 0), (0, 0)),
        )
        padded = apply(
            "reduce_window",
            x,
            ninf,
            kind="max",
            window_dimensions=(1, 2),
            window_strides=(1, 2),
            base_dilations=(1, 1),
            window_dilations=(1, 1),
            padding=((0, 0), (1, 1)),
        )
        dilated = apply(
            "reduce_window",
            x,
            ninf,
            kind="max",
            window_dimensions=(1, 2),
            window_strides=(1, 2),
            base_dilations=(1, 1),
            window_dilations=(1, 2),
            padding=((0, 0), (0, 0)),
        )
        grad = apply(
            "select_and_scatter_add",
            x,
            source,
            F32(0),
            window_dimensions=(1, 2),
            window_strides=(1, 1),
            padding=((0, 0), (0, 0)),
        )
        return overlap, padded, dilated, grad

    graph = graph_of(pools, ((2, 8), F32), ((2, 7), F32))
    out = passes.run(graph, "lower-pool", verify_each=True)
    assert out.op_counts()["reduce_window"] == 3 and out.op_counts()["select_and_scatter_add"] == 1


def test_lower_pool_options_and_statistics():
    def both(x, source):
        y = rw("max", (1, 4, 4), F32(-np.inf))(x)
        return y, sas((1, 4, 4), F32(0))(x, source)

    graph = graph_of(both, ((2, 8, 8), F32), ((2, 2, 2), F32))
    counts = passes.run(graph, "lower-pool{max_window=8}").op_counts()
    assert counts["reduce_window"] == 1 and counts["select_and_scatter_add"] == 1  # 16 > 8 elements
    counts = passes.run(graph, "lower-pool{forward=false}").op_counts()
    assert "reduce_window" in counts and "select_and_scatter_add" not in counts
    counts = passes.run(graph, "lower-pool{gradient=false}").op_counts()
    assert "reduce_window" not in counts and "select_and_scatter_add" in counts
    stats = passes.Statistics()
    passes.run(graph, "lower-pool{max_window=0}", instrumentations=[stats])
    counters = stats.records[0].counters
    assert counters["reduce_window lowered"] == 1 and counters["select_and_scatter_add lowered"] == 1
    with pytest.raises(ValueError, match="max_window"):
        passes.run(graph, "lower-pool{max_window=-1}")


def test_graphs_without_pools_or_convolutions_are_unchanged():
    def mlp(x, w):
        return kn.tanh(x @ w).sum()

    graph = graph_of(kn.grad(mlp, argnums=1), ((4, 3), F32), ((3, 2), F32))
    for pipeline in ("lower-pool", "lower-conv"):
        assert passes.run(graph, pipeline) is graph


# --------------------------------------------------------------------------- max pool end to end


def test_max_pool_network_gradient_with_the_cpu_defaults_matches_jax():
    rng = np.random.default_rng(5)
    x = ties(rng, (2, 3, 8, 8), nan=False)
    w = rng.standard_normal((4, 3, 3, 3)).astype(F32)

    def loss(w, x):
        h = kn.fn.conv2d(x, w, padding=1)
        return (kn.fn.max_pool2d(kn.maximum(h, 0.0), 2) ** 2).sum()

    def jax_loss(w, x):
        h = lax.conv_general_dilated(
            x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW")
        )
        pooled = lax.reduce_window(
            jnp.maximum(h, 0.0), -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID"
        )
        return (pooled**2).sum()

    pipeline = pipelines.default_train_pipeline("cpu")
    jitted = kn.jit(kn.grad(loss), pipeline=pipeline)
    got = np.asarray(jitted(w, x))
    counts = jitted.graph(w, x).op_counts()
    assert "select_and_scatter_add" not in counts and "reduce_window" not in counts
    np.testing.assert_allclose(got, jax.grad(jax_loss)(w, x), rtol=2e-5, atol=1e-4)
    np.testing.assert_allclose(
        got, np.asarray(kn.jit(kn.grad(loss), pipeline="")(w, x)), rtol=2e-5, atol=1e-4
    )


# --------------------------------------------------------------------------- lower-conv


def conv_kaun(strides, padding, rhs_dilation, specs):
    lhs_spec, rhs_spec, out_spec = specs

    def f(x, w):
        return apply(
            "convolution",
            x,
            w,
            window_strides=strides,
            padding=padding,
            lhs_dilation=(1,) * len(strides),
            rhs_dilation=rhs_dilation,
            lhs_spec=lhs_spec,
            rhs_spec=rhs_spec,
            out_spec=out_spec,
        )

    return f


CONV_CASES = {
    # name: x shape, w shape, strides, padding, rhs dilation, (kaun specs), jax dimension numbers
    "nchw-3x3-same": (
        (2, 3, 8, 7),
        (4, 3, 3, 3),
        (1, 1),
        ((1, 1), (1, 1)),
        (1, 1),
        ((0, 1, 2, 3),) * 3,
        ("NCHW", "OIHW", "NCHW"),
    ),
    "strided-dilated-asymmetric": (
        (2, 3, 9, 8),
        (4, 3, 3, 2),
        (2, 1),
        ((1, 0), (2, 1)),
        (1, 2),
        ((0, 1, 2, 3),) * 3,
        ("NCHW", "OIHW", "NCHW"),
    ),
    "nhwc-hwio": (
        (2, 7, 6, 3),
        (3, 3, 3, 5),
        (1, 1),
        ((1, 1), (1, 1)),
        (1, 1),
        ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2)),
        ("NHWC", "HWIO", "NHWC"),
    ),
    "1d": ((2, 3, 10), (4, 3, 3), (2,), ((2, 1),), (1,), ((0, 1, 2),) * 3, ("NCH", "OIH", "NCH")),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_lower_conv_forward_and_gradients_match_jax(case):
    xs, ws, strides, padding, rdil, specs, numbers = CONV_CASES[case]
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal(xs).astype(F32), rng.standard_normal(ws).astype(F32)
    f = conv_kaun(strides, padding, rdil, specs)

    def jax_f(x, w):
        return lax.conv_general_dilated(x, w, strides, padding, rhs_dilation=rdil, dimension_numbers=numbers)

    jitted = kn.jit(f, pipeline=CONV)
    np.testing.assert_allclose(np.asarray(jitted(x, w)), jax_f(x, w), rtol=1e-5, atol=1e-5)
    assert "convolution" not in jitted.graph(x, w).op_counts()

    # both gradients: the input's (a convolution with lhs dilation when strided: left alone
    # then) and the kernel's (lowered over its output positions)
    ct = rng.standard_normal(jax_f(x, w).shape).astype(F32)

    def loss(x, w):
        return (f(x, w) * ct).sum()

    grads = kn.jit(kn.grad(loss, argnums=(0, 1)), pipeline=CONV)
    want = jax.grad(lambda x, w: (jax_f(x, w) * ct).sum(), argnums=(0, 1))(x, w)
    for got, expected in zip(grads(x, w), want):
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


def test_lower_conv_picks_the_fewer_slices_and_reports_them():
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((2, 3, 6, 6)).astype(F32), rng.standard_normal((4, 3, 3, 3)).astype(F32)
    f = conv_kaun((1, 1), ((1, 1), (1, 1)), (1, 1), ((0, 1, 2, 3),) * 3)
    graph = kn.jit(
        kn.grad(lambda x, w: (f(x, w) ** 2).sum(), argnums=(0, 1)), pipeline="canonicalize,cse,dce"
    ).graph(x, w)
    assert graph.op_counts()["convolution"] == 3  # forward, input gradient, kernel gradient
    stats = passes.Statistics()
    out = passes.run(graph, "lower-conv", instrumentations=[stats], verify_each=True)
    counters = stats.records[0].counters
    assert "convolution" not in out.op_counts()
    assert counters["convolutions lowered over kernel positions"] == 2  # 9 kernel vs 36 output positions
    assert counters["convolutions lowered over output positions"] == 1  # the kernel gradient: 9 vs 36
    args = [x, w]
    for want, got in zip(kn.ir.interpret(graph, *args), kn.ir.interpret(out, *args)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_lower_conv_leaves_other_convolutions_alone():
    def convs(x, w, wg):
        base = dict(
            window_strides=(1, 1),
            padding=((1, 1), (1, 1)),
            lhs_dilation=(1, 1),
            rhs_dilation=(1, 1),
            lhs_spec=(0, 1, 2, 3),
            rhs_spec=(0, 1, 2, 3),
            out_spec=(0, 1, 2, 3),
        )
        transposed = apply("convolution", x, w, **{**base, "lhs_dilation": (2, 2)})
        grouped = apply("convolution", x, wg, **base, feature_group_count=2)
        cropped = apply("convolution", x, w, **{**base, "padding": ((-1, 1), (1, 1))})
        plain = apply("convolution", x, w, **base)
        return transposed, grouped, cropped, plain

    graph = graph_of(convs, ((1, 4, 6, 6), F32), ((2, 4, 3, 3), F32), ((2, 2, 3, 3), F32))
    assert passes.run(graph, "lower-conv").op_counts()["convolution"] == 3  # only the plain one
    assert passes.run(graph, "lower-conv{mode=native}") is graph
    assert passes.run(graph, "lower-conv{max_slices=8}").op_counts()["convolution"] == 4  # 9 > 8
    assert passes.run(graph, "lower-conv{max_features=3}").op_counts()["convolution"] == 4  # 4 > 3
    with pytest.raises(
        kn.errors.PassOptionError, match="'mode' of pass 'lower-conv' must be one of im2col, native"
    ):
        passes.run(graph, "lower-conv{mode=fast}")


# --------------------------------------------------------------------------- default pipelines


def test_default_pipelines_per_backend():
    cpu = pipelines.default_train_pipeline("cpu")
    assert (
        cpu
        == f"{pipelines.DEFAULT_TRAIN_PIPELINE},{pipelines.CPU_CONVOLUTION_PASSES},{pipelines.CPU_DOT_PASSES}"
    )
    assert "lower-pool" in cpu and "layout{prefer=nhwc}" in cpu and "lower-conv" not in cpu
    assert (
        pipelines.default_jit_pipeline("cpu")
        == f"{pipelines.DEFAULT_JIT_PIPELINE},{pipelines.CPU_CONVOLUTION_PASSES},{pipelines.CPU_DOT_PASSES}"
    )
    for backend in ("gpu", "tpu"):
        assert pipelines.default_train_pipeline(backend) == pipelines.DEFAULT_TRAIN_PIPELINE
        assert pipelines.default_jit_pipeline(backend) == pipelines.DEFAULT_JIT_PIPELINE
    for text in (cpu, pipelines.default_jit_pipeline("cpu")):
        assert str(passes.Pipeline.parse(text)) == text  # canonical, so exe.pipeline records it as is


def test_the_backend_decides_and_the_environment_overrides(monkeypatch):
    monkeypatch.delenv(pipelines.TRAIN_PIPELINE_ENV, raising=False)
    monkeypatch.delenv(pipelines.JIT_PIPELINE_ENV, raising=False)
    monkeypatch.setenv("KAUN_IR_BACKEND", "cpu")
    assert pipelines.train_pipeline() == pipelines.default_train_pipeline("cpu")
    assert pipelines.jit_pipeline() == pipelines.default_jit_pipeline("cpu")
    monkeypatch.setenv("KAUN_IR_BACKEND", "gpu")  # only read here, nothing is started
    assert pipelines.train_pipeline() == pipelines.DEFAULT_TRAIN_PIPELINE
    assert pipelines.jit_pipeline() == pipelines.DEFAULT_JIT_PIPELINE
    monkeypatch.setenv("KAUN_IR_BACKEND", "cpu")
    # the switch: an explicit pipeline or the environment variable wins (the backend is not asked)
    from kaun_ir.runtime.xla import backend

    def no_backend():
        raise AssertionError("the backend was asked for")

    monkeypatch.setattr(backend, "backend_name", no_backend)
    monkeypatch.setenv(pipelines.TRAIN_PIPELINE_ENV, pipelines.DEFAULT_TRAIN_PIPELINE)
    assert pipelines.train_pipeline() == pipelines.DEFAULT_TRAIN_PIPELINE
    assert pipelines.train_pipeline("cse") == "cse"
    monkeypatch.setenv(pipelines.JIT_PIPELINE_ENV, "")
    assert pipelines.jit_pipeline() == ""


def test_cnn_training_with_the_cpu_default_matches_the_plain_pipeline():
    from kaun_ir import layer, optim, train
    from kaun_ir.nn import loss

    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 1, 8, 8)).astype(F32)
    labels = rng.integers(0, 10, size=4).astype(np.int32)
    model = layer.sequential(
        [
            layer.conv2d(1, 4, 3, padding="same"),
            layer.relu(),
            layer.max_pool2d(2),
            layer.flatten(),
            layer.linear(4 * 4 * 4, 10),
        ]
    )
    losses = {}
    for name, pipeline in (
        ("cpu", pipelines.default_train_pipeline("cpu")),
        ("plain", pipelines.DEFAULT_TRAIN_PIPELINE),
    ):
        trainer = train.make(model, optim.adam(1e-2), pipeline=pipeline)
        with kn.rng.scope(0):
            st = train.init(trainer)
        values = []
        for _ in range(3):
            value, st = train.step(trainer, st, x, lambda logits: loss.cross_entropy_sparse(logits, labels))
            values.append(float(value))
        losses[name] = values
    np.testing.assert_allclose(losses["cpu"], losses["plain"], rtol=1e-5)
