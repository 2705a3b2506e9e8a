"""Saving and restoring a whole training state (``kn.checkpoint`` files)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import checkpoint, dtypes, layer, optim, tree
from .state import State, Trainer, check_state

__all__ = ["state_to_tree", "state_of_tree", "save", "load"]


def state_to_tree(st: State) -> dict:
    """A plain tree of the whole training state (for ``kn.checkpoint``)."""
    count, trees = optim.state_to_trees(st.opt_state)
    return {"params": st.vars.params, "state": st.vars.state,
            "optimizer": {"count": count, "trees": list(trees)},
            "step": np.asarray(st.step, np.int64), "key": st.key}


def state_of_tree(trainer: Trainer, data: dict, dtype=None) -> State:
    """Inverse of :func:`state_to_tree`."""
    dt = dtypes.canonical(dtype) if dtype is not None else _dtype_of_params(data["params"])
    saved = data["optimizer"]
    opt = optim.state_of_trees(trainer.optimizer, saved["count"], tuple(saved["trees"]))
    return State(layer.Vars(data["params"], data["state"], dt), opt, int(np.asarray(data["step"])),
                 data["key"])


def _dtype_of_params(params) -> np.dtype:
    for leaf in tree.flatten(params)[0]:
        if hasattr(leaf, "dtype") and dtypes.is_float(leaf.dtype):
            return np.dtype(leaf.dtype)
    return dtypes.float32


def save(path: str, st: State) -> None:
    """Write the whole training state (parameters, layer state, optimiser state, step, key)
    atomically as SafeTensors."""
    check_state(st, "save")
    checkpoint.save(path, state_to_tree(st))


def load(path: str, trainer: Trainer, like: State) -> State:
    """Read a state written by :func:`save`; ``like`` (e.g. ``train.init(trainer)``) gives the
    structure, shapes and dtypes. Resuming gives bit-for-bit the same run as not stopping."""
    data = checkpoint.load(path, like=state_to_tree(like))
    return replace(state_of_tree(trainer, data, like.vars.dtype))
