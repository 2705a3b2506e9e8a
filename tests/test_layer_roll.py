"""``layer.sequential(..., roll=...)``: runs of identical blocks become one ``scan`` over their
stacked parameters, with the losses, gradients, state and randomness of the unrolled model.
Oracles: JAX on the same weights (the bench transformer), NumPy, and the unrolled model for
what only kaun_ir defines (its dropout keys). No timing assertions."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

import kaun_ir as kn
from kaun_ir import layer, tree
from kaun_ir.layer import roll as roll_module
from kaun_ir.tools.bench import runners as bench_runners
from kaun_ir.tools.bench import workloads as bench_workloads


def _scans(fn, *args) -> int:
    graph = kn.trace(fn, *args)
    return sum(node.op == "scan" for node in graph.nodes)


def _loss_and_grads(model, vars_, x, y):
    """The loss function over the parameters, its value and its gradient's leaves."""

    def loss(p):
        logits, _ = layer.apply(model, layer.with_params(vars_, p), x)
        return kn.loss.cross_entropy_sparse(logits, y)

    value, grads = kn.value_and_grad(loss)(vars_.params)
    return loss, float(np.asarray(value)), [np.asarray(g) for g in tree.flatten(grads)[0]]


def test_rolled_transformer_matches_jax():
    """Two identical decoder blocks between an embedding and a head: one scan; loss and every
    parameter's gradient (per block, in the user's tree) agree with jax.grad of the reference."""
    setup = bench_workloads.Setup("transformer", small=True, overrides={"layers": 2, "roll": True})
    x, y = setup.batches[0]
    vars_ = layer.with_params(setup.fresh, setup.params)
    model = setup.workload.kaun_model(setup.cfg)
    loss, value, grads = _loss_and_grads(model, vars_, x, y)
    assert _scans(loss, vars_.params) == 1

    def jax_loss(p):
        logits = setup.workload.jax_forward(p, x, setup.cfg)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    want, want_grads = jax.jit(jax.value_and_grad(jax_loss))(setup.params)
    np.testing.assert_allclose(value, float(want), rtol=1e-5)
    want_leaves = tree.flatten(jax.tree_util.tree_map(np.asarray, want_grads))[0]
    assert len(grads) == len(want_leaves)
    for got, expected in zip(grads, want_leaves):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)

    unrolled = setup.workload.kaun_model({**setup.cfg, "roll": False})

    def loss_unrolled(p):
        return layer.apply(unrolled, layer.with_params(vars_, p), x)[0].sum()

    assert _scans(loss_unrolled, vars_.params) == 0


def _dense(act: str, scale: float = 1.0):
    """``act(x @ w + b) * scale``: blocks whose computations differ by activation or constant."""
    fns = {"tanh": np.tanh, "relu": lambda v: np.maximum(v, 0.0)}

    def init_(dt):
        return layer.Vars(
            {"w": kn.init.normal(0.5)(kn.rng.next_key(), (4, 4), dt), "b": kn.zeros((4,), dt)}, [], dt
        )

    def apply_(params, state, x, *, training, ctx):
        h = x @ params["w"] + params["b"]
        h = kn.tanh(h) if act == "tanh" else kn.maximum(h, 0.0)
        return h * scale, state

    def oracle(params, x):
        return fns[act](x @ params["w"] + params["b"]) * scale

    block = layer.Layer(init_, apply_, "dense")
    object.__setattr__(block, "oracle", oracle)
    return block


@pytest.mark.parametrize(
    "kinds, scans",
    [
        ([("tanh", 1.0)] * 3, 1),
        ([("tanh", 1.0), ("tanh", 1.0), ("relu", 1.0), ("tanh", 1.0), ("tanh", 1.0)], 2),
        ([("tanh", 1.0), ("tanh", 2.0), ("tanh", 1.0)], 0),  # a different constant
        ([("tanh", 1.0), ("relu", 1.0)], 0),
    ],
)
def test_only_identical_runs_roll(kinds, scans):
    blocks = [_dense(act, scale) for act, scale in kinds]
    model = layer.sequential(blocks, roll=True)
    with kn.rng.scope(0):
        vars_ = layer.init(model)
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)

    def forward(p):
        return layer.apply(model, layer.with_params(vars_, p), x)[0]

    assert _scans(forward, vars_.params) == scans
    want = x
    for block, p in zip(blocks, vars_.params):
        want = block.oracle({k: np.asarray(v) for k, v in p.items()}, want)
    np.testing.assert_allclose(np.asarray(kn.jit(forward)(vars_.params)), want, rtol=1e-5, atol=1e-6)


