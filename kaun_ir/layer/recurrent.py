"""Recurrent layers on ``kn.scan``: ``rnn`` (Elman), ``gru`` and ``lstm``.

All three are batch-first: the input is ``x: [batch, time, input_size]``, or a dict
``{"x": x, "state": initial_state, "lengths": int[batch]}`` (both extra keys optional). The
output is ``[batch, time, D * hidden_size]`` (``D = 2`` when ``bidirectional``, the forward and
backward outputs concatenated on the last axis), and with ``return_state=True`` the pair
``(output, final_state)``. A state is ``h: [D, batch, hidden_size]`` for ``rnn``/``gru`` and the
pair ``(h, c)`` of such arrays for ``lstm`` (PyTorch's ``h_n``/``c_n`` layout for one layer). A
missing initial state is zeros.

``lengths`` gives each sequence's true length (the rest of its time steps is padding): outputs at
padded steps are zero, the final state is the state after the last real step, and the backward
direction of a bidirectional layer starts at each sequence's last real step — the semantics of
PyTorch's packed sequences.

Parameters (one direction): ``{"w_ih": [input_size, G * hidden_size], "w_hh": [hidden_size,
G * hidden_size], "b_ih": [G * hidden_size], "b_hh": [G * hidden_size]}`` with ``G`` = 1 (rnn),
3 (gru, gates ``r, z, n``) or 4 (lstm, gates ``i, f, g, o``), in PyTorch's gate order; a
bidirectional layer has ``{"forward": ..., "backward": ...}``. Our weights are PyTorch's
transposed: ``w_ih = weight_ih_l0.T``, ``w_hh = weight_hh_l0.T``, ``b_ih = bias_ih_l0``,
``b_hh = bias_hh_l0`` (``..._l0_reverse`` for ``backward``); see :func:`from_torch`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.builder import current_path, scope
from kaun_ir.layer.construct import make_param, positive_int, resolve_init
from kaun_ir.layer.core import Layer, Vars
from kaun_ir.nn import init as initializers
from kaun_ir.nn.activations import relu
from kaun_ir.surface.control import scan
from kaun_ir.surface.creation import arange, zeros
from kaun_ir.surface.elementwise import sigmoid, tanh, where
from kaun_ir.surface.linalg import matmul
from kaun_ir.surface.shapes import concatenate, stack, transpose
from kaun_ir.surface.tensor import type_of

__all__ = ["rnn", "gru", "lstm", "from_torch", "GATES"]

#: gates per cell kind, in PyTorch's order
GATES = {"rnn": 1, "gru": 3, "lstm": 4}


def _rnn_cell(nonlinearity: Callable):
    def cell(p, xw, state):
        (h,) = state
        h = nonlinearity(xw + matmul(h, p["w_hh"]) + p["b_hh"])
        return (h,), h

    return cell


def _gru_cell(p, xw, state):
    (h,) = state
    hw = matmul(h, p["w_hh"]) + p["b_hh"]
    n_h = h.shape[-1]
    r = sigmoid(xw[..., :n_h] + hw[..., :n_h])
    z = sigmoid(xw[..., n_h : 2 * n_h] + hw[..., n_h : 2 * n_h])
    n = tanh(xw[..., 2 * n_h :] + r * hw[..., 2 * n_h :])
    h = (1.0 - z) * n + z * h
    return (h,), h


def _lstm_gate_affine(n_h: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """``(scale, shift)``, each ``[4 * n_h]``, with ``scale * sigmoid(scale * x) + shift`` equal to
    ``sigmoid`` on the ``i, f, o`` gates and to ``tanh(x) = 2 sigmoid(2x) - 1`` on ``g``."""
    scale = np.ones(4 * n_h, dtype)
    scale[2 * n_h : 3 * n_h] = 2.0
    return scale, np.where(scale == 2.0, -1.0, 0.0).astype(scale.dtype)


def _lstm_cell(p, xw, state):
    h, c = state
    gates = xw + matmul(h, p["w_hh"]) + p["b_hh"]
    n_h = h.shape[-1]
    # the four gates' activations as one element-wise op over [batch, 4 * hidden]: one kernel
    # in the forward loop and one cotangent in the backward loop, where four activations of
    # slices made four kernels and a concatenation of their cotangents (the lstm bench step
    # 0.91x the time, docs/performance.md); g's tanh is 2 sigmoid(2x) - 1, exact to an ulp of 1
    scale, shift = _lstm_gate_affine(n_h, type_of(gates).dtype)
    act = scale * sigmoid(scale * gates) + shift
    i = act[..., :n_h]
    f = act[..., n_h : 2 * n_h]
    g = act[..., 2 * n_h : 3 * n_h]
    o = act[..., 3 * n_h :]
    c = f * c + i * g
    h = o * tanh(c)
    return (h, c), h


def _direction(cell, p, x, state, mask, reverse: bool):
    """One direction over time: ``x [B, T, in]`` -> (outputs ``[B, T, H]``, final state)."""
    # every time step's input projection in one matmul, time-major: the input is transposed
    # rather than the G times wider projection, and a stacked layer's input (the previous
    # layer's outputs, transposed to batch-first) is transposed back, which folds away
    # (the bias is added inside the loop, where it joins the gates' element-wise work instead
    # of costing a pass over the whole [T, B, G * H] projection)
    xw = matmul(transpose(x, (1, 0, 2)), p["w_ih"])
    xs = {"xw": xw}
    if mask is not None:
        xs["mask"] = mask

    def step(carry, inp):
        new, y = cell(p, inp["xw"] + p["b_ih"], carry)
        if "mask" in inp:  # padded steps keep the state and output zeros
            keep = inp["mask"]
            new = tuple(where(keep, n, c) for n, c in zip(new, carry))
            y = where(keep, y, 0.0)
        return new, y

    final, ys = scan(step, tuple(state), xs, reverse=reverse)
    return transpose(ys, (1, 0, 2)), final


def _unpack_input(x, kind: str, hidden: int, directions: int, dt):
    """``(x, state tuple per direction, mask [T, B, 1] or None)`` from the layer's input."""
    where_ = f"{current_path() or kind}: "
    if isinstance(x, dict):
        unknown = set(x) - {"x", "state", "lengths"}
        if "x" not in x or unknown:
            raise ValueError(
                f"{where_}{kind} takes an array or a dict with keys 'x' and optionally 'state', "
                f"'lengths'; got keys {sorted(x)}"
            )
        seq, state, lengths = x["x"], x.get("state"), x.get("lengths")
    else:
        seq, state, lengths = x, None, None
    t = type_of(seq)
    if t.ndim != 3:
        raise ShapeError(f"{where_}{kind} expects a batch-first input [batch, time, features], got {t}")
    batch, steps = t.shape[0], t.shape[1]
    n_state = 2 if kind == "lstm" else 1
    want = (directions, batch, hidden)
    if state is None:
        parts = [zeros(want, dt)] * n_state
    else:
        parts = list(state) if kind == "lstm" else [state]
        if len(parts) != n_state or any(tuple(type_of(s).shape) != want for s in parts):
            shapes = [list(type_of(s).shape) for s in parts]
            raise ShapeError(
                f"{where_}{kind} initial state must be {'(h, c), each' if n_state == 2 else 'h'} "
                f"of shape {list(want)} ([directions, batch, hidden]); got {shapes}"
            )
    per_direction = [tuple(s[d] for s in parts) for d in range(directions)]
    mask = None
    if lengths is not None:
        lt = type_of(lengths)
        if lt.shape != (batch,) or not dtypes.is_integer(lt.dtype):
            raise ShapeError(f"{where_}{kind} lengths must be an integer array [batch] = [{batch}], got {lt}")
        time_index = arange(steps, dtype=lt.dtype).reshape((steps, 1))
        mask = (time_index < lengths.reshape((1, batch))).reshape((steps, batch, 1))
    return seq, per_direction, mask


