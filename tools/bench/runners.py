"""The rows of ``kaun-ir bench``: kaun_ir's runners (``train.step``, ``train.steps`` blocks and the
``--variant`` rows), their names, and :func:`make_runner`, which builds any row, the references
of :mod:`.reference` included.

A runner has a ``name``, ``steps_per_call``, ``call()`` (one executable call, returning its loss
without waiting for it), ``last_loss(value)`` (that loss as a float, waiting) and
``memory_analysis()`` (XLA's analysis of its executable, or None).
"""

from __future__ import annotations

import numpy as np

from kaun_ir.tools.bench.reference import JaxRunner, TorchCompileRunner, TorchRunner
from kaun_ir.tools.bench.workloads import NUM_BATCHES, Setup

#: ``--variant`` rows: kaun_ir trained with ``train.make(..., precision=...)`` or ``remat=...``,
#: the closure form, or the model's repeated blocks rolled into a loop (``roll``)
VARIANTS = (
    "bfloat16",
    "float16",
    "remat=nothing",
    "remat=dots",
    "closure",
    "roll",
    "user",
    "user-closure",
    "iree",
)
#: the user-loop rows: ``train.step`` called as a user's loop calls it (see :class:`UserLoopRunner`)
USER_VARIANTS = ("user", "user-closure")


#: the implementation name of the ``torch.compile`` row (``--torch-compile``)
TORCH_COMPILE = "torch.compile"


def block_name(steps_per_call: int) -> str:
    """The implementation name of the fused row: ``kaun_ir[K=16]``."""
    return f"kaun_ir[K={steps_per_call}]"


def make_runner(impl: str, setup: Setup, steps_per_call: int = 0):
    """A fresh runner of implementation ``impl`` (``kaun_ir``, ``kaun_ir[K=..]``, ``jax``,
    ``torch``)."""
    if impl == "kaun_ir":
        return KaunRunner(setup)
    if impl == "jax":
        return JaxRunner.of(setup)
    if impl == "torch":
        return TorchRunner(setup)
    if impl == TORCH_COMPILE:
        return TorchCompileRunner(setup)
    if impl == block_name(steps_per_call) and steps_per_call > 0:
        return KaunBlockRunner(setup, steps_per_call)
    for variant in USER_VARIANTS:
        if impl == variant_name(variant):
            return UserLoopRunner(setup, variant == "user-closure")
    for variant in VARIANTS:
        if impl == variant_name(variant):
            return KaunRunner(setup, variant)
    raise ValueError(f"unknown implementation {impl!r}")


def variant_name(variant: str) -> str:
    """The implementation name of a ``--variant`` row: ``kaun_ir[bfloat16]``."""
    return f"kaun_ir[{variant}]"


def implementations(
    steps_per_call: int, torch: bool, variants: tuple = (), torch_compile: bool = False
) -> list[str]:
    """The rows of one workload, in table order (``torch_compile``: with the ``torch.compile``
    row, when ``torch`` is)."""
    names = ["kaun_ir"] + [variant_name(v) for v in variants]
    if steps_per_call > 0:
        names.append(block_name(steps_per_call))
    names.append("jax")
    if torch:
        names.append("torch")
        if torch_compile:
            names.append(TORCH_COMPILE)
    return names


# ------------------------------------------------------------------------------ kaun_ir side


def _kaun_optimizer(spec: tuple):
    from kaun_ir import layer, optim

    opt = optim.adam(spec[1]) if spec[0] == "adam" else optim.adamw(spec[1], weight_decay=spec[2])
    return optim.freeze(opt, layer.lora_frozen) if spec[-1] == "lora" else opt


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
    elif variant == "iree":  # the same step compiled by IREE (its CPU target) instead of XLA
        options["backend"] = "iree"
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


class UserLoopRunner(KaunRunner):
    """The loop a user writes, public API only: the batches as ``jax.Array`` s
    (``jax.device_put``; the workload's batches twice over, 16 distinct arrays cycled, the same
    data sequence as the other rows) and ``train.step(trainer, st, x, y)`` (``user``) or, with
    ``closure``, ``train.step(trainer, st, x, lambda logits: loss.cross_entropy_sparse(logits,
    y))`` on a trainer made without ``loss=`` (``user-closure``). Dispatch is asynchronous; the
    bench blocks at the end of each round."""

    steps_per_call = 1

    def __init__(self, setup: Setup, closure: bool):
        import jax

        from kaun_ir import train
        from kaun_ir.nn import loss

        self.name = variant_name("user-closure" if closure else "user")
        self.trainer = _kaun_trainer(setup, "closure" if closure else None)
        self.state = _kaun_state(self.trainer, setup)
        self.batches = [(jax.device_put(x), jax.device_put(y)) for x, y in setup.batches * 2]
        self.count = 0
        self._step, self._loss, self._closure = train.step, loss.cross_entropy_sparse, closure

    def call(self):
        x, y = self.batches[self.count % len(self.batches)]
        self.count += 1
        if self._closure:
            cross_entropy = self._loss
            value, self.state = self._step(
                self.trainer, self.state, x, lambda logits: cross_entropy(logits, y)
            )
        else:
            value, self.state = self._step(self.trainer, self.state, x, y)
        return value
