"""kn.fn convolutions against jax.lax.conv_general_dilated and pools against a NumPy loop reference,
eagerly and under kn.jit; their gradients (the VJPs of convolution, reduce_window and
select_and_scatter_add) against jax.grad and NumPy, including second order."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.surface.tensor import apply
from kaun_ir.transforms.autodiff import gradient_graph


def _rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _check(got, want, rtol=1e-4, atol=1e-4):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)


def _both(fn, *args):
    return [fn(*args), kn.jit(fn)(*args)]


def _jax_conv(x, w, b, stride, padding, dilation, groups, nd):
    return np.asarray(_lax_conv(x, w, b, stride, padding, dilation, groups, nd))


def _lax_conv(x, w, b, stride, padding, dilation, groups, nd):
    """PyTorch-style convolution written with jax.lax (differentiable by jax)."""
    spec = ("NCH", "OIH", "NCH") if nd == 1 else ("NCHW", "OIHW", "NCHW")
    if isinstance(padding, str):
        pad = padding.upper()
    else:
        pad = [(p, p) for p in ((padding,) * nd if isinstance(padding, int) else padding)]
    stride = (stride,) * nd if isinstance(stride, int) else stride
    dilation = (dilation,) * nd if isinstance(dilation, int) else dilation
    out = jax.lax.conv_general_dilated(
        x,
        w,
        stride,
        pad,
        rhs_dilation=dilation,
        dimension_numbers=spec,
        feature_group_count=groups,
        precision="highest",
    )
    if b is not None:
        out = out + b.reshape((-1,) + (1,) * nd)
    return out


# (x shape, weight shape, stride, padding, dilation, groups, bias)
CONV2D = [
    ((2, 3, 8, 8), (4, 3, 3, 3), 1, 0, 1, 1, True),
    ((2, 3, 8, 7), (4, 3, 3, 3), 1, 1, 1, 1, False),
    ((1, 2, 9, 9), (3, 2, 3, 2), 2, (1, 0), 1, 1, True),
    ((1, 2, 9, 10), (3, 2, 3, 3), (2, 3), (2, 1), (1, 2), 1, True),
    ((2, 4, 7, 7), (6, 2, 3, 3), 1, 1, 1, 2, True),  # two groups
    ((2, 3, 6, 6), (3, 1, 3, 3), 1, 1, 1, 3, False),  # depthwise
    ((2, 3, 6, 6), (6, 1, 3, 3), 2, 1, 1, 3, True),  # depthwise, channel multiplier 2
    ((1, 2, 7, 6), (3, 2, 3, 2), 1, "same", 1, 1, True),
    ((1, 2, 7, 6), (3, 2, 4, 2), 1, "same", (2, 1), 1, False),  # even kernel: extra padding at the end
    ((1, 2, 7, 6), (3, 2, 3, 3), 1, "valid", 1, 1, True),
]


@pytest.mark.parametrize("xs,ws,stride,padding,dilation,groups,bias", CONV2D)
def test_conv2d_matches_lax(xs, ws, stride, padding, dilation, groups, bias):
    rng = np.random.default_rng(0)
    x, w = _rand(rng, xs), _rand(rng, ws)
    b = _rand(rng, (ws[0],)) if bias else None
    want = _jax_conv(x, w, b, stride, padding, dilation, groups, 2)

    def f(x, w, b):
        return kn.fn.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)

    for got in _both(f, x, w, b):
        _check(got, want)


CONV1D = [
    ((2, 3, 10), (4, 3, 3), 1, 0, 1, 1, True),
    ((2, 3, 11), (4, 3, 3), 2, 2, 2, 1, False),
    ((1, 4, 9), (8, 2, 5), 3, (1,), 1, 2, True),
    ((1, 4, 9), (4, 1, 2), 1, "same", 3, 4, True),
]


@pytest.mark.parametrize("xs,ws,stride,padding,dilation,groups,bias", CONV1D)
def test_conv1d_matches_lax(xs, ws, stride, padding, dilation, groups, bias):
    rng = np.random.default_rng(1)
    x, w = _rand(rng, xs), _rand(rng, ws)
    b = _rand(rng, (ws[0],)) if bias else None
    want = _jax_conv(x, w, b, stride, padding, dilation, groups, 1)

    def f(x, w, b):
        return kn.fn.conv1d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)

    for got in _both(f, x, w, b):
        _check(got, want)


def test_conv_unbatched_input():
    rng = np.random.default_rng(2)
    x, w = _rand(rng, (3, 6, 6)), _rand(rng, (2, 3, 3, 3))
    want = _jax_conv(x[None], w, None, 1, 1, 1, 1, 2)[0]
    _check(kn.fn.conv2d(x, w, padding=1), want)


def test_conv_errors():
    x = np.zeros((1, 3, 8, 8), np.float32)
    with pytest.raises(kn.ShapeError, match="has 3 channels but weight"):
        kn.fn.conv2d(x, np.zeros((4, 2, 3, 3), np.float32))
    with pytest.raises(kn.ShapeError, match="groups=2 must divide"):
        kn.fn.conv2d(x, np.zeros((4, 1, 3, 3), np.float32), groups=2)
    with pytest.raises(ValueError, match="strided"):
        kn.fn.conv2d(x, np.zeros((4, 3, 3, 3), np.float32), stride=2, padding="same")
    with pytest.raises(ValueError, match="padding must be"):
        kn.fn.conv2d(x, np.zeros((4, 3, 3, 3), np.float32), padding="full")
    with pytest.raises(kn.ShapeError, match="bias must be"):
        kn.fn.conv2d(x, np.zeros((4, 3, 3, 3), np.float32), np.zeros((3,), np.float32))
    with pytest.raises(kn.ShapeError, match="larger than the padded input"):
        kn.fn.conv2d(x, np.zeros((4, 3, 9, 3), np.float32))
    with pytest.raises(kn.ShapeError, match="expected a"):
        kn.fn.conv1d(x, np.zeros((4, 3, 3), np.float32))


# ----------------------------------------------------------------------------------- pooling


def _np_pool(x, kind, kernel, stride, padding, dilation=None, count_include_pad=True):
    """PyTorch's pooling, written as loops over output positions and window offsets."""
    nd = len(kernel)
    dilation = dilation or (1,) * nd
    spatial = x.shape[-nd:]
    out_spatial = [
        (n + 2 * p - d * (k - 1) - 1) // s + 1
        for n, k, s, p, d in zip(spatial, kernel, stride, padding, dilation)
    ]
    out = np.zeros(x.shape[:-nd] + tuple(out_spatial), np.float64)
    for pos in itertools.product(*(range(m) for m in out_spatial)):
        values = []
        for off in itertools.product(*(range(k) for k in kernel)):
            index = [o * s - p + k * d for o, s, p, k, d in zip(pos, stride, padding, off, dilation)]
            if all(0 <= i < n for i, n in zip(index, spatial)):
                values.append(x[(Ellipsis,) + tuple(index)].astype(np.float64))
        if kind == "max":
            out[(Ellipsis,) + pos] = np.max(values, axis=0)
        else:
            divisor = np.prod(kernel) if count_include_pad else len(values)
            out[(Ellipsis,) + pos] = np.sum(values, axis=0) / divisor
    return out.astype(x.dtype)


