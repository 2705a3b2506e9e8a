"""kn.optim against optax (the oracle): parameter trajectories over 20 steps, driven by the same
data from the same initial parameters. Our side runs one ``kn.jit`` of a whole training step
(``kn.value_and_grad`` + ``optim.update``); optax's side ``jax.jit`` + ``jax.value_and_grad``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import kaun_ir as kn
import kaun_ir.optim as optim
from kaun_ir.errors import ShapeError
from kaun_ir.optim import schedule

STEPS = 20
RNG = np.random.default_rng(0)
X = RNG.standard_normal((16, 4)).astype(np.float32)
Y = RNG.standard_normal((16, 2)).astype(np.float32)


@pytest.fixture(autouse=True)
def _jax_default_precision():
    """The oracle is jax in its default 32-bit mode (another test module turns x64 on globally)."""
    with jax.enable_x64(False):
        yield


def make_params():
    """A dict holding a nested list (and a scalar leaf): the tree both sides optimise."""
    rng = np.random.default_rng(1)
    return {
        "layers": [
            {"w": (0.5 * rng.standard_normal((4, 5))).astype(np.float32), "b": np.zeros(5, np.float32)},
            [(0.5 * rng.standard_normal((5, 2))).astype(np.float32)],
        ],
        "scale": np.asarray(1.2, np.float32),
    }


def model_loss(xp, params, x, y):
    """The same regression loss written once for ``kn`` and once for ``jax.numpy``."""
    first, (w2,) = params["layers"]
    hidden = xp.tanh(x @ first["w"] + first["b"])
    out = (hidden @ w2) * params["scale"]
    return xp.mean((out - y) ** 2)


def kn_trajectory(alg, steps=STEPS):
    @kn.jit
    def train_step(params, state, x, y):
        loss, grads = kn.value_and_grad(lambda p: model_loss(kn, p, x, y))(params)
        params, state = optim.update(alg, state, params, grads)
        return loss, params, state

    params, state = make_params(), optim.init(alg, make_params())
    history = []
    for _ in range(steps):
        _, params, state = train_step(params, state, X, Y)
        history.append([np.asarray(leaf) for leaf in kn.ptree.leaves(params)])
    return history, state, train_step


def optax_trajectory(tx, steps=STEPS):
    @jax.jit
    def train_step(params, state, x, y):
        loss, grads = jax.value_and_grad(lambda p: model_loss(jnp, p, x, y))(params)
        updates, state = tx.update(grads, state, params)
        return loss, optax.apply_updates(params, updates), state

    params = jax.tree.map(jnp.asarray, make_params())
    state = tx.init(params)
    history = []
    for _ in range(steps):
        _, params, state = train_step(params, state, X, Y)
        history.append([np.asarray(leaf) for leaf in kn.ptree.leaves(params)])
    return history


def assert_same_trajectory(ours, theirs, rtol=2e-5, atol=2e-6):
    assert len(ours) == len(theirs)
    for step, (a, b) in enumerate(zip(ours, theirs), start=1):
        for leaf_a, leaf_b in zip(a, b):
            np.testing.assert_allclose(leaf_a, leaf_b, rtol=rtol, atol=atol, err_msg=f"step {step}")
    # the parameters did move (a test that could not fail otherwise)
    assert not np.allclose(ours[-1][0], make_params()["layers"][0]["b"])


def _shifted(ours):
    """optax evaluates a schedule at the 0-based count, kaun_ir at the 1-based step."""
    return lambda count: ours(count + 1)


CASES = {
    "sgd": (lambda: optim.sgd(0.1), lambda: optax.sgd(0.1)),
    "sgd_momentum": (lambda: optim.sgd(0.05, momentum=0.9), lambda: optax.sgd(0.05, momentum=0.9)),
    "sgd_nesterov": (
        lambda: optim.sgd(0.05, momentum=0.9, nesterov=True),
        lambda: optax.sgd(0.05, momentum=0.9, nesterov=True),
    ),
    "adam": (lambda: optim.adam(0.02), lambda: optax.adam(0.02)),
    "adam_betas": (
        lambda: optim.adam(0.01, b1=0.8, b2=0.99, eps=1e-6),
        lambda: optax.adam(0.01, b1=0.8, b2=0.99, eps=1e-6),
    ),
    "adamw": (lambda: optim.adamw(0.02, weight_decay=0.1), lambda: optax.adamw(0.02, weight_decay=0.1)),
    "rmsprop": (lambda: optim.rmsprop(0.005), lambda: optax.rmsprop(0.005)),
    "rmsprop_momentum": (
        lambda: optim.rmsprop(0.002, decay=0.95, momentum=0.9),
        lambda: optax.rmsprop(0.002, decay=0.95, momentum=0.9),
    ),
    "adagrad": (
        lambda: optim.adagrad(0.1),
        lambda: optax.adagrad(0.1, initial_accumulator_value=0.1, eps=1e-8),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_trajectory_matches_optax(name):
    ours, theirs = CASES[name]
    history, state, _ = kn_trajectory(ours())
    assert_same_trajectory(history, optax_trajectory(theirs()))
    count, trees = optim.state_to_trees(state)
    assert int(count) == STEPS and count.dtype == np.int32
    assert len(trees) == len(ours().slots)


SCHEDULED = {  # (our optimiser, optax's, our schedule, optax's same schedule)
    "adam_warmup_cosine": (
        optim.adam,
        optax.adam,
        schedule.warmup_cosine(0.0, 0.05, warmup_steps=5, decay_steps=STEPS, end_value=0.005),
        optax.warmup_cosine_decay_schedule(0.0, 0.05, warmup_steps=5, decay_steps=STEPS, end_value=0.005),
    ),
    "sgd_momentum_exponential": (
        lambda s: optim.sgd(s, momentum=0.9),
        lambda s: optax.sgd(s, momentum=0.9),
        schedule.exponential_decay(0.05, 0.5, decay_steps=4),
        optax.exponential_decay(0.05, transition_steps=4, decay_rate=0.5),
    ),
    "rmsprop_momentum_linear": (
        lambda s: optim.rmsprop(s, momentum=0.5),
        lambda s: optax.rmsprop(s, momentum=0.5),
        schedule.linear(0.01, 0.001, steps=15),
        optax.linear_schedule(0.01, 0.001, 15),
    ),
    "adamw_piecewise": (
        optim.adamw,
        lambda s: optax.adamw(s, weight_decay=0.01),
        schedule.piecewise_constant([4, 12], [0.02, 0.01, 0.005]),
        optax.piecewise_constant_schedule(0.02, {4: 0.5, 12: 0.5}),
    ),
}


@pytest.mark.parametrize("name", list(SCHEDULED))
def test_scheduled_trajectory_matches_optax_and_never_retraces(name):
    ours, theirs, our_schedule, their_schedule = SCHEDULED[name]
    history, _, jitted = kn_trajectory(ours(our_schedule))
    assert jitted.trace_count == 1  # the schedule was evaluated on the traced step count
    assert_same_trajectory(history, optax_trajectory(theirs(_shifted(their_schedule))))


def test_schedule_sees_one_based_steps():
    seen = []

    def record(step):
        seen.append(step)
        return kn.astype(step, kn.float32) * 0.0 + 0.1

    alg = optim.sgd(record)
    history, _, jitted = kn_trajectory(alg, steps=3)
    assert jitted.trace_count == 1 and len(seen) == 1  # traced once, a symbolic step
    # lr(t) = 0.1 * t where t is the 1-based step: compare with plain sgd by hand
    alg = optim.sgd(lambda step: kn.astype(step, kn.float32) * 0.1)
    params = make_params()
    grads = jax.grad(lambda p: model_loss(jnp, p, X, Y))(params)
    state = optim.init(alg, params)
    for expected_step in (1, 2):
        updates, state = optim.step(alg, state, params, grads)
        expected = -0.1 * expected_step * np.asarray(grads["scale"])
        np.testing.assert_allclose(np.asarray(updates["scale"]), expected, rtol=1e-6)


def test_eager_update_matches_compiled_and_step_plus_apply():
    alg = optim.adam(0.02)
    params = make_params()
    grads = jax.grad(lambda p: model_loss(jnp, p, X, Y))(jax.tree.map(jnp.asarray, params))
    state = optim.init(alg, params)
    new_params, new_state = optim.update(alg, state, params, grads)
    assert isinstance(new_state, optim.State) and int(new_state.count) == 1
    updates, stepped = optim.step(alg, state, params, grads)
    applied = optim.apply_updates(params, updates)
    jitted = kn.jit(optim.update)(alg, state, params, grads)  # kn.jit of the function itself
    for a, b, c in zip(kn.ptree.leaves(new_params), kn.ptree.leaves(applied), kn.ptree.leaves(jitted[0])):
        # separately compiled graphs may fuse differently: equal up to rounding
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-6, atol=1e-9)
    # a plain (count, trees) tuple, as it comes out of kn.jit, is accepted as a state
    again, _ = optim.update(alg, tuple(jitted[1]), new_params, grads)
    assert kn.ptree.structure_equal(again, params)
    tx = optax.adam(0.02)
    reference = optax.apply_updates(params, tx.update(grads, tx.init(params), params)[0])
    for a, b in zip(kn.ptree.leaves(new_params), jax.tree.leaves(reference)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_per_step_scalars_are_hoisted():
    """Adam's bias corrections are two scalar powers per step, whatever the number of leaves."""
    alg = optim.adam(schedule.cosine_decay(0.01, 100))
    params = {"a": np.ones((3,), np.float32), "b": [np.ones((2, 2), np.float32)] * 4}
    state = optim.init(alg, params)
    graph = kn.trace(lambda s, p, g: optim.update(alg, s, p, g), state, params, params)
    ops = [node.op for node in graph.nodes]
    assert ops.count("power") == 2
    assert ops.count("cosine") == 1  # the schedule, once
    assert ops.count("sqrt") == 5  # one per leaf


