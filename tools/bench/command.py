"""``kaun-ir bench``: training-step throughput of kaun_ir against a hand-written JAX + optax step
(and PyTorch eager when ``torch`` is importable).

Implementations, all in one process and started from the same NumPy-generated weights, trained
on the same fixed synthetic batches (8, cycled step by step) with the same optimiser:

- ``kaun_ir``: ``train.step``, one executable call per step (state donated);
- ``kaun_ir[K=k]``: ``k`` steps fused in one executable (a ``while`` loop, as
  ``train.fit(..., steps_per_call=k)``) on a device-resident block of ``k`` stacked batches;
  ``--steps-per-call`` (0 leaves the row out; ``--steps`` must be a multiple of it);
- ``kaun_ir[bfloat16]``, ``kaun_ir[float16]``, ``kaun_ir[remat=nothing]``, ``kaun_ir[remat=dots]``
  (``--variant``, repeatable, none by default): ``kaun_ir`` trained with
  ``train.make(..., precision=...)`` or ``train.make(..., remat=...)`` (docs/memory.md); their
  losses must agree with JAX's within ``MIXED_LOSS_RTOL`` (5e-2, products in 8 / 11 mantissa bits)
  or ``LOSS_RTOL`` (rematerialisation does not change the arithmetic);
- ``kaun_ir[closure]`` (``--variant closure``): the path a user's loop writes, the Kaun closure
  form: ``train.make`` without ``loss=`` and ``train.step(trainer, st, x, lambda logits:
  loss.cross_entropy_sparse(logits, y))`` with a new closure every step over the batch's labels
  (device arrays); the same executable as ``kaun_ir`` plus the closure's inspection per call;
- ``kaun_ir[roll]`` (``--variant roll``): the transformers built with
  ``layer.sequential(..., roll=True)``, their decoder blocks one ``scan`` over stacked
  parameters (docs/loops.md); loss within ``LOSS_RTOL``. Workloads without repeated blocks
  train exactly as ``kaun_ir``;
- ``jax``: the reference, ``jax.jit`` of the whole step (forward, ``jax.grad``, optax update)
  with parameters and optimiser state donated;
- ``torch``: PyTorch eager, ``torch.optim.Adam`` / ``AdamW`` with optax's hyper-parameters and
  PyTorch's default (per-parameter loop) optimiser implementation and thread count. Left out,
  with a line saying so, when ``import torch`` fails (``pip install kaun-ir[bench]``).

Measured per workload (``--workload``, default all):

1. *first step*: building a fresh instance (weights to the device, optimiser state) + trace +
   compile + the first finished call (for ``kaun_ir[K]`` that call runs ``k`` steps). With
   ``--memory`` (the default) it is taken in the fresh child process of 4., where that
   compilation is the first of its kind in the process (every child first builds the same host
   data, which warms up XLA alike for kaun_ir and JAX); with ``--no-memory``, in the bench
   process, with the order of the implementations rotated from workload to workload. The JSON
   keeps both (``first_step_child_s``, ``first_step_in_process_s``).
2. ``--steps`` (N) steps each, the first included; the losses after N steps must agree with
   JAX's within a relative tolerance: ``LOSS_RTOL`` (1e-4) for ``kaun_ir`` (the same XLA
   kernels as the JAX step), ``TORCH_LOSS_RTOL`` (1e-3) for PyTorch (other kernels, other
   rounding) and ``FUSED_LOSS_RTOL`` (1e-3) for ``kaun_ir[K]`` (XLA compiles some ops inside a
   loop to other kernels: on CPU the convolutions of the CNN, in JAX's own ``fori_loop`` too).
   Rounding differences grow over the steps (Adam amplifies them; the CNN's trajectories of
   different kernels are ~1e-2 apart after 100 steps), so the check is meant for modest N.
3. ``--rounds`` alternating rounds of N steps per implementation (rotated order as above);
   *steps/s* is the median over the rounds (each round blocks on its last loss), *ratio vs JAX*
   is steps/s over JAX's steps/s.
4. *peak memory* (``--memory``, the default; ``--no-memory`` skips it): every implementation
   runs again in a fresh child process that imports everything, builds the host data (initial
   weights, batches), hands freed heap back to the OS (``malloc_trim``) and records its
   resident set size (RSS). It then builds and compiles its step and runs one call (the peak
   RSS of this phase minus that RSS, compiler working memory included, is
   ``compile_peak_bytes`` in the JSON), trims again, resets the kernel's peak-RSS counter
   (``/proc/self/clear_refs``) and runs ``MEMORY_CALLS`` more calls. **Peak memory** is the
   peak RSS of that last phase minus the RSS before building: what the implementation holds
   and touches while it trains (weights, optimiser state, its device-resident batches — ``k``
   stacked ones for ``kaun_ir[K]`` —, compiled code, runtime caches, per-step temporaries),
   measured the same way for kaun_ir, JAX and PyTorch. For the XLA implementations the JSON
   adds XLA's compiled memory analysis of the step executable (``xla.total_bytes = argument +
   output + temp - alias``), also shown in the footer. Needs Linux's ``/proc``; n/a elsewhere.
5. *GFLOP/s*: the step's FLOPs (kaun_ir's cost model over the optimised step graph, one count
   for every row of a workload) times steps/s. Once per run, before the workloads
   (``--matmul``, the default), XLA's own 1024^3 float32 matmul through kaun_ir's runtime and
   ``torch.mm`` are timed; the footer sets the steps' GFLOP/s against them
   (``kaun_ir.tools.bench.flops``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

from kaun_ir.tools.bench import compile as bench_compile
from kaun_ir.tools.bench import flops as bench_flops
from kaun_ir.tools.bench.workloads import WORKLOADS, Workload, initial_params

LOSS_RTOL = 1e-4
#: PyTorch vs JAX: other kernels, other float rounding (see the module docstring)
TORCH_LOSS_RTOL = 1e-3
#: kaun_ir[K] vs JAX: XLA may pick other kernels for ops inside the fused loop (on CPU a
#: convolution in a ``while`` body is compiled differently, in JAX's own ``fori_loop`` too)
FUSED_LOSS_RTOL = 1e-3
#: kaun_ir[bfloat16] / kaun_ir[float16] vs JAX in float32: products in 8 / 11 mantissa bits
MIXED_LOSS_RTOL = 5e-2
#: ``--variant`` rows: kaun_ir trained with ``train.make(..., precision=...)`` or ``remat=...``,
#: the closure form, or the model's repeated blocks rolled into a loop (``roll``)
VARIANTS = ("bfloat16", "float16", "remat=nothing", "remat=dots", "closure", "roll")
SEED = 0
#: distinct fixed batches, cycled step by step (one batch alone is memorised within ~20 steps,
#: after which the loss is ~1e-4 and a relative comparison of it measures nothing)
NUM_BATCHES = 8
#: default ``--steps-per-call``: a multiple of NUM_BATCHES, so one device-resident block of
#: batches serves every call
#: seconds of idle time before each timed run (see bench_workload)
PAUSE_S = 0.02
#: calls measured for the training-phase peak memory (after the first)
MEMORY_CALLS = 3
#: a child process' result line starts with this
_CHILD_TAG = "kaun-ir-bench-child:"


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "bench",
        help="training-step speed of kaun_ir vs JAX + optax (and PyTorch)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-w",
        "--workload",
        action="append",
        default=None,
        help=f"workload(s), repeatable or comma-separated: {', '.join(WORKLOADS)} (default: all)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="steps per round, N (default: per workload, "
        + ", ".join(f"{w.name} {w.steps}" for w in WORKLOADS.values())
        + ")",
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default: %(default)s)")
    parser.add_argument(
        "--steps-per-call",
        type=int,
        default=None,
        metavar="K",
        help="the kaun_ir[K] row: K steps fused per executable call; 0 leaves it out "
        "(default: per workload, "
        + ", ".join(f"{w.name} {w.steps_per_call}" for w in WORKLOADS.values())
        + ")",
    )
    parser.add_argument(
        "--memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure peak memory (and first step) in a fresh child process per implementation (default: on)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=None,
        choices=VARIANTS,
        help="add a kaun_ir[VARIANT] row: mixed precision (train.make(precision=...)), "
        "rematerialisation (train.make(remat=...)), the closure form of the loss (closure) or "
        "the transformers' blocks rolled into a loop (roll: layer.sequential(roll=True)); "
        "repeatable",
    )
    parser.add_argument(
        "--matmul",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"time XLA's {bench_flops.MATMUL_N}^3 float32 matmul through kaun_ir's runtime (and "
        "torch.mm) once, to compare the steps' GFLOP/s with (default: on)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="instead of throughput: the time to the first step, per compilation stage, "
        "against JAX's (see kaun_ir.tools.bench.compile)",
    )
    parser.add_argument(
        "--layers",
        default=",".join(map(str, bench_compile.DEFAULT_LAYERS)),
        metavar="N,N,..",
        help="with --compile: also the transformer at these depths (default: %(default)s; '' for none)",
    )
    # tiny sizes of every workload, for the tests (not a benchmark)
    parser.add_argument("--small", action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(run=run)


def parse_workloads(values: list[str] | None) -> list[str]:
    """``["mlp,cnn", "transformer"]`` -> ``["mlp", "cnn", "transformer"]``; None -> all."""
    if not values:
        return list(WORKLOADS)
    names = [name.strip() for value in values for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    return names


def block_name(steps_per_call: int) -> str:
    """The implementation name of the fused row: ``kaun_ir[K=16]``."""
    return f"kaun_ir[K={steps_per_call}]"


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


# ------------------------------------------------------------------------------ kaun_ir side


def _kaun_optimizer(spec: tuple):
    from kaun_ir import optim

    if spec[0] == "adam":
        return optim.adam(spec[1])
    return optim.adamw(spec[1], weight_decay=spec[2])


def _kaun_trainer(setup: Setup, variant: str | None = None):
    from kaun_ir import train
    from kaun_ir.nn import loss

    options = {}
    if variant == "roll":  # the transformers' decoder blocks as one scan (other models: no runs)
        return train.make(
            setup.workload.kaun_model({**setup.cfg, "roll": True}),
            _kaun_optimizer(setup.workload.optimizer),
            loss=loss.cross_entropy_sparse,
        )
    if variant == "closure":  # the Kaun closure form: no loss=, a loss closure per step
        return train.make(setup.workload.kaun_model(setup.cfg), _kaun_optimizer(setup.workload.optimizer))
    if variant in ("bfloat16", "float16"):
        options["precision"] = variant
    elif variant is not None:
        options["remat"] = variant.split("=", 1)[1]
    # explicit targets: the labels are an input of the one shared executable
    return train.make(
        setup.workload.kaun_model(setup.cfg),
        _kaun_optimizer(setup.workload.optimizer),
        loss=loss.cross_entropy_sparse,
        **options,
    )


def _kaun_state(trainer, setup: Setup):
    """A training state holding ``setup.params`` on the device."""
    from kaun_ir import layer, train, tree
    from kaun_ir.runtime.xla import backend, transfer

    device = backend.default_device()

    def on_device(t):
        leaves, treedef = tree.flatten(t)
        return tree.unflatten(treedef, [transfer.to_device(np.array(a), a.dtype, device) for a in leaves])

    fresh = layer.with_state(
        layer.with_params(setup.fresh, on_device(setup.params)), on_device(setup.layer_state)
    )
    return train.make_state(trainer, fresh)


class KaunRunner:
    """kaun_ir: ``train.make`` + ``train.step`` over the device-resident batches (state donated
    step to step)."""

    name = "kaun_ir"
    steps_per_call = 1

    def __init__(self, setup: Setup, variant: str | None = None):
        from kaun_ir import train
        from kaun_ir.runtime.xla import backend, transfer

        if variant is not None:
            self.name = variant_name(variant)
        self.trainer = _kaun_trainer(setup, variant)
        self.state = _kaun_state(self.trainer, setup)
        device = backend.default_device()
        self.batches = [
            (transfer.to_device(x, x.dtype, device), transfer.to_device(y, y.dtype, device))
            for x, y in setup.batches
        ]
        self.count = 0
        self._step = train.step
        self._closure = variant == "closure"

    def call(self):
        x, y = self.batches[self.count % NUM_BATCHES]
        self.count += 1
        if self._closure:  # as a user's loop writes it: a new closure over the batch's labels
            value, self.state = self._step(self.trainer, self.state, x, _closure_loss(y))
        else:
            value, self.state = self._step(self.trainer, self.state, x, y)
        return value

    @staticmethod
    def last_loss(value) -> float:
        return float(np.asarray(value))

    def memory_analysis(self) -> dict | None:
        return _kaun_memory_analysis(self.trainer.cache.step)


def _closure_loss(y):
    """``lambda logits: loss.cross_entropy_sparse(logits, y)``: the closure form's loss, holding
    the batch's labels (a device array) in its closure."""
    from kaun_ir.nn import loss

    return lambda logits: loss.cross_entropy_sparse(logits, y)


