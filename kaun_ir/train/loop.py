"""Running training: ``step``, ``steps`` (``K`` steps in one executable), ``fit`` and ``predict``,
plus the graphs and executable of a step for inspection."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from kaun_ir import layer, optim, tree
from kaun_ir.train import builder, dispatch
from kaun_ir.train.capture import LossSpec, Probed, Unlifted, warn_opaque
from kaun_ir.train.diagnose import raise_if_foreign_state
from kaun_ir.train.state import State, Trainer, check_state

__all__ = ["EarlyStop", "step", "steps", "fit", "predict", "step_graph", "forward_graph", "step_executable"]


_NOT_HELD = (
    "it uses NumPy or device arrays that the closure does not hold itself: reached through an "
    "object, a class or another function, or built inside the loss; build constants with kn "
    "functions"
)


class EarlyStop(Exception):
    """Raise inside ``fit``'s ``report`` callback to end training; ``fit`` returns the state."""


def _new_state(trainer: Trainer, st: State, params, state, opt_state, steps_taken: int) -> State:
    new_opt = optim.state_of_trees(trainer.optimizer, opt_state[0], opt_state[1])
    return State(
        layer.Vars(params, state, st.vars.dtype), new_opt, st.step + steps_taken, st.key, st.optimizer
    )


def _prepare(trainer: Trainer, st: State, x: Any, targets: tuple, training: bool, ctx, where: str):
    """``(loss, arrays)`` for a single step: explicit, lifted closure, or probed closure."""
    loss, arrays = builder.loss_call(trainer, targets, where)
    if isinstance(loss, LossSpec) and not builder.is_liftable(trainer, loss):
        warn_opaque(loss.fn, loss.opaque or _NOT_HELD)
        return builder.probe_call(trainer, st, x, loss.fn, training, ctx)
    return loss, arrays


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
    if trainer.mesh is not None:
        x, targets = builder.global_batch(trainer, x, targets)
    if not ctx and type(st) is State:
        flat = st.cache.flat
        if flat is not None:
            result = dispatch.fast_step(trainer, st, flat, x, targets, training)
            if result is not None:
                return result
    check_state(st, "step")
    loss, arrays = _prepare(trainer, st, x, targets, training, ctx, "step")
    compiled = builder.compiled_step(trainer)
    try:
        route, flat = compiled.route(*builder.step_args(st, x, arrays, loss, training, ctx))
    except Unlifted:  # the closure reached arrays the inspection missed: never bake them in
        trainer.cache.opaque.add(loss.key)
        loss, arrays = _prepare(trainer, st, x, targets, training, ctx, "step")
        route, flat = compiled.route(*builder.step_args(st, x, arrays, loss, training, ctx))
    except (ValueError, TypeError) as err:  # a state of another model fails inside some layer
        raise_if_foreign_state(trainer, st, "step", err)
        raise
    outs = route.run(route.place(flat))
    loss_value, params, state, opt_state = route.unflatten(outs)
    new = _new_state(trainer, st, params, state, opt_state, 1)
    if not ctx and not isinstance(loss, Probed):
        dispatch.record(trainer, route, st, new, loss, x, arrays, training, outs)
    return loss_value, new


def _run_block(
    trainer: Trainer, st: State, xs: Any, loss, stacked: tuple, training: bool, ctx: dict | None
) -> tuple[Any, State]:
    compiled = builder.compiled_block(trainer)
    if trainer.mesh is not None:
        xs, stacked = builder.global_batch(trainer, xs, stacked, block=True)
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
    from kaun_ir.surface.numeric import stack

    return stack(list(arrays))


def _block_step(trainer: Trainer, st: State, batches: list, ctx: dict | None):
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


# ------------------------------------------------------------------------------- the loop


