"""The reference implementations ``kaun-ir bench`` compares kaun_ir with: a hand-written JAX +
optax step (``jax.jit`` of the whole step) and PyTorch eager. Neither is an execution path of
kaun_ir; JAX is imported here as the oracle, not as a runtime."""

from __future__ import annotations

from typing import Any

import numpy as np

from kaun_ir.tools.bench.workloads import NUM_BATCHES, Setup, Workload

# ------------------------------------------------------------------------------ JAX reference


def trains_lora_only(spec: tuple) -> bool:
    """The optimiser spec trains the LoRA adapters alone (``params["lora"]``)."""
    return spec[-1] == "lora"


def _jax_optax_optimizer(spec: tuple):
    import optax

    if spec[0] == "adam":
        opt = optax.adam(spec[1])
    else:
        opt = optax.adamw(spec[1], weight_decay=spec[2])
    if trains_lora_only(spec):  # the base frozen: no state for it, zero updates
        return optax.multi_transform(
            {"train": opt, "frozen": optax.set_to_zero()},
            lambda params: {k: ("train" if k == "lora" else "frozen") for k in params},
        )
    return opt


def make_jax_step(workload: Workload, cfg: dict):
    """The reference step: ``jax.jit`` of loss + ``jax.grad`` + optax update, params and
    optimiser state donated. Returns ``(step, optimizer)``; ``step(params, opt_state, x, y) ->
    (loss, params, opt_state)``. For a ``stateful`` workload ``opt_state`` is the pair
    ``(optax state, layer state)`` (batch norm's running statistics, updated by the step)."""
    import jax
    import optax

    opt = _jax_optax_optimizer(workload.optimizer)

    def loss_of(params, x, y):
        logits = workload.jax_forward(params, x, cfg)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def lora_loss_of(adapters, base, x, y):  # the gradient of the adapters alone
        return loss_of({"base": base, "lora": adapters}, x, y)

    def step(params, opt_state, x, y):
        if trains_lora_only(workload.optimizer):
            value, lora_grads = jax.value_and_grad(lora_loss_of)(params["lora"], params["base"], x, y)
            grads = {"base": jax.tree_util.tree_map(jax.numpy.zeros_like, params["base"]), "lora": lora_grads}
        else:
            value, grads = jax.value_and_grad(loss_of)(params, x, y)
        updates, opt_state = opt.update(grads, opt_state, params)
        return value, optax.apply_updates(params, updates), opt_state

    def stateful_loss_of(params, layer_state, x, y):
        logits, layer_state = workload.jax_forward(params, x, cfg, state=layer_state)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), layer_state

    def stateful_step(params, opt_state, x, y):
        opt_state, layer_state = opt_state
        (value, layer_state), grads = jax.value_and_grad(stateful_loss_of, has_aux=True)(
            params, layer_state, x, y
        )
        updates, opt_state = opt.update(grads, opt_state, params)
        return value, optax.apply_updates(params, updates), (opt_state, layer_state)

    return jax.jit(stateful_step if workload.stateful else step, donate_argnums=(0, 1)), opt


class JaxRunner:
    """The JAX + optax reference (one jit of the whole step, donated)."""

    name = "jax"
    steps_per_call = 1

    def __init__(self, workload: Workload, cfg: dict, params: Any, batches: list, layer_state: Any = None):
        import jax

        self.jax_step, opt = make_jax_step(workload, cfg)
        self.params = jax.device_put(jax.tree_util.tree_map(np.array, params))
        self.opt_state = opt.init(self.params)
        if workload.stateful:  # the layer state travels with the optimiser state (make_jax_step)
            self.opt_state = (self.opt_state, jax.device_put(jax.tree_util.tree_map(np.array, layer_state)))
        self.batches = [(jax.device_put(x), jax.device_put(y)) for x, y in batches]
        self.count = 0

    @classmethod
    def of(cls, setup: Setup) -> JaxRunner:
        return cls(setup.workload, setup.cfg, setup.params, setup.batches, setup.layer_state)

    def call(self):
        x, y = self.batches[self.count % NUM_BATCHES]
        self.count += 1
        value, self.params, self.opt_state = self.jax_step(self.params, self.opt_state, x, y)
        return value

    step = call

    @staticmethod
    def last_loss(value) -> float:
        return float(np.asarray(value))

    def memory_analysis(self) -> dict | None:
        x, y = self.batches[0]
        try:  # lowers and compiles the step once more (jit's own executable is not exposed)
            from kaun_ir.runtime.xla import compiler

            compiled = self.jax_step.lower(self.params, self.opt_state, x, y).compile()
            return compiler.memory_stats_dict(compiled.memory_analysis())
        except Exception:
            return None


# ------------------------------------------------------------------------------ PyTorch eager


