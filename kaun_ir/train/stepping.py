"""One training step and blocks of steps: ``step``, ``steps`` (``K`` steps in one executable)
and ``predict``; ``train.fit`` (:mod:`.loop`) runs them over a pipeline."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from kaun_ir import layer, optim, tree
from kaun_ir.runtime.jit import jit
from kaun_ir.runtime.xla import backend
from kaun_ir.sharding.placement import Spec
from kaun_ir.surface.shapes import stack
from kaun_ir.train import builder, dispatch
from kaun_ir.train.call import StepCall
from kaun_ir.train.capture import LossSpec, Probed, Unlifted, warn_opaque
from kaun_ir.train.diagnose import raise_if_foreign_state
from kaun_ir.train.state import State, Trainer, check_state

__all__ = ["step", "steps", "predict", "ema_vars"]

_NOT_HELD = (
    "it uses NumPy or device arrays that the closure does not hold itself: reached through an "
    "object, a class or another function, or built inside the loss; build constants with kn "
    "functions"
)


def _new_state(trainer: Trainer, st: State, params, state, opt_state, steps_taken: int) -> State:
    new_opt = optim.state_of_trees(trainer.optimizer, opt_state[0], opt_state[1])
    return State(
        layer.Vars(params, state, st.vars.dtype), new_opt, st.step + steps_taken, st.key, st.optimizer
    )


def prepare_call(trainer: Trainer, st: State, call: StepCall, where: str):
    """``(loss, arrays)`` for a single step: explicit, lifted closure, or probed closure (``where``
    names the public function in messages); the lifted arrays made global in a mesh run."""
    loss, arrays = builder.loss_call(trainer, call.targets, where)
    if isinstance(loss, LossSpec) and not builder.is_liftable(trainer, loss):
        warn_opaque(loss.fn, loss.opaque or _NOT_HELD)
        loss, arrays = builder.probe_call(trainer, st, call.input_types(), loss.fn, call.training, call.ctx)
    return loss, builder.global_lifted(trainer, arrays, call.rows)


def step(
    trainer: Trainer, st: State, x: Any, *targets: Any, training: bool = True, ctx: dict | None = None
) -> tuple[Any, State]:
    """One training step: ``(loss, new_state)``.

    Explicit form (a trainer made with ``loss=fn``): ``train.step(trainer, st, x, *targets)``
    computes ``fn(model(x), *targets)``; the targets (arrays or trees of arrays) are inputs of
    the compiled step like ``x``. Closure form (no ``loss=``): ``train.step(trainer, st, x,
    loss_fn)`` with ``loss_fn(outputs) -> scalar`` closing over the batch's targets; whatever it
    reads, a call with new data never runs an executable built for other data (see
    ``kaun_ir.train.capture``). One executable per input signature either way. The ``State``
    passed in is consumed (its buffers are donated to XLA): use the returned one.
    """
    call = StepCall.at_the_door(trainer, x, targets, training, ctx)
    if call.may_take_the_fast_path(st):
        result = dispatch.fast_step(trainer, st, call)
        if result is not None:
            return result
    return _general_step(trainer, st, call)


def _general_step(trainer: Trainer, st: State, call: StepCall) -> tuple[Any, State]:
    """A step through ``kn.jit``'s signature cache: traced and compiled on a new signature; its
    route is filed for the fast path of the state it returns."""
    check_state(st, "step")
    loss, arrays = prepare_call(trainer, st, call, "step")
    compiled = builder.compiled_step(trainer)
    try:
        route, flat = compiled.route(*builder.step_args(st, call.x, arrays, loss, call.training, call.ctx))
    except Unlifted:  # the closure reached arrays the inspection missed: never bake them in
        trainer.cache.opaque.add(loss.key)
        loss, arrays = prepare_call(trainer, st, call, "step")
        route, flat = compiled.route(*builder.step_args(st, call.x, arrays, loss, call.training, call.ctx))
    except (ValueError, TypeError) as err:  # a state of another model fails inside some layer
        raise_if_foreign_state(trainer, st, "step", err)
        raise
    outs = route.run(route.place(flat))
    loss_value, params, state, opt_state = route.unflatten(outs)
    new = _new_state(trainer, st, params, state, opt_state, 1)
    if not call.ctx and not isinstance(loss, Probed):
        dispatch.record(trainer, route, st, new, loss, call.x, arrays, call.training, outs)
    return loss_value, new


def _run_block(
    trainer: Trainer, st: State, xs: Any, loss, stacked: tuple, training: bool, ctx: dict | None
) -> tuple[Any, State]:
    compiled = builder.compiled_block(trainer)
    if trainer.mesh is not None:  # the block's batches made global as a single step's are
        call = StepCall.at_the_door(trainer, xs, stacked, training, ctx, block=True)
        xs, stacked = call.x, builder.global_lifted(trainer, call.targets, call.rows, block=True)
    losses, params, state, opt_state = compiled(*builder.step_args(st, xs, stacked, loss, training, ctx))
    return losses, _new_state(trainer, st, params, state, opt_state, int(xs.shape[0]))


def _block_loss(trainer: Trainer, targets: tuple, where: str):
    """The loss and stacked arrays of a block; the closure form must be liftable."""
    loss, arrays = builder.loss_call(trainer, targets, where)
    if isinstance(loss, LossSpec) and not builder.is_liftable(trainer, loss):
        raise ValueError(
            f"train.{where}: the loss function reads data that cannot be made an input "
            f"({loss.opaque or _NOT_HELD}); blocks of steps need its arrays as inputs: "
            "use train.make(..., loss=fn) and pass the stacked targets, or a plain function "
            "or functools.partial holding the stacked arrays directly"
        )
    return loss, arrays


def steps(
    trainer: Trainer, st: State, xs: Any, *targets: Any, training: bool = True, ctx: dict | None = None
) -> tuple[Any, State]:
    """``K = xs.shape[0]`` training steps in ONE executable (a ``while`` loop on the device):
    ``(losses, new_state)`` with ``losses: f32[K]``, equal to ``K`` calls of :func:`step`.

    ``xs: [K, *x.shape]`` holds the ``K`` batches stacked, and so does every target array
    (explicit form: ``train.steps(tr, st, xs, ys)`` with ``ys: [K, B]``) or every array a loss
    closure captures (closure form: ``train.steps(tr, st, xs, lambda logits: ce(logits, ys))``);
    step ``i`` sees row ``i`` of each. With device-resident blocks this removes the per-step
    Python dispatch altogether; :func:`fit` with ``steps_per_call=K`` stacks its batches and
    calls this. The ``State`` passed in is consumed (donated)."""
    check_state(st, "steps")
    k = getattr(xs, "shape", (None,))[0] if getattr(xs, "ndim", 0) else None
    if not isinstance(k, int) or k < 1:
        raise ValueError(
            f"train.steps: xs must be an array with a leading axis of K >= 1 batches, "
            f"got shape {getattr(xs, 'shape', None)}"
        )
    loss, stacked = _block_loss(trainer, targets, "steps")
    bad = [tuple(np.shape(a)) for a in tree.flatten(stacked)[0] if not np.ndim(a) or np.shape(a)[0] != k]
    if bad:
        what = "target" if trainer.loss is not None else "array the loss_fn captures"
        raise ValueError(
            f"train.steps: every {what} needs a leading axis of K = {k} (one row per step); "
            f"got shape(s) {bad}"
        )
    return _run_block(trainer, st, xs, loss, stacked, training, ctx)


def _stack(arrays: list):
    """The arrays stacked on a new leading axis (NumPy on the host when all are NumPy arrays,
    else one XLA ``stack`` so device arrays stay on the device)."""
    if all(isinstance(a, np.ndarray) for a in arrays):
        return np.stack(arrays)

    return stack(list(arrays))


def block_step(trainer: Trainer, st: State, batches: list, ctx: dict | None):
    """``K`` steps over ``batches`` (``(x, *targets)`` tuples) in one executable, or ``None`` when
    they cannot share one block (different shapes, loss code, or data that cannot be lifted)."""
    calls = [builder.loss_call(trainer, batch[1:], "fit") for batch in batches]
    first = calls[0][0]
    if isinstance(first, LossSpec) and not builder.is_liftable(trainer, first):
        return None
    if any(loss != first for loss, _ in calls[1:]):
        return None
    columns = [tree.flatten((batch[0], arrays)) for batch, (_, arrays) in zip(batches, calls)]
    treedef = columns[0][1]

    def sig(leaves):
        return [(tuple(np.shape(a)), np.dtype(getattr(a, "dtype", type(a)))) for a in leaves]

    head = sig(columns[0][0])
    if any(d != treedef or sig(leaves) != head for leaves, d in columns[1:]):
        return None
    stacked = [_stack(list(column)) for column in zip(*(leaves for leaves, _ in columns))]
    xs, arrays = tree.unflatten(treedef, stacked)
    return _run_block(trainer, st, xs, first, arrays, True, ctx)


def ema_vars(trainer: Trainer, st: State) -> layer.Vars:
    """The model variables with the weight average of an ``optim.ema`` member of the trainer's
    optimiser as parameters (``ValueError`` if it keeps none): for evaluation and for saving the
    averaged model. The average lives in the optimiser state, so checkpoints keep it."""
    check_state(st, "ema_vars")
    params = optim.ema_params(trainer.optimizer, st.opt_state, st.vars.params)
    return layer.Vars(params, st.vars.state, st.vars.dtype)


def predict(trainer: Trainer, st: State, x: Any, ctx: dict | None = None, ema: bool = False) -> Any:
    """Inference (``training=False``): the model's output only. ``ema=True``: with the weight
    average an ``optim.ema`` member of the optimiser keeps (see :func:`ema_vars`).

    In a multi-process run on a mesh, ``x`` is this process's rows (as for :func:`step`): the
    model runs as one program over the mesh on the processes' rows concatenated, split over the
    data axis, and the result is a global array of which this process holds its rows
    (``kn.sharding.gather`` brings it whole to the host)."""
    check_state(st, "predict")
    if not isinstance(ema, bool):
        raise TypeError(f"train.predict: ema must be True or False, got {ema!r}")
    v = ema_vars(trainer, st) if ema else st.vars
    if trainer.mesh is not None and backend.process_count() > 1:
        x, _ = builder.global_batch(trainer, x, ())
        return _compiled_predict(trainer, v.dtype)(v.params, v.state, x, ctx)
    return layer.apply(trainer.model, v, x, training=False, ctx=ctx)[0]


# the compiled forward pass of each trainer on a mesh (kept while the trainer lives)
_PREDICT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _compiled_predict(trainer: Trainer, dtype):
    """The trainer's forward pass under ``kn.jit`` on its mesh, for variables of ``dtype``:
    parameters and state keep their layout, the batch is split over the data axis."""
    by_dtype = _PREDICT.setdefault(trainer, {})
    compiled = by_dtype.get(str(dtype))
    if compiled is None:

        def forward(params, state, x, ctx):
            return layer.apply(trainer.model, layer.Vars(params, state, dtype), x, training=False, ctx=ctx)[0]

        forward.__name__ = "predict"
        compiled = by_dtype[str(dtype)] = jit(
            forward, mesh=trainer.mesh, in_shardings=(None, None, Spec(trainer.data_axis), None)
        )
    return compiled
