"""A model's run of identical blocks, declared for pipeline parallelism.

A ``layer.sequential`` shows its children, so the pipeline finds a run of identical blocks in it
by itself. A model written as one function (``kn.models.decoder``: embeddings, ``L`` transformer
blocks, final norm and head) declares its structure instead with :func:`with_block_run`: what
runs before the blocks, where the blocks' parameters are, one block's forward pass, and what runs
after them. ``train.make(..., pipeline=kn.sharding.pipeline(...))`` then splits the blocks over
the stages while the model's own ``apply`` stays what every other caller uses.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kaun_ir.layer.core import Layer

__all__ = ["BlockRun", "with_block_run", "block_run"]


@dataclass(frozen=True)
class BlockRun:
    """The structure of a model as ``after(blocks(before(x)))`` over a run of identical blocks.

    - ``before(params, state, x, *, training, ctx) -> h``: what runs ahead of the blocks
      (embeddings); ``h`` is one array whose first dimension is the batch;
    - ``blocks(params) -> list``: the blocks' parameter trees, in order (all of one structure
      and shapes), read out of the model's parameters;
    - ``block``: one block as a :class:`~kaun_ir.layer.Layer` (``apply(p, state, h, ...) -> (h,
      state)``, the same function for every block; it holds no layer state);
    - ``after(params, state, h, *, training, ctx) -> y``: what runs after them (final norm, head);
    - ``path``: the blocks' dotted parameter path (``"layers"``), for layer paths and messages.

    The model's layer state passes through unchanged (a model with a block run holds none that
    the run updates)."""

    before: Callable[..., Any]
    blocks: Callable[[Any], list]
    block: Layer
    after: Callable[..., Any]
    path: str = "blocks"


# the block runs declared for models (kept while the model lives; a Layer compares by identity)
_RUNS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def with_block_run(model: Layer, run: BlockRun) -> Layer:
    """``model``, with ``run`` recorded as its structure for pipeline parallelism (returned for
    chaining: ``return with_block_run(Layer(init, apply, "gpt2"), BlockRun(...))``)."""
    if not isinstance(model, Layer):
        raise TypeError(f"with_block_run: model must be a kn.layer.Layer, got {type(model).__name__}")
    if not isinstance(run, BlockRun):
        raise TypeError(f"with_block_run: run must be a BlockRun, got {type(run).__name__}")
    _RUNS[model] = run
    return model


def block_run(model: Layer) -> BlockRun | None:
    """The :class:`BlockRun` declared for ``model``, or None."""
    return _RUNS.get(model)
