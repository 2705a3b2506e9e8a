"""The optimisers: ``sgd``, ``adam``, ``adamw``, ``lion``, ``rmsprop``, ``adagrad``.

Each constructor returns an :class:`~kaun_ir.optim.core.Algorithm`. The update rules follow
optax exactly (same formulas, same order of the momentum and learning-rate scaling); where
PyTorch differs it is noted. ``lr`` is a number or a schedule ``step -> value`` (see
``kn.optim.schedule``) evaluated at the 1-based step inside the compiled update.

Per-step scalars (the learning rate, Adam's bias corrections ``1 - b**t``) are computed once per
step as scalars and cast once per parameter dtype; only the per-element work is done per leaf.
"""

from __future__ import annotations

from typing import Any

from kaun_ir import dtypes, ptree
from kaun_ir.optim.compose import chain
from kaun_ir.optim.core import Algorithm, filled_like
from kaun_ir.optim.leafwise import (
    _ema,
    _in,
    _learning_rate,
    _learning_rate_arg,
    _map_leaves,
    _number,
    _out,
    _Scalars,
    _scale,
    _state_dtype_arg,
)
from kaun_ir.optim.masks import decay_mask
from kaun_ir.optim.transforms import add_decayed_weights, scale_by_adam, scale_by_learning_rate, scale_by_lion
from kaun_ir.surface.elementwise import add, greater, multiply, rsqrt, where

__all__ = ["sgd", "adam", "adamw", "lion", "rmsprop", "adagrad"]


# ------------------------------------------------------------------------ optimisers


def sgd(lr: Any, momentum: float = 0.0, nesterov: bool = False, state_dtype: Any = None) -> Algorithm:
    """Stochastic gradient descent (optax ``sgd``; PyTorch ``SGD`` without dampening).

    Plain: ``update = -lr * g``. With ``momentum > 0`` a trace ``v = g + momentum * v`` is kept
    (one slot, ``"trace"``) and ``update = -lr * v``, or ``-lr * (g + momentum * v)`` with
    ``nesterov``. ``nesterov`` needs ``momentum > 0``. ``state_dtype``: see
    :func:`kaun_ir.optim.core.slot_dtype` (float32 for float16/bfloat16 parameters by default).
    """
    lr = _learning_rate_arg("sgd", lr)
    momentum = _number("sgd", "momentum", momentum)
    nesterov = bool(nesterov)
    if nesterov and momentum == 0.0:
        raise ValueError("optim.sgd: nesterov=True needs momentum > 0")
    state_dtype = _state_dtype_arg("sgd", state_dtype)

    def init(params):
        return (filled_like(params, 0.0, state_dtype),) if momentum else ()

    def step(t, trees, params, grads):
        scalars = _Scalars(neg_lr=_scale(_learning_rate(lr, t), -1.0))
        if not momentum:
            return _map_leaves(
                "sgd", lambda p, g: (multiply(scalars("neg_lr", g), g),), params, grads, trees, 1
            )[0], ()

        def leaf(p, g, v):
            g = _in(v, g)
            v = add(g, multiply(momentum, v))
            direction = add(g, multiply(momentum, v)) if nesterov else v
            return _out(p, multiply(scalars("neg_lr", g), direction)), v

        updates, velocity = _map_leaves("sgd", leaf, params, grads, trees, 2)
        return updates, (velocity,)

    hyper = {"lr": lr, "momentum": momentum, "nesterov": nesterov}
    if state_dtype is not None:
        hyper["state_dtype"] = dtypes.short_name(state_dtype)
    return Algorithm(init, step, "sgd", hyper, ("trace",) if momentum else ())


def _named_chain(name: str, members: list, hyper: dict, state_dtype: Any, slots: tuple) -> Algorithm:
    """``chain(*members)`` under one optimiser's name and hyper-parameters, its updates cast to
    the parameters' dtypes (the members compute in the slot dtype)."""
    inner = chain(*members)

    def step(t, trees, params, grads):
        updates, trees = inner.step(t, trees, params, grads)
        return ptree.map2(_out, params, updates), trees

    if state_dtype is not None:
        hyper["state_dtype"] = dtypes.short_name(state_dtype)
    return Algorithm(inner.init, step, name, hyper, slots)


def _decayed_chain(direction: Algorithm, lr: Any, weight_decay: float, mask: Any) -> list:
    """optax's order: the direction, then ``add_decayed_weights(wd, mask)``, then the learning rate."""
    members = [direction]
    if weight_decay:
        members.append(add_decayed_weights(weight_decay, mask))
    return members + [scale_by_learning_rate(lr)]


