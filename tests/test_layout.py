"""The ``layout`` pass (passes/layout.py): transpose absorption, sinking, and NCHW/NHWC assignment.

Every rewrite is a permutation of elements, so the NumPy reference interpreter must give
bit-identical results before and after, on the conv net forward and gradient graphs and on
random transpose-heavy graphs. Measured on XLA CPU (see ``AUTO_LAYOUT`` in passes/layout.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from passutil import same_snapshot, snapshot

import kaun_ir as kn
from kaun_ir import tree as kn_tree
from kaun_ir.ir import Builder, TensorType, interpret
from kaun_ir.passes import layout as layout_pass
from kaun_ir.surface.tensor import Tensor, apply


def transposes(graph) -> int:
    return graph.op_counts().get("transpose", 0)


def run(graph, pipeline):
    before = snapshot(graph)
    out = kn.passes.run(graph, pipeline, verify_each=True)
    assert same_snapshot(graph, before), "the pass modified its input"
    kn.ir.parse(out.text())  # round-trips through the textual IR
    return out


def assert_same(graph, out, args):
    for i, (want, got) in enumerate(zip(interpret(graph, *args), interpret(out, *args))):
        assert want.shape == got.shape and np.array_equal(want, got, equal_nan=True), f"output {i}"


def build(types, body):
    with Builder(record_source=False) as b:
        args = [Tensor(b.add_input(t), b) for t in types]
        outs = body(*args)
        return b.finish([o.value for o in outs], "g")


F32 = np.dtype(np.float32)


def t(shape):
    return TensorType(F32, shape)


# ----------------------------------------------------------------------------- the conv net


def cnn(params, x):
    h = kn.fn.conv2d(x, params["c1"]["w"], params["c1"]["b"], padding=1)
    h = kn.fn.max_pool2d(kn.maximum(h, 0.0), 2)
    h = kn.fn.conv2d(h, params["c2"]["w"], params["c2"]["b"], padding=1)
    h = kn.fn.max_pool2d(kn.maximum(h, 0.0), 2)
    h = h.reshape(h.shape[0], -1)
    return h @ params["fc"]["w"] + params["fc"]["b"]


def loss(params, x):
    return kn.mean(cnn(params, x) ** 2)


@pytest.fixture(scope="module")
def net():
    rng = np.random.default_rng(7)
    params = {
        "c1": {
            "w": rng.standard_normal((4, 1, 3, 3)).astype(np.float32),
            "b": rng.standard_normal(4).astype(np.float32),
        },
        "c2": {
            "w": rng.standard_normal((6, 4, 3, 3)).astype(np.float32) / 3,
            "b": rng.standard_normal(6).astype(np.float32),
        },
        "fc": {
            "w": rng.standard_normal((6 * 2 * 2, 3)).astype(np.float32) / 5,
            "b": rng.standard_normal(3).astype(np.float32),
        },
    }
    x = rng.standard_normal((2, 1, 8, 8)).astype(np.float32)
    return params, x, kn_tree.flatten((params, x))[0]


@pytest.mark.parametrize("prefer", ["none", "nchw", "nhwc"])
@pytest.mark.parametrize("which", ["forward", "gradient"])
def test_cnn_same_outputs_and_gradients(net, prefer, which):
    params, x, args = net
    f = cnn if which == "forward" else kn.grad(loss)
    graph = run(kn.trace(f, params, x), "canonicalize,cse,dce")
    out = run(graph, f"layout{{prefer={prefer}}},cse,dce")
    assert_same(graph, out, args)
    if prefer != "nhwc":
        assert transposes(out) == 0  # the user's layout: nothing to do
    else:
        assert all(
            n.attr("lhs_spec")[1] == 3 or n.attr("lhs_spec")[0] == 3
            for n in out.nodes
            if n.op == "convolution"
        )  # channels last everywhere
    if which == "forward" and prefer == "nhwc":
        # input, two kernels, and back to NCHW before the flatten: only the chain's boundaries
        assert transposes(out) == 4


def test_pool_gradient_runs_in_the_chosen_layout(net):
    """The max-pool's gradient (select_and_scatter_add) takes its 4x smaller source transposed,
    so the full-resolution relu mask, activation and cotangent are never transposed: the only
    activation-sized transposes left are the pooled [N, C, 2, 2] at the flatten and the input."""
    params, x, args = net
    graph = run(kn.trace(kn.grad(loss), params, x), "canonicalize,cse,dce")
    out = run(graph, "layout{prefer=nhwc},cse,dce")
    assert_same(graph, out, args)
    activations = [
        n.outputs[0] for n in out.nodes if n.op == "transpose" and n.outputs[0].shape[0] == x.shape[0]
    ]
    # before: also the [2, 6, 4, 4] relu output, its mask and its cotangent (192 elements each)
    assert max(v.type.size for v in activations) == x.size
    assert sorted(v.type.size for v in activations) == [6 * 2 * 2 * 2, 6 * 2 * 2 * 2, x.size]


def test_sink_and_hoist_do_not_undo_each_other():
    """An elementwise op with one operand that is not transposed stays as it is, and a pool
    gradient over a transposed operand alone is either rewritten once or left: no endless
    sink/hoist exchange, and the values are those of NumPy."""
    rng = np.random.default_rng(3)
    a, b = (
        rng.standard_normal((2, 3, 4)).astype(np.float32),
        rng.standard_normal((2, 3, 4)).astype(np.float32),
    )
    c = rng.standard_normal((2, 4, 3)).astype(np.float32)

    def where(x, y, z):
        return kn.where(kn.transpose(x, (0, 2, 1)) > 0, kn.transpose(y, (0, 2, 1)), z)

    got = kn.jit(where, pipeline="layout{prefer=none}")(a, b, c)
    np.testing.assert_array_equal(
        np.asarray(got), np.where(a.transpose(0, 2, 1) > 0, b.transpose(0, 2, 1), c)
    )

    x = rng.standard_normal((1, 4, 4, 2)).astype(np.float32)
    s = rng.standard_normal((1, 2, 2, 2)).astype(np.float32)

    def pool_grad(x, s):
        return apply(
            "select_and_scatter_add",
            kn.transpose(x, (0, 3, 1, 2)),
            s,
            np.float32(0),
            window_dimensions=(1, 1, 2, 2),
            window_strides=(1, 1, 2, 2),
            padding=((0, 0),) * 4,
        )

    graph = kn.jit(pool_grad, pipeline="").graph(x, s)
    out = run(graph, "layout{prefer=none}")
    assert transposes(out) <= transposes(graph)
    want = np.zeros((1, 2, 4, 4), np.float32)  # each 2x2 window's source at its first maximum
    xt = x.transpose(0, 3, 1, 2)
    for c_, i, j in np.ndindex(2, 2, 2):
        window = xt[0, c_, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2]
        k, m = np.unravel_index(np.argmax(window), (2, 2))
        want[0, c_, 2 * i + k, 2 * j + m] += s[0, c_, i, j]
    np.testing.assert_array_equal(np.asarray(kn.jit(pool_grad, pipeline="layout{prefer=none}")(x, s)), want)


def test_cnn_nhwc_runs_on_xla(net):
    params, x, _ = net
    want = np.asarray(kn.jit(cnn, pipeline="canonicalize,cse,dce")(params, x))
    got = np.asarray(kn.jit(cnn, pipeline="layout{prefer=nhwc},cse,dce")(params, x))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    gw = kn_tree.flatten(kn.jit(kn.grad(loss), pipeline="cse,dce")(params, x))[0]
    gg = kn_tree.flatten(kn.jit(kn.grad(loss), pipeline="layout{prefer=nhwc},cse,dce")(params, x))[0]
    for a, b in zip(gw, gg):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)


def test_auto_tells_training_graphs(net):
    params, x, _ = net
    assert not layout_pass.has_gradient_convolutions(kn.trace(cnn, params, x))
    assert layout_pass.has_gradient_convolutions(kn.trace(kn.grad(loss), params, x))
    fwd = kn.passes.run(kn.trace(cnn, params, x), "layout{target=cpu}")
    grad = kn.passes.run(kn.trace(kn.grad(loss), params, x), "layout{target=cpu}")
    assert transposes(fwd) == 4 and transposes(grad) == 0


def test_statistics(net):
    params, x, _ = net
    graph = kn.trace(cnn, params, x)
    stats = kn.passes.Statistics()
    kn.passes.run(graph, "layout{prefer=nhwc}", instrumentations=[stats])
    counters = stats.records[0].counters
    assert counters["transposes before"] == 0 and counters["transposes after"] == 4
    assert counters["convolutions re-laid out"] == 2


# ----------------------------------------------------------------------------- absorption


def test_dot_absorbs_transposes():
    def body(a, b):
        at = apply("transpose", a, permutation=(1, 0))  # [5,3] -> [3,5]
        bt = apply("transpose", b, permutation=(1, 0))  # [4,5] -> [5,4]
        return [
            apply(
                "dot_general", at, bt, lhs_batch=(), rhs_batch=(), lhs_contracting=(1,), rhs_contracting=(0,)
            )
        ]

    graph = build([t((5, 3)), t((4, 5))], body)
    out = run(graph, "layout{prefer=none},dce")
    assert transposes(out) == 0
    rng = np.random.default_rng(0)
    assert_same(graph, out, [rng.standard_normal((5, 3)), rng.standard_normal((4, 5))])


def test_dot_keeps_transpose_that_would_reorder_result():
    def body(a, b):
        at = apply("transpose", a, permutation=(2, 1, 0))  # [4,3,2] -> [2,3,4]: free axes 0,1 swap
        return [
            apply(
                "dot_general", at, b, lhs_batch=(), rhs_batch=(), lhs_contracting=(2,), rhs_contracting=(0,)
            )
        ]

    graph = build([t((4, 3, 2)), t((4, 5))], body)
    out = run(graph, "layout{prefer=none}")
    assert transposes(out) == 1


def test_convolution_absorbs_transposes():
    def body(x, w):
        xt = apply("transpose", x, permutation=(0, 3, 1, 2))  # NHWC data read as NCHW
        y = apply(
            "convolution",
            xt,
            w,
            window_strides=(1, 1),
            padding=((0, 0), (0, 0)),
            lhs_dilation=(1, 1),
            rhs_dilation=(1, 1),
            lhs_spec=(0, 1, 2, 3),
            rhs_spec=(0, 1, 2, 3),
            out_spec=(0, 1, 2, 3),
        )
        return [apply("transpose", y, permutation=(0, 2, 3, 1))]

    graph = build([t((2, 5, 5, 3)), t((4, 3, 2, 2))], body)
    out = run(graph, "layout{prefer=none},dce")
    assert transposes(out) == 0
    rng = np.random.default_rng(1)
    assert_same(graph, out, [rng.standard_normal((2, 5, 5, 3)), rng.standard_normal((4, 3, 2, 2))])


def test_transposes_meet_through_elementwise():
    def body(a, b):
        p = (2, 0, 1)
        x = apply("exponential", apply("transpose", a, permutation=p))
        y = apply("add", x, apply("transpose", b, permutation=p))
        return [apply("transpose", apply("negate", y), permutation=(1, 2, 0))]

    graph = build([t((2, 3, 4)), t((2, 3, 4))], body)
    out = run(graph, "layout{prefer=none},dce")
    assert transposes(out) == 0
    rng = np.random.default_rng(2)
    assert_same(graph, out, [rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))])


def test_shared_transpose_is_not_duplicated():
    def body(a):
        x = apply("transpose", a, permutation=(1, 0))
        return [apply("exponential", x), apply("reshape", x, shape=(6,))]

    graph = build([t((2, 3))], body)
    out = run(graph, "layout{prefer=none},dce")
    assert transposes(out) == 1


def test_target_auto_asks_the_runtime_for_its_backend(monkeypatch):
    # the runtime installed its answer when it was imported; only the variable is read here
    monkeypatch.setenv("KAUN_IR_BACKEND", "gpu")
    assert layout_pass.resolve("auto", "auto", training=True) == "nhwc"
    monkeypatch.setenv("KAUN_IR_BACKEND", "cpu")
    assert layout_pass.resolve("auto", "auto", training=True) == "nchw"
    assert layout_pass.resolve("nhwc", "auto", training=True) == "nhwc"  # asked only for auto


def test_options():
    assert layout_pass.resolve("auto", "cpu") == "nhwc"  # measured: inference
    assert layout_pass.resolve("auto", "cpu", training=True) == "nchw"  # measured: training
    assert layout_pass.resolve("auto", "gpu") == "nhwc"
    assert layout_pass.resolve("nchw", "gpu") == "nchw"
    graph = build([t((2,))], lambda a: [a])
    # a misspelt choice is an option error when the pipeline is read, not a crash of the pass
    with pytest.raises(
        kn.errors.PassOptionError, match="'prefer' of pass 'layout' must be one of auto, nchw"
    ):
        kn.passes.run(graph, "layout{prefer=nhcw}")


# ----------------------------------------------------------------------------- random graphs


def random_graph(seed: int):
    """A random DAG of transposes, elementwise ops, broadcasts and dots on rank-3 tensors."""
    rng = np.random.default_rng(seed)
    shape = (2, 3, 4)

    def body(a, b, v):
        pool = [a, b]
        for _ in range(12):
            x = pool[rng.integers(len(pool))]
            r = rng.random()
            if r < 0.35:
                perm = tuple(int(i) for i in rng.permutation(3))
                pool.append(apply("transpose", x, permutation=perm))
                continue
            same = [y for y in pool if y.shape == x.shape]
            if r < 0.55:
                pool.append(apply(str(rng.choice(["exponential", "negate", "tanh", "abs"])), x))
            elif r < 0.8:
                pool.append(
                    apply(str(rng.choice(["add", "multiply", "maximum"])), x, same[rng.integers(len(same))])
                )
            elif r < 0.9:
                axis = int(rng.integers(3))
                vb = apply(
                    "broadcast_in_dim",
                    apply("slice", v, start_indices=(0,), limit_indices=(x.shape[axis],), strides=(1,)),
                    shape=x.shape,
                    broadcast_dimensions=(axis,),
                )
                pool.append(apply("subtract", x, vb))
            else:
                other = pool[rng.integers(len(pool))]
                pool.append(
                    apply(
                        "dot_general",
                        x,
                        other,
                        lhs_batch=(0,),
                        rhs_batch=(0,),
                        lhs_contracting=(2,),
                        rhs_contracting=(2,),
                    )
                    if x.shape[0] == other.shape[0] and x.shape[2] == other.shape[2]
                    else apply("negate", x)
                )
        return pool[-3:]

    return build([t(shape), t(shape), t((4,))], body), rng


@pytest.mark.parametrize("seed", range(40))
def test_random_transpose_graphs(seed):
    graph, rng = random_graph(seed)
    graph = run(graph, "canonicalize,dce")
    args = [rng.standard_normal(v.shape).astype(np.float32) for v in graph.inputs]
    out = run(graph, "layout,cse,dce")
    assert_same(graph, out, args)
    assert transposes(out) <= transposes(graph)


def test_deep_batch_norm_chain_converges():
    """A transpose moves about one op per sweep, so a deep network needs more sweeps than a
    fixed bound of 64: ten conv + batch norm + ReLU layers with their gradient (83 sweeps)."""
    rng = np.random.default_rng(3)
    ws = [rng.standard_normal((3, 3, 3, 3)).astype(np.float32) / 4 for _ in range(10)]
    x = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)

    def deep_loss(ws, x):
        h = x
        for w in ws:
            h = kn.fn.conv2d(h, w, None, padding=1)
            h = kn.maximum(kn.fn.batch_norm(h, None, None, *kn.fn.batch_stats(h)), 0.0)
        return kn.mean(h * h)

    graph = run(kn.trace(kn.grad(deep_loss), ws, x), "canonicalize,cse,dce")
    stats = kn.passes.Statistics()
    out = kn.passes.run(graph, "layout{prefer=nhwc}", instrumentations=[stats])
    assert stats.records[0].counters["convolutions re-laid out"] == 29
    assert_same(graph, out, kn_tree.flatten((ws, x))[0])


# ----------------------------------------------------------------------------- flatten before a dense layer


def _jax_loss(params, x):
    """The conv net of ``cnn`` written in JAX (the float64 oracle)."""
    import jax  # noqa: PLC0415 - the oracle only
    import jax.numpy as jnp  # noqa: PLC0415 - the oracle only

    def conv(h, w, b):
        dn = ("NCHW", "OIHW", "NCHW")
        out = jax.lax.conv_general_dilated(h, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=dn)
        return out + b[None, :, None, None]

    def pool(h):
        return jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    h = pool(jnp.maximum(conv(x, params["c1"]["w"], params["c1"]["b"]), 0.0))
    h = pool(jnp.maximum(conv(h, params["c2"]["w"], params["c2"]["b"]), 0.0))
    out = h.reshape(h.shape[0], -1) @ params["fc"]["w"] + params["fc"]["b"]
    return jnp.mean(out**2)


def test_flatten_transpose_moves_onto_the_dense_weight(net):
    """NHWC chains end in a flatten feeding the dense layer: the transpose back to NCHW order
    moves onto the dense weight (forward and the input gradient) and onto the weight's gradient,
    so no activation-sized transpose is left but the input's; float64 values match JAX."""
    import jax  # noqa: PLC0415 - the oracle only

    params, _, _ = net
    params = {k: {n: np.asarray(a, np.float64) for n, a in v.items()} for k, v in params.items()}
    x = np.random.default_rng(11).standard_normal((32, 1, 8, 8))  # activation larger than fc.w
    pipeline = "canonicalize,cse,dce,layout{prefer=nhwc},cse,dce"
    graph = kn.trace(kn.grad(loss), params, x)
    stats = kn.passes.Statistics()
    out = kn.passes.run(graph, pipeline, instrumentations=[stats], verify_each=True)
    fired = [r.counters.get("rewrites applied by dot-absorb-flatten-transpose", 0) for r in stats.records]
    assert sum(fired) == 3  # the forward dot, the weight-gradient dot, the input-gradient transpose
    big = [n for n in out.nodes if n.op == "transpose" and n.outputs[0].shape[0] == x.shape[0]]
    assert [n.outputs[0].shape for n in big] == [(32, 8, 8, 1)]
    got = kn.jit(kn.grad(loss), pipeline=pipeline)(params, x)
    with jax.enable_x64(True):
        want = jax.grad(_jax_loss)(params, x)
    for g, w in zip(kn_tree.flatten(got)[0], kn_tree.flatten(want)[0]):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-10, atol=1e-12)
    fwd = kn.passes.run(kn.trace(cnn, params, x), pipeline)
    assert transposes(fwd) == 4  # input, two kernels, and the dense weight (not the activation)
    off = kn.passes.run(graph, pipeline.replace("nhwc}", "nhwc flatten=false}"))
    kept = [
        n.outputs[0].shape for n in off.nodes if n.op == "transpose" and n.outputs[0].shape[0] == x.shape[0]
    ]
    assert sorted(kept) == [(32, 2, 2, 6), (32, 6, 2, 2), (32, 8, 8, 1)]  # flatten=false: as before