def _pair(build, x, training, key=None):
    """(rolled, unrolled) results of ``layer.apply`` and the number of scans each traced."""
    out = []
    with kn.rng.scope(0):
        vars_ = layer.init(build(False), x)
    for roll in (True, False):
        model = build(roll)

        def forward(p, s, key, model=model):
            ctx = {} if key is None else {"rng": key}
            y, v = layer.apply(model, layer.Vars(p, s, vars_.dtype), x, training=training, ctx=ctx)
            return y, v.state

        args = (vars_.params, vars_.state, key)
        out.append((kn.jit(forward)(*args), _scans(forward, *args)))
    return out


def test_dropout_blocks_roll_with_the_unrolled_keys():
    """Block i draws from fold_in(key, i) rolled as unrolled: the same masks, bit for bit."""

    def build(roll):
        return layer.sequential(
            [layer.sequential([layer.linear(6, 6), layer.dropout(0.5)]) for _ in range(3)], roll=roll
        )

    x = np.ones((4, 6), np.float32)
    key = kn.random.key(3)
    (rolled, n_rolled), (unrolled, n_unrolled) = _pair(build, x, True, key)
    assert (n_rolled, n_unrolled) == (1, 0)
    np.testing.assert_array_equal(np.asarray(rolled[0]), np.asarray(unrolled[0]))
    assert (np.asarray(rolled[0]) == 0).any()  # dropout did drop


def test_batch_norm_state_rolls():
    """Each block's running statistics come back in its own place of the state tree."""

    def build(roll):
        blocks = [layer.sequential([layer.linear(5, 5), layer.batch_norm(5), layer.relu()]) for _ in range(4)]
        return layer.sequential(blocks, roll=roll)

    x = np.random.default_rng(2).standard_normal((8, 5)).astype(np.float32)
    (rolled, n_rolled), (unrolled, _) = _pair(build, x, True)
    assert n_rolled == 1
    got, want = tree.flatten(rolled)[0], tree.flatten(unrolled)[0]
    assert len(got) == len(want) == 1 + 4 * 2
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    means = [np.asarray(s[1]["running_mean"]) for s in rolled[1]]
    assert not np.allclose(means[0], means[1])  # per-block statistics, not one shared


def test_roll_option(monkeypatch):
    resolve = roll_module.resolve_roll
    assert (resolve(True), resolve(False), resolve(3), resolve("auto")) == (2, 0, 3, roll_module.MIN_ROLL)
    monkeypatch.delenv(roll_module.ROLL_ENV, raising=False)
    assert resolve(None) == 0  # off unless asked for
    for text, want in (("0", 0), ("1", 2), ("auto", roll_module.MIN_ROLL), ("5", 5)):
        monkeypatch.setenv(roll_module.ROLL_ENV, text)
        assert resolve(None) == want
    for bad in ("sometimes", "-3", "0x10"):  # a mistake is refused, never "roll runs of 2"
        monkeypatch.setenv(roll_module.ROLL_ENV, bad)
        with pytest.raises(ValueError, match="KAUN_IR_ROLL"):
            resolve(None)
    for bad in (1, 0, "yes", 2.5):
        with pytest.raises(ValueError, match="roll must be"):
            layer.sequential([layer.relu()], roll=bad)


def test_canonical_tells_bool_attributes_from_ints():
    assert roll_module._exact(True) != roll_module._exact(1)
    assert roll_module._exact((0.0, False)) != roll_module._exact((-0.0, 0))


