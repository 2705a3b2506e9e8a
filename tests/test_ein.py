"""kn.ein (OCANNL's generalized einsum) against numpy.einsum, jax.lax.conv_general_dilated and
jax.lax.reduce_window; gradients through our autodiff against jax.grad; the ops it lowers to; and
the bad specs, each an error pointing at the offending position."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.errors import EinSpecError

RNG = np.random.default_rng(16)


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _close(got, want, tol=1e-4):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# (ein spec, operand shapes, the same computation as a numpy.einsum spec)
EINSUM_FORMS = [
    ("ij; jk => ik", [(3, 4), (4, 5)], "ij,jk->ik"),
    ("i, j; j, k => i, k", [(3, 4), (4, 5)], "ij,jk->ik"),
    ("row, col; col, out => row, out", [(3, 4), (4, 5)], "ij,jk->ik"),
    # the guide's batch matmul: "batch, i" are input axes, so an operand is laid out [j, batch, i]
    ("batch, i -> j; batch, j -> k => batch, i -> k", [(4, 2, 3), (5, 2, 4)], "jbi,kbj->kbi"),
    ("b i j; b j k => b i k", [(2, 3, 4), (2, 4, 5)], "bij,bjk->bik"),
    ("b | i, j; b | j, k => b | i, k", [(2, 3, 4), (2, 4, 5)], "bij,bjk->bik"),
    # attention scores: "b | q, k -> h" is [b, h, q, k]
    ("bq|hd; bk|hd => b|qk->h", [(2, 5, 3, 4), (2, 6, 3, 4)], "bqhd,bkhd->bhqk"),
    ("b, q | h, d; b, k | h, d => b | q, k -> h", [(2, 5, 3, 4), (2, 6, 3, 4)], "bqhd,bkhd->bhqk"),
    ("i; j => i, j", [(3,), (4,)], "i,j->ij"),
    ("i; i => i", [(3,), (3,)], "i,i->i"),
    ("i; i => ", [(3,), (3,)], "i,i->"),
    ("i, j; j, k => k", [(3, 4), (4, 5)], "ij,jk->k"),  # i summed before the product
    ("i, j; k => k, i", [(3, 4), (5,)], "ij,k->ki"),
    # row variables: '...' of one part is one variable across operands, '..r..' is shared by name
    ("... | i; i -> j => ... | j", [(2, 3, 4), (5, 4)], "abi,ji->abj"),
    ("..r.., i; i, j => ..r.., j", [(2, 3, 4), (4, 5)], "abi,ij->abj"),
    ("..s.. | c; c -> d => ..s.. | d", [(2, 3, 4), (5, 4)], "abc,dc->abd"),
    ("..s.. | c; ..s.. | c => c -> ..s..", [(2, 3, 4), (2, 3, 4)], "abc,abc->abc"),
    ("x, ..r..; ..r.., y => x, y", [(2, 3, 4), (3, 4, 5)], "xab,aby->xy"),
    # unary: transposes, sums, keeping summed axes as size 1 is tested below
    ("i, j => j, i", [(3, 4)], "ij->ji"),
    ("ij => ", [(3, 4)], "ij->"),
    ("... | ... d => ... | ...", [(2, 3, 4)], "abd->ab"),
    ("b | h, w, c => b | c", [(2, 3, 4, 5)], "bhwc->bc"),
    ("..sp.., c => c", [(2, 3, 4)], "abc->c"),
]


@pytest.mark.parametrize("spec,shapes,reference", EINSUM_FORMS, ids=[f[0] for f in EINSUM_FORMS])
def test_against_numpy_einsum(spec, shapes, reference):
    operands = [_rand(*shape) for shape in shapes]
    _close(kn.ein(spec, *operands), np.einsum(reference, *operands))


def test_single_and_multi_character_modes_agree_and_work_under_jit():
    q, k = _rand(2, 5, 3, 4), _rand(2, 6, 3, 4)
    single = kn.jit(lambda a, b: kn.ein("bq|hd; bk|hd => b|qk->h", a, b))(q, k)
    multi = kn.ein("b, q | h, d; b, k | h, d => b | q, k -> h", q, k)
    np.testing.assert_array_equal(np.asarray(single), np.asarray(multi))


@pytest.mark.parametrize("reduce", ["sum", "max", "min", "mean"])
def test_unary_reductions_and_size_one_axes(reduce):
    x = _rand(2, 3, 4, 5)
    ref = getattr(np, reduce)
    _close(kn.ein("... | h, w, c => ... | 0, 0, c", x, reduce=reduce), ref(x, axis=(1, 2), keepdims=True))
    _close(kn.ein("... | ... d => ... | ... 0", x, reduce=reduce), ref(x, axis=-1, keepdims=True))
    _close(kn.ein("b | ..sp.. => b | 0", x, reduce=reduce), ref(x.reshape(2, -1), axis=1, keepdims=True))


def test_integer_sum_keeps_the_dtype_and_mean_gives_floats():
    x = RNG.integers(-5, 5, size=(3, 4)).astype(np.int32)
    got = kn.ein("i, j => i", x)
    assert np.asarray(got).dtype == np.int32
    np.testing.assert_array_equal(np.asarray(got), x.sum(1))
    _close(kn.ein("i, j => i", x, reduce="mean"), x.mean(1).astype(np.float32))


def test_result_axes_absent_from_the_operands_broadcast():
    x = _rand(3)
    _close(kn.ein("i => i, j", x, sizes={"j": 4}), np.broadcast_to(x[:, None], (3, 4)))


def _lax_conv(x, w, strides, dilation, spec):
    return jax.lax.conv_general_dilated(
        x, w, strides, "VALID", rhs_dilation=dilation, dimension_numbers=spec, precision="highest"
    )


# (spec, x shape, kernel shape, constants, strides, dilation, lax dimension numbers)
CONV_FORMS = [
    (
        "... | stride*oh+kh, stride*ow+kw, ic; kh, kw, ic -> oc => ... | oh, ow, oc",
        (2, 9, 8, 3),
        (5, 3, 3, 3),
        {"stride": 2},
        (2, 2),
        (1, 1),
        ("NHWC", "OHWI", "NHWC"),
    ),
    (
        "... | oh+kh, ow+kw, ic; kh, kw, ic -> oc => ... | oh, ow, oc",
        (2, 7, 6, 2),
        (4, 2, 3, 2),
        {},
        (1, 1),
        (1, 1),
        ("NHWC", "OHWI", "NHWC"),
    ),
    (
        "b | oh + 2*kh, 3*ow + kw, ic; kh, kw, ic -> oc => b | oh, ow, oc",
        (2, 9, 10, 3),
        (4, 3, 2, 3),
        {},
        (1, 3),
        (2, 1),
        ("NHWC", "OHWI", "NHWC"),
    ),
    (
        "n | ic, s*oh+d*kh, s*ow+d*kw; ic, kh, kw -> oc => n | oc, oh, ow",  # PyTorch's NCHW / OIHW
        (2, 3, 11, 9),
        (4, 3, 3, 2),
        {"s": 2, "d": 2},
        (2, 2),
        (2, 2),
        ("NCHW", "OIHW", "NCHW"),
    ),
    ("n | c, ot+kt; c, kt -> o => n | o, ot", (3, 2, 10), (4, 2, 3), {}, (1,), (1,), ("NCH", "OIH", "NCH")),
]


@pytest.mark.parametrize(
    "spec,xs,ws,constants,strides,dilation,dims", CONV_FORMS, ids=[f"conv{i}" for i in range(len(CONV_FORMS))]
)
def test_convolution_against_lax(spec, xs, ws, constants, strides, dilation, dims):
    x, w = _rand(*xs), _rand(*ws)
    _close(kn.ein(spec, x, w, **constants), _lax_conv(x, w, strides, dilation, dims))


def test_convolution_with_several_batch_axes_and_the_kernel_first():
    x, w = _rand(2, 3, 8, 4), _rand(5, 3, 4)  # batch row of two axes; 1-d conv over axis 2
    want = _lax_conv(x.reshape(6, 8, 4), w, (2,), (1,), ("NHC", "OHI", "NHC")).reshape(2, 3, 3, 5)
    _close(kn.ein("... | 2*o+k, c; k, c -> f => ... | o, f", x, w), want)
    _close(kn.ein("k, c -> f; ... | 2*o+k, c => ... | f, o", w, x), np.moveaxis(np.asarray(want), -1, -2))


@pytest.mark.parametrize("reduce,init,op", [("max", -np.inf, jax.lax.max), ("sum", 0.0, jax.lax.add)])
def test_pooling_against_reduce_window(reduce, init, op):
    x = _rand(2, 9, 8, 3)
    got = kn.ein("... | 2*oh+wh, 2*ow+2*ww, c => ... | oh, ow, c", x, reduce=reduce, sizes={"wh": 3, "ww": 2})
    want = jax.lax.reduce_window(
        x, init, op, (1, 3, 2, 1), (1, 2, 2, 1), "VALID", window_dilation=(1, 1, 2, 1)
    )
    _close(got, want)


def test_lowers_to_ordinary_ops_only():
    allowed = {
        "input",
        "dot_general",
        "reduce",
        "convolution",
        "reduce_window",
        "transpose",
        "reshape",
        "broadcast_in_dim",
        "convert",
        "constant",
    }
    cases = [
        ("b, q | h, d; b, k | h, d => b | q, k -> h", (2, 5, 3, 4), (2, 6, 3, 4)),
        ("... | 2*oh+kh, ow+kw, ic; kh, kw, ic -> oc => ... | oh, ow, oc", (2, 7, 6, 3), (4, 3, 2, 3)),
    ]
    for spec, xs, ws in cases:
        graph = kn.trace(lambda a, b, s=spec: kn.ein(s, a, b), kn.ShapeDtype(xs), kn.ShapeDtype(ws))
        ops = {node.op for node in graph.nodes}
        assert ops <= allowed, ops - allowed
    pool = kn.trace(
        lambda a: kn.ein("... | 2*oh+wh, c => ... | oh, c", a, reduce="max", sizes={"wh": 2}),
        kn.ShapeDtype((2, 8, 3)),
    )
    assert "reduce_window" in {node.op for node in pool.nodes}


# ---------------------------------------------------------------------------------- gradients

GRAD_CASES = [
    (
        "b, q | h, d; b, k | h, d => b | q, k -> h",
        [(2, 5, 3, 4), (2, 6, 3, 4)],
        lambda a, b: jnp.einsum("bqhd,bkhd->bhqk", a, b),
    ),
    ("..s.. | c; c -> d => ..s.. | d", [(2, 3, 4), (5, 4)], lambda a, b: jnp.einsum("abc,dc->abd", a, b)),
    ("i, j; j, k => k", [(3, 4), (4, 5)], lambda a, b: jnp.einsum("ij,jk->k", a, b)),
    (
        "... | s*oh+kh, s*ow+kw, ic; kh, kw, ic -> oc => ... | oc, oh, ow",
        [(2, 9, 8, 3), (4, 3, 2, 3)],
        lambda a, b: jnp.moveaxis(_lax_conv(a, b, (2, 2), (1, 1), ("NHWC", "OHWI", "NHWC")), -1, 1),
    ),
]


@pytest.mark.parametrize("spec,shapes,jax_fn", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_gradients_against_jax(spec, shapes, jax_fn):
    a, b = (_rand(*s) for s in shapes)
    constants = {"s": 2} if "s*" in spec else {}
    cotangent = _rand(*np.shape(jax_fn(a, b)))

    def ours(x, y):
        return kn.sum(kn.ein(spec, x, y, **constants) * cotangent)

    def theirs(x, y):
        return jnp.sum(jax_fn(x, y) * cotangent)

    got = kn.grad(ours, argnums=(0, 1))(a, b)
    want = jax.grad(theirs, argnums=(0, 1))(a, b)
    for g, w in zip(got, want):
        _close(g, w, tol=2e-4)


@pytest.mark.parametrize("reduce", ["max", "mean"])
def test_unary_and_pooling_gradients_against_jax(reduce):
    x = _rand(2, 6, 6, 3)
    cot_keep, cot_pool = _rand(2, 1, 1, 3), _rand(2, 3, 3, 3)
    jax_reduce = getattr(jnp, reduce)

    def ours(v):
        kept = kn.ein("... | h, w, c => ... | 0, 0, c", v, reduce=reduce)
        pooled = kn.ein(
            "... | 2*oh+wh, 2*ow+ww, c => ... | oh, ow, c", v, reduce=reduce, sizes={"wh": 2, "ww": 2}
        )
        return kn.sum(kept * cot_keep) + kn.sum(pooled * cot_pool)

    def theirs(v):
        kept = jax_reduce(v, axis=(1, 2), keepdims=True)
        pooled = jax_reduce(v.reshape(2, 3, 2, 3, 2, 3), axis=(2, 4))
        return jnp.sum(kept * cot_keep) + jnp.sum(pooled * cot_pool)

    _close(kn.grad(ours)(x), jax.grad(theirs)(x))


# ---------------------------------------------------------------------------------- errors


def _caret(err: Exception) -> int:
    """The column of the caret line's '^' relative to the spec line above it."""
    lines = str(err).splitlines()
    return lines[-1].index("^") - 2


