"""layer.rnn / gru / lstm: outputs vs a NumPy loop, gradients vs JAX, and vs PyTorch when installed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import layer, rng

B, T, IN, H = 3, 5, 4, 6
RNG = np.random.default_rng(3)
X = RNG.standard_normal((B, T, IN)).astype(np.float32)
LENGTHS = np.array([5, 2, 4], np.int32)


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _np_cell(kind, p, x, state):
    h = state[0]
    xw = x @ p["w_ih"] + p["b_ih"]
    hw = h @ p["w_hh"] + p["b_hh"]
    if kind == "rnn":
        h = np.tanh(xw + hw)
        return (h,), h
    if kind == "gru":
        r = _sigmoid(xw[:, :H] + hw[:, :H])
        z = _sigmoid(xw[:, H : 2 * H] + hw[:, H : 2 * H])
        n = np.tanh(xw[:, 2 * H :] + r * hw[:, 2 * H :])
        h = (1 - z) * n + z * h
        return (h,), h
    g = xw + hw
    i, f, gg, o = (
        _sigmoid(g[:, :H]),
        _sigmoid(g[:, H : 2 * H]),
        np.tanh(g[:, 2 * H : 3 * H]),
        _sigmoid(g[:, 3 * H :]),
    )
    c = f * state[1] + i * gg
    h = o * np.tanh(c)
    return (h, c), h


def _np_layer(kind, params, x, state0, lengths, bidirectional):
    """Per sequence, per direction, a plain loop over its real time steps (padding untouched)."""
    dirs = [("forward", False), ("backward", True)] if bidirectional else [(None, False)]
    out = np.zeros((B, T, H * len(dirs)), np.float64)
    finals = [np.zeros((len(dirs), B, H)) for _ in state0]
    for d, (name, reverse) in enumerate(dirs):
        p = {k: v.astype(np.float64) for k, v in (params[name] if name else params).items()}
        for b in range(B):
            n = lengths[b] if lengths is not None else T
            state = tuple(s[d, b : b + 1].astype(np.float64) for s in state0)
            steps = range(n - 1, -1, -1) if reverse else range(n)
            for t in steps:
                state, y = _np_cell(kind, p, x[b : b + 1, t].astype(np.float64), state)
                out[b, t, d * H : (d + 1) * H] = y[0]
            for k, s in enumerate(state):
                finals[k][d, b] = s[0]
    return out, finals


def _init(model):
    return rng.run(0, lambda: layer.init(model, kn.ShapeDtype((B, T, IN))))


@pytest.mark.parametrize("kind", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("bidirectional,masked", [(False, False), (True, True)])
def test_matches_numpy_loop(kind, bidirectional, masked):
    model = getattr(layer, kind)(hidden_size=H, bidirectional=bidirectional, return_state=True)
    v = _init(model)
    d = 2 if bidirectional else 1
    n_state = 2 if kind == "lstm" else 1
    state0 = [RNG.standard_normal((d, B, H)).astype(np.float32) for _ in range(n_state)]
    inp = {"x": X, "state": tuple(state0) if kind == "lstm" else state0[0]}
    if masked:
        inp["lengths"] = LENGTHS
    (y, final), _ = layer.apply(model, v, inp)
    want_y, want_final = _np_layer(
        kind, kn.ptree.map(np.asarray, v.params), X, state0, LENGTHS if masked else None, bidirectional
    )
    np.testing.assert_allclose(np.asarray(y), want_y, rtol=1e-5, atol=1e-5)
    finals = final if kind == "lstm" else (final,)
    for got, want in zip(finals, want_final):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def _jax_gru(p, x):
    def step(h, x_t):
        xw = x_t @ p["w_ih"] + p["b_ih"]
        hw = h @ p["w_hh"] + p["b_hh"]
        r = jax.nn.sigmoid(xw[:, :H] + hw[:, :H])
        z = jax.nn.sigmoid(xw[:, H : 2 * H] + hw[:, H : 2 * H])
        n = jnp.tanh(xw[:, 2 * H :] + r * hw[:, 2 * H :])
        h = (1 - z) * n + z * h
        return h, h

    _, ys = jax.lax.scan(step, jnp.zeros((x.shape[0], H), x.dtype), jnp.swapaxes(x, 0, 1))
    return jnp.sum(jnp.swapaxes(ys, 0, 1) ** 2)


def test_gru_gradients_match_jax_in_float64():
    model = layer.gru(IN, H)
    v = rng.run(0, lambda: layer.init(model, dtype=kn.float64))
    x = X.astype(np.float64)

    def loss(p, x):
        y, _ = layer.apply(model, layer.with_params(v, p), x)
        return kn.sum(y * y)

    got = kn.grad(loss, argnums=(0, 1))(v.params, x)
    with jax.enable_x64(True):
        want = jax.grad(_jax_gru, argnums=(0, 1))(kn.ptree.map(np.asarray, v.params), x)
    for g, w in zip(
        jax.tree_util.tree_leaves(kn.ptree.map(np.asarray, got)), jax.tree_util.tree_leaves(want)
    ):
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-9, atol=1e-11)


def test_bad_input_errors():
    model = layer.lstm(IN, H)
    v = _init(model)
    with pytest.raises(kn.ShapeError, match=r"batch-first input \[batch, time, features\]"):
        layer.apply(model, v, X[0])
    with pytest.raises(kn.ShapeError, match="initial state must be"):
        layer.apply(model, v, {"x": X, "state": np.zeros((1, B, H), np.float32)})
    with pytest.raises(kn.ShapeError, match="lengths must be an integer array"):
        layer.apply(model, v, {"x": X, "lengths": np.ones(B, np.float32)})
    with pytest.raises(ValueError, match="nonlinearity"):
        layer.rnn(IN, H, nonlinearity="sigmoid")


@pytest.mark.interop
@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_outputs_and_gradients_equal_pytorch(kind):
    torch = pytest.importorskip("torch", reason="PyTorch is an optional extra (pip install -e '.[interop]')")
    torch.manual_seed(0)
    module = {"gru": torch.nn.GRU, "lstm": torch.nn.LSTM}[kind](IN, H, batch_first=True, bidirectional=True)
    module = module.double()
    x = X.astype(np.float64)
    params = layer.recurrent_from_torch(module.state_dict(), bidirectional=True)
    model = getattr(layer, kind)(IN, H, bidirectional=True, return_state=True)
    v = layer.Vars(params, [], kn.float64)

    def loss(p, x):
        (y, final), _ = layer.apply(model, layer.with_params(v, p), {"x": x, "lengths": LENGTHS})
        h = final[0] if kind == "lstm" else final
        return kn.sum(y * y) + kn.sum(h * 0.5)

    value, grads = kn.value_and_grad(loss)(params, x)

    tx = torch.tensor(x)
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        tx, torch.tensor(LENGTHS), batch_first=True, enforce_sorted=False
    )
    out, final = module(packed)
    y, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=T)
    h = final[0] if kind == "lstm" else final
    want = (y * y).sum() + (h * 0.5).sum()
    want.backward()
    np.testing.assert_allclose(float(value), want.item(), rtol=1e-12)
    want_grads = layer.recurrent_from_torch(
        {k: p.grad for k, p in module.named_parameters()}, bidirectional=True
    )
    for (path, g), (_, w) in zip(kn.ptree.flatten_with_paths(grads), kn.ptree.flatten_with_paths(want_grads)):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-10, atol=1e-12, err_msg=path)
