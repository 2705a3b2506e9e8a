"""The ``lstm`` workload of ``kaun-ir bench``: a next-token LSTM language model, as a kaun_ir
model, in JAX (``lax.scan``) and in PyTorch eager (``torch.nn.LSTM``) over the same parameters.

Network (``cfg``: ``vocab``, ``dim``, ``hidden``, ``layers``, ``seq``, ``batch``): token ids
``[B, T]`` -> embedding rows ``[B, T, dim]`` (unscaled) -> ``layers`` stacked one-direction LSTMs
of width ``hidden`` -> a dense layer to ``vocab`` logits per position. The parameter tree is
kaun_ir's ``layer.sequential`` list: ``{"weight": [vocab, dim]}``, one ``{"w_ih", "w_hh", "b_ih",
"b_hh"}`` per LSTM (``layer.lstm``'s layout: PyTorch's weights transposed, gates ``i, f, g, o``),
``{"weight": [hidden, vocab], "bias"}``.

The JAX reference is the LSTM as a JAX user writes it: every time step's input projection in one
matmul, then ``lax.scan`` over time of the recurrent matmul and the gates. The PyTorch side is
``torch.nn.LSTM(batch_first=True)`` (its fused CPU kernels) run with our tensors as its weights
(``torch.func.functional_call``; ``weight_ih_l0 = w_ih.T`` and so on, transposed views of the
same leaves, so the gradients land on them).
"""

from __future__ import annotations

import functools

# ------------------------------------------------------------------------------ kaun_ir


def kaun_model(cfg: dict):
    """Ids ``[B, T]`` -> logits ``[B, T, vocab]``."""
    from kaun_ir import layer

    widths = [cfg["dim"]] + [cfg["hidden"]] * cfg["layers"]
    return layer.sequential(
        [
            layer.embedding(cfg["vocab"], cfg["dim"], scale=False),
            *[layer.lstm(a, b) for a, b in zip(widths[:-1], widths[1:])],
            layer.linear(cfg["hidden"], cfg["vocab"]),
        ]
    )


# ------------------------------------------------------------------------------ JAX


def _jax_lstm(x, p):
    """One LSTM over ``x [B, T, in]`` from a zero state -> ``[B, T, hidden]``."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    xw = x @ p["w_ih"] + p["b_ih"]  # [B, T, 4H]: the input projection of every step at once
    hidden = p["w_hh"].shape[0]
    zero = jnp.zeros((x.shape[0], hidden), x.dtype)

    def step(carry, xw_t):
        h, c = carry
        i, f, g, o = jnp.split(xw_t + h @ p["w_hh"] + p["b_hh"], 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    _, ys = lax.scan(step, (zero, zero), jnp.swapaxes(xw, 0, 1))
    return jnp.swapaxes(ys, 0, 1)


def jax_forward(params, ids, cfg):
    """The LSTM language model in plain JAX over kaun_ir's parameter list."""
    x = params[0]["weight"][ids]
    for p in params[1:-1]:
        x = _jax_lstm(x, p)
    return x @ params[-1]["weight"] + params[-1]["bias"]


# ------------------------------------------------------------------------------ PyTorch


@functools.cache
def _torch_lstm(input_size: int, hidden: int):
    """An ``nn.LSTM`` shell whose own weights are never used (functional_call supplies ours)."""
    import torch

    module = torch.nn.LSTM(input_size, hidden, batch_first=True)
    module.requires_grad_(False)
    return module


def _torch_lstm_forward(x, p):
    from torch.func import functional_call

    module = _torch_lstm(p["w_ih"].shape[0], p["w_hh"].shape[0])
    weights = {
        "weight_ih_l0": p["w_ih"].T,
        "weight_hh_l0": p["w_hh"].T,
        "bias_ih_l0": p["b_ih"],
        "bias_hh_l0": p["b_hh"],
    }
    y, _ = functional_call(module, weights, (x,))
    return y


def torch_forward(params, ids, cfg):
    """The LSTM language model in PyTorch eager: ``F.embedding``, ``nn.LSTM`` per layer, ``addmm``."""
    import torch
    import torch.nn.functional as F

    x = F.embedding(ids, params[0]["weight"])
    for p in params[1:-1]:
        x = _torch_lstm_forward(x, p)
    b, t, h = x.shape
    return torch.addmm(params[-1]["bias"], x.reshape(b * t, h), params[-1]["weight"]).reshape(b, t, -1)