def _kaun_memory_analysis(compiled) -> dict | None:
    """XLA's memory analysis of the trainer's compiled step or block (``trainer.cache.step`` /
    ``.block``); None when unavailable."""
    # one executable per signature; the bench compiles exactly one
    executables = compiled.executables() if compiled is not None else []
    if len(executables) != 1:
        return None
    return executables[0].memory_analysis()


class KaunBlockRunner:
    """kaun_ir with ``k`` steps per executable call (``train.steps``) on device-resident
    blocks of ``k`` stacked batches, following the same cycle of batches as the other rows."""

    def __init__(self, setup: Setup, steps_per_call: int):
        from kaun_ir import train
        from kaun_ir.runtime.xla import backend, transfer

        self._train = train

        k = self.steps_per_call = steps_per_call
        self.name = block_name(k)
        self.trainer = _kaun_trainer(setup)
        self.state = _kaun_state(self.trainer, setup)
        device = backend.default_device()
        # block c starts at batch (c * k) % NUM_BATCHES; only distinct starts are stored
        self.blocks = {}
        for start in sorted({(c * k) % NUM_BATCHES for c in range(NUM_BATCHES)}):
            picked = [setup.batches[(start + j) % NUM_BATCHES] for j in range(k)]
            xs, ys = (np.stack(column) for column in zip(*picked))
            self.blocks[start] = (
                transfer.to_device(xs, xs.dtype, device),
                transfer.to_device(ys, ys.dtype, device),
            )
        self.count = 0

    def call(self):
        xs, ys = self.blocks[(self.count * self.steps_per_call) % NUM_BATCHES]
        self.count += 1
        losses, self.state = self._train.steps(self.trainer, self.state, xs, ys)
        return losses

    @staticmethod
    def last_loss(value) -> float:
        return float(np.asarray(value)[-1])

    def memory_analysis(self) -> dict | None:
        return _kaun_memory_analysis(self.trainer.cache.block)


