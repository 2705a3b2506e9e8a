"""The step builder: what one training step (and a block of ``K`` steps) traces into, and the
``kn.jit`` functions that compile them, one per trainer.

A step is traced from ``(params, state, opt_state, key, x, targets, ctx, loss, training,
dtype)``: the first five and ``targets`` / ``ctx`` hold arrays (inputs of the executable; the
first three are donated), ``loss`` (one of the callables of :mod:`.capture`), ``training`` and
``dtype`` are static (part of the compile key).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from kaun_ir import dtypes, layer, optim, ptree, tree
from kaun_ir.ir.builder import scope as ir_scope
from kaun_ir.precision import loss_scale_of
from kaun_ir.runtime import jit
from kaun_ir.runtime.backends import resolve as resolve_backend
from kaun_ir.runtime.pipelines import train_pipeline
from kaun_ir.runtime.xla import backend
from kaun_ir.sharding.pipeline import apply as pipeline_apply
from kaun_ir.sharding.placement import Spec, put, put_local
from kaun_ir.sharding.policy import step_shardings
from kaun_ir.surface import random
from kaun_ir.surface import random as krandom
from kaun_ir.surface.control import fori_loop
from kaun_ir.surface.creation import zeros
from kaun_ir.surface.dynamic_slice import dynamic_slice, dynamic_update_slice
from kaun_ir.surface.promotion import astype, dtype_of
from kaun_ir.surface.shapes import reshape
from kaun_ir.surface.trace import ShapeDtype, trace_flat
from kaun_ir.train import step_memory
from kaun_ir.train.capture import Explicit, LossSpec, Probed, probe
from kaun_ir.train.diagnose import warn_if_independent
from kaun_ir.train.state import State, Trainer
from kaun_ir.transforms.autodiff import value_and_grad

__all__ = ["step_body", "block_body", "compiled_step", "compiled_block", "step_args", "loss_call"]


def step_body(
    trainer: Trainer,
    params,
    state,
    opt_state,
    key,
    x,
    targets: tuple,
    ctx: dict,
    loss: Callable,
    training: bool,
    dtype,
) -> tuple:
    """One training step, traced: forward, loss, own-IR autodiff, optimiser update. Returns
    ``(loss, new_params, new_state, new_opt_state)``. With ``trainer.accumulate = N > 1`` the
    batch is split into ``N`` micro-batches along its first axis, their gradients are summed in a
    loop on the device and their mean is given to the optimiser (one update per step)."""
    alg = trainer.optimizer
    count = opt_state[0]
    ctx = dict(ctx)
    with ir_scope("rng"):
        step_key = random.fold_in(key, count)

    # float16 loss scaling (kaun_ir.precision): differentiate loss * scale, report the loss
    scale = None
    if trainer.precision is not None and trainer.precision.loss_scale is not None:
        scale = loss_scale_of(opt_state)

    def loss_and_grads(state, x, targets, rng_key):
        def objective(p):
            step_ctx = dict(ctx, rng=rng_key)
            if trainer.stages is not None:
                y, new_state = pipeline_apply(
                    trainer.stages,
                    trainer.model,
                    p,
                    state,
                    x,
                    training=training,
                    ctx=step_ctx,
                    data_axis=trainer.data_axis,
                )
                new_vars = layer.Vars(p, new_state, dtype)
            else:
                y, new_vars = layer.apply(
                    trainer.model, layer.Vars(p, state, dtype), x, training=training, ctx=step_ctx
                )
            with ir_scope("loss"):  # the loss's nodes (and their backward) are grouped as "loss"
                value = loss(y, targets)
            shape = getattr(value, "shape", ())
            if tuple(shape) != ():
                what = "the loss given to train.make" if isinstance(loss, Explicit) else "loss_fn"
                raise ValueError(f"{what} must return a scalar, returned shape {list(shape)}")
            warn_if_independent(value, p)
            if scale is None:
                return value, (value, new_vars.state)
            with ir_scope("loss"):
                scaled = value * astype(scale, dtype_of(value))
            return scaled, (value, new_vars.state)

        (_, (loss_value, new_state)), grads = value_and_grad(objective, has_aux=True)(params)
        return loss_value, new_state, grads

    if trainer.accumulate == 1:
        loss_value, new_state, grads = loss_and_grads(state, x, targets, step_key)
    else:
        loss_value, new_state, grads = _accumulated(
            trainer.accumulate, loss_and_grads, params, state, x, targets, step_key
        )
    new_params, new_opt = optim.update(alg, opt_state, params, grads)
    new_params = step_memory.ordered_updates(trainer, params, grads, new_params)
    return loss_value, new_params, new_state, tuple(new_opt)


def _micro_batch(leaf, i, size: int):
    """Rows ``[i * size, (i + 1) * size)`` of ``leaf`` (``i`` traced)."""
    shape = tuple(leaf.shape)
    return dynamic_slice(leaf, [i * size] + [0] * (len(shape) - 1), (size,) + shape[1:])


def _accumulated(n: int, loss_and_grads: Callable, params, state, x, targets, step_key) -> tuple:
    """``loss_and_grads`` on ``n`` micro-batches of ``(x, targets)`` in one ``fori_loop``: the
    mean loss, the layer state after the last micro-batch and the mean gradient."""
    leaves, treedef = tree.flatten((x, targets))
    rows = {int(leaf.shape[0]) if getattr(leaf, "ndim", 0) else None for leaf in leaves}
    if len(rows) != 1 or None in rows or next(iter(rows)) % n:
        shapes = [list(getattr(leaf, "shape", ())) for leaf in leaves]
        raise ValueError(
            f"train.make(accumulate={n}): x and every target need the same leading batch size, a "
            f"multiple of {n} (it is split into {n} micro-batches); got shapes {shapes}"
        )
    size = next(iter(rows)) // n
    zero_grads = ptree.map(lambda p: zeros(tuple(p.shape), dtype_of(p)), params)

    def body(i, carry):
        total, state, grads = carry
        micro_x, micro_targets = tree.unflatten(treedef, [_micro_batch(leaf, i, size) for leaf in leaves])
        with ir_scope("rng"):
            key = random.fold_in(step_key, i)
        value, state, new = loss_and_grads(state, micro_x, micro_targets, key)
        grads = ptree.map2(lambda a, g: a + astype(g, dtype_of(a)), grads, new)
        return total + astype(value, dtypes.float32), state, grads

    total, new_state, grads = fori_loop(0, n, body, (np.zeros((), np.float32), state, zero_grads))
    grads = ptree.map(lambda g: g / astype(np.float32(n), dtype_of(g)), grads)
    return total / np.float32(n), new_state, grads


def block_body(
    trainer: Trainer,
    params,
    state,
    opt_state,
    key,
    xs,
    targets: tuple,
    ctx: dict,
    loss: Callable,
    training: bool,
    dtype,
) -> tuple:
    """``K = xs.shape[0]`` training steps in one ``while`` op: step ``i`` trains on ``xs[i]`` and
    row ``i`` of every target array. Each iteration is exactly :func:`step_body` (its gradient
    is traced inside the loop body, so the loop itself needs no derivative; its dropout key is
    ``fold_in(key, count)`` with the in-loop step counter)."""
    steps = int(xs.shape[0])
    leaves, treedef = tree.flatten(targets)

    def row(stacked, i):
        shape = tuple(stacked.shape[1:])
        block = dynamic_slice(stacked, [i] + [0] * len(shape), (1,) + shape)
        return reshape(block, shape)

    def body(i, carry):
        p, s, o, losses = carry
        rows = tree.unflatten(treedef, [row(leaf, i) for leaf in leaves])
        loss_value, p, s, o = step_body(trainer, p, s, o, key, row(xs, i), rows, ctx, loss, training, dtype)
        losses = dynamic_update_slice(losses, reshape(loss_value, (1,)), [i])
        return p, s, o, losses

    init = (params, state, opt_state, np.zeros((steps,), np.float32))
    new_params, new_state, new_opt, losses = fori_loop(0, steps, body, init)
    return losses, new_params, new_state, tuple(new_opt)


def _compiled(trainer: Trainer, attr: str, body: Callable, name: str):
    """``body(trainer, ...)`` under ``kn.jit`` with params/state/optimiser state donated, made once
    per trainer and kept in its cache under ``attr``."""
    compiled = getattr(trainer.cache, attr)
    if compiled is None:

        def traced(params, state, opt_state, key, x, targets, ctx, loss, training, dtype):
            return body(trainer, params, state, opt_state, key, x, targets, ctx, loss, training, dtype)

        traced.__name__ = name
        # resolved at each compilation, so $KAUN_IR_TRAIN_PIPELINE is read at compile time
        pipeline = functools.partial(_step_pipeline, trainer)
        if trainer.mesh is None:
            compiled = jit(traced, donate_argnums=(0, 1, 2), pipeline=pipeline, backend=trainer.backend)
        else:  # one SPMD program over the mesh: batch split, parameters laid out by the policy
            ins, outs = step_shardings(
                trainer.mesh, trainer.param_sharding, trainer.data_axis, block=attr == "block"
            )
            compiled = jit(
                traced,
                donate_argnums=(0, 1, 2),
                pipeline=pipeline,
                mesh=trainer.mesh,
                in_shardings=ins,
                out_shardings=outs,
                backend=trainer.backend,
            )
        setattr(trainer.cache, attr, compiled)
    return compiled


def _step_pipeline(trainer: Trainer) -> str:
    """The step's pipeline: ``trainer.pipeline`` (or the default), after the ``remat`` pass when
    the trainer rematerialises (it needs the step's forward/backward structure, before fusion)
    and the ``mixed-precision`` pass when it has a precision policy."""
    pipeline = train_pipeline(trainer.pipeline, trainer.backend or resolve_backend(None))
    if trainer.precision is not None:  # before the default passes, which clean up the casts
        pipeline = f"mixed-precision{{compute={trainer.precision.name}}},{pipeline}"
    if trainer.remat is None:  # the default: "dots" where it takes enough off the peak
        return step_memory.with_auto_remat(trainer, pipeline)
    if trainer.remat is False:
        return pipeline
    policy, depth = trainer.remat
    return f'remat{{policy="{policy.spec}" depth={depth}}},{pipeline}'


def compiled_step(trainer: Trainer):
    """The trainer's ``kn.jit`` function of one step (made on first use)."""
    return _compiled(trainer, "step", step_body, "train_step")


def compiled_block(trainer: Trainer):
    """The trainer's ``kn.jit`` function of ``K`` steps in one executable (made on first use)."""
    return _compiled(trainer, "block", block_body, "train_block")


def global_batch(trainer: Trainer, x: Any, arrays: tuple, block: bool = False) -> tuple:
    """In a multi-process run on a mesh, ``x`` and the target arrays hold this process's rows:
    the global batch is their concatenation over processes (split over the data axis). As
    they are otherwise. In the closure form ``arrays`` is ``(loss_fn,)`` and stays as it is: the
    arrays lifted from the closure go through :func:`global_lifted` once they are known."""
    if trainer.mesh is None:
        return x, arrays

    if backend.process_count() == 1:
        return x, arrays

    spec = Spec(None, trainer.data_axis) if block else Spec(trainer.data_axis)
    if trainer.loss is None:
        return put_local(x, trainer.mesh, spec), arrays
    return put_local(x, trainer.mesh, spec), put_local(arrays, trainer.mesh, spec)


def local_rows(trainer: Trainer, x: Any, block: bool = False) -> int | None:
    """This process's batch size in a multi-process closure-form run on a mesh (the leading axis
    of ``x``, the second for a block of steps), else None (nothing to make global)."""
    if trainer.mesh is None or trainer.loss is not None or backend.process_count() == 1:
        return None
    shape = tuple(getattr(x, "shape", None) or np.shape(x))
    axis = 1 if block else 0
    return shape[axis] if len(shape) > axis else None


def global_lifted(trainer: Trainer, arrays, rows: int | None, block: bool = False) -> tuple:
    """The arrays lifted from a loss closure as global arrays of a multi-process run: an array
    whose leading axis (after the steps axis of a block) has this process's batch size ``rows``
    holds this process's rows, like an explicit-form target, and is concatenated over the
    processes; any other array (a weight vector, a scalar) must be the same in every process and
    is replicated. ``arrays`` unchanged when ``rows`` is None (one process, or no mesh)."""
    if rows is None:
        return tuple(arrays)
    axis = 1 if block else 0
    spec = Spec(None, trainer.data_axis) if block else Spec(trainer.data_axis)

    def one(array):
        shape = tuple(getattr(array, "shape", None) or np.shape(array))
        if len(shape) > axis and shape[axis] == rows:
            return put_local(array, trainer.mesh, spec)
        return put(array, trainer.mesh, Spec(*([None] * len(shape))))

    return tuple(one(array) for array in arrays)


def step_args(st: State, x: Any, targets: tuple, loss: Callable, training: bool, ctx: dict | None) -> tuple:
    """The arguments of the compiled step (or block) for this call."""
    v = st.vars
    return (
        v.params,
        v.state,
        tuple(st.opt_state),
        st.key,
        x,
        tuple(targets),
        dict(ctx or {}),
        loss,
        bool(training),
        v.dtype,
    )


def loss_call(trainer: Trainer, targets: tuple, where: str) -> tuple[Callable, tuple]:
    """``(loss, arrays)`` for a step's trailing arguments: the explicit form's loss and targets,
    or a closure's :class:`LossSpec` and lifted arrays (``Probed`` is decided by the caller)."""
    if trainer.loss is not None:
        if len(targets) == 1 and callable(targets[0]) and not hasattr(targets[0], "shape"):
            raise TypeError(
                f"train.{where}: this trainer was made with loss=, so pass the targets "
                f"(train.{where}(trainer, st, x, *targets)), not a loss function"
            )
        return Explicit(trainer.loss), tuple(targets)
    if len(targets) != 1 or not callable(targets[0]):
        raise TypeError(
            f"train.{where}: this trainer has no loss function: pass a callable "
            f"loss_fn(outputs) -> scalar, train.{where}(trainer, st, x, loss_fn), or make "
            "the trainer with train.make(model, optimizer, loss=fn) and pass the targets"
        )
    spec = LossSpec(targets[0])
    return spec, tuple(spec.arrays)


def output_types(trainer: Trainer, st: State, x_types: Any, training: bool, ctx: dict | None) -> list:
    """The model's outputs for the input signature ``x_types`` (``x`` as ShapeDtype leaves) as
    ShapeDtype leaves with their treedef (traced once per signature, nothing executed)."""
    v = st.vars
    leaves, treedef = tree.flatten((v.params, v.state, x_types, dict(ctx or {})))
    sig = (
        treedef,
        tuple((tuple(np.shape(a)), np.dtype(getattr(a, "dtype", np.asarray(a).dtype))) for a in leaves),
        bool(training),
        v.dtype,
    )
    cached = trainer.cache.output_types.get(sig)
    if cached is None:

        def forward(params, state, x, ctx):
            ctx = dict(ctx)

            ctx["rng"] = krandom.key(0)
            return layer.apply(
                trainer.model, layer.Vars(params, state, v.dtype), x, training=training, ctx=ctx
            )[0]

        traced = trace_flat(forward, (v.params, v.state, x_types, dict(ctx or {})), {})
        out_leaves = [ShapeDtype(o.type.shape, o.type.dtype) for o in traced.graph.outputs]
        cached = trainer.cache.output_types[sig] = tree.unflatten(traced.out_treedef, out_leaves)
    return cached


def probe_call(
    trainer: Trainer, st: State, x_types: Any, fn: Callable, training: bool, ctx: dict | None
) -> tuple[Probed, tuple]:
    """The probing path of a closure that cannot be lifted (see :mod:`.capture`): the loss
    traced alone on the model's output types for the input signature ``x_types``."""
    probed = probe(fn, output_types(trainer, st, x_types, training, ctx))
    return probed, tuple(probed.arrays)


def is_liftable(trainer: Trainer, loss: Callable) -> bool:
    """Whether a closure form's :class:`LossSpec` may take the lifted path."""
    return isinstance(loss, LossSpec) and loss.opaque is None and loss.key not in trainer.cache.opaque