POOL2D = [
    (2, None, 0, 1),
    (3, None, 0, 1),
    (3, 2, 1, 1),
    ((2, 3), (1, 2), (1, 1), 1),
    (3, 1, 1, 1),
    (2, 2, 0, 2),  # dilation (max pool only)
]


@pytest.mark.parametrize("kernel,stride,padding,dilation", POOL2D)
def test_max_pool2d_matches_reference(kernel, stride, padding, dilation):
    rng = np.random.default_rng(3)
    x = _rand(rng, (2, 3, 7, 8))
    k = (kernel,) * 2 if isinstance(kernel, int) else kernel
    s = k if stride is None else ((stride,) * 2 if isinstance(stride, int) else stride)
    p = (padding,) * 2 if isinstance(padding, int) else padding
    want = _np_pool(x, "max", k, s, p, (dilation,) * 2)
    for got in _both(lambda x: kn.fn.max_pool2d(x, kernel, stride, padding, dilation), x):
        _check(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("kernel,stride,padding,dilation", [c for c in POOL2D if c[3] == 1])
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool2d_matches_reference(kernel, stride, padding, dilation, count_include_pad):
    rng = np.random.default_rng(4)
    x = _rand(rng, (2, 3, 7, 8))
    k = (kernel,) * 2 if isinstance(kernel, int) else kernel
    s = k if stride is None else ((stride,) * 2 if isinstance(stride, int) else stride)
    p = (padding,) * 2 if isinstance(padding, int) else padding
    want = _np_pool(x, "avg", k, s, p, count_include_pad=count_include_pad)
    for got in _both(lambda x: kn.fn.avg_pool2d(x, kernel, stride, padding, count_include_pad), x):
        _check(got, want, rtol=1e-5, atol=1e-6)


def test_pool2d_matches_lax():
    rng = np.random.default_rng(5)
    x = _rand(rng, (2, 3, 8, 8))
    want = jax.lax.reduce_window(x, -np.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
    _check(kn.fn.max_pool2d(x, 2), np.asarray(want), rtol=0, atol=0)
    padding = ((0, 0), (0, 0), (1, 1), (1, 1))
    want = jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 1, 3, 3), (1, 1, 1, 1), padding)
    _check(kn.fn.avg_pool2d(x, 3, 1, 1), np.asarray(want) / 9)


