"""The ``resnet`` workload of ``kaun-ir bench``: a CIFAR-sized ResNet of BasicBlocks with batch norm,
as a kaun_ir model, in JAX and in PyTorch eager over the same parameter and state trees.

Network (``cfg["channels"] = (c0, c1, ...)``, ``cfg["blocks"]`` blocks per stage): a 3x3 stem
convolution to ``c0`` + batch norm + ReLU; stage ``i`` has ``blocks`` BasicBlocks of width ``ci``,
the first of every stage after the first with stride 2; global average pooling; a dense layer to
``classes``. A BasicBlock is ``relu(bn(conv3x3(relu(bn(conv3x3(x))))) + shortcut(x))``, the
shortcut a strided 1x1 convolution + batch norm where the shape changes. Convolutions have no
bias (the batch norm's shift is the bias). Batch norm trains with the batch's statistics and
updates running statistics the PyTorch way (new-batch weight 0.1, running variance unbiased):
kaun_ir's ``batch_norm(momentum=0.9, unbiased_running_var=True)``.

The forward walks kaun_ir's trees, so JAX and PyTorch read the same arrays: ``params`` (a list
per ``layer.sequential``, ``{"block", "shortcut"}`` per ``layer.residual``, ``[]`` for layers
without parameters) and the layer state of the same shape (``{"running_mean", "running_var"}``
per batch norm). With ``state=None`` the forward returns the logits only (training-mode batch
statistics, running statistics untouched); with a state, the JAX forward returns ``(logits,
new_state)`` and the PyTorch forward updates the state's tensors in place.
"""

from __future__ import annotations

from typing import Any

#: kaun_ir momentum (weight of the old value) of PyTorch's default BatchNorm momentum 0.1
BN_MOMENTUM = 0.9
BN_EPS = 1e-5


def strides(cfg: dict) -> list[int]:
    """The stride of every block, stage by stage."""
    return [2 if i > 0 and j == 0 else 1 for i in range(len(cfg["channels"])) for j in range(cfg["blocks"])]


def widths(cfg: dict) -> list[tuple[int, int]]:
    """``(in, out)`` channels of every block."""
    out, c_in = [], cfg["channels"][0]
    for c in cfg["channels"]:
        for _ in range(cfg["blocks"]):
            out.append((c_in, c))
            c_in = c
    return out


# ------------------------------------------------------------------------------ kaun_ir


def _conv_bn(c_in: int, c_out: int, stride: int, kernel: int = 3) -> list:
    from kaun_ir import layer

    return [
        layer.conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, use_bias=False),
        layer.batch_norm(c_out, momentum=BN_MOMENTUM, eps=BN_EPS, unbiased_running_var=True),
    ]


def _basic_block(c_in: int, c_out: int, stride: int):
    from kaun_ir import layer

    body = layer.sequential([*_conv_bn(c_in, c_out, stride), layer.relu(), *_conv_bn(c_out, c_out, 1)])
    shortcut = None
    if stride != 1 or c_in != c_out:
        shortcut = layer.sequential(_conv_bn(c_in, c_out, stride, kernel=1))
    return layer.sequential([layer.residual(body, shortcut), layer.relu()])


def kaun_model(cfg: dict):
    """NCHW ``[B, 3, S, S]`` -> logits ``[B, classes]`` (see the module docstring)."""
    from kaun_ir import layer

    blocks = [_basic_block(a, b, s) for (a, b), s in zip(widths(cfg), strides(cfg))]
    return layer.sequential(
        [
            *_conv_bn(cfg["x_shape"][1], cfg["channels"][0], 1),
            layer.relu(),
            *blocks,
            layer.global_avg_pool(),
            layer.linear(cfg["channels"][-1], cfg["classes"]),
        ]
    )


# ------------------------------------------------------------------------------ shared walk


class _NoState:
    """Stands for a missing state tree: every index of it is itself."""

    def __getitem__(self, key):
        return self


_NO_STATE = _NoState()


