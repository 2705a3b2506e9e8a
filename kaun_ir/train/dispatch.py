"""Repeated steps at dispatch cost: ``train.step``'s use of ``kaun_ir.runtime``'s routes.

After a step on a state, the returned state remembers its flattened device arrays and an
interned token of their structure (``State.cache``); the route of the step's executable is
filed in the compiled step's ``routes`` under ``("train", state token, loss key, training,
(shape, dtype) of x and the targets)``. The next ``train.step`` on that state with a batch of the
same signature is then one dict lookup, the transfer of ``x`` and the targets, and the
execution: no tree flattening, no signature building.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kaun_ir import optim, tree
from kaun_ir.runtime import compilation
from kaun_ir.surface.trace import is_array_leaf
from kaun_ir.train import capture
from kaun_ir.train.call import StepCall
from kaun_ir.train.capture import Explicit, LossSpec
from kaun_ir.train.state import State, Trainer, successor

__all__ = ["fast_step", "record"]


class _Struct:
    """An interned token for the structure, shapes and dtypes of a state's arrays (identity
    compared, so the per-step check is one dict lookup, not a tree walk)."""

    __slots__ = ("description",)

    def __init__(self, description):
        self.description = description


class _Meta:
    """What ``train`` keeps with a route: the token of the state the step returns and the
    number of flat state inputs (params, layer state, optimiser state, key)."""

    __slots__ = ("out_struct", "n_state")

    def __init__(self, out_struct: _Struct, n_state: int):
        self.out_struct, self.n_state = out_struct, n_state


def _struct_of(trainer: Trainer, leaves: list, treedef, dtype) -> _Struct | None:
    if not all(is_array_leaf(leaf) and hasattr(leaf, "shape") for leaf in leaves):
        return None
    description = (treedef, dtype, tuple((tuple(a.shape), np.dtype(a.dtype)) for a in leaves))
    table = trainer.cache.structs
    return table.setdefault(description, _Struct(description))


def _state_leaves(st: State) -> tuple[list, Any]:
    v = st.vars
    return tree.flatten((v.params, v.state, tuple(st.opt_state), st.key))


def _loss_key(loss) -> Any:
    return "explicit" if isinstance(loss, Explicit) else loss.key


def record(
    trainer: Trainer, route, st: State, new: State, loss, x: Any, arrays: tuple, training: bool, outs: list
) -> None:
    """After a general step: file its route for the fast path and give ``new`` its flat arrays."""
    array_types = compilation.array_types()
    if type(x) not in array_types or any(type(a) not in array_types for a in arrays):
        return
    dtype = st.vars.dtype
    leaves, treedef = _state_leaves(st)
    in_struct = _struct_of(trainer, leaves, treedef, dtype)
    new_leaves, new_def = _state_leaves(new)
    out_struct = _struct_of(trainer, new_leaves, new_def, dtype)
    if in_struct is None or out_struct is None:
        return
    sig = ((x.shape, np.dtype(x.dtype)),) + tuple((a.shape, np.dtype(a.dtype)) for a in arrays)
    n_state = len(leaves)
    routes = trainer.cache.step.routes
    key = ("train", in_struct, _loss_key(loss), bool(training), sig)
    routes.put(key, route.with_meta(_Meta(out_struct, n_state)))
    flat = outs[1:]  # the new params, layer state and optimiser state, in state order
    # the base key is the same every step: move it to the device once, not on every dispatch
    flat.append(route.place([st.key], n_state - 1)[0])
    new.cache.flat = (out_struct, flat)


def fast_step(trainer: Trainer, st: State, call: StepCall):
    """``(loss, new_state)`` for a signature seen before on a state returned by ``step``; None
    when anything differs (the general path then runs)."""
    compiled = trainer.cache.step
    if compiled is None:
        return None
    x, targets, training = call.x, call.targets, call.training
    struct, leaves = st.cache.flat
    is_deleted = getattr(leaves[0], "is_deleted", None) if leaves else None  # NumPy (IREE): never
    if is_deleted is not None and is_deleted():
        return None  # the general path raises the clear error
    array_types = compilation.array_types()
    if trainer.loss is not None:
        loss_key, arrays = "explicit", targets
    else:
        if len(targets) != 1:
            return None
        quick = capture.quick_key(targets[0], array_types)
        if quick is None:
            spec = LossSpec(targets[0]) if callable(targets[0]) else None
            if spec is None or spec.opaque is not None:
                return None
            capture.remember(spec, array_types)
            quick = spec.key, spec.arrays
        loss_key, arrays = quick
        if loss_key in trainer.cache.opaque:
            return None
    # NumPy and jax arrays only (their ``dtype`` is a NumPy dtype, as in the key ``record`` files)
    if type(x) not in array_types:
        return None
    sig = [(x.shape, x.dtype)]
    for a in arrays:
        if type(a) not in array_types:
            return None
        sig.append((a.shape, a.dtype))
    sig = tuple(sig)
    route = compiled.routes.get(("train", struct, loss_key, bool(training), sig))
    if route is None:
        return None
    meta = route.meta
    # the state's leaves are outputs of this executable: already on its device, right dtypes
    outs = route.run(leaves + route.place([x, *arrays], meta.n_state))
    loss_value, params, state, (count, trees) = route.unflatten(outs)
    new_leaves = outs[1:]
    new_leaves.append(leaves[-1])  # the base key, already on the device
    new = successor(st, params, state, optim.State(count, trees), 1, (meta.out_struct, new_leaves))
    return loss_value, new
