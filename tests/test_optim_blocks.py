"""The optax-style building blocks of kn.optim (scale_by_adam, add_decayed_weights, scale,
scale_by_learning_rate, apply_every, multi_steps, ema, freeze), checked against optax and NumPy."""

import numpy as np
import optax
import pytest

import kaun_ir as kn
from kaun_ir import optim

RTOL, ATOL = 2e-5, 1e-7


def _params():
    rs = np.random.default_rng(0)
    return {
        "embed": {"weight": rs.normal(size=(6, 4)).astype(np.float32)},
        "head": {
            "bias": rs.normal(size=(3,)).astype(np.float32),
            "weight": rs.normal(size=(4, 3)).astype(np.float32),
        },
    }


def _grads(step):
    rs = np.random.default_rng(100 + step)
    return {
        k: {n: rs.normal(size=a.shape).astype(np.float32) for n, a in v.items()} for k, v in _params().items()
    }


def _close(ours, theirs, rtol=RTOL, atol=ATOL):
    for a, b in zip(kn.ptree.leaves(ours), kn.ptree.leaves(theirs)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def _run_ours(alg, steps):
    params = _params()
    state = optim.init(alg, params)
    out = []
    for t in range(steps):
        updates, state = optim.step(alg, state, params, _grads(t))
        params = optim.apply_updates(params, updates)
        out.append((updates, params))
    return out, state


def _run_optax(tx, steps):
    params = _params()
    state = tx.init(params)
    out = []
    for t in range(steps):
        updates, state = tx.update(_grads(t), state, params)
        params = optax.apply_updates(params, updates)
        out.append((updates, params))
    return out


def _compare(ours, theirs, rtol=RTOL, atol=ATOL):
    for (u1, p1), (u2, p2) in zip(ours, theirs):
        _close(u1, u2, rtol, atol)
        _close(p1, p2, rtol, atol)


def test_scale_by_adam_scale_and_learning_rate_match_optax():
    ours, _ = _run_ours(optim.chain(optim.scale_by_adam(b1=0.8), optim.scale(0.5)), 3)
    _compare(ours, _run_optax(optax.chain(optax.scale_by_adam(b1=0.8), optax.scale(0.5)), 3))
    schedule = optim.schedule.linear(1e-2, 1e-3, 10)  # at the 1-based step; optax's count is 0-based
    ours, _ = _run_ours(optim.chain(optim.scale_by_adam(), optim.scale_by_learning_rate(schedule)), 3)
    theirs = _run_optax(
        optax.chain(
            optax.scale_by_adam(),
            optax.scale_by_learning_rate(lambda count: optax.linear_schedule(1e-2, 1e-3, 10)(count + 1)),
        ),
        3,
    )
    _compare(ours, theirs)


def test_add_decayed_weights_with_a_mask_matches_optax():
    mask = {"embed": {"weight": False}, "head": {"bias": False, "weight": True}}
    ours, _ = _run_ours(
        optim.chain(
            optim.add_decayed_weights(0.1, mask=lambda path, p: p.ndim >= 2 and "head" in path),
            optim.scale(-0.1),
        ),
        2,
    )
    _compare(ours, _run_optax(optax.chain(optax.add_decayed_weights(0.1, mask=mask), optax.scale(-0.1)), 2))


def test_adam_and_adamw_are_their_chains():
    adamw = optim.adamw(1e-2, weight_decay=0.1, mask=lambda path: path.endswith("weight"))
    chain = optim.chain(
        optim.scale_by_adam(),
        optim.add_decayed_weights(0.1, mask=lambda path: path.endswith("weight")),
        optim.scale_by_learning_rate(1e-2),
    )
    a, _ = _run_ours(adamw, 3)
    b, _ = _run_ours(chain, 3)
    _compare(a, b, rtol=1e-6, atol=0)
    assert adamw.slots == ("mu", "nu") and repr(adamw).startswith("optim.adamw(")
    mask = {"embed": {"weight": True}, "head": {"bias": False, "weight": True}}
    _compare(a, _run_optax(optax.adamw(1e-2, weight_decay=0.1, mask=mask), 3))


def test_lion_and_its_block_match_optax():
    # the sign makes Lion's updates exactly +-lr (plus decay): compare them and the moment tightly
    ours, _ = _run_ours(optim.scale_by_lion(b1=0.8, b2=0.95), 4)
    _compare(ours, _run_optax(optax.scale_by_lion(b1=0.8, b2=0.95), 4))
    mask = {"embed": {"weight": False}, "head": {"bias": False, "weight": True}}
    lion = optim.lion(3e-3, weight_decay=0.1, mask=lambda path, p: p.ndim >= 2 and "head" in path)
    ours, state = _run_ours(lion, 4)
    _compare(ours, _run_optax(optax.lion(3e-3, weight_decay=0.1, mask=mask), 4))
    assert lion.slots == ("mu",) and repr(lion).startswith("optim.lion(")
    # the state holds one moment, mu = (1-b2) g + b2 mu, for every parameter: NumPy's own sum
    mu = np.zeros((4, 3), np.float32)
    for t in range(4):
        mu = 0.01 * _grads(t)["head"]["weight"] + 0.99 * mu
    np.testing.assert_allclose(np.asarray(state.trees[0]["head"]["weight"]), mu, rtol=1e-5)
    with pytest.raises(ValueError, match="optim.lion: b2"):
        optim.lion(1e-3, b2=1.5)


def test_apply_every_matches_optax():
    ours, _ = _run_ours(optim.chain(optim.apply_every(3), optim.scale(-0.1)), 7)
    _compare(ours, _run_optax(optax.chain(optax.apply_every(3), optax.scale(-0.1)), 7))


def test_multi_steps_matches_optax():
    ours, state = _run_ours(optim.multi_steps(optim.adam(1e-2), 3), 7)
    theirs = _run_optax(optax.MultiSteps(optax.adam(1e-2), every_k_schedule=3), 7)
    _compare(ours, theirs, rtol=1e-5, atol=1e-7)
    for updates, _ in ours[:2]:  # the calls between two real steps change nothing
        assert all(not np.any(np.asarray(u)) for u in kn.ptree.leaves(updates))
    assert int(state.count) == 7


def test_ema_of_the_weights_matches_numpy():
    decay = 0.9
    alg = optim.chain(optim.sgd(0.1), optim.ema(decay))
    params = _params()
    state = optim.init(alg, params)
    expected = {k: {n: a.copy() for n, a in v.items()} for k, v in params.items()}
    reference = {k: {n: a.copy() for n, a in v.items()} for k, v in params.items()}
    for t in range(3):
        params, state = optim.update(alg, state, params, _grads(t))
        for k, v in reference.items():
            for n in v:
                v[n] = (v[n] - np.float32(0.1) * _grads(t)[k][n]).astype(np.float32)
                expected[k][n] = decay * expected[k][n] + (1 - decay) * v[n]
    _close(params, reference, rtol=1e-6)
    _close(optim.ema_params(alg, state), expected, rtol=1e-6)
    with pytest.raises(ValueError, match="ema"):
        optim.ema_params(optim.adam(1e-3), optim.init(optim.adam(1e-3), params))


def test_freeze_trains_only_the_rest_and_keeps_state_for_it_only():
    alg = optim.freeze(optim.adam(1e-2), lambda path: path.startswith("embed"))
    ours, state = _run_ours(alg, 3)
    for updates, params in ours:
        assert not np.any(np.asarray(updates["embed"]["weight"]))
        np.testing.assert_array_equal(np.asarray(params["embed"]["weight"]), _params()["embed"]["weight"])
    # the moments exist for the head only
    assert set(state.trees[0]) == {"head"}
    labels = {"embed": {"weight": "frozen"}, "head": {"bias": "train", "weight": "train"}}
    theirs = _run_optax(
        optax.multi_transform({"train": optax.adam(1e-2), "frozen": optax.set_to_zero()}, labels), 3
    )
    _compare(ours, theirs)


def test_clip_grads_by_global_norm_and_the_old_spelling():
    grads = _grads(0)
    want, _ = optax.clip_by_global_norm(0.5).update(grads, optax.EmptyState())
    _close(optim.clip_grads_by_global_norm(grads, 0.5), want, rtol=1e-6)
    _close(optim.clip_by_global_norm(0.5, grads), want, rtol=1e-6)  # deprecated form, still works
    assert isinstance(optim.clip_by_global_norm(0.5), optim.Algorithm)
    with pytest.raises(ValueError, match="max_norm"):
        optim.clip_grads_by_global_norm(grads, 0.0)
