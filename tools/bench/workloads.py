"""The workloads of ``kaun-ir bench``: each as a kaun_ir model and a hand-written JAX reference.

Every workload describes one training problem with fixed synthetic data and fixed initial weights:

- ``kaun_model(cfg)`` builds the kaun_ir ``layer.Layer``;
- ``jax_forward(params, x, cfg)`` is the same network written directly in JAX (the reference
  implementation of the benchmark, not an execution path of kaun_ir), reading the *same
  parameter tree* as the kaun_ir model (linear weights ``[in, out]``, conv weights OIHW, NCHW
  activations), so both sides start from identical arrays without any layout conversion;
- ``torch_forward(params, x, cfg)`` is the same network in PyTorch eager over the same tree
  with ``torch.Tensor`` leaves (``x @ W + b`` on the ``[in, out]`` weights; OIHW/NCHW are
  PyTorch's own conv layouts), used when ``torch`` is importable;
- ``batch(cfg, seed)`` makes the fixed batch ``(x, labels)``;
- ``optimizer`` names the optimiser (same hyper-parameters on both sides);
- ``stateful``: the model has layer state (batch norm's running statistics). Its forwards then
  take a ``state=`` tree shaped like kaun_ir's layer state: the JAX forward returns ``(logits,
  new_state)`` and the PyTorch forward updates the state's tensors in place (without it, both
  return the logits only).

``cfg`` holds the sizes; ``SMALL`` configurations keep the tests fast. :class:`Setup` makes one
workload's shared starting point: its batches, initial weights and kaun_ir variables.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kaun_ir.tools.bench import gpt2 as bench_gpt2
from kaun_ir.tools.bench import resnet as bench_resnet
from kaun_ir.tools.bench import rnn as bench_rnn
from kaun_ir.tools.bench import transformer as bench_transformer

SEED = 0
#: distinct fixed batches, cycled step by step (one batch alone is memorised within ~20 steps,
#: after which the loss is ~1e-4 and a relative comparison of it measures nothing)
NUM_BATCHES = 8

# ------------------------------------------------------------------------------ kaun_ir models


def _mlp_model(cfg: dict):
    """``[B, d0] -> [B, dk]``: linear layers with ReLU between them (sizes ``cfg["sizes"]``)."""
    from kaun_ir import layer

    sizes = cfg["sizes"]
    layers: list = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(layer.linear(a, b))
        if i < len(sizes) - 2:
            layers.append(layer.relu())
    return layer.sequential(layers)


def _cnn_model(cfg: dict):
    """NCHW ``[B, 1, S, S]`` -> conv3x3 c1 + ReLU + pool2, conv3x3 c2 + ReLU + pool2, flatten, dense 10."""
    from kaun_ir import layer

    s, c1, c2 = cfg["size"], cfg["c1"], cfg["c2"]
    return layer.sequential(
        [
            layer.conv2d(1, c1, 3, padding="same"),
            layer.relu(),
            layer.max_pool2d(2),
            layer.conv2d(c1, c2, 3, padding="same"),
            layer.relu(),
            layer.max_pool2d(2),
            layer.flatten(),
            layer.linear(c2 * (s // 4) * (s // 4), 10),
        ]
    )


# ------------------------------------------------------------------------------ JAX references


def mlp_jax_forward(params, x, cfg):
    """The MLP in plain JAX over kaun_ir's parameter list (ReLU at even positions skipped)."""
    import jax.numpy as jnp

    dense = [p for p in params if p]  # the ReLU layers have no parameters
    for i, p in enumerate(dense):
        x = x @ p["weight"] + p["bias"]
        if i < len(dense) - 1:
            x = jnp.maximum(x, 0.0)
    return x