def test_pool1d_matches_reference():
    rng = np.random.default_rng(6)
    x = _rand(rng, (2, 3, 11))
    for got in _both(lambda x: kn.fn.max_pool1d(x, 3, 2, 1), x):
        _check(got, _np_pool(x, "max", (3,), (2,), (1,)), rtol=0, atol=0)
    for got in _both(lambda x: kn.fn.avg_pool1d(x, 4), x):
        _check(got, _np_pool(x, "avg", (4,), (4,), (0,)))
    xi = rng.integers(-9, 9, size=(3, 10)).astype(np.int32)  # unbatched, integer max pool
    _check(kn.fn.max_pool1d(xi, 2, padding=1), _np_pool(xi, "max", (2,), (2,), (1,)), rtol=0, atol=0)


def test_pool_errors():
    x = np.zeros((1, 2, 6, 6), np.float32)
    with pytest.raises(ValueError, match="at most half"):
        kn.fn.max_pool2d(x, 2, padding=2)
    with pytest.raises(TypeError, match="floating-point"):
        kn.fn.avg_pool2d(x.astype(np.int32), 2)
    with pytest.raises(kn.ShapeError, match="larger than the padded input"):
        kn.fn.max_pool2d(x, 7)
    with pytest.raises(ValueError, match="kernel_size needs 1 or 2 values"):
        kn.fn.max_pool2d(x, (2, 2, 2))


# ------------------------------------------------------------------------------- derivatives


def _grads(kn_fn, jax_fn, operands, seed=0):
    """Gradients of ``sum(f(*operands) * c)`` (random c) w.r.t. every operand: kaun_ir's, jax's."""
    rng = np.random.default_rng(seed)
    c = _rand(rng, jax.eval_shape(jax_fn, *operands).shape)  # eval_shape: nothing compiled
    argnums = tuple(range(len(operands)))
    got = kn.grad(lambda *xs: kn.sum(kn_fn(*xs) * c), argnums=argnums)(*operands)
    # jitted: one XLA compilation instead of one per primitive
    want = jax.jit(jax.grad(lambda *xs: jnp.sum(jax_fn(*xs) * c), argnums=argnums))(*operands)
    return got, [np.asarray(w) for w in want]


# a spread of the forward configurations (the random ones below cover the primitive more widely)
CONV_GRAD = [(2,) + CONV2D[i] for i in (0, 3, 4, 6, 8)] + [(1,) + CONV1D[i] for i in (1, 2)]


@pytest.mark.parametrize("nd,xs,ws,stride,padding,dilation,groups,bias", CONV_GRAD)
def test_conv_grad_matches_jax(nd, xs, ws, stride, padding, dilation, groups, bias):
    rng = np.random.default_rng(20)
    operands = [_rand(rng, xs), _rand(rng, ws)] + ([_rand(rng, (ws[0],))] if bias else [])
    conv = kn.fn.conv2d if nd == 2 else kn.fn.conv1d

    def kn_fn(x, w, b=None):
        return conv(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)

    def jax_fn(x, w, b=None):
        return _lax_conv(x, w, b, stride, padding, dilation, groups, nd)

    got, want = _grads(kn_fn, jax_fn, operands)
    for g, w in zip(got, want):
        _check(g, w)


