"""The ``merge-dots`` pass: sibling products sharing an operand, and sums of products, as one
larger ``dot_general``. Values are compared with float64 NumPy (the merged product sums the same
terms, in another order for sums)."""

from __future__ import annotations

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import passes
from kaun_ir.runtime import pipelines
from kaun_ir.surface.tensor import apply

F32 = np.float32
RNG = np.random.default_rng(5)


def rand(*shape):
    return RNG.standard_normal(shape).astype(F32)


def run(f, args, pipeline="merge-dots,cse,dce"):
    """(counters of merge-dots, dot_general count before / after, outputs with the pass)."""
    graph = kn.jit(f, pipeline="").graph(*args)
    stats = passes.Statistics()
    out = passes.run(graph, pipeline, instrumentations=[stats], verify_each=True)
    counters = stats.records[0].counters
    values = kn.jit(f, pipeline=pipeline)(*args)
    return counters, graph.op_counts()["dot_general"], out.op_counts()["dot_general"], values


def close(got, want64, scale64):
    got = np.asarray(got, np.float64)
    assert got.shape == want64.shape
    assert np.all(np.abs(got - want64) <= 1e-6 * scale64 + 1e-30)


def f64(*xs):
    return [x.astype(np.float64) for x in xs]


def test_siblings_sharing_the_left_operand():
    x, w1, w2, w3 = rand(4, 6, 8), rand(8, 5), rand(8, 5), rand(8, 5)
    counters, before, after, got = run(lambda x, a, b, c: (x @ a, x @ b, x @ c), (x, w1, w2, w3))
    assert counters["sibling products merged"] == 3 and (before, after) == (3, 1)
    for g, w in zip(got, (w1, w2, w3)):
        xx, ww = f64(x, w)
        close(g, xx @ ww, np.abs(xx) @ np.abs(ww))


def test_siblings_sharing_the_right_operand():
    a1, a2, w = rand(64, 32), rand(64, 32), rand(32, 48)
    counters, before, after, got = run(lambda a, b, w: (a @ w, b @ w), (a1, a2, w))
    assert counters["sibling products merged"] == 2 and after == 1
    for g, a in zip(got, (a1, a2)):
        aa, ww = f64(a, w)
        close(g, aa @ ww, np.abs(aa) @ np.abs(ww))


def test_weight_gradient_siblings_contracting_two_axes():
    x, d1, d2 = rand(3, 5, 32), rand(3, 5, 4), rand(3, 5, 4)

    def f(x, d1, d2):
        dims = dict(lhs_batch=(), rhs_batch=(), lhs_contracting=(0, 1), rhs_contracting=(0, 1))
        return apply("dot_general", x, d1, **dims), apply("dot_general", x, d2, **dims)

    counters, _, after, got = run(f, (x, d1, d2))
    assert counters["sibling products merged"] == 2 and after == 1
    for g, d in zip(got, (d1, d2)):
        xx, dd = f64(x, d)
        close(g, np.einsum("btf,btg->fg", xx, dd), np.einsum("btf,btg->fg", np.abs(xx), np.abs(dd)))


def test_batched_siblings():
    x, w1, w2 = rand(2, 32, 4), rand(2, 4, 3), rand(2, 4, 3)

    def f(x, a, b):
        dims = dict(lhs_batch=(0,), rhs_batch=(0,), lhs_contracting=(2,), rhs_contracting=(1,))
        return apply("dot_general", x, a, **dims), apply("dot_general", x, b, **dims)

    counters, _, after, got = run(f, (x, w1, w2))
    assert counters["sibling products merged"] == 2 and after == 1
    for g, w in zip(got, (w1, w2)):
        xx, ww = f64(x, w)
        close(g, xx @ ww, np.abs(xx) @ np.abs(ww))


def test_sum_of_three_products():
    a, b, c, p, q, r = (rand(64, 4) for _ in range(6))

    def f(a, b, c, p, q, r):
        return a @ p.T + b @ q.T + c @ r.T

    counters, before, after, got = run(f, (a, b, c, p, q, r))
    assert counters["summed products merged"] == 2 and (before, after) == (3, 1)
    xs = f64(a, b, c, p, q, r)
    want = sum(x @ y.T for x, y in zip(xs[:3], xs[3:]))
    scale = sum(np.abs(x) @ np.abs(y).T for x, y in zip(xs[:3], xs[3:]))
    close(got, want, scale)


def test_left_alone_when_order_or_other_uses_forbid():
    x, w1 = rand(4, 4), rand(4, 4)
    # the second sibling's operand is computed from the first product: no place for one product
    counters, before, after, got = run(lambda x, w: (x @ w, x @ (x @ w)), (x, w1), "merge-dots")
    assert "sibling products merged" not in counters and after == before
    xx, ww = f64(x, w1)
    close(got[1], xx @ (xx @ ww), np.abs(xx) @ (np.abs(xx) @ np.abs(ww)))

    # a product used twice stays as it is inside the sum
    def used_twice(a, b, p, q):
        ap = a @ p
        return ap + b @ q, ap * 2

    counters, before, after, _ = run(used_twice, (x, x * 2, w1, w1 * 3), "merge-dots")
    assert "summed products merged" not in counters and after == before