def test_low_precision_params_keep_their_dtype():
    alg = optim.adam(schedule.constant(1e-2))
    params = {"h": np.ones((3,), np.float16), "b": np.ones((2,), kn.bfloat16), "f": np.ones((2,), np.float32)}
    grads = {
        "h": np.full((3,), 0.5, np.float16),
        "b": np.full((2,), 0.5, kn.bfloat16),
        "f": np.full((2,), 0.5, np.float32),
    }
    state = optim.init(alg, params)
    new_params, state = optim.update(alg, state, params, grads)
    for key in params:
        assert new_params[key].dtype == params[key].dtype
        # the moments of float16 / bfloat16 parameters are float32 (optim.slot_dtype)
        assert state.trees[0][key].dtype == np.float32
        np.testing.assert_allclose(np.asarray(new_params[key], np.float32), 1 - 1e-2, rtol=1e-2)


def test_global_norm_and_clipping_match_optax():
    grads = {
        "a": RNG.standard_normal((3, 4)).astype(np.float32),
        "b": [RNG.standard_normal(5).astype(np.float32)],
    }
    np.testing.assert_allclose(
        np.asarray(optim.global_norm(grads)), np.asarray(optax.tree.norm(grads)), rtol=1e-6
    )
    norm = float(optax.tree.norm(grads))
    for max_norm in (0.5 * norm, 2.0 * norm):
        ours = optim.clip_by_global_norm(max_norm, grads)
        theirs, _ = optax.clip_by_global_norm(max_norm).update(grads, None)
        for a, b in zip(kn.ptree.leaves(ours), jax.tree.leaves(theirs)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    clipped = optim.clip_by_global_norm(0.5 * norm, grads)
    np.testing.assert_allclose(np.asarray(optim.global_norm(clipped)), 0.5 * norm, rtol=1e-5)
    # inside a trace, with a traced max_norm
    traced = kn.jit(lambda m, g: optim.clip_by_global_norm(m, g))(np.float32(0.5 * norm), grads)
    for a, b in zip(kn.ptree.leaves(traced), kn.ptree.leaves(clipped)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
    zeros = {"a": np.zeros((2,), np.float32)}
    np.testing.assert_array_equal(np.asarray(optim.clip_by_global_norm(1.0, zeros)["a"]), 0.0)


def test_state_round_trip_through_checkpoint(tmp_path):
    alg = optim.rmsprop(0.01, momentum=0.9)
    params = make_params()
    grads = jax.grad(lambda p: model_loss(jnp, p, X, Y))(params)
    state = optim.init(alg, params)
    params, state = optim.update(alg, state, params, grads)
    count, trees = optim.state_to_trees(state)
    path = kn.checkpoint.save(tmp_path / "opt.safetensors", {"count": count, "trees": list(trees)})
    loaded = kn.checkpoint.load(path, like={"count": count, "trees": list(trees)})
    restored = optim.state_of_trees(alg, loaded["count"], loaded["trees"])
    assert int(restored.count) == 1 and restored.count.dtype == np.int32
    a, sa = optim.update(alg, state, params, grads)
    b, sb = optim.update(alg, restored, params, grads)
    for x, y in zip(kn.ptree.leaves((a, sa)), kn.ptree.leaves((b, sb))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert int(optim.state_of_trees(alg, 7, trees).count) == 7


def test_errors():
    params = {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    alg = optim.adam(0.1)
    state = optim.init(alg, params)
    with pytest.raises(ValueError, match="gradients do not match.*'b'"):
        optim.update(alg, state, params, {"w": params["w"], "c": params["b"]})
    with pytest.raises(ShapeError, match="'w'.*\\[3,2\\]"):
        optim.update(alg, state, params, {"w": np.ones((3, 2), np.float32), "b": params["b"]})
    with pytest.raises(ValueError, match="keeps 2 trees"):
        optim.state_of_trees(alg, 0, (params,))
    with pytest.raises(ValueError, match="sgd keeps 0 trees"):
        optim.update(optim.sgd(0.1), state, params, params)
    with pytest.raises(TypeError, match="optim.Algorithm"):
        optim.init("adam", params)
    with pytest.raises(ValueError, match="nesterov"):
        optim.sgd(0.1, nesterov=True)
    with pytest.raises(ValueError, match="b1"):
        optim.adam(0.1, b1=1.0)
    with pytest.raises(ValueError, match="lr"):
        optim.sgd(-0.1)
    with pytest.raises(TypeError, match="lr"):
        optim.adam("fast")
    with pytest.raises(ValueError, match="max_norm"):
        optim.clip_by_global_norm(0.0, params)
    trees = state[1]
    with pytest.raises(TypeError, match=r"count must be an integer scalar, got f32\[\]"):
        optim.step(alg, (np.float32(1.0), trees), params, params)


def test_algorithm_record():
    alg = optim.adamw(schedule.cosine_decay(1e-3, 10), weight_decay=0.05)
    assert alg.name == "adamw" and alg.slots == ("mu", "nu")
    assert alg.hyperparams["weight_decay"] == 0.05
    assert "adamw(" in repr(alg) and "cosine_decay" in repr(alg)
    assert hash(alg) == hash(alg) and alg == alg
    assert optim.sgd(0.1).slots == () and optim.sgd(0.1, momentum=0.5).slots == ("trace",)
    assert optim.adagrad(0.1).slots == ("sum_of_squares",)
    state = optim.init(optim.adagrad(0.1), {"w": np.ones(2, np.float32)})
    np.testing.assert_allclose(np.asarray(state.trees[0]["w"]), 0.1)


@pytest.mark.parametrize("value", [0.0, -0.0, 0.25])
def test_init_fills_slots_with_the_exact_value(value):
    """A fresh state's slots hold the fill value bit for bit (a +0.0 fill takes the zeroed-pages
    path, -0.0 must keep its sign), in the parameters' shapes and dtypes."""
    params = {"w": np.ones((3, 4), np.float32), "b": np.ones((5,), np.float64)}
    state = optim.init(optim.adagrad(0.1, initial_accumulator_value=value), params)
    for name, leaf in params.items():
        got = np.asarray(state.trees[0][name])
        want = np.full(leaf.shape, value, leaf.dtype)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()
    moments = optim.init(optim.adam(1e-3), params).trees
    for tree_ in moments:
        for name, leaf in params.items():
            assert np.asarray(tree_[name]).tobytes() == np.zeros(leaf.shape, leaf.dtype).tobytes()