def test_mixed_precision_reaches_the_rolled_blocks():
    """The mixed-precision pass casts the products inside the scan body as it does unrolled."""
    model = layer.sequential([layer.linear(4, 4) for _ in range(3)], roll=True)
    with kn.rng.scope(0):
        vars_ = layer.init(model)
    x = np.ones((2, 4), np.float32)
    graph = kn.trace(lambda p: layer.apply(model, layer.with_params(vars_, p), x)[0], vars_.params)
    out = kn.passes.run(graph, "mixed-precision{compute=bfloat16}")
    (scan,) = [n for n in out.nodes if n.op == "scan"]
    (dot,) = [n for n in scan.regions[0].nodes if n.op == "dot_general"]
    assert [v.type.dtype for v in dot.inputs] == [kn.bfloat16, kn.bfloat16]
    assert dot.types[0].dtype == kn.float32


def test_bench_compile_has_a_rolled_row_per_depth():
    from kaun_ir.tools.bench import compile as bench_compile

    plan = bench_compile.cases(["mlp", "transformer"], (2, 24), small=True)
    assert [label for label, _, _ in plan] == [
        "mlp",
        "transformer",
        "transformer-2",
        "transformer-2 rolled",
        "transformer-24",
        "transformer-24 rolled",
    ]
    assert [overrides.get("roll") for _, _, overrides in plan] == [None, None, False, True, False, True]


def test_canonical_form_tells_signed_zeros_apart():
    """Float attributes compare by their bits (0.0 == -0.0 in Python); constants already do."""
    from kaun_ir.ir.core import Graph, Node, TensorType

    t = TensorType(np.float32, (3,))

    def graph(low):
        args = Graph.arguments([t])
        node = Node("clamp_below", args, {"low": low}, [t])
        return Graph(args, list(node.outputs), [node], "g")

    assert roll_module.canonical(graph(0.0)) == roll_module.canonical(graph(0.0))
    assert roll_module.canonical(graph(0.0)) != roll_module.canonical(graph(-0.0))

    def clipped(low):
        return kn.trace(lambda x: kn.clip(x, low, 1.0), np.ones(3, np.float32))

    assert roll_module.canonical(clipped(0.0)) != roll_module.canonical(clipped(-0.0))


def test_bench_roll_variant_rolls_the_transformer():
    """``--variant roll`` trains the workload's model built with roll=True (its numbers are
    test_rolled_transformer_matches_jax's); the plain row stays unrolled."""
    setup = bench_workloads.Setup("transformer", small=True)
    x, _ = setup.batches[0]
    for name, scans in (("kaun_ir", 0), ("kaun_ir[roll]", 1)):
        model = bench_runners.make_runner(name, setup).trainer.model

        def forward(p, model=model):
            return layer.apply(model, layer.with_params(setup.fresh, p), x)[0]

        assert _scans(forward, setup.params) == scans


def test_summary_shows_every_block_of_a_rolled_model():
    def build(roll):
        return layer.sequential([layer.linear(6, 6) for _ in range(3)], roll=roll)

    x = np.ones((2, 6), np.float32)
    rolled, unrolled = (layer.summary(build(r), x, print_fn=None) for r in (True, False))
    assert rolled == unrolled
    assert [row["path"] for row in rolled] == ["0.linear", "1.linear", "2.linear", "total"]


def test_vmap_and_second_order_through_a_rolled_run():
    """kn.vmap over a rolled model and the gradient of a gradient agree with the unrolled model."""

    def build(roll):
        return layer.sequential(
            [layer.sequential([layer.linear(4, 4), layer.tanh()]) for _ in range(3)], roll=roll
        )

    with kn.rng.scope(0):
        vars_ = layer.init(build(False))
    x = np.random.default_rng(0).standard_normal((5, 2, 4)).astype(np.float32)
    results = []
    for roll in (True, False):
        model = build(roll)

        def loss(p, model=model):
            return kn.sum(layer.apply(model, layer.with_params(vars_, p), x[0])[0] ** 2)

        def curvature(p, loss=loss):
            return kn.sum(kn.ptree.leaves(kn.grad(loss)(p))[0] ** 2)

        batched = kn.vmap(lambda xi, model=model: layer.apply(model, vars_, xi)[0])(x)
        results.append(
            [np.asarray(batched)] + [np.asarray(g) for g in kn.ptree.leaves(kn.grad(curvature)(vars_.params))]
        )
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
