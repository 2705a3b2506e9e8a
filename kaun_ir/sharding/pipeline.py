"""Pipeline parallelism: the run of identical blocks of a model split over a ``stage`` mesh axis,
micro-batches scheduled through it, all in the one executable of a step.

``train.make(model, opt, loss=..., mesh=m, pipeline=kn.sharding.pipeline(stages=S,
microbatches=M))`` traces the training step with the model's run of identical blocks (the
transformer blocks of a ``kn.models`` decoder; the longest run of identical consecutive blocks
of a ``sequential``: same layer function, same parameter shapes; see
:mod:`kaun_ir.sharding.stages`) replaced by a pipelined loop, in the standard SPMD formulation:

- the run's ``L`` blocks are cut into ``S`` stages of ``K = L / S`` consecutive blocks; their
  parameters are stacked inside the graph into arrays ``[S, K, ...]`` laid out over the
  ``stage`` axis, so each device of a stage holds its own stage's blocks while it computes;
- the batch entering the run is cut into ``M`` micro-batches; a ``scan`` runs ``M + S - 1``
  ticks over a buffer ``[S, micro-batch, ...]`` (laid out over ``stage``, and over the data axis
  along the micro-batch rows when the mesh has one): at every tick the buffer shifts by one
  stage (micro-batch ``t`` enters stage 0, every other stage receives what its predecessor
  produced: XLA's partitioner turns the shift into a collective-permute) and every stage applies
  its ``K`` blocks to what it holds (a ``vmap`` over the stage dimension);
- the last stage's result of tick ``t`` is micro-batch ``t - S + 1``; the ``M`` results,
  concatenated, are the run's output; the layers before and after the run are applied to the
  whole batch as usual.

The backward pass is kaun_ir's reverse mode of that scan (the ticks run backwards, the shifts
become shifts the other way). The schedule is GPipe's: all forward ticks, then all backward
ticks; the *bubble* (the fraction of stage-ticks that idle) is ``(S - 1) / (M + S - 1)``.

``schedule="1f1b"`` is the memory-bounded variant, not a true one-forward-one-backward
interleaving: in one SPMD program whose backward pass reverse mode derives after the whole
forward scan, a stage cannot start a micro-batch's backward before the forward ticks end. What
1F1B buys is memory (at most ``S`` micro-batches' activations in flight per stage instead of
``M``); the variant here bounds the saved activations instead by rematerialising each tick's
stage computation (``kn.remat``), so a stage keeps only its ``M + S - 1`` stage inputs across
the forward ticks and recomputes the blocks' internals in the backward tick. Same bubble, same
results, less memory for more compute (one more forward of the blocks).

Limits, checked with clear errors: the run's blocks hold no layer state (no batch norm), the
input of the run is a single array whose first dimension (the batch) divides into ``M``
micro-batches, and ``L`` is a multiple of ``S``. Blocks inside the pipeline see the step's
``ctx`` without its ``"rng"`` key (no dropout inside pipelined blocks). Parameters and optimiser
state stay laid out by ``param_sharding`` (replicated by default); the stacking slices each
stage's blocks out of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kaun_ir import tree
from kaun_ir.ir.builder import scope
from kaun_ir.layer.combinators import child_ctx
from kaun_ir.layer.core import Layer
from kaun_ir.runtime import mesh as runtime_mesh
from kaun_ir.sharding.placement import constrain
from kaun_ir.sharding.stages import locate
from kaun_ir.surface.control import scan
from kaun_ir.surface.creation import zeros
from kaun_ir.surface.shapes import concatenate, reshape, stack
from kaun_ir.surface.tensor import type_of
from kaun_ir.transforms.remat import remat
from kaun_ir.transforms.vmap import vmap

__all__ = ["Pipeline", "pipeline", "SCHEDULES"]

#: the schedules :func:`pipeline` knows
SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class Pipeline:
    """How ``train.make(..., pipeline=...)`` pipelines a model: ``stages`` (``S``, the size of
    mesh axis ``axis``), ``microbatches`` (``M``) and ``schedule`` (``"gpipe"`` or ``"1f1b"``);
    see :mod:`kaun_ir.sharding.pipeline`."""

    stages: int
    microbatches: int
    schedule: str = "gpipe"
    axis: str = "stage"

    @property
    def ticks(self) -> int:
        """Loop trips of one forward pass: ``M + S - 1``."""
        return self.microbatches + self.stages - 1

    @property
    def bubble(self) -> float:
        """The fraction of stage-ticks that idle: ``(S - 1) / (M + S - 1)``."""
        return (self.stages - 1) / self.ticks

    def schedule_text(self) -> str:
        """The forward ticks drawn as text: one row per stage, micro-batch numbers where the
        stage computes, ``.`` where it idles (the backward ticks are the same, mirrored)."""
        rows = []
        for s in range(self.stages):
            cells = [f"{t - s:>2}" if 0 <= t - s < self.microbatches else " ." for t in range(self.ticks)]
            rows.append(f"stage {s}: " + " ".join(cells))
        return "\n".join(rows)


def pipeline(stages: int, microbatches: int, schedule: str = "gpipe", axis: str = "stage") -> Pipeline:
    """A pipeline-parallel layout for ``train.make(..., pipeline=...)``: ``stages`` stages over
    mesh axis ``axis`` (its size), ``microbatches`` micro-batches per step, ``schedule``
    ``"gpipe"`` or ``"1f1b"`` (the memory-bounded variant: see :mod:`kaun_ir.sharding.pipeline`).
    """
    for name, value in (("stages", stages), ("microbatches", microbatches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"kn.sharding.pipeline: {name} must be a positive int, got {value!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"kn.sharding.pipeline: schedule must be one of {SCHEDULES}, got {schedule!r}")
    if not isinstance(axis, str):
        raise TypeError(f"kn.sharding.pipeline: axis must be a mesh axis name, got {axis!r}")
    return Pipeline(stages, microbatches, schedule, axis)


def apply(pipe: Pipeline, model: Layer, params, state, x, *, training: bool, ctx: dict, data_axis: str):
    """The traced forward pass of ``model`` (a ``sequential``, or a model declaring its run of
    blocks such as a ``kn.models`` decoder) with its block run pipelined; returns ``(y,
    new_state)`` like ``model.apply``. ``data_axis`` may be None (a mesh without one)."""
    where = locate(pipe.stages, model, params, state)
    if where.declared is not None:
        run = where.declared
        x = run.before(params, state, x, training=training, ctx=ctx)
        blocks = run.blocks(params)
        with scope(f"{run.path}.pipeline"):
            x = _pipelined(pipe, [run.block] * len(blocks), blocks, [], x, training, ctx, data_axis)
        return run.after(params, state, x, training=training, ctx=ctx), state
    layers, start, end = where.layers, where.start, where.end
    new_state = list(state)
    for i in range(start):
        with scope(_path(i, layers[i])):
            x, new_state[i] = layers[i].apply(
                params[i], state[i], x, training=training, ctx=child_ctx(ctx, i)
            )
    with scope(f"{start}-{end - 1}.pipeline"):
        x = _pipelined(pipe, layers[start:end], params[start:end], state[start], x, training, ctx, data_axis)
    for i in range(end, len(layers)):
        with scope(_path(i, layers[i])):
            x, new_state[i] = layers[i].apply(
                params[i], state[i], x, training=training, ctx=child_ctx(ctx, i)
            )
    return x, new_state


def _path(i: int, layer: Layer) -> str:
    return f"{i}.{layer.name}" if layer.name else str(i)


def _pipelined(
    pipe: Pipeline, blocks: list, params: list, block_state, x, training: bool, ctx: dict, data_axis: str
):
    S, M = pipe.stages, pipe.microbatches
    K = len(blocks) // S
    if not hasattr(x, "shape"):
        raise ValueError("pipeline parallelism: the input of the pipelined blocks must be one array")
    shape = tuple(type_of(x).shape)
    if not shape or shape[0] % M:
        raise ValueError(
            f"pipeline parallelism: the batch entering block {blocks[0].name!r} has shape {list(shape)}, "
            f"whose first dimension does not split into {M} micro-batches"
        )
    mb = shape[0] // M
    mesh = runtime_mesh.active()
    spec = None
    if mesh is not None:
        axes = dict(mesh.axes)
        if pipe.axis not in axes:
            raise ValueError(
                f"pipeline parallelism over mesh axis {pipe.axis!r}: the mesh {axes} has no such axis"
            )
        if axes[pipe.axis] != S:
            raise ValueError(
                f"pipeline parallelism: {S} stages, but mesh axis {pipe.axis!r} has {axes[pipe.axis]} devices"
            )
        rows = data_axis if data_axis in axes and axes[data_axis] > 1 and mb % axes[data_axis] == 0 else None
        spec = (pipe.axis, rows)

    def lay(v, *dims):
        return constrain(v, dims) if mesh is not None else v

    # the blocks' parameters stacked inside the graph: every leaf [S, K, ...] over the stage axis
    leaves = [tree.flatten(p)[0] for p in params]
    treedef = tree.flatten(params[0])[1]
    stacked = []
    for k in range(len(leaves[0])):
        column = stack([leaves[b][k] for b in range(len(blocks))])
        stacked.append(lay(reshape(column, (S, K) + tuple(type_of(column).shape[1:])), pipe.axis))
    inner_ctx = {key: value for key, value in ctx.items() if key != "rng"}

    def stage(stage_leaves, h):
        for k in range(K):
            p = tree.unflatten(treedef, [leaf[k] for leaf in stage_leaves])
            with scope(_path(k, blocks[k])):
                h, _ = blocks[k].apply(p, block_state, h, training=training, ctx=inner_ctx)
        return h

    run_stage = remat(stage) if pipe.schedule == "1f1b" else stage
    micro = reshape(x, (M, mb) + shape[1:])
    if S > 1:
        micro = concatenate([micro, zeros((S - 1, mb) + shape[1:], type_of(x).dtype)], axis=0)

    def tick(buf, x_t):
        entering = reshape(x_t, (1, mb) + shape[1:])
        shifted = concatenate([entering, buf[: S - 1]], axis=0) if S > 1 else entering
        if spec is not None:
            shifted = lay(shifted, *spec)
        out = vmap(run_stage)(stacked, shifted)
        if spec is not None:
            out = lay(out, *spec)
        return out, out[S - 1]

    buf0 = zeros((S, mb) + shape[1:], type_of(x).dtype)
    _, ys = scan(tick, buf0, micro)
    return reshape(ys[S - 1 :], shape)