def _adam_like(
    name: str,
    lr: Any,
    b1: float,
    b2: float,
    eps: float,
    weight_decay: float,
    mask: Any = None,
    state_dtype: Any = None,
) -> Algorithm:
    lr = _learning_rate_arg(name, lr)
    b1 = _number(name, "b1", b1, 0.0, 1.0)
    b2 = _number(name, "b2", b2, 0.0, 1.0)
    eps = _number(name, "eps", eps)
    weight_decay = _number(name, "weight_decay", weight_decay)
    state_dtype = _state_dtype_arg(name, state_dtype)
    decay_mask(name, mask)  # a bad mask fails here
    hyper = {"lr": lr, "b1": b1, "b2": b2, "eps": eps}
    if name == "adamw":
        hyper["weight_decay"] = weight_decay
        if mask is not None:
            hyper["mask"] = mask
    members = _decayed_chain(scale_by_adam(b1, b2, eps, state_dtype), lr, weight_decay, mask)
    return _named_chain(name, members, hyper, state_dtype, ("mu", "nu"))


def adam(
    lr: Any, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, state_dtype: Any = None
) -> Algorithm:
    """Adam (optax ``adam`` with ``eps_root=0``; PyTorch ``Adam``): the chain
    ``scale_by_adam(b1, b2, eps)`` then ``scale_by_learning_rate(lr)``, named ``adam``.

    Slots ``mu``, ``nu``: ``mu = b1*mu + (1-b1)*g``, ``nu = b2*nu + (1-b2)*g**2``, then
    ``update = -lr * mu_hat / (sqrt(nu_hat) + eps)`` with ``mu_hat = mu / (1 - b1**t)``,
    ``nu_hat = nu / (1 - b2**t)`` at the 1-based step ``t``.

    ``state_dtype``: the dtype of ``mu``/``nu`` and of the update arithmetic (``eps`` included);
    default float32 for float16/bfloat16 parameters (in float16, ``eps = 1e-8`` rounds to 0 and
    the second moment underflows, so the update turns NaN), the parameter's dtype otherwise.
    The update is cast back to the parameter's dtype.
    """
    return _adam_like("adam", lr, b1, b2, eps, 0.0, None, state_dtype)


def adamw(
    lr: Any,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    mask: Any = None,
    state_dtype: Any = None,
) -> Algorithm:
    """Adam with decoupled weight decay (optax ``adamw``, whose default decay is 1e-4; PyTorch
    ``AdamW``'s default 0.01 is used here): ``update = -lr * (adam_direction + weight_decay *
    param)``, the chain ``scale_by_adam``, ``add_decayed_weights(weight_decay, mask)``,
    ``scale_by_learning_rate(lr)``, named ``adamw``.

    ``mask`` chooses the decayed parameters (default: all): a predicate ``mask(path) -> bool``
    on the dotted parameter path (``"blocks.0.attn.weight"``), or ``mask(path, param) -> bool``
    also given the parameter (nanoGPT decays only matrices: ``lambda path, p: p.ndim >= 2``),
    or a tree of bools shaped like the parameters (optax's form). ``state_dtype``: as in
    :func:`adam`."""
    return _adam_like("adamw", lr, b1, b2, eps, weight_decay, mask, state_dtype)


def lion(
    lr: Any,
    b1: float = 0.9,
    b2: float = 0.99,
    weight_decay: float = 1e-3,
    mask: Any = None,
    state_dtype: Any = None,
) -> Algorithm:
    """Lion (optax ``lion``; Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"):
    the chain ``scale_by_lion(b1, b2)``, ``add_decayed_weights(weight_decay, mask)``,
    ``scale_by_learning_rate(lr)``, named ``lion``: ``update = -lr * (sign((1-b1)*g + b1*mu) +
    weight_decay * param)``, then ``mu = (1-b2)*g + b2*mu``. One slot, ``mu`` (half Adam's
    state). ``mask`` and ``state_dtype`` as in :func:`adamw`; optax's defaults."""
    lr = _learning_rate_arg("lion", lr)
    b1 = _number("lion", "b1", b1, 0.0, 1.0)
    b2 = _number("lion", "b2", b2, 0.0, 1.0)
    weight_decay = _number("lion", "weight_decay", weight_decay)
    state_dtype = _state_dtype_arg("lion", state_dtype)
    decay_mask("lion", mask)  # a bad mask fails here
    hyper = {"lr": lr, "b1": b1, "b2": b2, "weight_decay": weight_decay}
    if mask is not None:
        hyper["mask"] = mask
    members = _decayed_chain(scale_by_lion(b1, b2, state_dtype), lr, weight_decay, mask)
    return _named_chain("lion", members, hyper, state_dtype, ("mu",))