def test_conv2d_backward_is_two_convolutions_without_transposes():
    x, w = kn.ShapeDtype((2, 3, 8, 8)), kn.ShapeDtype((4, 3, 3, 3))
    graph = gradient_graph(kn.trace(lambda x, w: kn.sum(kn.fn.conv2d(x, w, stride=2, padding=1)), x, w))
    counts = graph.op_counts()
    assert counts["convolution"] == 3 and "transpose" not in counts


def _random_conv_config(seed):
    """Random convolution attributes and operand shapes: 1-3 spatial axes, random layouts,
    strides, (negative) padding, both dilations, feature or batch groups; never an empty result."""
    rng = np.random.default_rng(seed)
    nd = (1, 2, 2, 3)[seed % 4]
    mode = seed % 3  # 0: plain, 1: feature groups, 2: batch groups
    count = int(rng.integers(2, 4))
    groups, bgroups = (count if mode == 1 else 1), (count if mode == 2 else 1)
    batch = int(rng.integers(1, 3)) * bgroups
    per_group = int(rng.integers(1, 3))
    features = per_group * groups
    out_features = int(rng.integers(1, 3)) * groups * bgroups
    kernel = [int(k) for k in rng.integers(1, 4, nd)]
    strides = tuple(int(v) for v in rng.integers(1, 4, nd))
    lhs_dil = tuple(int(v) for v in rng.integers(1, 3, nd))
    rhs_dil = tuple(int(v) for v in rng.integers(1, 3, nd))
    padding = tuple((int(rng.integers(-1, 3)), int(rng.integers(-1, 3))) for _ in range(nd))
    spatial = []
    for k, ld, rd, (lo, hi) in zip(kernel, lhs_dil, rhs_dil, padding):
        size = int(rng.integers(2, 7))
        while (size - 1) * ld + 1 + lo + hi < (k - 1) * rd + 1:
            size += 1
        spatial.append(size)
    specs = [tuple(int(a) for a in rng.permutation(nd + 2)) for _ in range(3)]

    def shape(spec, first, second, rest):
        out = [0] * (nd + 2)
        out[spec[0]], out[spec[1]] = first, second
        for i, n in enumerate(rest):
            out[spec[2 + i]] = n
        return tuple(out)

    attrs = dict(
        window_strides=strides,
        padding=padding,
        lhs_dilation=lhs_dil,
        rhs_dilation=rhs_dil,
        lhs_spec=specs[0],
        rhs_spec=specs[1],
        out_spec=specs[2],
        feature_group_count=groups,
        batch_group_count=bgroups,
    )
    return (
        shape(specs[0], batch, features, spatial),
        shape(specs[1], out_features, features // groups, kernel),
        attrs,
    )


@pytest.mark.parametrize("seed", range(10))
def test_convolution_vjp_random_configs_match_jax(seed):
    lhs_shape, rhs_shape, attrs = _random_conv_config(seed)
    rng = np.random.default_rng(seed)
    lhs, rhs = _rand(rng, lhs_shape), _rand(rng, rhs_shape)
    numbers = jax.lax.ConvDimensionNumbers(attrs["lhs_spec"], attrs["rhs_spec"], attrs["out_spec"])

    def jax_fn(x, w):
        return jax.lax.conv_general_dilated(
            x,
            w,
            attrs["window_strides"],
            attrs["padding"],
            attrs["lhs_dilation"],
            attrs["rhs_dilation"],
            numbers,
            feature_group_count=attrs["feature_group_count"],
            batch_group_count=attrs["batch_group_count"],
            precision="highest",
        )

    got, want = _grads(lambda x, w: apply("convolution", x, w, **attrs), jax_fn, [lhs, rhs], seed)
    for g, w in zip(got, want):
        _check(g, w)


# ------------------------------------------------------------------------- pooling derivatives


def _np_max_pool_grad(x, ct, kernel, stride, padding, dilation):
    """PyTorch's max-pool gradient as loops: each window's cotangent goes to its first largest
    element (row-major window order; padding is never chosen)."""
    nd = len(kernel)
    spatial = x.shape[-nd:]
    grad = np.zeros(x.shape, np.float64)
    for lead in np.ndindex(*x.shape[:-nd]):
        for pos in itertools.product(*(range(m) for m in ct.shape[-nd:])):
            best = None
            for off in itertools.product(*(range(k) for k in kernel)):
                index = tuple(o * s - p + k * d for o, s, p, k, d in zip(pos, stride, padding, off, dilation))
                if all(0 <= i < n for i, n in zip(index, spatial)) and (
                    best is None or x[lead + index] > x[lead + best]
                ):
                    best = index
            grad[lead + best] += ct[lead + pos]
    return grad.astype(x.dtype)


def _pullback(f, x, ct):
    """kaun_ir's VJP of ``f`` at ``x`` applied to ``ct`` (one compiled gradient)."""
    return kn.grad(lambda x: kn.sum(f(x) * ct))(x)


def _jax_pullback(f, x, ct):
    return np.asarray(jax.jit(lambda x: jax.vjp(f, x)[1](ct)[0])(x))


def _lax_pool(x, kind, kernel, stride, padding, count_include_pad=True):
    """PyTorch-style pooling over the trailing two axes with jax.lax (differentiable by jax)."""
    window, strides = (1, 1) + tuple(kernel), (1, 1) + tuple(stride)
    pads = ((0, 0), (0, 0)) + tuple((p, p) for p in padding)
    if kind == "max":
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, window, strides, pads)
    total = jax.lax.reduce_window(x, 0.0, jax.lax.add, window, strides, pads)
    if count_include_pad:
        return total / np.prod(kernel)
    return total / jax.lax.reduce_window(jnp.ones_like(x), 0.0, jax.lax.add, window, strides, pads)


