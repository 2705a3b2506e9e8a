"""Diagnostics of training steps that would otherwise mislead: a state made for another model
(which fails deep inside some layer as a shape error) and a loss that ignores the parameters
(which trains with zero gradients without a word)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from kaun_ir import layer, rng, tree
from kaun_ir.surface.trace import trace_flat
from kaun_ir.train.state import State, Trainer


def raise_if_foreign_state(trainer: Trainer, st: State, where: str, err: Exception) -> None:
    """After a step failed to trace: if the state's parameters are not the model's own (compared
    with a trace of the model's ``init``, never materialised), raise a ``ValueError`` saying that
    the state does not match the model and naming the first differing paths."""

    def make():
        return layer.init(trainer.model, st.vars.dtype).params

    try:
        with rng.scope(0):
            traced = trace_flat(make, (), {}, name="init")
    except Exception:  # noqa: BLE001 - the model cannot initialise without an example: keep err
        return
    expected = tree.unflatten(traced.out_treedef, [tuple(t.shape) for t in traced.graph.output_types])
    want = dict(tree.paths(expected, is_leaf=lambda leaf: isinstance(leaf, tuple)))
    got = {path: tuple(np.shape(leaf)) for path, leaf in tree.paths(st.vars.params)}
    problems = [f"parameter {path or '<root>'!r} missing" for path in want if path not in got]
    problems += [f"unexpected parameter {path or '<root>'!r}" for path in got if path not in want]
    problems += [
        f"parameter {path!r} has shape {list(got[path])}, the model expects {list(shape)}"
        for path, shape in want.items()
        if path in got and got[path] != shape
    ]
    if problems:
        raise ValueError(
            f"train.{where}: the training state does not match the model: "
            f"{'; '.join(problems[:3])}{' ...' if len(problems) > 3 else ''} "
            f"(was the state made by train.init of another model?)"
        ) from err


def warn_if_independent(loss_value: Any, params: Any) -> None:
    """Warn (while tracing, so once per compiled signature) when the loss does not depend on any
    parameter: every gradient is zero and training silently changes nothing."""
    sources = {id(leaf.value) for leaf in tree.flatten(params)[0] if hasattr(leaf, "value")}
    value = getattr(loss_value, "value", None)
    if not sources or value is None:
        return
    stack, seen = [value], set()
    while stack:
        current = stack.pop()
        if id(current) in sources:
            return
        node = current.node
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(node.inputs)
    warnings.warn(
        "train.step: the loss does not depend on the model's parameters, so every gradient is "
        "zero and training changes nothing (does the loss use the model's output?)",
        UserWarning,
        stacklevel=2,
    )