@pytest.mark.parametrize("perm", [(0, 2, 3, 1), (0, 3, 1, 2), (0, 1, 3, 2), (0, 2, 1, 3)])
def test_flatten_rules_against_numpy(perm):
    """The three shapes the rules rewrite, for several permutations, against NumPy float64:
    a dot contracting the flattened axis, one keeping it free, and the mirror image."""
    from kaun_ir.passes.layout_flatten import FLATTEN  # noqa: PLC0415 - phase 2 table
    from kaun_ir.passes.layout_rules import run_to_fixpoint  # noqa: PLC0415 - its driver

    rng = np.random.default_rng(5)
    x = rng.standard_normal((16, 3, 4, 5))
    w = rng.standard_normal((60, 2))
    g = rng.standard_normal((16, 2))
    f64 = np.dtype(np.float64)
    shape = np.transpose(x, perm).shape

    def body(xv, wv, gv):
        flat = apply("transpose", xv, permutation=perm).reshape(16, 60)
        dims = {"lhs_batch": (), "rhs_batch": ()}
        y = apply("dot_general", flat, wv, lhs_contracting=(1,), rhs_contracting=(0,), **dims)
        dw = apply("dot_general", flat, gv, lhs_contracting=(0,), rhs_contracting=(0,), **dims)
        dflat = apply("dot_general", gv, wv, lhs_contracting=(1,), rhs_contracting=(1,), **dims)
        dx = apply("transpose", dflat.reshape(*shape), permutation=tuple(np.argsort(perm)))
        return [y, dw, dx]

    graph = build([TensorType(f64, x.shape), TensorType(f64, w.shape), TensorType(f64, g.shape)], body)
    counts: dict[str, int] = {}
    out = run_to_fixpoint(graph, FLATTEN, counts, "layout")
    assert counts.get("dot-absorb-flatten-transpose") == 3  # y, dw and dx
    assert all(n.outputs[0].type.size < x.size for n in out.nodes if n.op == "transpose")
    flat = np.transpose(x, perm).reshape(16, 60)
    want = [flat @ w, flat.T @ g, np.transpose((g @ w.T).reshape(shape), np.argsort(perm))]
    for got, ref in zip(interpret(out, x, w, g), want):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