def torch_status() -> tuple[bool, str]:
    """``(available, description)``: whether ``import torch`` works, and its version, wheel
    (CPU-only or CUDA) and thread count or the reason it does not."""
    try:
        import torch
    except Exception as err:  # ImportError, or a broken installation
        return False, f"skipped: import torch failed ({type(err).__name__}: {err}); install kaun-ir[bench]"
    return True, f"{torch_wheel()}, {torch.get_num_threads()} threads"


class TorchRunner:
    """PyTorch eager: the workload's ``torch_forward`` over the same weights (leaf tensors in
    kaun_ir's parameter tree), ``F.cross_entropy``, ``backward`` and ``torch.optim.Adam`` /
    ``AdamW`` with optax's hyper-parameters (betas 0.9/0.999, eps 1e-8; AdamW's decoupled decay
    ``p *= 1 - lr * wd`` equals optax's ``p -= lr * wd * p``, applied to every parameter as in
    optax without a mask)."""

    name = "torch"
    steps_per_call = 1

    def __init__(self, setup: Setup):
        import torch
        import torch.nn.functional as F

        from kaun_ir import tree

        workload, cfg = setup.workload, setup.cfg
        spec = workload.optimizer
        paths = [path for path, _ in tree.paths(setup.params)]
        leaves, treedef = tree.flatten(setup.params)
        trained = [not trains_lora_only(spec) or path.startswith("lora.") for path in paths]
        self.leaves = [torch.tensor(np.array(a), requires_grad=t) for a, t in zip(leaves, trained)]
        self.params = tree.unflatten(treedef, self.leaves)
        optimised = [leaf for leaf, t in zip(self.leaves, trained) if t]
        if spec[0] == "adam":
            self.opt = torch.optim.Adam(optimised, lr=spec[1], betas=(0.9, 0.999), eps=1e-8)
        else:
            self.opt = torch.optim.AdamW(
                optimised, lr=spec[1], betas=(0.9, 0.999), eps=1e-8, weight_decay=spec[2]
            )

        def as_torch(a):  # integer ids and labels as int64, what embedding / cross_entropy take
            return torch.from_numpy(a.astype(np.int64) if a.dtype.kind in "iu" else np.array(a))

        self.batches = [(as_torch(x), as_torch(y)) for x, y in setup.batches]
        if workload.stateful:  # running statistics, updated in place by the forward
            state_leaves, state_def = tree.flatten(setup.layer_state)
            self.layer_state = tree.unflatten(state_def, [torch.tensor(np.array(a)) for a in state_leaves])
            self.forward = lambda x: workload.torch_forward(self.params, x, cfg, state=self.layer_state)
        else:
            self.forward = lambda x: workload.torch_forward(self.params, x, cfg)
        self.cross_entropy = F.cross_entropy
        self.count = 0

    def call(self):
        x, y = self.batches[self.count % NUM_BATCHES]
        self.count += 1
        self.opt.zero_grad(set_to_none=True)
        logits = self.forward(x)
        value = self.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        value.backward()
        self.opt.step()
        return value.detach()

    @staticmethod
    def last_loss(value) -> float:
        return float(value)

    def memory_analysis(self) -> dict | None:
        return None  # no XLA executable


# ------------------------------------------------------------------------------ torch.compile


def torch_wheel() -> str:
    """Which PyTorch build runs: its version and whether it is a CPU-only or a CUDA wheel (a CUDA
    wheel on a machine without a GPU still runs on the CPU, with other kernels and threads)."""
    try:
        import torch
    except Exception as err:  # ImportError, or a broken installation
        return f"no torch ({type(err).__name__})"
    cuda = getattr(torch.version, "cuda", None)
    return f"torch {torch.__version__} ({'CUDA ' + cuda if cuda else 'CPU-only'} wheel)"


class TorchCompileRunner(TorchRunner):
    """``torch.compile`` of the same PyTorch step: the forward + loss compiled as one function
    (its backward compiled by AOTAutograd alongside) and ``opt.step`` compiled as another, both
    with the default inductor backend (C++/OpenMP kernels on the CPU). The compilation happens
    in the first call, so it is part of the first step."""

    name = "torch.compile"

    def __init__(self, setup: Setup):
        import torch

        super().__init__(setup)
        forward, cross_entropy, opt = self.forward, self.cross_entropy, self.opt

        def loss_of(x, y):
            logits = forward(x)
            return cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

        def opt_step():
            opt.step()

        self.loss_of = torch.compile(loss_of)
        self.opt_step = torch.compile(opt_step)

    def call(self):
        x, y = self.batches[self.count % NUM_BATCHES]
        self.count += 1
        self.opt.zero_grad(set_to_none=True)
        value = self.loss_of(x, y)
        value.backward()
        self.opt_step()
        return value.detach()