def _recurrent(
    kind: str, cell, input_size, hidden_size, bidirectional: bool, return_state: bool, weight_init, bias_init
) -> Layer:
    hidden = positive_int(hidden_size, "hidden_size", kind)
    n_in = None if input_size is None else positive_int(input_size, "input_size", kind)
    directions = 2 if bidirectional else 1
    width = GATES[kind] * hidden
    bound = 1.0 / math.sqrt(hidden)  # PyTorch's default: U(-1/sqrt(hidden), 1/sqrt(hidden)) for all

    default = initializers.uniform((-bound, bound))
    weight_init = resolve_init(weight_init, default, "weight_init", kind)
    bias_init = resolve_init(bias_init, default, "bias_init", kind)
    names = ("forward", "backward")

    def one_direction(size, dt):
        return {
            "w_ih": make_param(weight_init, (size, width), dt),
            "w_hh": make_param(weight_init, (hidden, width), dt),
            "b_ih": make_param(bias_init, (width,), dt),
            "b_hh": make_param(bias_init, (width,), dt),
        }

    def init_(dt, x=None):
        size = n_in
        if x is not None:
            seq = x["x"] if isinstance(x, dict) else x
            got = tuple(seq.shape)
            if len(got) != 3:
                raise ShapeError(
                    f"{current_path() or kind}: {kind} expects a batch-first input [batch, time, "
                    f"features], got shape {list(got)}"
                )
            if size is not None and got[-1] != size:
                raise ShapeError(
                    f"{current_path() or kind}: input_size={size} but the input has {got[-1]} features"
                )
            size = got[-1]
        if size is None:
            raise ValueError(
                f"{current_path() or kind}: input_size was not given and there is no example input "
                "to infer it from; pass input_size=... or call layer.init(model, example)"
            )
        if not bidirectional:
            return Vars(one_direction(size, dt), [], dt)
        return Vars({name: one_direction(size, dt) for name in names}, [], dt)

    def apply_(params, state, x, *, training, ctx):
        per = [params[name] for name in names] if bidirectional else [params]
        dt = type_of(per[0]["w_ih"]).dtype
        seq, states, mask = _unpack_input(x, kind, hidden, directions, dt)
        features = type_of(per[0]["w_ih"]).shape[0]
        if type_of(seq).shape[-1] != features:
            raise ShapeError(
                f"{current_path() or kind}: {kind}(input_size={features}) got an input with "
                f"{type_of(seq).shape[-1]} features ({type_of(seq)})"
            )
        outputs, finals = [], []
        for d in range(directions):
            with scope(names[d]) if bidirectional else _nullscope():
                out, final = _direction(cell, per[d], seq, states[d], mask, reverse=(d == 1))
            outputs.append(out)
            finals.append(final)
        y = outputs[0] if directions == 1 else concatenate(outputs, axis=-1)
        if not return_state:
            return y, state
        stacked = tuple(stack([f[k] for f in finals], axis=0) for k in range(len(finals[0])))
        return (y, stacked if kind == "lstm" else stacked[0]), state

    return Layer(init_, apply_, kind)