def test_attention_projection_gradients_match_the_unmerged_step():
    x, wq, wk, wv = rand(2, 8, 16), rand(16, 16) / 4, rand(16, 16) / 4, rand(16, 16) / 4

    def loss(wq, wk, wv, x):
        q, k, v = x @ wq, x @ wk, x @ wv
        s = kn.softmax(q @ kn.transpose(k, (0, 2, 1)), axis=-1)
        return (s @ v).sum()

    grad = kn.grad(loss, argnums=(0, 1, 2, 3))
    graph = kn.jit(grad, pipeline="canonicalize,cse,dce").graph(wq, wk, wv, x)
    stats = passes.Statistics()
    passes.run(graph, "merge-dots", instrumentations=[stats], verify_each=True)
    assert stats.records[0].counters["sibling products merged"] >= 6  # q/k/v and their weight gradients
    plain = kn.jit(grad, pipeline="canonicalize,cse,dce")(wq, wk, wv, x)
    merged = kn.jit(grad, pipeline="canonicalize,cse,dce,merge-dots,cse,dce")(wq, wk, wv, x)
    for a, b in zip(plain, merged):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_products_inside_a_loop_body_merge():
    h0, xs = rand(32, 16), rand(5, 32, 16)
    ws = [rand(16, 16) / 8 for _ in range(3)]

    def f(h0, xs, a, b, c):
        def step(h, x):
            h = kn.tanh(x @ a + h @ b + h @ c)
            return h, h @ a

        return kn.scan(step, h0, xs)

    graph = kn.jit(f, pipeline="").graph(h0, xs, *ws)
    stats = passes.Statistics()
    passes.run(graph, "merge-dots", instrumentations=[stats], verify_each=True)
    counters = stats.records[0].counters
    # h @ b and h @ c share h: siblings, merged inside the body
    assert counters["sibling products merged"] == 2
    got = kn.jit(f, pipeline="merge-dots,cse,dce")(h0, xs, *ws)
    h, a, b, c = h0.astype(np.float64), *f64(*ws)
    ys = []
    for x in xs.astype(np.float64):
        h = np.tanh(x @ a + h @ b + h @ c)
        ys.append(h @ a)
    np.testing.assert_allclose(np.asarray(got[0]), h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got[1]), np.stack(ys), rtol=1e-5, atol=1e-6)


def test_a_group_reading_another_groups_product_is_left_for_later():
    x, w1, a, v1, v2 = (rand(16, 16) for _ in range(5))

    def f(x, w1, a, v1, v2):
        y = x @ w1
        y2 = x @ kn.exp(a)  # x @ w1 and x @ exp(a) are siblings; so are y @ v1 and y @ v2
        return y2, y @ v1, y @ v2

    graph = kn.jit(f, pipeline="").graph(x, w1, a, v1, v2)
    passes.run(graph, "merge-dots", verify_each=True)
    got = kn.jit(f, pipeline="merge-dots,cse,dce")(x, w1, a, v1, v2)
    xx, ww, aa, p, q = f64(x, w1, a, v1, v2)
    yy = xx @ ww
    for g, want in zip(got, (xx @ np.exp(aa), yy @ p, yy @ q)):
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-4)


def test_matrix_vector_products_are_not_merged():
    x, ws = rand(1, 64), [rand(64, 256) for _ in range(3)]
    counters, before, after, _ = run(lambda x, a, b, c: (x @ a, x @ b, x @ c), (x, *ws), "merge-dots")
    assert "sibling products merged" not in counters and after == before == 3
    vs, bs = [rand(1, 64) for _ in range(3)], [rand(64, 256) for _ in range(3)]
    counters, _, after, _ = run(lambda *t: t[0] @ t[3] + t[1] @ t[4] + t[2] @ t[5], (*vs, *bs), "merge-dots")
    assert "summed products merged" not in counters and after == 3


def test_in_the_cpu_defaults():
    assert "merge-dots" in pipelines.default_train_pipeline("cpu")
    assert "merge-dots" not in pipelines.default_train_pipeline("gpu")


if __name__ == "__main__":
    pytest.main([__file__])


def test_forward_and_input_gradient_read_one_concatenation_of_the_weights():
    x, wq, wk, wv = rand(2, 32, 64), rand(64, 64) / 8, rand(64, 64) / 8, rand(64, 64) / 8

    def loss(x, wq, wk, wv):
        q, k, v = x @ wq, x @ wk, x @ wv
        s = kn.softmax(q @ kn.transpose(k, (0, 2, 1)), axis=-1)
        return ((s @ v) ** 2).sum()

    grad = kn.grad(loss, argnums=(0, 1, 2, 3))
    graph = kn.jit(grad, pipeline="canonicalize,cse,dce").graph(x, wq, wk, wv)
    out = passes.run(graph, "merge-dots,cse,dce", verify_each=True)
    weights = {id(v) for v in out.inputs[1:]}
    concats = [n for n in out.nodes if n.op == "concatenate"]
    # one concatenation of the weights (forward q|k|v and the input gradient's sum over dq wq^T
    # + dk wk^T + dv wv^T agree on the order) and one of dq, dk, dv (weight gradients and sum)
    assert sum(all(id(v) in weights for v in n.inputs) for n in concats) == 1
    assert len(concats) == 2 and all(len(n.inputs) == 3 for n in concats)
    got = kn.jit(grad, pipeline="canonicalize,cse,dce,merge-dots,cse,dce")(x, wq, wk, wv)
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def ref(x, wq, wk, wv):
        q, k, v = x @ wq, x @ wk, x @ wv
        s = jax.nn.softmax(q @ jnp.swapaxes(k, 1, 2), axis=-1)
        return ((s @ v) ** 2).sum()

    with jax.enable_x64(True):
        want = jax.grad(ref, argnums=(0, 1, 2, 3))(*(jnp.asarray(a, jnp.float64) for a in (x, wq, wk, wv)))
    for g, w in zip(got, want, strict=True):  # float32 rounding of sums of terms up to |w|'s largest
        w = np.asarray(w)
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=1e-4, atol=1e-5 * np.abs(w).max())
