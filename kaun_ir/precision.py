"""Mixed precision: float32 master weights and optimiser state, matrix products in bfloat16 or
float16, dynamic loss scaling for float16 — ``train.make(..., precision=...)``.

A :class:`Policy` names the compute dtype. The ``mixed-precision`` pass casts the operands of
every float32 ``dot_general`` and ``convolution`` of the training step (forward and backward)
to it; ``dot_general`` accumulates and returns float32 (its ``preferred_dtype``), a
``convolution`` runs in the compute dtype and its result is cast back. Everything else
(elementwise ops, reductions, softmax, the loss, the optimiser update) stays float32, as do the
parameters and the optimiser state: only the products, where the time goes, are cheap.

float16 has 5 exponent bits: small gradients underflow to zero. With ``loss_scale="dynamic"``
(the default for float16) the loss is multiplied by a scale ``S`` before differentiation and the
gradients divided by ``S`` afterwards; when a gradient is not finite the update is skipped
(parameters and optimiser state unchanged) and ``S`` halves, and after ``growth_interval``
finite steps in a row ``S`` doubles. All of it runs inside the compiled step: ``S`` and the
count of finite steps are two more optimiser slots (:func:`loss_scaled`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kaun_ir import dtypes, ptree, tree
from kaun_ir.names import public_dir
from kaun_ir.optim.core import Algorithm
from kaun_ir.surface import reductions
from kaun_ir.surface.creation import zeros_like
from kaun_ir.surface.elementwise import where
from kaun_ir.surface.promotion import astype, dtype_of
from kaun_ir.surface.tensor import apply

__all__ = ["Policy", "as_policy", "loss_scaled", "loss_scale_of"]


@dataclass(frozen=True)
class Policy:
    """``compute``: ``bfloat16`` or ``float16`` (the dtype of the matrix products);
    ``loss_scale``: ``None`` (no scaling), ``"dynamic"``, or a fixed number;
    ``initial_scale``, ``growth_interval``: the dynamic scale's start and doubling period."""

    compute: Any = dtypes.bfloat16
    loss_scale: Any = None
    initial_scale: float = 2.0**15
    growth_interval: int = 2000

    def __post_init__(self):
        compute = dtypes.canonical(self.compute)
        if compute not in (dtypes.bfloat16, dtypes.float16):
            raise ValueError(
                f"precision: compute must be bfloat16 or float16, got {dtypes.short_name(compute)}"
            )
        # a normalisation, not a cache: dataclasses have no converters (tests/test_declared_state.py)
        object.__setattr__(self, "compute", compute)
        scale = self.loss_scale
        if not (scale is None or scale == "dynamic" or (isinstance(scale, (int, float)) and scale > 0)):
            raise ValueError(
                f"precision: loss_scale must be None, 'dynamic' or a positive number, got {scale!r}"
            )
        if self.growth_interval < 1 or self.initial_scale <= 0:
            raise ValueError("precision: growth_interval must be >= 1 and initial_scale > 0")

    @property
    def name(self) -> str:
        """``"bfloat16"`` or ``"float16"``."""
        return np.dtype(self.compute).name


def as_policy(precision: Any) -> Policy:
    """A :class:`Policy` from ``"bfloat16"`` (no loss scaling), ``"float16"`` (dynamic loss
    scaling), a dtype, or a Policy."""
    if isinstance(precision, Policy):
        return precision
    try:
        compute = dtypes.canonical(precision)
    except (TypeError, ValueError):
        raise ValueError(
            f"precision must be 'bfloat16', 'float16' or a kn.precision.Policy, got {precision!r}"
        ) from None
    return Policy(compute, "dynamic" if compute == dtypes.float16 else None)


def loss_scaled(alg: Algorithm, policy: Policy) -> Algorithm:
    """``alg`` taking gradients of the loss times the current scale: they are divided by it, and
    a step with a non-finite gradient changes nothing but the scale (see the module docstring).
    Two slots are added: ``loss_scale`` and ``finite_steps``, trees of scalars shaped like the
    parameter tree (every leaf holds the same value)."""

    dynamic = policy.loss_scale == "dynamic"
    start = policy.initial_scale if dynamic else float(policy.loss_scale)
    n_inner = len(alg.slots)

    def init(params):
        scale = ptree.map(lambda p: np.asarray(start, np.float32), params)
        finite = ptree.map(lambda p: np.asarray(0, np.int32), params)
        return tuple(alg.init(params)) + (scale, finite)

    def step(t, trees, params, grads):
        inner, scale_tree, finite_tree = tuple(trees[:n_inner]), trees[n_inner], trees[n_inner + 1]
        scale = ptree.flatten(scale_tree)[0][0]
        finite_steps = ptree.flatten(finite_tree)[0][0]
        grads = ptree.map(
            lambda g: astype(g / astype(scale, dtype_of(g)), dtype_of(g)),
            grads,
        )
        ok = None
        for g in ptree.flatten(grads)[0]:
            leaf_ok = reductions.all(apply("is_finite", g))
            ok = leaf_ok if ok is None else ok & leaf_ok
        updates, new_inner = alg.step(t, inner, params, grads)
        updates = ptree.map(lambda u: where(ok, u, zeros_like(u)), updates)
        new_inner = tuple(
            ptree.map2(lambda new, old: where(ok, new, old), n, o) for n, o in zip(new_inner, inner)
        )
        if dynamic:
            grown = finite_steps + 1
            double = grown >= policy.growth_interval
            new_scale = where(ok, where(double, scale * 2.0, scale), scale * 0.5)
            new_finite = where(ok, where(double, 0, grown), 0).astype(dtypes.int32)
        else:
            new_scale, new_finite = scale, finite_steps
        return updates, new_inner + (
            ptree.map(lambda _: new_scale, scale_tree),
            ptree.map(lambda _: new_finite, finite_tree),
        )

    return Algorithm(
        init,
        step,
        f"{alg.name}+loss_scale",
        dict(alg.hyperparams, loss_scale=policy.loss_scale),
        tuple(alg.slots) + ("loss_scale", "finite_steps"),
    )


def loss_scale_of(opt_state: Any) -> Any:
    """The current loss scale in the state ``(count, trees)`` of a :func:`loss_scaled` optimiser."""
    return tree.flatten(opt_state[1][-2])[0][0]


__dir__ = public_dir(__all__)