def _walk(ops, params, state, x, cfg):
    """The network over kaun_ir's trees with backend ``ops`` (``conv(h, w, stride)``,
    ``bn(h, p, s) -> (y, new_s)``, ``relu``, ``pool``, ``dense(h, p)``); ``(logits, new_state)``."""
    st = _NO_STATE if state is None else state
    new = None if state is None else list(state)

    def conv_bn(h, p, s, stride):  # p, s: the [conv, bn] pair of parameters / state
        y, s_bn = ops.bn(ops.conv(h, p[0]["weight"], stride), p[1], s[1])
        return y, [s[0], s_bn]

    h, stem = conv_bn(x, params[0:2], [st[0], st[1]], 1)
    h = ops.relu(h)
    for i, stride in enumerate(strides(cfg), start=3):
        p, s = params[i][0], st[i][0]
        y, s01 = conv_bn(h, p["block"][0:2], [s["block"][0], s["block"][1]], stride)
        y, s34 = conv_bn(ops.relu(y), p["block"][3:5], [s["block"][3], s["block"][4]], 1)
        updated = {"block": [*s01, s["block"][2], *s34]}
        skip = h
        if "shortcut" in p:
            skip, updated["shortcut"] = conv_bn(h, p["shortcut"], s["shortcut"], stride)
        h = ops.relu(y + skip)
        if new is not None:
            new[i] = [updated, state[i][1]]
    if new is not None:
        new[1] = stem[1]
    return ops.dense(ops.pool(h), params[-1]), new


# ------------------------------------------------------------------------------ JAX


class _JaxOps:
    @staticmethod
    def conv(h, w, stride):
        from jax import lax

        pad = w.shape[-1] // 2
        return lax.conv_general_dilated(
            h, w, (stride, stride), [(pad, pad)] * 2, dimension_numbers=("NCHW", "OIHW", "NCHW")
        )

    @staticmethod
    def bn(h, p, s):
        import jax
        import jax.numpy as jnp

        mean = jnp.mean(h, axis=(0, 2, 3))
        centred = h - mean[None, :, None, None]
        var = jnp.mean(centred * centred, axis=(0, 2, 3))
        inv = jax.lax.rsqrt(var + BN_EPS) * p["scale"]
        y = centred * inv[None, :, None, None] + p["bias"][None, :, None, None]
        if s is _NO_STATE:
            return y, s
        n = h.size // h.shape[1]
        mean, var = jax.lax.stop_gradient(mean), jax.lax.stop_gradient(var) * (n / (n - 1))
        return y, {
            "running_mean": s["running_mean"] * BN_MOMENTUM + mean * (1.0 - BN_MOMENTUM),
            "running_var": s["running_var"] * BN_MOMENTUM + var * (1.0 - BN_MOMENTUM),
        }

    @staticmethod
    def relu(h):
        import jax.numpy as jnp

        return jnp.maximum(h, 0.0)

    @staticmethod
    def pool(h):
        return h.mean(axis=(2, 3))

    @staticmethod
    def dense(h, p):
        return h @ p["weight"] + p["bias"]


def jax_forward(params, x, cfg, state=None):
    """The ResNet in plain JAX: logits, or ``(logits, new_state)`` when a state is given."""
    logits, new = _walk(_JaxOps, params, state, x, cfg)
    return logits if state is None else (logits, new)


# ------------------------------------------------------------------------------ PyTorch eager


class _TorchOps:
    @staticmethod
    def conv(h, w, stride):
        import torch.nn.functional as F

        return F.conv2d(h, w, None, stride=stride, padding=w.shape[-1] // 2)

    @staticmethod
    def bn(h, p, s):
        import torch.nn.functional as F

        running = (None, None) if s is _NO_STATE else (s["running_mean"], s["running_var"])
        # PyTorch's own batch norm: biased variance to normalise, unbiased into running_var
        y = F.batch_norm(
            h, *running, p["scale"], p["bias"], training=True, momentum=1.0 - BN_MOMENTUM, eps=BN_EPS
        )
        return y, s

    @staticmethod
    def relu(h):
        import torch

        return torch.relu(h)

    @staticmethod
    def pool(h):
        return h.mean(dim=(2, 3))

    @staticmethod
    def dense(h, p):
        import torch

        return torch.addmm(p["bias"], h, p["weight"])


def torch_forward(params, x, cfg, state=None) -> Any:
    """The ResNet in PyTorch eager; a given state's running statistics are updated in place."""
    return _walk(_TorchOps, params, state, x, cfg)[0]
