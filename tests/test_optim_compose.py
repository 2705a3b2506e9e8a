"""Composed optimisers (``optim.chain``, the ``clip_by_global_norm`` transform), weight-decay
masks and float32 optimiser state for low-precision parameters.

Oracles: optax (``optax.chain``, ``optax.adamw(mask=)``) run under JAX, and NumPy."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

import kaun_ir as kn
from kaun_ir import layer, optim, rng, train
from kaun_ir.nn import loss

RNG = np.random.default_rng(7)


def _params():
    return {
        "embed": RNG.standard_normal((6, 4)).astype(np.float32),
        "blocks": [
            {
                "weight": RNG.standard_normal((4, 4)).astype(np.float32),
                "bias": RNG.standard_normal((4,)).astype(np.float32),
            }
        ],
        "scale": RNG.standard_normal((4,)).astype(np.float32),
    }


def _grads_sequence(params, n=4, size=3.0):
    return [
        jax.tree_util.tree_map(lambda p: (size * RNG.standard_normal(p.shape)).astype(np.float32), params)
        for _ in range(n)
    ]


def _run_ours(alg, params, grads_seq):
    state = optim.init(alg, params)
    for grads in grads_seq:
        params, state = optim.update(alg, state, params, grads)
    return params


def _run_optax(tx, params, grads_seq):
    state = tx.init(params)
    for grads in grads_seq:
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params


def _close(ours, theirs, rtol=2e-5, atol=2e-6):
    flat_ours = kn.ptree.leaves(ours)
    flat_theirs = jax.tree_util.tree_leaves(theirs)
    assert len(flat_ours) == len(flat_theirs)
    for a, b in zip(flat_ours, flat_theirs):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def _is_matrix(path, p):
    return p.ndim >= 2


def test_chain_of_clipping_and_masked_adamw_matches_optax():
    params = _params()
    grads = _grads_sequence(params)
    # the clipping is active: every gradient's global norm is above 1
    assert all(np.sqrt(sum(float(np.sum(g * g)) for g in kn.ptree.leaves(t))) > 1.0 for t in grads)
    ours = _run_ours(
        optim.chain(optim.clip_by_global_norm(1.0), optim.adamw(0.05, weight_decay=0.1, mask=_is_matrix)),
        params,
        grads,
    )
    tree_mask = jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)
    theirs = _run_optax(
        optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(0.05, weight_decay=0.1, mask=tree_mask)),
        params,
        grads,
    )
    _close(ours, theirs)


@pytest.mark.parametrize(
    "mask",
    [
        lambda path: not path.endswith("bias") and path != "scale",  # a predicate on paths
        {"embed": True, "blocks": [{"weight": True, "bias": False}], "scale": False},  # a tree of bools
    ],
    ids=["path", "tree"],
)
def test_mask_forms_decay_exactly_the_chosen_parameters(mask):
    params = _params()
    grads = _grads_sequence(params, 3)
    ours = _run_ours(optim.adamw(0.05, weight_decay=0.3, mask=mask), params, grads)
    want_mask = {"embed": True, "blocks": [{"weight": True, "bias": False}], "scale": False}
    theirs = _run_optax(optax.adamw(0.05, weight_decay=0.3, mask=want_mask), params, grads)
    _close(ours, theirs)


def test_the_clipping_transform_alone_and_the_two_argument_form_agree_with_optax():
    params = _params()
    grads = _grads_sequence(params, 1, size=5.0)[0]
    transform = optim.clip_by_global_norm(2.0)
    assert isinstance(transform, optim.Algorithm) and transform.slots == ()
    updates, _ = optim.step(transform, optim.init(transform, params), params, grads)
    theirs, _ = optax.clip_by_global_norm(2.0).update(grads, None)
    _close(updates, theirs)
    _close(optim.clip_by_global_norm(2.0, grads), theirs)


def test_chain_state_names_and_train_make_accept_a_chain():
    alg = optim.chain(optim.clip_by_global_norm(1.0), optim.sgd(0.1, momentum=0.9), optim.adam(1e-3))
    assert alg.slots == ("1.trace", "2.mu", "2.nu")
    model = layer.sequential([layer.linear(5, 8), layer.relu(), layer.linear(8, 3)])
    never_clips = optim.chain(optim.clip_by_global_norm(1e6), optim.adamw(0.01, weight_decay=0.1))
    chained = train.make(model, never_clips, loss=loss.cross_entropy_sparse)
    plain = train.make(model, optim.adamw(0.01, weight_decay=0.1), loss=loss.cross_entropy_sparse)
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    y = np.array([0, 1, 2, 1], np.int32)
    states = []
    for trainer in (chained, plain):
        with rng.scope(0):
            st = train.init(trainer)
        for _ in range(3):
            _, st = train.step(trainer, st, x, y)
        states.append(st)
    # clipping at a norm never reached changes nothing
    _close(
        states[0].vars.params, jax.tree_util.tree_map(np.asarray, states[1].vars.params), rtol=1e-6, atol=1e-7
    )


def _adam_reference_f16(params16, grads_seq, lr, eps=1e-8, b1=0.9, b2=0.999):
    """NumPy Adam with float32 moments and arithmetic, updates rounded to float16."""
    p = params16.copy()
    mu = np.zeros(p.shape, np.float32)
    nu = np.zeros(p.shape, np.float32)
    for t, g in enumerate(grads_seq, start=1):
        g32 = g.astype(np.float32)
        mu = (1 - b1) * g32 + b1 * mu
        nu = (1 - b2) * g32 * g32 + b2 * nu
        u = -lr / (1 - b1**t) * (mu / (np.sqrt(nu / (1 - b2**t)) + eps))
        p = (p + u.astype(np.float16)).astype(np.float16)
    return p


def test_float16_adam_keeps_float32_state_and_stays_finite():
    params = {"w": np.linspace(-1, 1, 12).astype(np.float16).reshape(3, 4)}
    # gradients whose squares underflow in float16: the old float16 state divided by zero
    grads = [{"w": np.full((3, 4), 1e-4 * (k + 1), np.float16)} for k in range(4)]
    new = _run_ours(optim.adam(1e-2), params, grads)
    assert new["w"].dtype == np.float16 and np.all(np.isfinite(np.asarray(new["w"], np.float32)))
    want = _adam_reference_f16(params["w"], [g["w"] for g in grads], 1e-2)
    np.testing.assert_allclose(
        np.asarray(new["w"], np.float32), want.astype(np.float32), rtol=2e-3, atol=1e-3
    )
    # asking for float16 state brings the failure back: the option is real
    broken = _run_ours(optim.adam(1e-2, state_dtype=np.float16), params, grads)
    assert not np.all(np.isfinite(np.asarray(broken["w"], np.float32)))


def test_float16_training_with_adam_stays_finite():
    model = layer.sequential([layer.linear(5, 8), layer.relu(), layer.linear(8, 3)])
    trainer = train.make(model, optim.adam(1e-3), loss=loss.cross_entropy_sparse)
    with rng.scope(0):
        st = train.init(trainer, kn.float16)
    assert all(t.dtype == np.float32 for t in kn.ptree.leaves(st.opt_state.trees))
    x = RNG.standard_normal((8, 5)).astype(np.float16)
    y = RNG.integers(0, 3, 8).astype(np.int32)
    values = []
    for _ in range(5):
        value, st = train.step(trainer, st, x, y)
        values.append(float(value))
    assert np.all(np.isfinite(values)) and values[-1] < values[0]
    assert all(p.dtype == np.float16 for p in kn.ptree.leaves(st.vars.params))


def test_sgd_rmsprop_adagrad_state_dtype():
    params = {"w": np.ones((2, 3), kn.bfloat16)}
    for alg in (optim.sgd(0.1, momentum=0.9), optim.rmsprop(0.1), optim.adagrad(0.1)):
        state = optim.init(alg, params)
        assert all(t.dtype == np.float32 for t in kn.ptree.leaves(state.trees)), alg
        new, _ = optim.update(alg, state, params, {"w": np.full((2, 3), 0.5, kn.bfloat16)})
        assert new["w"].dtype == kn.bfloat16
    kept = optim.init(optim.sgd(0.1, momentum=0.9, state_dtype=kn.bfloat16), params)
    assert kn.ptree.leaves(kept.trees)[0].dtype == kn.bfloat16
    assert optim.slot_dtype(np.float64) == np.float64 and optim.slot_dtype(np.int32) == np.int32


def test_bad_compositions_and_masks():
    with pytest.raises(ValueError, match="at least one"):
        optim.chain()
    with pytest.raises(TypeError, match="argument 1"):
        optim.chain(optim.sgd(0.1), 0.1)
    with pytest.raises(ValueError, match="max_norm must be > 0"):
        optim.clip_by_global_norm(0.0)
    with pytest.raises(ValueError, match="floating-point"):
        optim.adam(0.1, state_dtype=np.int32)
    params = _params()
    bad_tree = optim.adamw(0.1, mask={"embed": True})
    with pytest.raises(ValueError, match="mask tree does not match"):
        optim.update(bad_tree, optim.init(bad_tree, params), params, params)
    not_bool = optim.adamw(0.1, mask=lambda path: 1)
    with pytest.raises(TypeError, match="must return a bool"):
        optim.update(not_bool, optim.init(not_bool, params), params, params)