def _jax_conv_same(x, p):
    from jax import lax

    y = lax.conv_general_dilated(x, p["weight"], (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return y + p["bias"][None, :, None, None]


def _jax_max_pool2(x):
    import jax.numpy as jnp
    from jax import lax

    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")


def cnn_jax_forward(params, x, cfg):
    """The CNN in plain JAX (NCHW, OIHW weights) over kaun_ir's parameter list."""
    import jax.numpy as jnp

    h = _jax_max_pool2(jnp.maximum(_jax_conv_same(x, params[0]), 0.0))
    h = _jax_max_pool2(jnp.maximum(_jax_conv_same(h, params[3]), 0.0))
    h = h.reshape(h.shape[0], -1)
    return h @ params[7]["weight"] + params[7]["bias"]


# ------------------------------------------------------------------------------ PyTorch eager
# The same networks over the same parameter tree (torch.Tensor leaves, identical layouts: dense
# weights [in, out] are used as ``x @ W + b`` rather than through nn.Linear's [out, in]).


def mlp_torch_forward(params, x, cfg):
    """The MLP in PyTorch eager (``torch.addmm`` on ``[in, out]`` weights)."""
    import torch

    dense = [p for p in params if p]
    for i, p in enumerate(dense):
        x = torch.addmm(p["bias"], x, p["weight"])
        if i < len(dense) - 1:
            x = torch.relu(x)
    return x


def cnn_torch_forward(params, x, cfg):
    """The CNN in PyTorch eager: NCHW activations, OIHW kernels (PyTorch's native layouts);
    ``padding=1`` is SAME for a 3x3 kernel with stride 1."""
    import torch
    import torch.nn.functional as F

    def conv(h, p):
        return F.conv2d(h, p["weight"], p["bias"], padding=1)

    h = F.max_pool2d(torch.relu(conv(x, params[0])), 2)
    h = F.max_pool2d(torch.relu(conv(h, params[3])), 2)
    h = h.reshape(h.shape[0], -1)
    return torch.addmm(params[7]["bias"], h, params[7]["weight"])


# ------------------------------------------------------------------------------ data


def _image_batch(cfg: dict, seed: int):
    r = np.random.default_rng(seed)
    x = r.standard_normal(cfg["x_shape"]).astype(np.float32)
    y = r.integers(0, cfg["classes"], size=cfg["x_shape"][0]).astype(np.int32)
    return x, y


def _token_batch(cfg: dict, seed: int):
    r = np.random.default_rng(seed)
    shape = (cfg["batch"], cfg["seq"])
    x = r.integers(0, cfg["vocab"], size=shape).astype(np.int32)
    y = r.integers(0, cfg["vocab"], size=shape).astype(np.int32)  # next tokens (synthetic)
    return x, y


@dataclass(frozen=True)
class Workload:
    """One benchmark problem (see the module docstring)."""

    name: str
    description: str
    kaun_model: Callable[[dict], Any]
    jax_forward: Callable[[Any, Any, dict], Any]
    torch_forward: Callable[[Any, Any, dict], Any]
    batch: Callable[[dict, int], tuple]
    #: ("adam", lr) or ("adamw", lr, weight_decay); a last element "lora" trains the LoRA
    #: adapters alone (the base parameters frozen: no gradient, no optimiser state)
    optimizer: tuple
    full: dict = field(default_factory=dict)
    small: dict = field(default_factory=dict)
    #: the CLI's defaults for this workload: steps per round (long enough that a round is not
    #: timer noise) and K of the fused kaun_ir[K] row (0: no fused row by default)
    steps: int = 32
    steps_per_call: int = 16
    stateful: bool = False
    #: the steps after which the losses are compared with JAX's (0: ``steps``, the CLI's
    #: ``--steps``, whichever is fewer); for a training whose float32 rounding differences grow
    #: faster than the bench's tolerance within a round (see resnet)
    loss_steps: int = 0
    #: run when no workload is named (the real-size rows take minutes: named with -w only)
    default: bool = True


GPT2_SMALL = {"layers": 12, "dim": 768, "heads": 12, "seq": 128, "batch": 4, "vocab": 50257}
GPT2_TINY = {"layers": 2, "dim": 32, "heads": 4, "seq": 8, "batch": 2, "vocab": 64}


def _image_cfg(batch: int, x_rest: tuple, **extra) -> dict:
    return {"x_shape": (batch, *x_rest), "classes": 10, **extra}


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload(
            "mlp",
            "MLP 784-512-512-10 ReLU, batch 128, Adam 1e-3",
            _mlp_model,
            mlp_jax_forward,
            mlp_torch_forward,
            _image_batch,
            ("adam", 1e-3),
            full=_image_cfg(128, (784,), sizes=(784, 512, 512, 10)),
            small=_image_cfg(16, (64,), sizes=(64, 32, 32, 10)),
            steps=64,
        ),
        Workload(
            "cnn",
            "CNN NCHW 1x28x28: conv3x3 32+ReLU+pool2, conv3x3 64+ReLU+pool2, dense 10; batch 64, Adam 1e-3",
            _cnn_model,
            cnn_jax_forward,
            cnn_torch_forward,
            _image_batch,
            ("adam", 1e-3),
            full=_image_cfg(64, (1, 28, 28), size=28, c1=32, c2=64),
            small=_image_cfg(4, (1, 8, 8), size=8, c1=4, c2=8),
            # XLA CPU runs convolutions inside a while loop far slower than at the top level
            # (measured 2.7 vs 65 steps/s at K=16; jax's fori_loop shows the same), so the fused
            # row is opt-in here: --steps-per-call 16
            steps_per_call=0,
        ),
        Workload(
            "mlp_small",
            "MLP 64-128-10 ReLU, batch 32, Adam 1e-3",
            _mlp_model,
            mlp_jax_forward,
            mlp_torch_forward,
            _image_batch,
            ("adam", 1e-3),
            full=_image_cfg(32, (64,), sizes=(64, 128, 10)),
            small=_image_cfg(8, (64,), sizes=(64, 128, 10)),
            steps=512,
            steps_per_call=128,
        ),
        Workload(
            "transformer",
            "decoder-only transformer: 4 layers, d_model 128, 4 heads, seq 64, batch 16, "
            "vocab 512, causal, pre-LN, GELU MLP 4x; AdamW 1e-3 (decay 0.01)",
            bench_transformer.kaun_model,
            bench_transformer.jax_forward,
            bench_transformer.torch_forward,
            _token_batch,
            ("adamw", 1e-3, 0.01),
            full={"layers": 4, "dim": 128, "heads": 4, "seq": 64, "batch": 16, "vocab": 512},
            small={"layers": 2, "dim": 16, "heads": 2, "seq": 8, "batch": 2, "vocab": 32},
        ),
        Workload(
            "resnet",
            "ResNet NCHW 3x32x32: 3x3 stem 16 + BN, BasicBlocks (conv3x3+BN+ReLU, conv3x3+BN, "
            "shortcut) 16, 32/2, 64/2, global average pool, dense 10; batch 16, Adam 1e-3",
            bench_resnet.kaun_model,
            bench_resnet.jax_forward,
            bench_resnet.torch_forward,
            _image_batch,
            ("adam", 1e-3),
            full=_image_cfg(16, (3, 32, 32), channels=(16, 32, 64), blocks=1),
            small=_image_cfg(4, (3, 8, 8), channels=(4, 8), blocks=1),
            steps=16,
            # batch norm + Adam amplify any difference in float32 rounding: after 16 steps JAX's
            # loss is 3.9e-5 and kaun_ir's 2.1e-4 from a float64 run of the same JAX step,
            # PyTorch's ~4e-4 from JAX's; after 8 steps 2.4e-6 and 3.7e-7 (docs/performance.md,
            # round 7), so the losses are compared there, where they still measure arithmetic
            loss_steps=8,
            # convolutions inside a while loop are slow on XLA CPU (see cnn)
            steps_per_call=0,
            stateful=True,
        ),
        Workload(
            "transformer12",
            "decoder-only transformer: 12 layers, d_model 256, 8 heads, seq 64, batch 4, "
            "vocab 512, causal, pre-LN, GELU MLP 4x; AdamW 1e-3 (decay 0.01)",
            bench_transformer.kaun_model,
            bench_transformer.jax_forward,
            bench_transformer.torch_forward,
            _token_batch,
            ("adamw", 1e-3, 0.01),
            full={"layers": 12, "dim": 256, "heads": 8, "seq": 64, "batch": 4, "vocab": 512},
            small={"layers": 2, "dim": 16, "heads": 4, "seq": 8, "batch": 2, "vocab": 32},
            steps=8,
            steps_per_call=0,
        ),
        Workload(
            "lstm",
            "LSTM language model: embedding 128, 2 LSTM layers of 256, dense to vocab 512 per "
            "position (next-token loss); seq 64, batch 32, Adam 1e-3",
            bench_rnn.kaun_model,
            bench_rnn.jax_forward,
            bench_rnn.torch_forward,
            _token_batch,
            ("adam", 1e-3),
            full={"vocab": 512, "dim": 128, "hidden": 256, "layers": 2, "seq": 64, "batch": 32},
            small={"vocab": 32, "dim": 8, "hidden": 16, "layers": 2, "seq": 6, "batch": 2},
            # a step is ~0.1 s on 2 cores: 8 steps make a round; the fused row is opt-in
            # (--steps-per-call 8; the tests train it at K=2)
            steps=8,
            steps_per_call=0,
        ),
        Workload(
            "gpt2_small",
            "GPT-2 124M (kn.models.gpt2: 12 layers, d_model 768, 12 heads, vocab 50257), seq 128, "
            "batch 4; AdamW 1e-4 (decay 0.01)",
            bench_gpt2.kaun_model,
            bench_gpt2.jax_forward,
            bench_gpt2.torch_forward,
            _token_batch,
            ("adamw", 1e-4, 0.01),
            full=GPT2_SMALL,
            small=GPT2_TINY,
            steps=4,
            steps_per_call=0,
            default=False,
        ),
        Workload(
            "gpt2_small_lora",
            "gpt2_small with rank-8 LoRA adapters on every attention query and value (base "
            "frozen); AdamW 1e-3 (decay 0.01) on the adapters",
            bench_gpt2.kaun_model,
            bench_gpt2.jax_forward,
            bench_gpt2.torch_forward,
            _token_batch,
            ("adamw", 1e-3, 0.01, "lora"),
            full={**GPT2_SMALL, "lora": True},
            small={**GPT2_TINY, "lora": True},
            steps=4,
            steps_per_call=0,
            default=False,
        ),
    ]
}
#: the workloads ``kaun-ir bench`` runs when none is named
DEFAULT_WORKLOADS = [name for name, w in WORKLOADS.items() if w.default]