BAD = [
    # (spec, operand shapes, constants, error type, the text at the caret, words in the message)
    ("i, j; j, k => i, k", [(3, 4), (5, 6)], {}, kn.ShapeError, "j, k", "'j' is 5"),
    ("... | ... d => ... | d ...", [(2, 3, 4)], {}, EinSpecError, "... d", "ambiguous"),
    ("..a.. | ..b..; ..b.. => ..a..", [(2, 3), (3,)], {}, None, None, None),  # resolvable: fine
    ("..a.. | ..b.. => ..b.. | ..a..", [(2, 3)], {}, EinSpecError, "..b.. =>", "ambiguous"),
    ("oh*kh, c; kh, c => oh", [(5, 2), (3, 2)], {}, EinSpecError, "oh*kh", "not affine"),
    ("stride*oh+kh; kh => oh", [(5,), (3,)], {}, EinSpecError, "stride*oh", "unknown constant"),
    ("oh+kh+1; kh => oh", [(5,), (3,)], {}, EinSpecError, "1", "constant offset"),
    ("oh+kh; kh => oh", [(2,), (3,)], {}, kn.ShapeError, "oh+kh", "spans 3"),
    ("i, j; j, k => i, k", [(3, 4)], {}, EinSpecError, "=>", "2 operand(s) but 1"),
    ("i, j => i", [(3, 4, 5)], {}, kn.ShapeError, "i, j", "3 axes"),
    ("i, ..a.., ..b.. => i", [(3, 4)], {}, EinSpecError, "..b..", "only one row variable"),
    ("i, 0 => i", [(3, 4)], {}, EinSpecError, "0", "result"),
    ("i, i => i", [(3, 3)], {}, EinSpecError, "i =>", "twice"),
    ("i, j => i, q", [(3, 4)], {}, EinSpecError, "q", "unknown"),
    ("i, j => i, ..r..", [(3, 4)], {}, EinSpecError, "..r..", "no operand"),
    ("i, j | k => i", [(3, 4)], {}, None, None, None),
    ("i -> j | k => i", [(3, 4, 5)], {}, EinSpecError, "-> j", "after '|'"),
    ("i, j; j, k -> i, k", [(3, 4), (4, 5)], {}, EinSpecError, "", "'=>'"),
    ("i, j$ => i", [(3, 4)], {}, EinSpecError, "$", "not an axis name"),
    ("ij => i$", [(3, 4)], {}, EinSpecError, "$", "unexpected character"),
]


