"""Saving and restoring a whole training state (``kn.checkpoint`` files).

The file holds the parameters, layer state, optimiser state, step and base key as tensors, and
in its header which optimiser the state belongs to (``"kaun_ir.optimizer"``, e.g.
``"adam(mu,nu)"``), so a state is never resumed under a different optimiser: an Adam state has
two trees of parameter shapes, and SGD with momentum would otherwise read the first as its
momentum without a word.
"""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes, layer, optim, tree
from kaun_ir.checkpoint import core as checkpoint
from kaun_ir.train.state import State, Trainer, check_state, describe_optimizer

__all__ = ["state_to_tree", "state_of_tree", "save", "load", "load_like"]


def state_to_tree(st: State) -> dict:
    """A plain tree of the whole training state (for ``kn.checkpoint``)."""
    count, trees = optim.state_to_trees(st.opt_state)
    return {
        "params": st.vars.params,
        "state": st.vars.state,
        "optimizer": {"count": count, "trees": list(trees)},
        "step": np.asarray(st.step, np.int64),
        "key": st.key,
    }


def state_of_tree(trainer: Trainer, data: dict, dtype=None) -> State:
    """Inverse of :func:`state_to_tree`."""
    dt = dtypes.canonical(dtype) if dtype is not None else _dtype_of_params(data["params"])
    saved = data["optimizer"]
    opt = optim.state_of_trees(trainer.optimizer, saved["count"], tuple(saved["trees"]))
    return State(
        layer.Vars(data["params"], data["state"], dt),
        opt,
        int(np.asarray(data["step"])),
        data["key"],
        describe_optimizer(trainer.optimizer),
    )


def _dtype_of_params(params) -> np.dtype:
    for leaf in tree.flatten(params)[0]:
        if hasattr(leaf, "dtype") and dtypes.is_float(leaf.dtype):
            return np.dtype(leaf.dtype)
    return dtypes.float32


def save(path: str, st: State, metadata: dict | None = None) -> str:
    """Write the whole training state (parameters, layer state, optimiser state and which
    optimiser it belongs to, step, key) atomically as SafeTensors; ``checkpoint.save(path, st)``
    does the same. ``metadata``: extra string entries for the header. Returns ``path``."""
    check_state(st, "save")
    header = dict(metadata or {})
    if st.optimizer:
        header[checkpoint.OPTIMIZER_KEY] = st.optimizer
    return checkpoint.save(path, state_to_tree(st), metadata=header)


def _check_optimizer(path: str, want: str, where: str) -> None:
    saved = checkpoint.metadata(path).get(checkpoint.OPTIMIZER_KEY, "")
    if saved and want and saved != want:
        raise ValueError(
            f"{where}: {path} holds a training state of the optimiser {saved}, but this "
            f"trainer's optimiser is {want}; resume with the optimiser that wrote it, or keep "
            "only the parameters and start a fresh optimiser state: "
            "fresh = train.init(trainer); "
            "params = checkpoint.load(path, like={'params': fresh.vars.params})['params']; "
            "st = train.make_state(trainer, layer.with_params(fresh.vars, params))"
        )


def load(path: str, trainer: Trainer, like: State | None = None) -> State:
    """Read a state written by :func:`save` for ``trainer``. ``like`` (e.g. ``train.init(trainer)``)
    gives the structure, shapes and dtypes to check and cast to (and, for a trainer on a mesh,
    the layout); without it the structure stored in the file is used as it is. Resuming gives
    bit-for-bit the same run as not stopping. ``ValueError`` naming both optimisers when the
    file's state belongs to a different optimiser than ``trainer``'s."""
    _check_optimizer(str(path), describe_optimizer(trainer.optimizer), "train.load")
    if like is None:
        return state_of_tree(trainer, checkpoint.load(path))
    data = checkpoint.load(path, like=state_to_tree(like))
    return state_of_tree(trainer, data, like.vars.dtype)


def load_like(path: str, like: State) -> State:
    """``checkpoint.load(path, like=state)``: a state with ``like``'s structure, refused when the
    file's optimiser differs from the one ``like`` belongs to."""
    _check_optimizer(path, like.optimizer, "checkpoint.load")
    data = checkpoint.load(path, like=state_to_tree(like))
    count, trees = data["optimizer"]["count"], tuple(data["optimizer"]["trees"])
    return State(
        layer.Vars(data["params"], data["state"], like.vars.dtype),
        optim.State(count, trees),
        int(np.asarray(data["step"])),
        data["key"],
        like.optimizer,
    )