def initial_params(structure: Any, seed: int) -> Any:
    """Fixed initial weights with the structure of ``structure`` (a kaun_ir parameter tree),
    drawn with NumPy from ``seed`` in the tree's flatten order.

    Weights get ``normal / sqrt(fan_in)`` (fan_in: ``in`` of ``[in, out]``, ``in*kh*kw`` of an
    OIHW conv kernel), norm scales ``1 + 0.1 * normal``, biases ``0.01 * normal``.
    """
    from kaun_ir import tree

    r = np.random.default_rng(seed)
    leaves, treedef = tree.flatten(structure)
    paths = [path for path, _ in tree.paths(structure)]
    out = []
    for path, leaf in zip(paths, leaves):
        shape = tuple(leaf.shape)
        noise = r.standard_normal(shape).astype(np.float32)
        if path.endswith("scale"):
            value = 1.0 + 0.1 * noise
        elif len(shape) == 1:
            value = 0.01 * noise
        elif len(shape) == 4:
            value = noise / math.sqrt(math.prod(shape[1:]))
        else:
            value = noise / math.sqrt(shape[0])
        out.append(value.astype(np.float32))
    return tree.unflatten(treedef, out)


class Setup:
    """The shared starting point of one workload: sizes, batches, NumPy initial weights and the
    kaun_ir variables they go into (made once, so no implementation pays for it)."""

    def __init__(self, name: str, small: bool, overrides: dict | None = None):
        from kaun_ir import layer, rng

        self.workload: Workload = WORKLOADS[name]
        self.cfg = {**(self.workload.small if small else self.workload.full), **(overrides or {})}
        self.batches = [self.workload.batch(self.cfg, SEED + 100 + i) for i in range(NUM_BATCHES)]
        with rng.scope(SEED):
            #: the kaun_ir variables (their parameters are replaced by ``params``)
            self.fresh = layer.init(self.workload.kaun_model(self.cfg))
        self.params = initial_params(self.fresh.params, SEED + 1)
        #: the initial layer state (batch norm's running statistics) as NumPy arrays: every
        #: implementation copies it, since kaun_ir and JAX donate the state they are given
        self.layer_state = _numpy_tree(self.fresh.state)


def _numpy_tree(t: Any) -> Any:
    from kaun_ir import tree

    leaves, treedef = tree.flatten(t)
    return tree.unflatten(treedef, [np.array(a) for a in leaves])
