"""``train.evaluate``: the model in inference mode over a data set, with the trainer's loss and
any metrics averaged over the examples."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from kaun_ir import tree
from kaun_ir.train.state import State, Trainer, check_state
from kaun_ir.train.stepping import predict

__all__ = ["evaluate"]


def _batch_size(x: Any) -> int:
    leaves = [leaf for leaf in tree.flatten(x)[0] if hasattr(leaf, "shape") and len(leaf.shape)]
    if not leaves:
        raise ValueError("train.evaluate: the inputs have no batch axis (every leaf is a scalar)")
    return int(leaves[0].shape[0])


def evaluate(
    trainer: Trainer,
    st: State,
    data: Iterable,
    metrics: dict[str, Callable] | None = None,
    ctx: dict | None = None,
) -> dict[str, float]:
    """Run the model with ``training=False`` over ``data`` (an iterable of ``(x, *targets)``
    tuples, e.g. a ``kn.data`` pipeline, which is reset first) and return the mean of each
    measure over the examples, as Python floats.

    The measures: ``"loss"`` (the trainer's ``loss(outputs, *targets)``, when it was made with
    ``loss=``) and each ``metrics[name](outputs, *targets)`` — e.g. ``kn.metric.accuracy`` or a
    loss function. A batch's value counts in proportion to its number of examples (the first
    axis of ``x``), so a smaller last batch is weighted correctly. The state is not changed.
    """
    check_state(st, "evaluate")
    measures: dict[str, Callable] = {}
    if trainer.loss is not None:
        measures["loss"] = trainer.loss
    for name, fn in (metrics or {}).items():
        if not callable(fn):
            raise TypeError(f"train.evaluate: metric {name!r} is not callable ({type(fn).__name__})")
        measures[str(name)] = fn
    if not measures:
        raise ValueError("train.evaluate: nothing to measure: give metrics= or make the trainer with loss=")
    if hasattr(data, "reset"):
        data.reset()
    totals = dict.fromkeys(measures, 0.0)
    count = 0
    for item in data:
        if not isinstance(item, tuple) or len(item) < 1:
            raise TypeError(
                f"train.evaluate: data must yield (x, *targets) tuples, got {type(item).__name__}"
            )
        x, targets = item[0], item[1:]
        outputs = predict(trainer, st, x, ctx=ctx)
        size = _batch_size(x)
        for name, fn in measures.items():
            totals[name] += float(np.asarray(fn(outputs, *targets))) * size
        count += size
    if count == 0:
        raise ValueError("train.evaluate: the data yielded no batches")
    return {name: total / count for name, total in totals.items()}
