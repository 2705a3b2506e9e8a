"""Which part of a model pipeline parallelism splits over the stages, and why a model is refused.

Two kinds of model can be pipelined:

- a ``layer.sequential`` whose longest run of identical consecutive blocks (same layer function,
  same parameter shapes: ``sequential([embed, block, block, ..., head])``) is the run;
- a model that declares its run (:mod:`kaun_ir.layer.block_run`): the ``kn.models`` decoders
  (GPT-2, Llama, anything from ``from_pretrained``), whose ``num_layers`` transformer blocks
  are the run.

:func:`locate` finds the run and checks what the pipeline needs (at ``train.init`` /
``train.make_state``, before any step is traced, and again when the step is traced): the run's
length ``L`` is a multiple of the stages ``S``, its blocks hold no layer state. A flat
``sequential`` that repeats a group of layers (``linear, tanh, linear, tanh, ...``) has no run
of identical blocks; the refusal names the group and how to make each repetition one block.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from kaun_ir import tree
from kaun_ir.layer.block_run import BlockRun, block_run
from kaun_ir.layer.core import Layer
from kaun_ir.surface.tensor import type_of

__all__ = ["Located", "locate", "children", "find_run"]


@dataclass(frozen=True)
class Located:
    """Where a model's run is: ``declared`` (the model's :class:`BlockRun`, or None for a
    sequential), ``layers`` (the sequential's children, or None) and the run ``[start, end)``
    (indices into ``layers``, or ``0, L`` over the declared blocks)."""

    declared: BlockRun | None
    layers: list | None
    start: int
    end: int


def children(model: Layer) -> list | None:
    """The layers of a ``layer.sequential`` (read from its apply function), or None."""
    try:
        layers = inspect.getclosurevars(model.apply).nonlocals.get("layers")
    except TypeError:
        return None
    if isinstance(layers, list) and all(isinstance(c, Layer) for c in layers):
        return layers
    return None


def _signature(layer: Layer, params: Any) -> tuple:
    """What makes two blocks identical: name, apply function, parameter structure and shapes."""
    leaves, treedef = tree.flatten(params)
    shapes = tuple((tuple(type_of(x).shape), type_of(x).dtype) for x in leaves)
    return layer.name, getattr(layer.apply, "__code__", id(layer.apply)), treedef, shapes


def find_run(layers: list, params: list) -> tuple[int, int]:
    """``(start, end)`` of the longest run of identical consecutive blocks holding parameters
    (the first such run of that length); ``(0, 0)`` when no layer holds parameters."""
    sigs = [_signature(layer, p) for layer, p in zip(layers, params)]
    best = (0, 0)
    i = 0
    while i < len(layers):
        j = i + 1
        while j < len(layers) and sigs[j] == sigs[i]:
            j += 1
        if j - i > best[1] - best[0] and tree.flatten(params[i])[0]:
            best = (i, j)
        i = j
    return best


def _repeated_group(layers: list, params: list) -> tuple[int, int, int] | None:
    """``(start, period, repeats)`` of the longest stretch of layers repeating a group of at
    least two layers at least twice (``linear, tanh, linear, tanh``), or None."""
    sigs = [_signature(layer, p) for layer, p in zip(layers, params)]
    best = None
    for period in range(2, len(layers) // 2 + 1):
        for start in range(len(layers) - 2 * period + 1):
            repeats = 1
            while (
                start + (repeats + 1) * period <= len(layers)
                and sigs[start + repeats * period : start + (repeats + 1) * period]
                == sigs[start : start + period]
            ):
                repeats += 1
            holds = any(tree.flatten(params[k])[0] for k in range(start, start + period))
            if repeats >= 2 and holds and (best is None or repeats * period > best[1] * best[2]):
                best = (start, period, repeats)
    return best


def _no_run_message(stages: int, model: Layer, layers: list, params: list) -> str:
    head = (
        f"pipeline parallelism over {stages} stages: the sequential {model.name!r} has no run of "
        "identical blocks (consecutive layers of one kind with the same parameter shapes)"
    )
    group = _repeated_group(layers, params)
    if group is None:
        return head + " to split over the stages; make its repeated part a list of identical blocks"
    start, period, repeats = group
    names = ", ".join(layers[k].name for k in range(start, start + period))
    return (
        f"{head}; its layers {start}-{start + period * repeats - 1} repeat the group ({names}) "
        f"{repeats} times: make each repetition one block, layer.sequential([..., "
        f"*[layer.sequential([{names}]) for _ in range({repeats})], ...]), and the blocks are split "
        "over the stages"
    )


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _check_count(stages: int, model: Layer, count: int, where: str) -> None:
    if count % stages:
        raise ValueError(
            f"pipeline parallelism: {stages} stages do not divide the {count} identical blocks of "
            f"{model.name!r} ({where}); choose stages= among {_divisors(count)}, or change the "
            "number of blocks"
        )


def locate(stages: int, model: Layer, params: Any, state: Any) -> Located:
    """The run of ``model`` to split over ``stages`` stages; ``ValueError`` naming the model and
    the fix when there is none, when its length is not a multiple of ``stages``, or when its
    blocks hold layer state."""
    declared = block_run(model)
    if declared is not None:
        count = len(declared.blocks(params))
        _check_count(stages, model, count, f"parameters {declared.path!r}")
        return Located(declared, None, 0, count)
    layers = children(model)
    if layers is None:
        raise ValueError(
            f"pipeline parallelism needs a model made of a run of identical blocks: a "
            f"layer.sequential([<layers before>, *blocks, <layers after>]) or a kn.models decoder; "
            f"got layer {model.name!r}, which shows neither"
        )
    params, state = list(params), list(state)
    start, end = find_run(layers, params)
    if end == start or (end - start < 2 and stages > 1):
        raise ValueError(_no_run_message(stages, model, layers, params))
    _check_count(stages, model, end - start, f"layers {start}-{end - 1}")
    for i in range(start, end):
        if tree.flatten(state[i])[0]:
            raise ValueError(
                f"pipeline parallelism: block {i}.{layers[i].name} holds layer state (e.g. batch "
                "norm statistics), which pipelined blocks cannot update"
            )
    return Located(None, layers, start, end)
