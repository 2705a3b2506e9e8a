"""The ``dot-operand-order`` pass: dot_general operands swapped (result transposed back) where
XLA CPU then copies fewer elements into its ``[batch, M, K] x [batch, K, N]`` order.

The swapped product sums the same terms, possibly in another order inside XLA's kernels, so
values are compared with a float64 NumPy product within float32 rounding of the same sum over
absolute values.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import passes
from kaun_ir.passes.dot_operand_order import copied_elements
from kaun_ir.runtime import pipelines
from kaun_ir.surface.tensor import apply

F32 = np.float32


def dot(lb, rb, lc, rc):
    def f(x, y):
        return apply("dot_general", x, y, lhs_batch=lb, rhs_batch=rb, lhs_contracting=lc, rhs_contracting=rc)

    return f


def einsum_ref(x, y, lb, rb, lc, rc):
    """dot_general in float64 by einsum (batch, lhs free, rhs free), and the same over |x|, |y|."""
    letters = iter("abcdefghijklmnop")
    xs, ys = [None] * x.ndim, [None] * y.ndim
    batch = []
    for a, b in zip(lb, rb):
        xs[a] = ys[b] = c = next(letters)
        batch.append(c)
    for a, b in zip(lc, rc):
        xs[a] = ys[b] = next(letters)
    free_x = [xs.__setitem__(i, next(letters)) or xs[i] for i in range(x.ndim) if xs[i] is None]
    free_y = [ys.__setitem__(i, next(letters)) or ys[i] for i in range(y.ndim) if ys[i] is None]
    spec = f"{''.join(xs)},{''.join(ys)}->{''.join(batch + free_x + free_y)}"
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    return np.einsum(spec, x64, y64), np.einsum(spec, np.abs(x64), np.abs(y64))


# (lhs shape, rhs shape, lhs_batch, rhs_batch, lhs_contracting, rhs_contracting, swapped by default)
CASES = {
    # the weight gradient of a linear layer over [B, T, F] activations: x^T dy, x 4x larger
    "weight-gradient": ((4, 6, 64), (4, 6, 8), (), (), (0, 1), (0, 1), True),
    "weight-gradient-2d": ((24, 64), (24, 8), (), (), (0,), (0,), True),
    # batched: the larger operand's contracting axis leads
    "batched": ((3, 20, 16), (3, 20, 4), (0,), (0,), (1,), (1,), True),
    # equal sizes: swapping would only add the result's transpose
    "equal": ((24, 8), (24, 8), (), (), (0,), (0,), False),
    # already in XLA's order
    "canonical": ((5, 7), (7, 3), (), (), (1,), (0,), False),
    # the input gradient x = dy w^T: w is small, the result large
    "input-gradient": ((4, 6, 8), (32, 8), (), (), (2,), (1,), False),
    # size-1 axes do not count as out of order
    "unit-axes": ((1, 24, 32), (24, 1, 8), (), (), (1,), (0,), False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_values_match_float64_and_the_swap_is_where_it_pays(case):
    xs, ys, lb, rb, lc, rc, swapped = CASES[case]
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal(xs).astype(F32), rng.standard_normal(ys).astype(F32)
    f = dot(lb, rb, lc, rc)
    graph = kn.jit(f, pipeline="").graph(x, y)
    for ratio, expect in (("2.0", swapped), ("1.0", None)):
        stats = passes.Statistics()
        pipeline = f"dot-operand-order{{min_ratio={ratio}}}"
        out = passes.run(graph, pipeline, instrumentations=[stats], verify_each=True)
        count = stats.records[0].counters.get("dot products swapped", 0)
        if expect is not None:
            assert count == int(expect)
        want, scale = einsum_ref(x, y, lb, rb, lc, rc)
        got = np.asarray(kn.jit(f, pipeline=pipeline)(x, y), np.float64)
        assert got.shape == want.shape
        assert np.all(np.abs(got - want) <= 1e-6 * scale + 1e-30)
        if count:
            assert out.op_counts().get("transpose", 0) <= 1


def test_cost_model_counts_what_xla_copies():
    x, y = np.zeros((4, 6, 32), F32), np.zeros((4, 6, 8), F32)
    graph = kn.jit(dot((), (), (0, 1), (0, 1)), pipeline="").graph(x, y)
    (node,) = [n for n in graph.walk() if n.op == "dot_general"]
    lhs, rhs = node.inputs
    assert copied_elements(lhs, rhs, node.attr_dict) == 4 * 6 * 32  # x transposed, dy in order
    swapped = dict(
        node.attr_dict,
        lhs_contracting=node.attr("rhs_contracting"),
        rhs_contracting=node.attr("lhs_contracting"),
    )
    assert copied_elements(rhs, lhs, swapped) == 4 * 6 * 8  # dy transposed, x in order


def test_gradients_of_a_gelu_layer_match_and_the_weight_gradient_is_swapped():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 32, 16)).astype(F32)
    w1 = (rng.standard_normal((16, 64)) / 4).astype(F32)
    w2 = (rng.standard_normal((64, 16)) / 8).astype(F32)

    def loss(w1, w2, x):
        return (kn.fn.gelu(x @ w1) @ w2).sum()

    grad = kn.grad(loss, argnums=(0, 1))
    graph = kn.jit(grad, pipeline="canonicalize,cse,dce").graph(w1, w2, x)
    stats = passes.Statistics()
    passes.run(graph, "dot-operand-order", instrumentations=[stats], verify_each=True)
    assert stats.records[0].counters["dot products swapped"] == 1  # w2's gradient: gelu(x w1)^T dy
    plain = kn.jit(grad, pipeline="canonicalize,cse,dce")(w1, w2, x)
    swapped = kn.jit(grad, pipeline="canonicalize,cse,dce,dot-operand-order,cse,dce")(w1, w2, x)
    for a, b in zip(plain, swapped):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_bad_option_and_the_cpu_defaults():
    graph = kn.jit(dot((), (), (0,), (0,)), pipeline="").graph(np.zeros((3, 2), F32), np.zeros((3, 4), F32))
    with pytest.raises(ValueError, match="min_ratio"):
        passes.run(graph, "dot-operand-order{min_ratio=0.5}")
    assert "dot-operand-order" in pipelines.default_train_pipeline("cpu")
    assert "dot-operand-order" in pipelines.default_jit_pipeline("cpu")
    assert "dot-operand-order" not in pipelines.default_train_pipeline("gpu")


def test_equal_costs_do_not_swap_back_and_forth():
    # both orders copy 72 elements and the result (one free axis) needs no transpose back
    x, y = np.ones((3, 4), F32), np.ones((3, 4, 5), F32)
    graph = kn.jit(dot((), (), (1, 0), (1, 0)), pipeline="").graph(x, y)
    stats = passes.Statistics()
    passes.run(graph, "dot-operand-order{min_ratio=1.0}", instrumentations=[stats], verify_each=True)
    assert "dot products swapped" not in stats.records[0].counters


def _materialised(graph, pipeline):
    stats = passes.Statistics()
    out = passes.run(graph, pipeline, instrumentations=[stats], verify_each=True)
    return out, stats.records[0].counters.get("operands materialised", 0)


def test_a_sum_read_out_of_order_is_materialised_exactly_for_all_its_uses():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((4, 32, 16)).astype(F32), rng.standard_normal((4, 32, 16)).astype(F32)
    a[0, 0, :3] = (0.0, -0.0, 1e-30)
    g = rng.standard_normal((4, 32, 48)).astype(F32)

    def f(a, b, g):
        s = a + b  # read transposed by the weight-gradient-like product, and returned as it is
        return dot((), (), (0, 1), (0, 1))(s, g), s

    graph = kn.jit(f, pipeline="").graph(a, b, g)
    out, made = _materialised(graph, "dot-operand-order{merge_contracting=none min_ratio=100.0 min_rows=1}")
    assert made == 1 and out.op_counts()["dot_general"] == 2
    assert all(v.node.op == "dot_general" for v in out.outputs)  # both uses read the product
    _, none = _materialised(
        graph, "dot-operand-order{merge_contracting=none min_ratio=100.0 materialize=false min_rows=1}"
    )
    assert none == 0
    product, s = kn.jit(f, pipeline="dot-operand-order{merge_contracting=none min_ratio=100.0 min_rows=1}")(
        a, b, g
    )
    want = a + b  # float32 addition: the identity product must reproduce it bit for bit
    np.testing.assert_array_equal(np.abs(np.asarray(s)), np.abs(want))
    ss, gg = want.astype(np.float64), g.astype(np.float64)
    ref = np.einsum("btk,btn->kn", ss, gg)
    assert np.all(np.abs(np.asarray(product) - ref) <= 1e-5 * np.einsum("btk,btn->kn", abs(ss), abs(gg)))


def test_no_materialisation_when_the_identity_product_would_cost_too_much():
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((64, 32)).astype(F32), rng.standard_normal((64, 32)).astype(F32)
    g = rng.standard_normal((64, 8)).astype(F32)  # the product: 32 * 8 * 64; the identity: 64 * 32 * 32

    def f(a, b, g):
        return dot((), (), (0,), (0,))(a * b, g)

    graph = kn.jit(f, pipeline="").graph(a, b, g)
    _, made = _materialised(graph, "dot-operand-order{merge_contracting=none min_ratio=100.0 min_rows=1}")
    assert made == 0
    # an operand already in order (the input gradient's dy @ w^T) is left alone as well
    h = rng.standard_normal((32, 48)).astype(F32)
    graph = kn.jit(lambda a, b, h: (a + b) @ h, pipeline="").graph(a, b, h)
    assert _materialised(graph, "dot-operand-order{merge_contracting=none min_rows=1}")[1] == 0


def test_no_identity_constant_over_the_size_bound(monkeypatch):
    """The identity matrix is a literal of the program: a value with a wider last axis than the
    bound allows is left as it is."""
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((4, 32, 16)).astype(F32), rng.standard_normal((4, 32, 16)).astype(F32)
    g = rng.standard_normal((4, 32, 48)).astype(F32)
    graph = kn.jit(lambda a, b, g: dot((), (), (0, 1), (0, 1))(a + b, g), pipeline="").graph(a, b, g)
    pipeline = "dot-operand-order{merge_contracting=none min_ratio=100.0 min_rows=1}"
    assert _materialised(graph, pipeline)[1] == 1
    module = importlib.import_module("kaun_ir.passes.dot_operand_order")
    monkeypatch.setattr(module, "MAX_IDENTITY_ELEMENTS", 16 * 16 - 1)
    out, made = _materialised(graph, pipeline)
    assert made == 0 and not any(n.op == "constant" for n in out.nodes)


def test_a_residual_stack_trains_like_jax_with_materialised_gradients():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 16, 32))
    ws = [rng.standard_normal(shape) / 8 for _ in range(3) for shape in ((32, 96), (96, 32))]

    def loss(ws, x, np_):
        h = x
        for w1, w2 in zip(ws[::2], ws[1::2]):  # residual blocks: h's gradient sums every later one
            h = h + np_.tanh(h @ w1) @ w2
        return (h * h).sum()

    n = len(ws)
    grad = kn.grad(lambda *a: loss(a[:n], a[n], kn), argnums=tuple(range(n)))
    args = [w.astype(F32) for w in ws] + [x.astype(F32)]
    got = kn.jit(grad, pipeline="canonicalize,cse,dce,dot-operand-order{merge_contracting=none min_rows=64}")
    graph = kn.jit(grad, pipeline="canonicalize,cse,dce").graph(*args)
    assert _materialised(graph, "dot-operand-order{merge_contracting=none min_rows=64}")[1] >= 2
    # a strided walk over 64 rows stays in cache: at the default (512) nothing is materialised
    assert _materialised(graph, "dot-operand-order")[1] == 0
    with jax.enable_x64(True):
        want = jax.grad(lambda ws: loss(ws, jnp.asarray(x), jnp))([jnp.asarray(w) for w in ws])
    for g, w in zip(got(*args), want, strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w), rtol=2e-4, atol=2e-3)


@pytest.mark.parametrize("merge", ["swapped", "all"])
def test_weight_gradient_products_over_merged_contracting_axes(merge):
    rng = np.random.default_rng(8)
    x, y = rng.standard_normal((4, 6, 64)).astype(F32), rng.standard_normal((4, 6, 8)).astype(F32)
    small = rng.standard_normal((4, 6, 16)).astype(F32)  # x smaller than y: not swapped
    for lhs, rhs, merged in (
        (x, y, 1),
        (small, rng.standard_normal((4, 6, 32)).astype(F32), int(merge == "all")),
    ):
        f = dot((), (), (0, 1), (0, 1))
        graph = kn.jit(f, pipeline="").graph(lhs, rhs)
        pipeline = f"dot-operand-order{{merge_contracting={merge}}}"
        stats = passes.Statistics()
        out = passes.run(graph, pipeline, instrumentations=[stats], verify_each=True)
        assert stats.records[0].counters.get("contracting axes merged", 0) == merged
        if merged:  # every product left contracts one axis
            assert all(len(n.attr("lhs_contracting")) == 1 for n in out.walk() if n.op == "dot_general")
        want, scale = einsum_ref(lhs, rhs, (), (), (0, 1), (0, 1))
        got = np.asarray(kn.jit(f, pipeline=pipeline)(lhs, rhs), np.float64)
        assert got.shape == want.shape
        assert np.all(np.abs(got - want) <= 1e-6 * scale + 1e-30)
    # batch axes, or contracting axes that are not the leading ones, are left as they were
    for xs, ys, lb, rb, lc, rc in (
        ((3, 20, 16), (3, 20, 4), (0,), (0,), (1,), (1,)),
        (
            (6, 4, 64),
            (6, 4, 8),
            (),
            (),
            (1, 0),
            (1, 0),
        ),
    ):
        graph = kn.jit(dot(lb, rb, lc, rc), pipeline="").graph(np.zeros(xs, F32), np.zeros(ys, F32))
        stats = passes.Statistics()
        passes.run(graph, f"dot-operand-order{{merge_contracting={merge}}}", instrumentations=[stats])
        assert "contracting axes merged" not in stats.records[0].counters


def test_merged_weight_gradients_of_a_gelu_mlp_match_jax_in_float64():
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 32, 16))
    w1, w2 = rng.standard_normal((16, 64)) / 4, rng.standard_normal((64, 16)) / 8

    def loss(w1, w2, x, fn):
        return (fn(x @ w1) @ w2).sum()

    grad = kn.grad(lambda w1, w2, x: loss(w1, w2, x, kn.fn.gelu), argnums=(0, 1))
    args = [a.astype(F32) for a in (w1, w2, x)]
    graph = kn.jit(grad, pipeline="canonicalize,cse,dce").graph(*args)
    stats = passes.Statistics()
    passes.run(graph, "dot-operand-order{merge_contracting=all}", instrumentations=[stats], verify_each=True)
    assert stats.records[0].counters["contracting axes merged"] == 2  # both weight gradients
    got = kn.jit(grad, pipeline="canonicalize,cse,dce,dot-operand-order{merge_contracting=all},cse,dce")(
        *args
    )
    with jax.enable_x64(True):
        gelu = lambda v: jax.nn.gelu(v, approximate=False)  # noqa: E731
        want = jax.grad(loss, argnums=(0, 1))(w1, w2, jax.numpy.asarray(x), gelu)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w), rtol=1e-4, atol=1e-4)


def test_bad_merge_contracting_option():
    graph = kn.jit(dot((), (), (0,), (0,)), pipeline="").graph(np.zeros((3, 2), F32), np.zeros((3, 4), F32))
    with pytest.raises(kn.errors.PassOptionError, match="merge_contracting"):
        passes.run(graph, "dot-operand-order{merge_contracting=some}")
