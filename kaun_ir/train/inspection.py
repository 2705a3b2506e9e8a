"""Looking inside a training step without running it: its graph as traced or optimised, its
compiled executable, and the traced forward pass alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kaun_ir import layer
from kaun_ir.surface.trace import trace, trace_flat
from kaun_ir.train import builder
from kaun_ir.train.call import StepCall
from kaun_ir.train.capture import Unlifted
from kaun_ir.train.state import State, Trainer, check_state
from kaun_ir.train.stepping import prepare_call

__all__ = ["step_graph", "forward_graph", "step_executable"]


def _inspect(
    trainer: Trainer, st: State, x: Any, targets: tuple, training: bool, ctx, where: str, use: Callable
) -> Any:
    """``use(args)`` on the compiled step's arguments for these inputs (as :func:`step` would
    choose them, including the fall-back for closures that read data they do not hold)."""
    check_state(st, where)
    call = StepCall.at_the_door(trainer, x, targets, training, ctx)
    loss, arrays = prepare_call(trainer, st, call, where)
    try:
        return use(builder.step_args(st, call.x, arrays, loss, training, ctx))
    except Unlifted:
        trainer.cache.opaque.add(loss.key)
        loss, arrays = prepare_call(trainer, st, call, where)
        return use(builder.step_args(st, call.x, arrays, loss, training, ctx))


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

    def forward(params, state, x):
        return layer.apply(
            trainer.model, layer.Vars(params, state, st.vars.dtype), x, training=training, ctx=ctx
        )[0]

    return trace(forward, st.vars.params, st.vars.state, x)
