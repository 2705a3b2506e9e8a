"""kn.matmul / dot / tensordot / einsum / outer against NumPy and jax.numpy, eagerly and under kn.jit;
their derivatives (dot_general's VJP) against jax.grad, including second order."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.surface.tensor import apply
from kaun_ir.transforms.autodiff import gradient_graph


def _rand(rng, shape, dtype=np.float32):
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-5, 6, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _check(got, want, rtol=2e-5, atol=2e-5):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)


def _both(fn, *args):
    """``fn`` run eagerly and under kn.jit (one trace per signature)."""
    return [fn(*args), kn.jit(fn)(*args)]


MATMUL_SHAPES = [
    ((4,), (4,)),  # vector . vector -> scalar
    ((3, 4), (4,)),  # matrix . vector
    ((4,), (4, 5)),  # vector . matrix
    ((3, 4), (4, 5)),
    ((2, 3, 4), (4,)),
    ((4,), (2, 4, 5)),
    ((2, 3, 4), (4, 5)),  # batched lhs, shared rhs (no broadcast needed)
    ((3, 4), (2, 4, 5)),  # shared lhs, batched rhs
    ((2, 3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 2)),  # batch axes broadcast: [2,1] with [5]
    ((1, 3, 4), (6, 4, 2)),
    ((0, 3, 4), (4, 2)),  # empty batch
    ((3, 0), (0, 2)),  # empty contraction -> zeros
]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES, ids=[f"{a}@{b}" for a, b in MATMUL_SHAPES])
def test_matmul_matches_numpy(sa, sb):
    rng = np.random.default_rng(0)
    a, b = _rand(rng, sa), _rand(rng, sb)
    for got in _both(kn.matmul, a, b):
        _check(got, np.matmul(a, b))


def test_matmul_dtypes():
    rng = np.random.default_rng(1)
    a, b = _rand(rng, (3, 4), np.int32), _rand(rng, (4, 2), np.int32)
    _check(kn.matmul(a, b), a @ b)
    a64 = _rand(rng, (3, 4), np.float64)
    b32 = _rand(rng, (4, 2))
    _check(kn.matmul(a64, b32), a64 @ b32, rtol=1e-12, atol=1e-12)  # f64 @ f32 promotes to f64
    x = _rand(rng, (3, 4)).astype(kn.bfloat16)
    y = _rand(rng, (4, 2)).astype(kn.bfloat16)
    want = (x.astype(np.float64) @ y.astype(np.float64)).astype(kn.bfloat16)
    _check(kn.matmul(x, y), want, rtol=3e-2, atol=6e-2)


def test_matmul_lowers_to_one_dot_general_with_batch_axes():
    graph = kn.trace(kn.matmul, kn.ShapeDtype((2, 3, 4)), kn.ShapeDtype((2, 4, 5)))
    dots = [n for n in graph.nodes if n.op == "dot_general"]
    assert len(dots) == 1
    assert dots[0].attr("lhs_batch") == (0,) and dots[0].attr("rhs_batch") == (0,)
    # a shared 2-d weight is not broadcast over the batch
    graph = kn.trace(kn.matmul, kn.ShapeDtype((8, 3, 4)), kn.ShapeDtype((4, 5)))
    assert [n.op for n in graph.nodes] == ["dot_general"]


def test_matmul_error_names_shapes():
    with pytest.raises(
        kn.ShapeError,
        match=r"matmul of f32\[32,784\] and f32\[128,10\]: contracting "
        r"dimensions differ \(784 vs 128\)",
    ):
        kn.jit(kn.matmul)(np.zeros((32, 784), np.float32), np.zeros((128, 10), np.float32))
    with pytest.raises(kn.ShapeError, match="do not broadcast"):
        kn.matmul(np.zeros((2, 3, 4), np.float32), np.zeros((3, 4, 5), np.float32))
    with pytest.raises(kn.ShapeError, match="at least one axis"):
        kn.matmul(np.float32(2), np.zeros((3,), np.float32))
    with pytest.raises(TypeError, match="bool"):
        kn.matmul(np.ones((2, 2), bool), np.ones((2, 2), bool))


def test_matmul_operator():
    rng = np.random.default_rng(2)
    a, b = _rand(rng, (2, 3, 4)), _rand(rng, (4, 5))
    _check(kn.jit(lambda x, y: x @ y)(a, b), a @ b)
    _check(kn.jit(lambda y: a @ y)(b), a @ b)  # __rmatmul__ with a NumPy lhs


DOT_SHAPES = [
    ((), (3,)),
    ((4,), (4,)),
    ((3, 4), (4,)),
    ((3, 4), (4, 5)),
    ((2, 3, 4), (5, 4, 6)),
    ((2, 3, 4), (4,)),
]


@pytest.mark.parametrize("sa,sb", DOT_SHAPES, ids=[f"{a}.{b}" for a, b in DOT_SHAPES])
def test_dot_matches_numpy(sa, sb):
    rng = np.random.default_rng(3)
    a, b = _rand(rng, sa), _rand(rng, sb)
    for got in _both(kn.dot, a, b):
        _check(got, np.asarray(np.dot(a, b)))


TENSORDOT = [
    ((3, 4, 5), (4, 5, 2), 2),
    ((3, 4), (4, 5), 1),
    ((3, 4), (5, 6), 0),
    ((3, 4, 5), (5, 3, 2), ((0, 2), (1, 0))),
    ((2, 3), (3, 2), ((1, 0), (0, 1))),
    ((3, 4, 5), (5, 4), ((-1, -2), (0, 1))),
]


@pytest.mark.parametrize("sa,sb,axes", TENSORDOT)
def test_tensordot_matches_numpy(sa, sb, axes):
    rng = np.random.default_rng(4)
    a, b = _rand(rng, sa), _rand(rng, sb)
    for got in _both(lambda x, y: kn.tensordot(x, y, axes), a, b):
        _check(got, np.tensordot(a, b, axes))


def test_outer_matches_numpy():
    rng = np.random.default_rng(5)
    a, b = _rand(rng, (3,)), _rand(rng, (2, 2))
    for got in _both(kn.outer, a, b):
        _check(got, np.outer(a, b))


EINSUM = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),  # implicit output
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),  # attention scores
    ("bhqk,bhkd->bqhd", [(2, 3, 4, 6), (2, 3, 6, 5)]),
    ("i,i->", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij->ji", [(3, 4)]),
    ("ij->j", [(3, 4)]),  # sum over a letter of one operand
    ("ijk->", [(2, 3, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),  # chain
    ("ab,cd,bd->ac", [(2, 3), (4, 5), (3, 5)]),  # no shared letter in the first pair
    ("ij,kj->", [(3, 4), (5, 4)]),
    ("ijk,k->ij", [(2, 3, 4), (4,)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),  # broadcasting '...'
    ("...i,i", [(2, 3, 4), (4,)]),
    ("bi,bj->ij", [(6, 3), (6, 4)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),  # elementwise product: batch only
]


@pytest.mark.parametrize("spec,shapes", EINSUM, ids=[s for s, _ in EINSUM])
def test_einsum_matches_jax(spec, shapes):
    rng = np.random.default_rng(6)
    operands = [_rand(rng, s) for s in shapes]
    want = np.asarray(jnp.einsum(spec, *operands, precision="highest"))
    for got in _both(lambda *xs: kn.einsum(spec, *xs), *operands):
        _check(got, want, rtol=1e-4, atol=1e-4)


def test_einsum_int_keeps_dtype():
    rng = np.random.default_rng(7)
    a, b = _rand(rng, (3, 4), np.int32), _rand(rng, (4, 2), np.int32)
    _check(kn.einsum("ij,jk->i", a, b), np.einsum("ij,jk->i", a, b))


def test_einsum_errors():
    x = np.zeros((3, 3), np.float32)
    with pytest.raises(NotImplementedError, match="diagonal or trace"):
        kn.einsum("ii->", x)
    with pytest.raises(kn.ShapeError, match="letter 'j' has sizes 3 and 4"):
        kn.einsum("ij,jk->ik", x, np.zeros((4, 2), np.float32))
    with pytest.raises(kn.ShapeError, match="names 3 axes"):
        kn.einsum("ijk->i", x)
    with pytest.raises(ValueError, match="appear in no operand"):
        kn.einsum("ij->iz", x)
    with pytest.raises(ValueError, match="2 operand"):
        kn.einsum("ij,jk->ik", x)


def test_tensordot_errors():
    with pytest.raises(kn.ShapeError, match="differ"):
        kn.tensordot(np.zeros((3, 4), np.float32), np.zeros((5, 3), np.float32), 1)
    with pytest.raises(kn.ShapeError, match="contracting dimensions differ"):
        kn.dot(np.zeros((3, 4), np.float32), np.zeros((3,), np.float32))


# ------------------------------------------------------------------------------- derivatives


def _weighted_sum_grads(kn_fn, jax_fn, operands, seed=0):
    """Gradients of ``sum(f(*operands) * c)`` (random c, so every output element weighs
    differently) w.r.t. every operand, by kaun_ir and by jax."""
    rng = np.random.default_rng(seed)
    c = _rand(rng, jax.eval_shape(jax_fn, *operands).shape)  # eval_shape: nothing compiled
    argnums = tuple(range(len(operands)))
    got = kn.grad(lambda *xs: kn.sum(kn_fn(*xs) * c), argnums=argnums)(*operands)
    # jitted: one XLA compilation instead of one per primitive
    want = jax.jit(jax.grad(lambda *xs: jnp.sum(jax_fn(*xs) * c), argnums=argnums))(*operands)
    return got, want


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES, ids=[f"{a}@{b}" for a, b in MATMUL_SHAPES])
def test_matmul_grad_matches_jax(sa, sb):
    rng = np.random.default_rng(10)
    a, b = _rand(rng, sa), _rand(rng, sb)
    got, want = _weighted_sum_grads(kn.matmul, lambda x, y: jnp.matmul(x, y, precision="highest"), (a, b))
    for g, w in zip(got, want):
        _check(g, np.asarray(w), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("spec,shapes", EINSUM, ids=[s for s, _ in EINSUM])
def test_einsum_grad_matches_jax(spec, shapes):
    rng = np.random.default_rng(11)
    operands = [_rand(rng, s) for s in shapes]
    got, want = _weighted_sum_grads(
        lambda *xs: kn.einsum(spec, *xs), lambda *xs: jnp.einsum(spec, *xs, precision="highest"), operands
    )
    for g, w in zip(got, want):
        _check(g, np.asarray(w), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("sa,sb,axes", TENSORDOT)
def test_tensordot_grad_matches_jax(sa, sb, axes):
    rng = np.random.default_rng(12)
    a, b = _rand(rng, sa), _rand(rng, sb)
    got, want = _weighted_sum_grads(
        lambda x, y: kn.tensordot(x, y, axes),
        lambda x, y: jnp.tensordot(x, y, axes, precision="highest"),
        (a, b),
    )
    for g, w in zip(got, want):
        _check(g, np.asarray(w), rtol=1e-4, atol=1e-4)


def _transposes(f, *specs):
    """(transposes in the forward graph, transposes in the gradient graph) of scalar ``f``."""
    forward = kn.trace(f, *specs)
    return forward.op_counts().get("transpose", 0), gradient_graph(forward).op_counts().get("transpose", 0)


@pytest.mark.parametrize("x_shape", [(8, 5), (2, 8, 5)])
def test_mlp_backward_has_no_transpose(x_shape):
    w = kn.ShapeDtype((5, 3))
    assert _transposes(lambda x, w: kn.sum(x @ w), kn.ShapeDtype(x_shape), w) == (0, 0)
    graph = gradient_graph(kn.trace(lambda x, w: kn.sum(x @ w), kn.ShapeDtype(x_shape), w))
    assert graph.op_counts()["dot_general"] == 3  # forward, d/dx, d/dw

    def mlp(x, w1, b1, w2):
        return kn.sum(kn.tanh(x @ w1 + b1) @ w2)

    specs = (kn.ShapeDtype(x_shape), kn.ShapeDtype((5, 7)), kn.ShapeDtype((7,)), kn.ShapeDtype((7, 2)))
    assert _transposes(mlp, *specs) == (0, 0)


def test_dot_general_backward_transposes_only_when_unavoidable():
    # attention scores and values: batch axes lead everywhere, so no transpose is needed
    q, k = kn.ShapeDtype((2, 3, 4, 5)), kn.ShapeDtype((2, 3, 6, 5))
    assert _transposes(lambda q, k: kn.sum(kn.einsum("bhqd,bhkd->bhqk", q, k)), q, k) == (0, 0)
    p, v = kn.ShapeDtype((2, 3, 4, 6)), kn.ShapeDtype((2, 3, 6, 5))
    assert _transposes(lambda p, v: kn.sum(kn.einsum("bhqk,bhkd->bhqd", p, v)), p, v) == (0, 0)

    # a batch axis in the middle of lhs: its cotangent comes out batch-first, one transpose
    def middle_batch(a, b):
        return kn.sum(
            apply(
                "dot_general",
                a,
                b,
                lhs_batch=(1,),
                rhs_batch=(0,),
                lhs_contracting=(2,),
                rhs_contracting=(1,),
            )
        )

    assert _transposes(middle_batch, kn.ShapeDtype((3, 2, 4)), kn.ShapeDtype((2, 4, 5))) == (0, 1)


def test_dot_general_grad_with_middle_batch_axis_matches_jax():
    rng = np.random.default_rng(13)
    a, b = _rand(rng, (3, 2, 4)), _rand(rng, (4, 5, 2))
    dims = dict(lhs_batch=(1,), rhs_batch=(2,), lhs_contracting=(2,), rhs_contracting=(0,))
    got, want = _weighted_sum_grads(
        lambda x, y: apply("dot_general", x, y, **dims),
        lambda x, y: jax.lax.dot_general(x, y, (((2,), (0,)), ((1,), (2,))), precision="highest"),
        (a, b),
    )
    for g, w in zip(got, want):
        _check(g, np.asarray(w), rtol=1e-4, atol=1e-4)


def test_dot_general_grad_with_wider_result_dtype():
    rng = np.random.default_rng(14)
    a = _rand(rng, (4, 6)).astype(kn.bfloat16)
    b = _rand(rng, (6, 3)).astype(kn.bfloat16)
    dims = dict(lhs_batch=(), rhs_batch=(), lhs_contracting=(1,), rhs_contracting=(0,))
    got, want = _weighted_sum_grads(
        lambda x, y: apply("dot_general", x, y, preferred_dtype=kn.float32, **dims),
        lambda x, y: jax.lax.dot_general(x, y, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32),
        (a, b),
    )
    for g, w in zip(got, want):
        _check(g, np.asarray(w), rtol=3e-2, atol=6e-2)  # bf16 cotangents, like the operands


def test_grad_of_integer_matmul_is_refused():
    a = np.ones((2, 3), np.int32)
    with pytest.raises(kn.GradientError, match="floating-point"):
        kn.grad(lambda x: kn.sum(x @ x.T))(a)


def _mlp_loss(x, y, params, n):
    """Mean squared error of a two-layer tanh MLP; ``n`` is the module (kn or jnp)."""
    w1, b1, w2, b2 = params
    hidden = n.tanh(n.matmul(x, w1) + b1)
    error = n.matmul(hidden, w2) + b2 - y
    return n.mean(error * error)


def test_mlp_hessian_vector_product_matches_jax():
    rng = np.random.default_rng(15)
    x, y = _rand(rng, (5, 4)), _rand(rng, (5, 3))
    params = (_rand(rng, (4, 6)), _rand(rng, (6,)), _rand(rng, (6, 3)), _rand(rng, (3,)))
    v = tuple(_rand(rng, np.shape(p)) for p in params)

    def kn_hvp(params, v):
        def directional(p):
            grads = kn.grad(lambda q: _mlp_loss(x, y, q, kn))(p)
            return sum(kn.sum(g * d) for g, d in zip(grads, v))

        return kn.grad(directional)(params)

    def jax_loss(p):
        with jax.default_matmul_precision("highest"):
            return _mlp_loss(x, y, p, jnp)

    _, want = jax.jit(lambda p: jax.jvp(jax.grad(jax_loss), (p,), (v,)))(params)
    for got in (kn_hvp(params, v), kn.jit(kn_hvp)(params, v)):
        for g, w in zip(got, want):
            _check(g, np.asarray(w), rtol=1e-4, atol=1e-5)