@pytest.mark.parametrize("spec,shapes,constants,error,at,words", BAD, ids=[b[0] for b in BAD])
def test_bad_specs_point_at_the_offending_position(spec, shapes, constants, error, at, words):
    operands = [_rand(*s) for s in shapes]
    if error is None:
        if spec == "i, j | k => i":  # batch "i, j" then output "k": fine with three axes
            operands = [_rand(3, 4, 5)]
        kn.ein(spec, *operands, **constants)
        return
    with pytest.raises(error) as info:
        kn.ein(spec, *operands, **constants)
    message = str(info.value)
    assert words in message, message
    assert spec in message, message
    assert spec[_caret(info.value) :].startswith(at), (spec[_caret(info.value) :], message)


def test_bad_arguments():
    x = _rand(3, 4)
    with pytest.raises(ValueError, match="reduce must be"):
        kn.ein("i, j => i", x, reduce="prod")
    with pytest.raises(ValueError, match="sum of products"):
        kn.ein("i; i => i", x[0], x[0], reduce="max")
    with pytest.raises(TypeError, match="bool"):
        kn.ein("i, j => i", x > 0)
    with pytest.raises(ValueError, match="positive int"):
        kn.ein("i => i, j", x[0], sizes={"j": 0})
    with pytest.raises(kn.ShapeError, match="sizes"):
        kn.ein("i => i", x[0], sizes={"i": 7})


def test_errors_inside_a_model_name_the_layer_path():
    from kaun_ir.ir.builder import scope

    def scoped(spec):
        def forward(*xs):
            with scope("1.block"):
                return kn.ein(spec, *xs)

        return forward

    with pytest.raises(EinSpecError, match=r"^1\.block: ein: the size of result axis 'q'"):
        kn.trace(scoped("i, j => i, q"), kn.ShapeDtype((3, 4)))
    with pytest.raises(kn.ShapeError, match=r"^1\.block: ein: axis 'j' is 5"):
        kn.trace(scoped("i, j; j => i"), kn.ShapeDtype((3, 4)), kn.ShapeDtype((5,)))
