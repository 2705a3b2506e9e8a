"""EMA of the weights with LoRA: ``optim.ema`` keeps an average of the trainable leaves only, in
either order of ``optim.freeze`` and ``optim.chain``, and reads back as whole variables (the
frozen base from the current parameters), checked against a NumPy EMA recurrence."""

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import layer, loss, models, optim, rng, train

V = 64
GPT = models.gpt2(vocab_size=V, dim=32, num_layers=2, num_heads=4, max_positions=32)
ADAPTED = layer.lora(GPT, rank=4, targets=r"layers\.\d+\.attn\.(query|value)\.weight", alpha=8)
IDS = np.random.default_rng(0).integers(0, V, (4, 17)).astype(np.int32)
DECAY = 0.9


def _next_token_loss(logits, targets):
    return loss.cross_entropy_sparse(logits.reshape(-1, V), targets.reshape(-1))


def _paths(tree):
    return dict(kn.ptree.flatten_with_paths(tree))


def _nbytes(tree):
    return sum(np.asarray(leaf).nbytes for leaf in kn.ptree.leaves(tree))


ORDERS = {
    "ema_after_freeze": lambda: optim.chain(
        optim.freeze(optim.adam(1e-2), layer.lora_frozen), optim.ema(DECAY)
    ),
    "ema_inside_freeze": lambda: optim.freeze(
        optim.chain(optim.adam(1e-2), optim.ema(DECAY)), layer.lora_frozen
    ),
}


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_ema_with_lora_tracks_the_adapters_only_and_reads_back_whole(order):
    trainer = train.make(ADAPTED, ORDERS[order](), loss=_next_token_loss)
    with rng.scope(0):
        st = train.init(trainer, example=IDS[:, :-1])
    initial = {path: np.array(a, np.float64) for path, a in _paths(st.vars.params).items()}
    lora_paths = sorted(path for path in initial if path.startswith("lora."))
    # the optimiser state holds the adapters alone: Adam's two moments and the average
    for slot_tree in st.opt_state.trees:
        assert sorted(_paths(slot_tree)) == lora_paths
    assert _nbytes(st.opt_state.trees) == 3 * _nbytes(st.vars.params["lora"])
    assert _nbytes(st.opt_state.trees) < _nbytes(st.vars.params["base"]) / 5

    expected = {path: initial[path] for path in lora_paths}
    for _ in range(3):
        _, st = train.step(trainer, st, IDS[:, :-1], IDS[:, 1:])
        now = _paths(st.vars.params)
        expected = {p: DECAY * e + (1 - DECAY) * np.asarray(now[p], np.float64) for p, e in expected.items()}
    averaged = _paths(train.ema_vars(trainer, st).params)
    assert sorted(averaged) == sorted(initial)
    for path in lora_paths:
        np.testing.assert_allclose(np.asarray(averaged[path]), expected[path], rtol=1e-5, atol=1e-7)
        assert not np.allclose(expected[path], np.asarray(now[path]))  # the average lags
    for path in initial:
        if not path.startswith("lora."):  # the frozen base, exactly as loaded
            np.testing.assert_array_equal(np.asarray(averaged[path]), initial[path].astype(np.float32))
    # predict(ema=True) is the model run on those variables
    ema_vars = train.ema_vars(trainer, st)
    np.testing.assert_allclose(
        np.asarray(train.predict(trainer, st, IDS[:, :-1], ema=True)),
        np.asarray(layer.apply(ADAPTED, ema_vars, IDS[:, :-1])[0]),
        rtol=1e-6,
    )


def test_ema_params_refuses_an_average_of_other_parameters():
    params = {"a": np.ones(3, np.float32), "b": np.zeros(2, np.float32)}
    alg = optim.freeze(optim.chain(optim.sgd(0.1), optim.ema(0.5)), lambda path: path == "b")
    state = optim.init(alg, params)
    assert sorted(_paths(optim.ema_params(alg, state))) == ["a"]
    whole = optim.ema_params(alg, state, params)
    assert sorted(_paths(whole)) == ["a", "b"]
    with pytest.raises(ValueError, match=r"holds \['a'\] that the parameters lack"):
        optim.ema_params(alg, state, {"b": params["b"]})
