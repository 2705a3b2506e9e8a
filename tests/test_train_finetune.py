"""Fine-tuning: ``train.init(trainer, vars=...)`` from given weights, the EMA of the weights
(``optim.ema``, ``train.predict(..., ema=True)``, kept in checkpoints) and LoRA adapters
(``layer.lora``), checked against NumPy."""

import os

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import checkpoint, layer, loss, optim, rng, train

RS = np.random.default_rng(0)
X = RS.normal(size=(16, 8)).astype(np.float32)
T = RS.normal(size=(16, 3)).astype(np.float32)
MLP = layer.sequential([layer.linear(8, 16), layer.relu(), layer.linear(16, 3)])


def _np_mlp(p, x):
    h = np.maximum(x @ p[0]["weight"] + p[0]["bias"], 0.0)
    return h @ p[2]["weight"] + p[2]["bias"]


def _host(params):
    return kn.ptree.map(lambda a: np.array(a, np.float64), params)


def test_init_from_given_vars_params_and_pretrained():
    trainer = train.make(MLP, optim.sgd(0.1), loss=loss.mse)
    with rng.scope(5):
        v = layer.init(MLP)
    want = _host(v.params)
    for given in (v, v.params, kn.models.Pretrained(MLP, v, None, "mlp")):
        st = train.init(trainer, vars=given)
        assert st.step == 0 and int(st.opt_state.count) == 0
        for a, b in zip(kn.ptree.leaves(st.vars.params), kn.ptree.leaves(want)):
            np.testing.assert_array_equal(np.asarray(a), b)
    # the first step starts from those weights: the loss is NumPy's on them
    st = train.init(trainer, vars=v.params)
    value, st = train.step(trainer, st, X, T)
    np.testing.assert_allclose(float(value), np.mean((_np_mlp(want, X) - T) ** 2), rtol=1e-5)


def test_init_from_a_checkpoint_of_params(tmp_path):
    trainer = train.make(MLP, optim.adam(1e-3), loss=loss.mse)
    with rng.scope(2):
        v = layer.init(MLP)
    path = checkpoint.save(os.path.join(tmp_path, "p.safetensors"), v.params)
    st = train.init(trainer, vars=checkpoint.load(path))
    np.testing.assert_array_equal(np.asarray(st.vars.params[2]["weight"]), np.asarray(v.params[2]["weight"]))


def test_init_with_mismatched_vars_names_the_path_and_shapes():
    trainer = train.make(MLP, optim.sgd(0.1), loss=loss.mse)
    with rng.scope(0):
        v = layer.init(MLP)
    wrong = [
        dict(v.params[0]),
        [],
        {"weight": np.zeros((16, 4), np.float32), "bias": np.zeros(3, np.float32)},
    ]
    with pytest.raises(kn.ShapeError, match=r"'2\.weight' have shape \[16,4\].*expects \[16,3\]"):
        train.init(trainer, vars=wrong)
    missing = [{"weight": v.params[0]["weight"]}, [], v.params[2]]
    with pytest.raises(kn.ShapeError, match=r"lack \['0\.bias'\]"):
        train.init(trainer, vars=missing)
    extra = [dict(v.params[0], scale=np.ones(16, np.float32)), [], v.params[2]]
    with pytest.raises(kn.ShapeError, match=r"have \['0\.scale'\]"):
        train.init(trainer, vars=extra)