def rmsprop(
    lr: Any, decay: float = 0.9, eps: float = 1e-8, momentum: float = 0.0, state_dtype: Any = None
) -> Algorithm:
    """RMSProp with optax's semantics (``optax.rmsprop`` with ``centered=False``).

    Slot ``nu``: ``nu = decay*nu + (1-decay)*g**2`` (starting at 0), ``u = -lr * g /
    sqrt(nu + eps)`` — ``eps`` inside the square root, unlike PyTorch's ``RMSprop`` which adds it
    outside. With ``momentum > 0`` a second slot ``trace`` accumulates the already lr-scaled
    ``u``: ``trace = u + momentum * trace`` is the update (optax's order: the learning rate is
    applied before the momentum, which matters only when the rate changes over time).
    ``state_dtype``: as in :func:`adam`.
    """
    lr = _learning_rate_arg("rmsprop", lr)
    decay = _number("rmsprop", "decay", decay, 0.0, 1.0, high_open=False)
    eps = _number("rmsprop", "eps", eps)
    momentum = _number("rmsprop", "momentum", momentum)
    state_dtype = _state_dtype_arg("rmsprop", state_dtype)

    def init(params):
        trees = (filled_like(params, 0.0, state_dtype),)
        return trees + (filled_like(params, 0.0, state_dtype),) if momentum else trees

    def step(t, trees, params, grads):
        scalars = _Scalars(neg_lr=_scale(_learning_rate(lr, t), -1.0))

        def leaf(p, g, nu, *trace):
            g = _in(nu, g)
            nu = _ema(decay, multiply(g, g), nu)
            u = multiply(scalars("neg_lr", g), multiply(rsqrt(add(nu, eps)), g))
            if not momentum:
                return _out(p, u), nu
            velocity = add(u, multiply(momentum, trace[0]))
            return _out(p, velocity), nu, velocity

        if not momentum:
            updates, nu = _map_leaves("rmsprop", leaf, params, grads, trees, 2)
            return updates, (nu,)
        updates, nu, velocity = _map_leaves("rmsprop", leaf, params, grads, trees, 3)
        return updates, (nu, velocity)

    hyper = {"lr": lr, "decay": decay, "eps": eps, "momentum": momentum}
    if state_dtype is not None:
        hyper["state_dtype"] = dtypes.short_name(state_dtype)
    return Algorithm(init, step, "rmsprop", hyper, ("nu", "trace") if momentum else ("nu",))


def adagrad(
    lr: Any, eps: float = 1e-8, initial_accumulator_value: float = 0.1, state_dtype: Any = None
) -> Algorithm:
    """Adagrad (optax ``adagrad``; its default ``eps`` is 1e-7, ours 1e-8 as in API.md).

    Slot ``sum_of_squares``, starting at ``initial_accumulator_value`` (0.1 like optax and
    TensorFlow; PyTorch starts at 0): ``s = s + g**2``, ``update = -lr * g / sqrt(s + eps)``
    where ``s > 0``, and 0 where ``s == 0``. ``state_dtype``: as in :func:`adam`.
    """
    lr = _learning_rate_arg("adagrad", lr)
    eps = _number("adagrad", "eps", eps)
    initial = _number("adagrad", "initial_accumulator_value", initial_accumulator_value)
    state_dtype = _state_dtype_arg("adagrad", state_dtype)

    def init(params):
        return (filled_like(params, initial, state_dtype),)

    def step(t, trees, params, grads):
        scalars = _Scalars(neg_lr=_scale(_learning_rate(lr, t), -1.0))

        def leaf(p, g, total):
            g = _in(total, g)
            total = add(multiply(g, g), total)
            inv_root = where(greater(total, 0.0), rsqrt(add(total, eps)), 0.0)
            return _out(p, multiply(scalars("neg_lr", g), multiply(inv_root, g))), total

        updates, total = _map_leaves("adagrad", leaf, params, grads, trees, 2)
        return updates, (total,)

    hyper = {"lr": lr, "eps": eps, "initial_accumulator_value": initial}
    if state_dtype is not None:
        hyper["state_dtype"] = dtypes.short_name(state_dtype)
    return Algorithm(init, step, "adagrad", hyper, ("sum_of_squares",))
