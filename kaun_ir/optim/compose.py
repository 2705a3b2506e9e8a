"""Composing optimisers: ``chain`` and gradient transformations such as global-norm clipping.

A transformation is an :class:`~kaun_ir.optim.core.Algorithm` like any optimiser: its ``step``
maps incoming updates (the gradients, for the first one) to outgoing updates. ``chain(a, b, ...)``
feeds each one's output to the next, so ``chain(clip_by_global_norm(1.0), adamw(3e-4))`` clips
the gradients and then runs AdamW on them, as optax's ``chain`` does. A chain is itself an
Algorithm: it works wherever an optimiser does (``optim.update``, ``train.make``).
"""

from __future__ import annotations

import numbers
from typing import Any

from kaun_ir.optim.core import Algorithm, _clip, clip_grads_by_global_norm
from kaun_ir.optim.freezing import trainable_only

__all__ = ["chain", "clip_by_global_norm", "clip_by_global_norm_transform"]


def chain(*transforms: Algorithm) -> Algorithm:
    """The transformations applied one after the other to the gradients (optax ``chain``).

    The state holds every member's trees in order; their slot names are prefixed with the
    member's position (``"1.mu"``). One step counter is shared (schedules see the same step).
    An ``optim.ema`` after an ``optim.freeze`` averages the trainable leaves only
    (``chain(freeze(adam(1e-3), layer.lora_frozen), ema(0.999))`` keeps no copy of the frozen
    base model); ``optim.ema_params`` still reads back whole parameters.
    """
    if not transforms:
        raise ValueError("optim.chain: give at least one optimiser or transformation")
    for i, alg in enumerate(transforms):
        if not isinstance(alg, Algorithm):
            raise TypeError(
                f"optim.chain: argument {i} must be an optim algorithm or transformation (e.g. "
                f"optim.clip_by_global_norm(1.0), optim.adam(1e-3)), got {type(alg).__name__}"
            )
    transforms = trainable_only(transforms)
    sizes = [len(alg.slots) for alg in transforms]

    def init(params):
        trees: list = []
        for alg, size in zip(transforms, sizes):
            own = tuple(alg.init(params))
            if len(own) != size:
                raise ValueError(
                    f"optim.chain: {alg.name}.init returned {len(own)} trees for slots {alg.slots}"
                )
            trees.extend(own)
        return tuple(trees)

    def step(t, trees, params, grads):
        updates, new_trees, start = grads, [], 0
        for alg, size in zip(transforms, sizes):
            updates, own = alg.step(t, tuple(trees[start : start + size]), params, updates)
            new_trees.extend(own)
            start += size
        return updates, tuple(new_trees)

    slots = tuple(f"{i}.{slot}" for i, alg in enumerate(transforms) for slot in alg.slots)
    return Algorithm(init, step, "chain", {"transforms": list(transforms)}, slots)


def clip_by_global_norm_transform(max_norm: Any) -> Algorithm:
    """The transformation that scales its incoming updates by ``max_norm / global_norm`` when the
    norm exceeds ``max_norm`` (optax ``clip_by_global_norm``; PyTorch ``clip_grad_norm_``).
    Stateless. ``optim.clip_by_global_norm(max_norm)`` with one argument returns it."""
    if isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real):
        raise TypeError(f"optim.clip_by_global_norm: max_norm must be a number, got {max_norm!r}")
    max_norm = float(max_norm)
    if not max_norm > 0:
        raise ValueError(f"optim.clip_by_global_norm: max_norm must be > 0, got {max_norm}")

    def init(params):
        return ()

    def step(t, trees, params, updates):
        return _clip(max_norm, updates), ()

    return Algorithm(init, step, "clip_by_global_norm", {"max_norm": max_norm}, ())


_NO_GRADS = object()


def clip_by_global_norm(max_norm: Any, grads: Any = _NO_GRADS) -> Any:
    """The gradient *transformation* (an :class:`Algorithm`) that clips by global norm, for
    ``optim.chain(optim.clip_by_global_norm(1.0), optim.adamw(3e-4))`` (optax's name).

    Deprecated form: ``clip_by_global_norm(max_norm, grads)`` still clips a gradient tree
    directly; spell it :func:`clip_grads_by_global_norm(grads, max_norm)
    <clip_grads_by_global_norm>`, which is unambiguous.
    """
    if grads is _NO_GRADS:
        return clip_by_global_norm_transform(max_norm)
    if isinstance(max_norm, (int, float)) and not max_norm > 0:
        raise ValueError(f"optim.clip_by_global_norm: max_norm must be > 0, got {max_norm}")
    return clip_grads_by_global_norm(grads, max_norm)
