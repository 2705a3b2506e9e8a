"""Optimisers on part of the parameters: ``optim.freeze`` and the weight average under it.

``freeze(inner, mask)`` runs ``inner`` on the trainable leaves only (``mask`` selects the frozen
ones); ``inner`` sees a tree of those leaves with their own dotted paths, so it keeps state for
them alone. A weight average (``optim.ema``) placed *after* a freeze in a chain
(``chain(freeze(adam, mask), ema(0.999))``) is restricted the same way by :func:`chain`, so
both orders of LoRA + EMA keep an average of the adapters only; ``optim.ema_params`` reads the
frozen leaves back from the current parameters (they never change).
"""

from __future__ import annotations

from typing import Any

from kaun_ir import ptree
from kaun_ir.optim.core import Algorithm
from kaun_ir.optim.masks import decay_mask
from kaun_ir.surface.creation import zeros
from kaun_ir.surface.promotion import dtype_of, shape_of
from kaun_ir.tree import nested as nested_tree

__all__ = ["freeze", "trainable_only"]


def _trainable(tree: Any, flags: list) -> dict:
    """The leaves whose flag is False, as nested dicts keyed by their own paths."""
    pairs = [pair for pair, off in zip(ptree.flatten_with_paths(tree), flags) if not off]
    return nested_tree(pairs)


def _restricted(inner: Algorithm, mask: Any, opt: str, pass_frozen: bool) -> tuple:
    """``(init, step)`` running ``inner`` on the leaves ``mask`` does not select. The selected
    (frozen) leaves' updates become zeros, or pass through unchanged with ``pass_frozen``."""
    frozen = decay_mask(opt, mask)

    def init(params):
        return tuple(inner.init(_trainable(params, frozen(params))))

    def step(t, trees, params, updates):
        flags = frozen(params)
        sub_updates, new = inner.step(t, trees, _trainable(params, flags), _trainable(updates, flags))
        by_path = dict(ptree.flatten_with_paths(sub_updates))
        incoming = ptree.leaves(updates)
        out = []
        for (path, p), off, u in zip(ptree.flatten_with_paths(params), flags, incoming):
            if not off:
                out.append(by_path[path])
            else:
                out.append(u if pass_frozen else zeros(shape_of(p), dtype_of(p)))
        return ptree.flatten(params)[1](out), tuple(new)

    return init, step


def freeze(inner: Algorithm, mask: Any) -> Algorithm:
    """``inner`` on the trainable parameters only: ``mask`` selects the *frozen* leaves (a
    predicate ``mask(path)`` / ``mask(path, param)`` on dotted paths, or a tree of bools). Frozen
    leaves get zero updates and no optimiser state (``inner`` sees a tree of the trainable leaves
    alone, with their own paths), so fine-tuning a few layers of a large model keeps moments for
    those layers only. ``optim.chain(optim.freeze(optim.adamw(1e-4), lambda path:
    path.startswith("embed")), ...)``. An ``optim.ema`` inside ``inner`` or after the freeze in a
    chain averages the trainable leaves only."""
    if not isinstance(inner, Algorithm):
        raise TypeError(f"optim.freeze: inner must be an optim algorithm, got {type(inner).__name__}")
    init, step = _restricted(inner, mask, "freeze", pass_frozen=False)
    return Algorithm(init, step, "freeze", {"inner": inner, "mask": mask}, tuple(inner.slots))


def _frozen_masks(alg: Algorithm) -> list:
    """The masks of the freezes ``alg`` applies to the whole parameter tree (itself, or the
    members of a chain)."""
    if alg.name == "freeze":
        return [alg.hyperparams["mask"]]
    if alg.name == "chain":
        return [mask for member in alg.hyperparams.get("transforms", ()) for mask in _frozen_masks(member)]
    return []


def trainable_only(members: tuple) -> tuple:
    """A chain's members with each ``optim.ema`` that follows an ``optim.freeze`` restricted to
    that freeze's trainable leaves: the frozen leaves never change, so averaging them would only
    copy them (a whole base model for LoRA). The restricted average passes every update through
    unchanged and keeps its name and slot (``ema``)."""
    masks: list = []
    out = []
    for alg in members:
        if alg.name == "ema" and masks and "frozen" not in alg.hyperparams:
            for mask in reversed(masks):
                init, step = _restricted(alg, mask, "ema", pass_frozen=True)
                alg = Algorithm(init, step, "ema", {**alg.hyperparams, "frozen": mask}, alg.slots)
        out.append(alg)
        masks.extend(_frozen_masks(alg))
    return tuple(out)