def test_ema_is_used_by_predict_and_saved_in_checkpoints(tmp_path):
    decay, lr = 0.8, 0.05
    trainer = train.make(layer.linear(8, 3), optim.chain(optim.sgd(lr), optim.ema(decay)), loss=loss.mse)
    with rng.scope(0):
        st = train.init(trainer)
    w = np.array(st.vars.params["weight"], np.float64)
    b = np.array(st.vars.params["bias"], np.float64)
    ema_w, ema_b = w.copy(), b.copy()
    for _ in range(3):
        _, st = train.step(trainer, st, X, T)
        r = X @ w + b - T
        g = 2.0 * r / r.size
        w, b = w - lr * (X.T @ g), b - lr * g.sum(0)
        ema_w, ema_b = decay * ema_w + (1 - decay) * w, decay * ema_b + (1 - decay) * b
    np.testing.assert_allclose(
        np.asarray(train.ema_vars(trainer, st).params["weight"]), ema_w, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        np.asarray(train.predict(trainer, st, X, ema=True)), X @ ema_w + ema_b, rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(np.asarray(train.predict(trainer, st, X)), X @ w + b, rtol=1e-4, atol=1e-5)
    path = checkpoint.save(os.path.join(tmp_path, "st.safetensors"), st)
    back = train.load(path, trainer)
    np.testing.assert_array_equal(
        np.asarray(train.ema_vars(trainer, back).params["weight"]),
        np.asarray(train.ema_vars(trainer, st).params["weight"]),
    )
    plain = train.make(layer.linear(8, 3), optim.sgd(lr), loss=loss.mse)
    with rng.scope(0):
        pst = train.init(plain)
    with pytest.raises(ValueError, match="optim.ema"):
        train.predict(plain, pst, X, ema=True)


def test_lora_trains_only_the_adapters_and_merges_back():
    rank, alpha = 2, 4.0
    adapted = layer.lora(MLP, rank, targets=r"\d+\.weight", alpha=alpha)
    opt = optim.freeze(optim.adam(1e-2), layer.lora_frozen)
    trainer = train.make(adapted, opt, loss=loss.mse)
    with rng.scope(0):
        st = train.init(trainer)
    with rng.scope(0):
        plain = layer.init(MLP)
    base = _host(st.vars.params["base"])
    # the base parameters are the plain model's for the same seed; b = 0: same outputs at first
    for a, p in zip(kn.ptree.leaves(base), kn.ptree.leaves(plain.params)):
        np.testing.assert_array_equal(a, np.asarray(p))
    assert sorted(p for p, _ in kn.ptree.flatten_with_paths(st.vars.params["lora"])) == [
        "0.weight.a",
        "0.weight.b",
        "2.weight.a",
        "2.weight.b",
    ]
    # Adam keeps moments for the adapters only
    assert sorted(p for p, _ in kn.ptree.flatten_with_paths(st.opt_state.trees[0])) == [
        "lora.0.weight.a",
        "lora.0.weight.b",
        "lora.2.weight.a",
        "lora.2.weight.b",
    ]
    for _ in range(3):
        _, st = train.step(trainer, st, X, T)
    for a, b in zip(kn.ptree.leaves(st.vars.params["base"]), kn.ptree.leaves(base)):
        np.testing.assert_array_equal(np.asarray(a), b)  # frozen, bit for bit
    ad = _host(st.vars.params["lora"])
    assert np.any(ad["0"]["weight"]["b"] != 0)
    # the adapted forward pass is NumPy's W + alpha/rank * a @ b
    merged_np = [dict(base[0]), [], dict(base[2])]
    for i in (0, 2):
        merged_np[i]["weight"] = (
            base[i]["weight"] + alpha / rank * ad[str(i)]["weight"]["a"] @ ad[str(i)]["weight"]["b"]
        )
    y = np.asarray(train.predict(trainer, st, X))
    np.testing.assert_allclose(y, _np_mlp(merged_np, X), rtol=1e-4, atol=1e-5)
    # merged: plain variables of the base model with the same outputs
    merged = layer.lora_merge(adapted, st.vars)
    np.testing.assert_allclose(np.asarray(layer.apply(MLP, merged, X)[0]), y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(merged.params[2]["weight"]), merged_np[2]["weight"], rtol=1e-5, atol=1e-6
    )


def test_lora_around_loaded_weights_and_bad_targets():
    with rng.scope(3):
        loaded = layer.init(MLP)
    adapted = layer.lora(MLP, 1, targets=["2.weight"])
    with rng.scope(0):
        v = layer.lora_vars(adapted, loaded)
    trainer = train.make(adapted, optim.freeze(optim.sgd(0.1), layer.lora_frozen), loss=loss.mse)
    st = train.init(trainer, vars=v)
    np.testing.assert_allclose(
        np.asarray(train.predict(trainer, st, X)), np.asarray(layer.apply(MLP, loaded, X)[0]), rtol=1e-6
    )
    with pytest.raises(ValueError, match="select no parameter"):
        with rng.scope(0):
            layer.init(layer.lora(MLP, 1, targets="nothing"))
    with pytest.raises(ValueError, match="2-D"):
        with rng.scope(0):
            layer.init(layer.lora(MLP, 1, targets=r"\d+\.bias"))