# ------------------------------------------------------------------------------ JAX reference


def _jax_optax_optimizer(spec: tuple):
    import optax

    if spec[0] == "adam":
        return optax.adam(spec[1])
    return optax.adamw(spec[1], weight_decay=spec[2])


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

    def step(params, opt_state, x, y):
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
    """``(available, description)``: whether ``import torch`` works, and its version and
    thread count or the reason it does not."""
    try:
        import torch
    except Exception as err:  # ImportError, or a broken installation
        return False, f"skipped: import torch failed ({type(err).__name__}: {err}); install kaun-ir[bench]"
    return True, f"torch {torch.__version__}, {torch.get_num_threads()} threads"


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
        leaves, treedef = tree.flatten(setup.params)
        self.leaves = [torch.tensor(np.array(a), requires_grad=True) for a in leaves]
        self.params = tree.unflatten(treedef, self.leaves)
        spec = workload.optimizer
        if spec[0] == "adam":
            self.opt = torch.optim.Adam(self.leaves, lr=spec[1], betas=(0.9, 0.999), eps=1e-8)
        else:
            self.opt = torch.optim.AdamW(
                self.leaves, lr=spec[1], betas=(0.9, 0.999), eps=1e-8, weight_decay=spec[2]
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


def make_runner(impl: str, setup: Setup, steps_per_call: int = 0):
    """A fresh runner of implementation ``impl`` (``kaun_ir``, ``kaun_ir[K=..]``, ``jax``,
    ``torch``)."""
    if impl == "kaun_ir":
        return KaunRunner(setup)
    if impl == "jax":
        return JaxRunner.of(setup)
    if impl == "torch":
        return TorchRunner(setup)
    if impl == block_name(steps_per_call) and steps_per_call > 0:
        return KaunBlockRunner(setup, steps_per_call)
    for variant in VARIANTS:
        if impl == variant_name(variant):
            return KaunRunner(setup, variant)
    raise ValueError(f"unknown implementation {impl!r}")


def variant_name(variant: str) -> str:
    """The implementation name of a ``--variant`` row: ``kaun_ir[bfloat16]``."""
    return f"kaun_ir[{variant}]"


def implementations(steps_per_call: int, torch: bool, variants: tuple = ()) -> list[str]:
    """The rows of one workload, in table order."""
    names = ["kaun_ir"] + [variant_name(v) for v in variants]
    if steps_per_call > 0:
        names.append(block_name(steps_per_call))
    names.append("jax")
    if torch:
        names.append("torch")
    return names


# ------------------------------------------------------------------------------ memory (child)


def _proc_status() -> dict:
    """``VmRSS`` and ``VmHWM`` (peak RSS) of this process in bytes, from ``/proc/self/status``."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024  # "123 kB"
    return out


def _reset_peak() -> None:
    """Reset the kernel's peak-RSS counter (VmHWM) to the current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _trim_heap() -> None:
    """Collect garbage and hand freed heap back to the OS (glibc ``malloc_trim``), so the RSS
    reflects live memory rather than what an earlier phase left in the allocator's free lists."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _block(value) -> None:
    np.asarray(value)  # waits for the result (XLA dispatch is asynchronous)


def measure_here(
    name: str, impl: str, small: bool, steps_per_call: int = 0, calls: int = MEMORY_CALLS
) -> dict:
    """In this (fresh) process: build implementation ``impl`` of workload ``name``, time its
    first step and measure its memory (see the module docstring). Returns a dict of byte counts
    and seconds."""
    if impl == "torch":
        import torch  # imported before the baseline, like jax for the others

        torch.ones(2, requires_grad=True).square().sum().backward()  # autograd warmed up
    else:
        import jax
        import optax  # noqa: F401

        # the XLA client exists, and both jit machineries have run once, before the baseline:
        # Setup below compiles kaun_ir's layer init, so JAX's tracing and lowering get the same
        # warm start (each side's first *step* compile is what is timed)
        jax.jit(jax.grad(lambda v: (v * v).sum()))(np.ones(2, np.float32)).block_until_ready()
    setup = Setup(name, small)
    _trim_heap()
    before = _proc_status()["VmRSS"]
    _reset_peak()
    start = time.perf_counter()
    runner = make_runner(impl, setup, steps_per_call)
    _block(runner.call())
    first = time.perf_counter() - start
    compile_peak = _proc_status()["VmHWM"] - before
    _trim_heap()
    _reset_peak()
    for _ in range(calls):
        _block(runner.call())
    status = _proc_status()
    return {
        "peak_bytes": status["VmHWM"] - before,
        "compile_peak_bytes": compile_peak,
        "rss_before_bytes": before,
        "first_step_s": first,
        "xla": runner.memory_analysis(),
    }


def _child_main(spec_json: str) -> None:
    """Entry point of the child process: measure, print one tagged JSON line."""
    spec = json.loads(spec_json)
    result = measure_here(
        spec["workload"], spec["impl"], spec["small"], spec["steps_per_call"], spec["calls"]
    )
    print(_CHILD_TAG + json.dumps(result), flush=True)


def measure_in_child(
    name: str,
    impl: str,
    small: bool,
    steps_per_call: int = 0,
    calls: int = MEMORY_CALLS,
    timeout: float = 900,
) -> dict:
    """:func:`measure_here` in a fresh Python process; ``{"error": reason}`` when it fails."""
    if not (os.path.exists("/proc/self/status") and os.path.exists("/proc/self/clear_refs")):
        return {"error": "no /proc/self/status and clear_refs (Linux only)"}
    spec = {"workload": name, "impl": impl, "small": small, "steps_per_call": steps_per_call, "calls": calls}
    return run_child("kaun_ir.tools.bench.command", spec, _CHILD_TAG, timeout)


def run_child(module: str, spec: dict, tag: str, timeout: float) -> dict:
    """``module._child_main(json spec)`` in a fresh Python process; the dict it prints after ``tag``,
    or ``{"error": reason}`` when it fails or times out."""
    code = f"import sys; from {module} import _child_main; _child_main(sys.argv[1])"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, json.dumps(spec)], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(tag):
            return json.loads(line[len(tag) :])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"child exited with {proc.returncode}: {tail}"}


# ------------------------------------------------------------------------------ measuring


def _run_calls(runner, calls: int) -> float:
    """``calls`` calls, blocking on the last; returns the last step's loss."""
    value = None
    for _ in range(calls):
        value = runner.call()
    return runner.last_loss(value)


def _rotated(items: list, by: int) -> list:
    by %= max(len(items), 1)
    return items[by:] + items[:by]


def bench_workload(
    name: str,
    steps: int,
    rounds: int,
    small: bool = False,
    steps_per_call: int = 0,
    memory: bool = False,
    torch: bool | None = None,
    order: int = 0,
    variants: tuple = (),
) -> dict:
    """Benchmark one workload (see the module docstring); returns a result dict.

    ``small``: the tiny test sizes; ``steps_per_call``: K of the fused row (0: no such row;
    ``steps`` must be a multiple of it); ``memory``: child-process memory and first-step
    measurement; ``torch``: include PyTorch (None: when importable); ``order``: how far the
    order of the implementations is rotated (the CLI passes the workload's index)."""
    if steps < 1 or rounds < 0 or steps_per_call < 0:
        raise ValueError("steps must be >= 1, rounds >= 0 and steps_per_call >= 0")
    if steps_per_call and steps % steps_per_call:
        raise ValueError(f"steps ({steps}) must be a multiple of steps_per_call ({steps_per_call})")
    torch_ok, torch_line = torch_status()
    if torch is None:
        torch = torch_ok
    elif torch and not torch_ok:
        raise RuntimeError(torch_line)
    setup = Setup(name, small)
    names = implementations(steps_per_call, torch, tuple(variants))
    entries: dict[str, dict] = {impl: {} for impl in names}  # in table order
    schedule = _rotated(names, order)
    runners = {}

    for impl in schedule:
        entry = entries[impl]
        start = time.perf_counter()
        runner = runners[impl] = make_runner(impl, setup, steps_per_call)
        first_loss = _run_calls(runner, 1)
        entry["first_step_in_process_s"] = time.perf_counter() - start
        entry["steps_per_call"] = runner.steps_per_call
        entry["first_call_loss"] = first_loss
        more = steps // runner.steps_per_call - 1
        entry["loss_after_steps"] = _run_calls(runner, more) if more else first_loss
        entry["steps_per_s_rounds"] = []
    for round_ in range(rounds):
        # each round starts with another implementation, and every timed run starts after a
        # short pause: PyTorch's OpenMP workers keep spinning for a while after its steps end,
        # which would otherwise slow whatever always ran right after it
        for impl in _rotated(schedule, round_):
            runner = runners[impl]
            time.sleep(PAUSE_S)
            start = time.perf_counter()
            _run_calls(runner, steps // runner.steps_per_call)
            entries[impl]["steps_per_s_rounds"].append(steps / (time.perf_counter() - start))
    flops = bench_flops.step_flops(runners["kaun_ir"]) if "kaun_ir" in runners else None
    del runners  # free the arrays before any child process runs

    for entry in entries.values():
        entry["steps_per_s"] = statistics.median(entry["steps_per_s_rounds"]) if rounds else None
        entry["gflops"] = flops * entry["steps_per_s"] / 1e9 if flops and rounds else None
    ref = entries["jax"]
    for impl, entry in entries.items():
        entry["ratio_vs_jax"] = entry["steps_per_s"] / ref["steps_per_s"] if rounds else None
        a, b = entry["loss_after_steps"], ref["loss_after_steps"]
        entry["loss_rel_diff_vs_jax"] = abs(a - b) / max(abs(b), 1e-30)
        entry["loss_rtol"] = {
            "torch": TORCH_LOSS_RTOL,
            "jax": LOSS_RTOL,
            "kaun_ir": LOSS_RTOL,
            variant_name("bfloat16"): MIXED_LOSS_RTOL,
            variant_name("float16"): MIXED_LOSS_RTOL,
            variant_name("remat=nothing"): LOSS_RTOL,
            variant_name("remat=dots"): LOSS_RTOL,
            variant_name("closure"): LOSS_RTOL,
            variant_name("roll"): LOSS_RTOL,
        }.get(impl, FUSED_LOSS_RTOL)
        entry["loss_agrees"] = bool(entry["loss_rel_diff_vs_jax"] <= entry["loss_rtol"])
        entry["memory"] = None
        entry["first_step_child_s"] = None
    if memory:
        for impl in schedule:
            measured = measure_in_child(name, impl, small, steps_per_call)
            entries[impl]["memory"] = measured
            entries[impl]["first_step_child_s"] = measured.get("first_step_s")
    for entry in entries.values():
        child = entry["first_step_child_s"]
        entry["first_step_s"] = child if child is not None else entry["first_step_in_process_s"]
        peak = (entry["memory"] or {}).get("peak_bytes")
        ref_peak = (ref["memory"] or {}).get("peak_bytes")
        entry["peak_memory_bytes"] = peak
        entry["peak_memory_ratio_vs_jax"] = peak / ref_peak if peak is not None and ref_peak else None

    return {
        "workload": name,
        "description": setup.workload.description,
        "steps": steps,
        "rounds": rounds,
        "steps_per_call": steps_per_call,
        "small": small,
        "memory": memory,
        "gflop_per_step": flops / 1e9 if flops else None,
        "order": schedule,
        "torch": torch_line if torch or not torch_ok else "not run (torch=False)",
        "implementations": entries,
        "losses_agree": all(entry["loss_agrees"] for entry in entries.values()),
    }


# ------------------------------------------------------------------------------ output


def _fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _fmt_bytes(value: float | None) -> str:
    if value is None:
        return "n/a"
    mib = value / 2**20
    return f"{mib:.0f} MiB" if abs(mib) >= 100 else f"{mib:.1f} MiB"


def _fmt_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:.0f} ms" if value < 1 else f"{value:.2f} s"


def _fmt_gflops(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_table(results: list[dict]) -> str:
    """A Markdown table: one row per workload and implementation."""
    lines = [
        "| workload | implementation | steps/s | first step | peak memory | N | loss after N | "
        "ratio vs JAX | GFLOP/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for impl, entry in r["implementations"].items():
            ratio = "" if entry["ratio_vs_jax"] is None else f"{entry['ratio_vs_jax']:.2f}"
            loss = f"{entry['loss_after_steps']:.6g}" + ("" if entry["loss_agrees"] else " (!)")
            lines.append(
                f"| {r['workload']} | {impl} | {_fmt_rate(entry['steps_per_s'])} | "
                f"{_fmt_seconds(entry['first_step_s'])} | "
                f"{_fmt_bytes(entry['peak_memory_bytes'])} | {r['steps']} | {loss} | {ratio} | "
                f"{_fmt_gflops(entry.get('gflops'))} |"
            )
    return "\n".join(lines)


def format_footer(results: list[dict], matmul: dict | None = None) -> str:
    """Per workload: loss agreement, peak memory relative to JAX's and XLA's memory analysis;
    the matmul microbenchmark against the steps' GFLOP/s; then what the columns mean."""
    lines = []
    for r in results:
        entries = r["implementations"]
        others = [impl for impl in entries if impl != "jax"]
        diffs = ", ".join(f"{impl} {entries[impl]['loss_rel_diff_vs_jax']:.1e}" for impl in others)
        bad = [impl for impl in others if not entries[impl]["loss_agrees"]]
        verdict = f"DISAGREE: {', '.join(bad)}" if bad else "agree"
        line = f"{r['workload']}: losses after {r['steps']} steps vs JAX {diffs} ({verdict})"
        ratios = [
            f"{impl} {entries[impl]['peak_memory_ratio_vs_jax']:.2f}x"
            for impl in others
            if entries[impl]["peak_memory_ratio_vs_jax"] is not None
        ]
        if ratios:
            line += f"; peak memory vs JAX {', '.join(ratios)}"
        xla = [
            f"{impl} {_fmt_bytes(e['memory']['xla']['total_bytes'])}"
            for impl, e in entries.items()
            if (e["memory"] or {}).get("xla")
        ]
        if xla:
            line += f"; XLA buffers {', '.join(xla)}"
        errors = [
            f"{impl}: {e['memory']['error']}"
            for impl, e in entries.items()
            if (e["memory"] or {}).get("error")
        ]
        if errors:
            line += f"; memory n/a ({'; '.join(errors)})"
        lines.append(line)
    lines.append(
        f"relative loss tolerances: kaun_ir {LOSS_RTOL:.0e}, kaun_ir[K] {FUSED_LOSS_RTOL:.0e}, "
        f"torch {TORCH_LOSS_RTOL:.0e}, kaun_ir[bfloat16|float16] {MIXED_LOSS_RTOL:.0e}, "
        f"kaun_ir[remat=...|closure] {LOSS_RTOL:.0e}. "
        "steps/s: median of the rounds; ratio: steps/s over JAX's."
    )
    where = (
        "in a fresh process"
        if any(r["memory"] for r in results)
        else "in this process, implementation order rotated per workload"
    )
    lines.append(
        f"first step: build + trace + compile + first finished call (K steps for kaun_ir[K]) {where}."
    )
    if any(r["memory"] for r in results):
        lines.append(
            "peak memory: peak RSS while training (after the first call) minus RSS before building, "
            "a fresh process per implementation."
        )
    else:
        lines.append("peak memory: not measured (--no-memory).")
    lines.append(
        "GFLOP/s: the step's FLOPs (kaun_ir's cost model over the optimised step graph, the same "
        "count for every row) times steps/s."
    )
    matmul_line = bench_flops.format_line(matmul, results)
    if matmul_line:
        lines.append(matmul_line)
    lines.append(f"PyTorch: {results[0]['torch'] if results else torch_status()[1]}")
    return "\n".join(lines)


def run(args) -> int:
    import kaun_ir as kn

    try:
        names = parse_workloads(args.workload)
    except ValueError as err:
        print(f"kaun-ir bench: {err}")
        return 2
    if args.compile:
        try:
            layers = tuple(int(n) for n in args.layers.split(",") if n.strip())
        except ValueError:
            print(f"kaun-ir bench: --layers wants comma-separated integers, got {args.layers!r}")
            return 2
        if any(n < 1 for n in layers):
            print("kaun-ir bench: --layers must be positive")
            return 2
        return bench_compile.run(names, layers, args.small, args.json)
    plan = []
    for name in names:
        w = WORKLOADS[name]
        steps = w.steps if args.steps is None else args.steps
        k = w.steps_per_call if args.steps_per_call is None else args.steps_per_call
        if k and steps % k:
            if args.steps is None:
                steps = -(-steps // k) * k  # the default N rounded up to a multiple of an explicit K
            elif args.steps_per_call is None:
                k = 0  # an explicit N that the workload's default K does not divide: no fused row
        if steps < 1 or args.rounds < 0 or k < 0:
            print("kaun-ir bench: --steps must be >= 1, --rounds >= 0 and --steps-per-call >= 0")
            return 2
        if k and steps % k:
            print(
                f"kaun-ir bench: --steps ({steps}) must be a multiple of --steps-per-call ({k}); "
                "--steps-per-call 0 leaves the fused row out"
            )
            return 2
        plan.append((name, steps, k))
    matmul = None
    if args.matmul and args.rounds:
        matmul = bench_flops.matmul_rates(
            bench_flops.MATMUL_SMALL_N if args.small else bench_flops.MATMUL_N, torch=torch_status()[0]
        )
    results = []
    for i, (name, steps, k) in enumerate(plan):
        if sys.stderr.isatty():  # a full run takes minutes: say where it is
            sys.stderr.write(f"\rkaun-ir bench: {name} ({i + 1}/{len(names)})...\033[K")
            sys.stderr.flush()
        results.append(
            bench_workload(
                name,
                steps,
                args.rounds,
                small=args.small,
                steps_per_call=k,
                memory=args.memory,
                order=i,
                variants=tuple(args.variant or ()),
            )
        )
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
    ok = all(r["losses_agree"] for r in results)
    if args.json:
        print(
            json.dumps(
                {
                    "backend": kn.runtime.backend_name(),
                    "loss_rtol": LOSS_RTOL,
                    "torch_loss_rtol": TORCH_LOSS_RTOL,
                    "torch": torch_status()[1],
                    "matmul": matmul,
                    "results": results,
                    "ok": ok,
                },
                indent=1,
            )
        )
        return 0 if ok else 1
    print(
        f"kaun_ir {kn.__version__} on XLA '{kn.runtime.backend_name()}': {args.rounds} alternating "
        f"rounds of N steps per implementation\n"
    )
    for r in results:
        print(f"- {r['workload']}: {r['description']}")
    print()
    print(format_table(results))
    print()
    print(format_footer(results, matmul))
    return 0 if ok else 1