class _nullscope:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def rnn(
    input_size: int | None = None,
    hidden_size: int | None = None,
    nonlinearity: str = "tanh",
    bidirectional: bool = False,
    return_state: bool = False,
    weight_init=None,
    bias_init=None,
) -> Layer:
    """Elman RNN, ``h_t = act(x_t @ w_ih + b_ih + h_{t-1} @ w_hh + b_hh)`` with ``act`` ``"tanh"`` or
    ``"relu"`` (PyTorch ``nn.RNN(batch_first=True)``). Input, output, state and parameters: see the
    module docstring. ``input_size`` may be left out and inferred by ``layer.init(model, example)``."""
    if hidden_size is None:
        raise ValueError("layer.rnn: hidden_size is required")
    if nonlinearity not in ("tanh", "relu"):
        raise ValueError(f"layer.rnn: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
    return _recurrent(
        "rnn",
        _rnn_cell(tanh if nonlinearity == "tanh" else relu),
        input_size,
        hidden_size,
        bidirectional,
        return_state,
        weight_init,
        bias_init,
    )


def gru(
    input_size: int | None = None,
    hidden_size: int | None = None,
    bidirectional: bool = False,
    return_state: bool = False,
    weight_init=None,
    bias_init=None,
) -> Layer:
    """GRU (PyTorch ``nn.GRU(batch_first=True)``): ``r = σ(x W_ir + b_ir + h W_hr + b_hr)``,
    ``z = σ(x W_iz + b_iz + h W_hz + b_hz)``, ``n = tanh(x W_in + b_in + r * (h W_hn + b_hn))``,
    ``h' = (1 - z) * n + z * h``; gates stacked ``r, z, n``. See the module docstring."""
    if hidden_size is None:
        raise ValueError("layer.gru: hidden_size is required")
    return _recurrent(
        "gru", _gru_cell, input_size, hidden_size, bidirectional, return_state, weight_init, bias_init
    )


def lstm(
    input_size: int | None = None,
    hidden_size: int | None = None,
    bidirectional: bool = False,
    return_state: bool = False,
    weight_init=None,
    bias_init=None,
) -> Layer:
    """LSTM (PyTorch ``nn.LSTM(batch_first=True)``): gates ``i, f, g, o`` from
    ``x W_i* + b_i* + h W_h* + b_h*`` (σ, σ, tanh, σ), ``c' = f * c + i * g``, ``h' = o * tanh(c')``.
    The state is the pair ``(h, c)``. See the module docstring."""
    if hidden_size is None:
        raise ValueError("layer.lstm: hidden_size is required")
    return _recurrent(
        "lstm", _lstm_cell, input_size, hidden_size, bidirectional, return_state, weight_init, bias_init
    )


def from_torch(state_dict: dict[str, Any], bidirectional: bool = False) -> dict:
    """Our parameter tree from a one-layer PyTorch ``nn.RNN``/``nn.GRU``/``nn.LSTM`` ``state_dict``
    (tensors or arrays): ``w_ih = weight_ih_l0.T``, ``w_hh = weight_hh_l0.T``, biases as they are;
    ``*_l0_reverse`` go to ``"backward"``."""

    def array(v):
        v = v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)
        return np.ascontiguousarray(v)

    def one(suffix):
        try:
            return {
                "w_ih": array(state_dict[f"weight_ih_l0{suffix}"]).T.copy(),
                "w_hh": array(state_dict[f"weight_hh_l0{suffix}"]).T.copy(),
                "b_ih": array(state_dict[f"bias_ih_l0{suffix}"]),
                "b_hh": array(state_dict[f"bias_hh_l0{suffix}"]),
            }
        except KeyError as err:
            raise ValueError(
                f"from_torch: the state_dict has no {err.args[0]!r} (one layer with biases is "
                f"supported; keys: {sorted(state_dict)})"
            ) from None

    if bidirectional:
        return {"forward": one(""), "backward": one("_reverse")}
    return one("")