class _Progress:
    """A one-line progress bar on a terminal (stderr); silent otherwise."""

    def __init__(self, total: int | None, enabled: bool):
        self.total, self.enabled = total, enabled
        self.start = self.last = time.perf_counter()

    def update(self, count: int, loss_value: Callable[[], float], final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not final and now - self.last < 0.1:
            return
        self.last = now
        rate = count / max(now - self.start, 1e-9)
        if self.total:
            width = 24
            filled = int(width * count / self.total)
            bar = f"[{'#' * filled}{'.' * (width - filled)}] {count}/{self.total}"
        else:
            bar = f"step {count}"
        sys.stderr.write(f"\r{bar}  loss {loss_value():.4f}  {rate:.1f} steps/s")
        if final:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _batch(trainer: Trainer, item: Any) -> tuple:
    if trainer.loss is not None:
        if not isinstance(item, tuple) or not item:
            raise TypeError(
                "train.fit: data must yield (x, *targets) tuples (this trainer has loss=), got "
                f"{type(item).__name__}"
            )
        return item
    if not (isinstance(item, tuple) and len(item) == 2 and callable(item[1])):
        raise TypeError(
            "train.fit: data must yield (x, loss_fn) pairs (or make the trainer with "
            "train.make(model, optimizer, loss=fn) and yield (x, *targets) tuples)"
        )
    return item


def fit(
    trainer: Trainer,
    st: State,
    data: Iterable,
    report: Callable | None = None,
    ctx: dict | None = None,
    progress: bool | None = None,
    steps_per_call: int = 1,
    report_every: int = 1,
) -> State:
    """Run :func:`step` over ``data`` and return the final state. ``data`` is an iterable (e.g. a
    ``kn.data`` pipeline) of ``(x, *targets)`` tuples for a trainer made with ``loss=``, or of
    ``(x, loss_fn)`` pairs in the closure form.

    A ``kn.data`` pipeline is ``reset()`` first, so calling ``fit`` once per epoch works.
    ``report(step=, loss=, state=)`` is called after every ``report_every``-th step and after
    the last one (1-based ``step`` counts the steps of this call). ``loss`` is the step's loss
    as a 0-d device array: nothing waits for the device until the report reads it
    (``float(loss)``, formatting, a comparison), so a report that logs every 100th step does
    not stall the other 99. Raising :class:`EarlyStop` inside it ends training and returns the
    state at that point. A progress bar with the running loss is shown when stderr is a terminal
    (``progress=`` forces it on or off; it reads the loss at most ten times a second).

    ``steps_per_call=K > 1`` fuses training: ``K`` consecutive batches with the same shapes (and
    in the closure form the same loss code) are stacked and ``K`` steps run inside ONE
    executable (:func:`steps`), giving the same result as ``K`` single steps. ``report`` is then
    called for each of the ``K`` steps afterwards, in order, with that step's loss and the
    state *after the whole block*; :class:`EarlyStop` is honoured at block granularity: the
    steps of the block already ran and stay applied (no roll-back), and the remaining reports
    of the block are skipped. A final partial block (fewer than ``K`` batches left), or a
    block whose batches differ, runs as single steps. (A block's losses arrive on the host
    together, as NumPy scalars.)
    """
    check_state(st, "fit")
    if isinstance(steps_per_call, bool) or not isinstance(steps_per_call, int) or steps_per_call < 1:
        raise ValueError(f"train.fit: steps_per_call must be an int >= 1, got {steps_per_call!r}")
    if isinstance(report_every, bool) or not isinstance(report_every, int) or report_every < 1:
        raise ValueError(f"train.fit: report_every must be an int >= 1, got {report_every!r}")
    if hasattr(data, "reset"):
        data.reset()
    total = None
    try:
        total = len(data)  # type: ignore[arg-type]
    except TypeError:
        pass
    bar = _Progress(total, sys.stderr.isatty() if progress is None else progress)
    last_loss = None
    count = 0
    pending: list = []

    reported = 0

    def run_single(batch) -> bool:
        """One step; ``False`` when ``report`` asked to stop."""
        nonlocal st, last_loss, count, reported
        last_loss, st = step(trainer, st, batch[0], *batch[1:], ctx=ctx)
        count += 1
        if report is not None and count % report_every == 0:
            try:
                reported = count
                report(step=count, loss=last_loss, state=st)
            except EarlyStop:
                return False
        bar.update(count, lambda: float(last_loss))
        return True

    def run_block(batches) -> bool:
        nonlocal st, last_loss, count, reported
        result = _block_step(trainer, st, batches, ctx)
        if result is None:  # the batches cannot share a block: single steps
            return all(run_single(batch) for batch in batches)
        losses, st = result
        host = np.asarray(losses)
        last_loss, start = host[-1], count
        for value in host:
            count += 1
            if report is not None and count % report_every == 0:
                try:
                    reported = count
                    report(step=count, loss=value, state=st)
                except EarlyStop:
                    count = start + len(host)  # every step of the block ran
                    return False
        bar.update(count, lambda: float(last_loss))
        return True

    stopped = False
    for item in data:
        item = _batch(trainer, item)
        if steps_per_call == 1:
            if not run_single(item):
                stopped = True
                break
            continue
        pending.append(item)
        if len(pending) == steps_per_call:
            batches, pending = pending, []
            if not run_block(batches):
                stopped = True
                break
    if not stopped:
        for item in pending:  # the final partial block
            if not run_single(item):
                stopped = True
                break
    if report is not None and not stopped and count and reported != count:
        try:  # the last step is always reported
            report(step=count, loss=last_loss, state=st)
        except EarlyStop:
            pass
    if count:
        bar.update(count, lambda: float(last_loss), final=True)
    return st


def predict(trainer: Trainer, st: State, x: Any, ctx: dict | None = None) -> Any:
    """Inference (``training=False``): the model's output only."""
    check_state(st, "predict")
    return layer.apply(trainer.model, st.vars, x, training=False, ctx=ctx)[0]


# ------------------------------------------------------------------------- inspection


def _inspect(
    trainer: Trainer, st: State, x: Any, targets: tuple, training: bool, ctx, where: str, use: Callable
) -> Any:
    """``use(args)`` on the compiled step's arguments for these inputs (as :func:`step` would
    choose them, including the fall-back for closures that read data they do not hold)."""
    check_state(st, where)
    loss, arrays = _prepare(trainer, st, x, targets, training, ctx, where)
    try:
        return use(builder.step_args(st, x, arrays, loss, training, ctx))
    except Unlifted:
        trainer.cache.opaque.add(loss.key)
        loss, arrays = _prepare(trainer, st, x, targets, training, ctx, where)
        return use(builder.step_args(st, x, arrays, loss, training, ctx))


def step_graph(
    trainer: Trainer,
    st: State,
    x: Any,
    *targets: Any,
    training: bool = True,
    ctx: dict | None = None,
    optimized: bool = False,
):
    """The IR of the training step for these inputs (the targets, or the loss closure, as for
    :func:`step`): as traced (forward, the autodiff pass's backward and the optimiser update in
    one graph) or, with ``optimized=True``, after the pipeline that runs before lowering.
    Nothing is executed and ``st`` is not consumed."""
    from kaun_ir.surface.trace import trace_flat

    compiled = builder.compiled_step(trainer)
    if optimized:
        return _inspect(trainer, st, x, targets, training, ctx, "step_graph", lambda a: compiled.graph(*a))
    return _inspect(
        trainer, st, x, targets, training, ctx, "step_graph", lambda a: trace_flat(compiled.f, a, {}).graph
    )


def step_executable(
    trainer: Trainer, st: State, x: Any, *targets: Any, training: bool = True, ctx: dict | None = None
):
    """The compiled executable (``kn.runtime.Executable``: ``.mlir``, ``.hlo_text()``,
    ``.pipeline``, ``.memory_analysis()``) :func:`step` runs for these inputs; compiled if
    needed, nothing executed, ``st`` not consumed."""
    compiled = builder.compiled_step(trainer)
    return _inspect(
        trainer, st, x, targets, training, ctx, "step_executable", lambda a: compiled.executable(*a)
    )


def forward_graph(trainer: Trainer, st: State, x: Any, training: bool = False, ctx: dict | None = None):
    """The traced IR of the model's forward pass alone."""
    check_state(st, "forward_graph")
    from kaun_ir.surface.trace import trace

    def forward(params, state, x):
        return layer.apply(
            trainer.model, layer.Vars(params, state, st.vars.dtype), x, training=training, ctx=ctx
        )[0]

    return trace(forward, st.vars.params, st.vars.state, x)