def _pool_args(kernel, stride, padding):
    k = (kernel,) * 2 if isinstance(kernel, int) else kernel
    s = k if stride is None else ((stride,) * 2 if isinstance(stride, int) else stride)
    p = (padding,) * 2 if isinstance(padding, int) else padding
    return k, s, p


@pytest.mark.parametrize("kernel,stride,padding,dilation", POOL2D)
def test_max_pool2d_grad(kernel, stride, padding, dilation):
    rng = np.random.default_rng(21)
    x = _rand(rng, (2, 3, 7, 8))
    k, s, p = _pool_args(kernel, stride, padding)

    def f(x):
        return kn.fn.max_pool2d(x, kernel, stride, padding, dilation)

    ct = _rand(rng, kn.trace(f, kn.ShapeDtype(x.shape)).outputs[0].type.shape)
    got = _pullback(f, x, ct)
    _check(got, _np_max_pool_grad(x, ct, k, s, p, (dilation,) * 2), rtol=1e-6, atol=1e-6)
    if dilation == 1:  # jax has no max-pool VJP with window dilation
        _check(got, _jax_pullback(lambda x: _lax_pool(x, "max", k, s, p), x, ct), rtol=1e-6, atol=1e-6)


def test_max_pool_grad_ties_go_to_the_first_maximum():
    # few distinct values and overlapping windows: most windows hold several maxima
    rng = np.random.default_rng(22)
    x = rng.integers(0, 3, size=(2, 2, 7, 7)).astype(np.float32)
    ct = _rand(rng, (2, 2, 7, 7))
    got = _pullback(lambda x: kn.fn.max_pool2d(x, 3, 1, 1), x, ct)
    _check(got, _np_max_pool_grad(x, ct, (3, 3), (1, 1), (1, 1), (1, 1)), rtol=1e-6, atol=1e-6)
    # jax's max-pool VJP picks the first maximum as well
    want = _jax_pullback(lambda x: _lax_pool(x, "max", (3, 3), (1, 1), (1, 1)), x, ct)
    _check(got, want, rtol=1e-6, atol=1e-6)
    # windows holding nothing but -inf route to their first element like select_and_scatter_add
    # and PyTorch (jax's VJP drops them: its selection may pick the padding there)
    x[0, 1, :4, :4] = -np.inf
    got = _pullback(lambda x: kn.fn.max_pool2d(x, 3, 1, 1), x, ct)
    _check(got, _np_max_pool_grad(x, ct, (3, 3), (1, 1), (1, 1), (1, 1)), rtol=1e-6, atol=1e-6)
    # with window dilation (the loop over window offsets) too
    ct = _rand(rng, (2, 2, 3, 3))
    got = _pullback(lambda x: kn.fn.max_pool2d(x, 2, 2, 0, dilation=2), x, ct)
    _check(got, _np_max_pool_grad(x, ct, (2, 2), (2, 2), (0, 0), (2, 2)), rtol=1e-6, atol=1e-6)


def test_max_pool1d_and_unbatched_grad():
    rng = np.random.default_rng(23)
    x = _rand(rng, (3, 11))  # unbatched [C, W]
    ct = _rand(rng, (3, 6))
    got = _pullback(lambda x: kn.fn.max_pool1d(x, 3, 2, 1), x, ct)
    _check(got, _np_max_pool_grad(x, ct, (3,), (2,), (1,), (1,)), rtol=1e-6, atol=1e-6)


def test_max_pool2d_backward_is_one_select_and_scatter_add():
    graph = gradient_graph(
        kn.trace(lambda x: kn.sum(kn.fn.max_pool2d(x, 3, 2, 1)), kn.ShapeDtype((2, 3, 8, 8)))
    )
    counts = graph.op_counts()
    assert counts["select_and_scatter_add"] == 1 and "slice" not in counts


@pytest.mark.parametrize("kernel,stride,padding,dilation", [POOL2D[1], POOL2D[3]])
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool2d_grad_matches_jax(kernel, stride, padding, dilation, count_include_pad):
    rng = np.random.default_rng(24)
    x = _rand(rng, (2, 3, 7, 8))
    k, s, p = _pool_args(kernel, stride, padding)
    got, want = _grads(
        lambda x: kn.fn.avg_pool2d(x, kernel, stride, padding, count_include_pad),
        lambda x: _lax_pool(x, "avg", k, s, p, count_include_pad),
        [x],
    )
    _check(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_conv_pool_hessian_vector_product_matches_jax():
    # second order through convolution, max pooling (select_and_scatter_add's VJP) and avg pooling
    rng = np.random.default_rng(25)
    x, w = _rand(rng, (2, 2, 8, 8)), _rand(rng, (3, 2, 3, 3))
    c = _rand(rng, (2, 3, 2, 2))
    vx, vw = _rand(rng, x.shape), _rand(rng, w.shape)

    def kn_loss(x, w):
        h = kn.tanh(kn.fn.conv2d(x, w, padding=1))
        pooled = kn.fn.avg_pool2d(kn.fn.max_pool2d(h, 2), 2)
        return kn.sum(pooled * pooled * c)

    def jax_loss(x, w):
        h = jnp.tanh(_lax_conv(x, w, None, 1, 1, 1, 1, 2))
        pooled = _lax_pool(_lax_pool(h, "max", (2, 2), (2, 2), (0, 0)), "avg", (2, 2), (2, 2), (0, 0))
        return jnp.sum(pooled * pooled * c)

    def kn_hvp(x, w):
        def directional(x, w):
            gx, gw = kn.grad(kn_loss, argnums=(0, 1))(x, w)
            return kn.sum(gx * vx) + kn.sum(gw * vw)

        return kn.grad(directional, argnums=(0, 1))(x, w)

    _, want = jax.jit(lambda x, w: jax.jvp(jax.grad(jax_loss, argnums=(0, 1)), (x, w), (vx, vw)))(x, w)
    for g, wnt in zip(kn_hvp(x, w), want):
        _check(g, np.asarray(wnt), rtol=1e-4, atol=1e-4)


def test_max_pool_second_derivative_through_the_pooled_values():
    # d/dx of the max-pool gradient of sum(pool(x)^2 * c): the gradient 2 * pool(x) * c is
    # scattered to the chosen elements, so its derivative gathers (select_and_scatter_add's VJP)
    rng = np.random.default_rng(26)
    x = _rand(rng, (1, 2, 7, 7))
    c, v = _rand(rng, (1, 2, 4, 4)), _rand(rng, x.shape)

    def kn_hvp(x):
        grad = kn.grad(lambda x: kn.sum(kn.square(kn.fn.max_pool2d(x, 3, 2, 1)) * c))
        return kn.grad(lambda x: kn.sum(grad(x) * v))(x)

    def jax_loss(x):
        return jnp.sum(jnp.square(_lax_pool(x, "max", (3, 3), (2, 2), (1, 1))) * c)

    _, want = jax.jit(lambda x: jax.jvp(jax.grad(jax_loss), (x,), (v,)))(x)
    _check(kn_hvp(x), np.asarray(want), rtol=1e-5, atol=1e-5)
