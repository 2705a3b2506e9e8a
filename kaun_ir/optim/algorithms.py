"""The optimisers: ``sgd``, ``adam``, ``adamw``, ``rmsprop``, ``adagrad``.

Each constructor returns an :class:`~kaun_ir.optim.core.Algorithm`. The update rules follow
optax exactly (same formulas, same order of the momentum and learning-rate scaling); where
PyTorch differs it is noted. ``lr`` is a number or a schedule ``step -> value`` (see
``kn.optim.schedule``) evaluated at the 1-based step inside the compiled update.

Per-step scalars (the learning rate, Adam's bias corrections ``1 - b**t``) are computed once per
step as scalars and cast once per parameter dtype; only the per-element work is done per leaf.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable

import numpy as np

from .. import ptree
from ..errors import ShapeError
from .core import Algorithm

__all__ = ["sgd", "adam", "adamw", "rmsprop", "adagrad"]


def _kn():
    import kaun_ir

    return kaun_ir


# ------------------------------------------------------------------------ validation


def _number(opt: str, name: str, value: Any, low: float = 0.0, high: float | None = None,
            high_open: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"optim.{opt}: {name} must be a number, got {value!r}")
    value = float(value)
    too_high = high is not None and (value >= high if high_open else value > high)
    if value < low or too_high or value != value:
        upper = "" if high is None else f" and {'<' if high_open else '<='} {high}"
        raise ValueError(f"optim.{opt}: {name} must be >= {low}{upper}, got {value}")
    return value


def _learning_rate_arg(opt: str, lr: Any) -> Any:
    if callable(lr):
        return lr
    return _number(opt, "lr", lr)


# -------------------------------------------------------------------- per-step scalars


def _learning_rate(lr: Any, t: Any) -> Any:
    """The learning rate of step ``t``: a Python float or a float32 scalar Tensor."""
    from ..tensor import Tensor

    value = lr(t) if callable(lr) else lr
    if isinstance(value, (Tensor, float, int)) and not isinstance(value, bool):
        return value
    host = np.asarray(value)  # a concrete array returned by a user's schedule
    if host.shape != () or host.dtype.kind not in "iuf":
        raise TypeError(f"optim: the learning-rate schedule returned {value!r}; it must be a scalar")
    return float(host)


class _Scalars:
    """Named per-step scalars, each cast at most once per parameter dtype."""

    def __init__(self, **values: Any):
        self.values = values
        self.cast: dict = {}

    def __call__(self, name: str, like: Any) -> Any:
        kn = _kn()
        value = self.values[name]
        if isinstance(value, float):  # a Python float adapts to the leaf's dtype by itself
            return value
        key = (name, kn.dtype_of(like))
        if key not in self.cast:
            self.cast[key] = kn.astype(value, key[1])
        return self.cast[key]


def _scale(value: Any, factor: float) -> Any:
    """``value * factor`` for a Python float or a scalar Tensor."""
    return value * factor if isinstance(value, (float, int)) else _kn().multiply(value, factor)


def _step_float(t: Any) -> Any:
    kn = _kn()
    return kn.astype(t, kn.float32)


# ------------------------------------------------------------------- leaf-wise mapping


def _shape_text(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _leaves_like(params: Any, tree: Any, what: str, opt: str) -> list:
    """``tree``'s leaves, checked to have ``params``' structure and shapes."""
    kn = _kn()
    try:
        ptree.map2(lambda a, b: None, params, tree)
    except ValueError as err:
        raise ValueError(f"optim.{opt}: {what} do not match the parameters: {err}") from None
    pairs = zip(ptree.flatten_with_paths(params), ptree.leaves(tree))
    leaves = []
    for (path, p), leaf in pairs:
        if kn.shape_of(p) != kn.shape_of(leaf):
            where = f"at {path!r}" if path else "at the root"
            raise ShapeError(f"optim.{opt}: {what} {where} have shape {_shape_text(kn.shape_of(leaf))}, "
                             f"the parameter {_shape_text(kn.shape_of(p))}")
        leaves.append(leaf)
    return leaves


def _map_leaves(opt: str, fn: Callable, params: Any, grads: Any, trees: tuple, n_out: int) -> tuple:
    """Apply ``fn(param, grad, *slot_leaves) -> n_out results`` leaf by leaf; returns ``n_out``
    trees of ``params``' structure."""
    param_leaves, rebuild = ptree.flatten(params)
    columns = [param_leaves, _leaves_like(params, grads, "the gradients", opt)]
    columns += [_leaves_like(params, tree, "the optimiser state trees", opt) for tree in trees]
    results = [fn(*row) for row in zip(*columns)]
    return tuple(rebuild([r[i] for r in results]) for i in range(n_out))


def _ema(decay: float, new: Any, old: Any) -> Any:
    """``(1 - decay) * new + decay * old`` (optax's moment update)."""
    kn = _kn()
    return kn.add(kn.multiply(1.0 - decay, new), kn.multiply(decay, old))


# ------------------------------------------------------------------------ optimisers


def sgd(lr: Any, momentum: float = 0.0, nesterov: bool = False) -> Algorithm:
    """Stochastic gradient descent (optax ``sgd``; PyTorch ``SGD`` without dampening).

    Plain: ``update = -lr * g``. With ``momentum > 0`` a trace ``v = g + momentum * v`` is kept
    (one slot, ``"trace"``) and ``update = -lr * v``, or ``-lr * (g + momentum * v)`` with
    ``nesterov``. ``nesterov`` needs ``momentum > 0``.
    """
    lr = _learning_rate_arg("sgd", lr)
    momentum = _number("sgd", "momentum", momentum)
    nesterov = bool(nesterov)
    if nesterov and momentum == 0.0:
        raise ValueError("optim.sgd: nesterov=True needs momentum > 0")
    kn = _kn()

    def init(params):
        return (ptree.zeros_like(params),) if momentum else ()

    def step(t, trees, params, grads):
        scalars = _Scalars(neg_lr=_scale(_learning_rate(lr, t), -1.0))
        if not momentum:
            return _map_leaves("sgd", lambda p, g: (kn.multiply(scalars("neg_lr", g), g),),
                               params, grads, trees, 1)[0], ()

        def leaf(p, g, v):
            v = kn.add(g, kn.multiply(momentum, v))
            direction = kn.add(g, kn.multiply(momentum, v)) if nesterov else v
            return kn.multiply(scalars("neg_lr", g), direction), v

        updates, velocity = _map_leaves("sgd", leaf, params, grads, trees, 2)
        return updates, (velocity,)

    return Algorithm(init, step, "sgd", {"lr": lr, "momentum": momentum, "nesterov": nesterov},
                     ("trace",) if momentum else ())


def _adam_like(name: str, lr: Any, b1: float, b2: float, eps: float, weight_decay: float) -> Algorithm:
    lr = _learning_rate_arg(name, lr)
    b1 = _number(name, "b1", b1, 0.0, 1.0)
    b2 = _number(name, "b2", b2, 0.0, 1.0)
    eps = _number(name, "eps", eps)
    weight_decay = _number(name, "weight_decay", weight_decay)
    kn = _kn()

    def init(params):
        return ptree.zeros_like(params), ptree.zeros_like(params)

    def step(t, trees, params, grads):
        lr_t = _learning_rate(lr, t)
        t_float = _step_float(t)
        # bias corrections, once per step: mu_hat = mu / (1 - b1**t), nu_hat = nu / (1 - b2**t)
        correction1 = kn.subtract(1.0, kn.power(np.float32(b1), t_float))
        correction2 = kn.subtract(1.0, kn.power(np.float32(b2), t_float))
        scalars = _Scalars(neg_step=kn.divide(_scale(lr_t, -1.0), correction1),
                           inv_correction2=kn.divide(1.0, correction2),
                           neg_decay=_scale(lr_t, -weight_decay))

        def leaf(p, g, mu, nu):
            mu = _ema(b1, g, mu)
            nu = _ema(b2, kn.multiply(g, g), nu)
            root = kn.sqrt(kn.multiply(nu, scalars("inv_correction2", g)))
            u = kn.multiply(scalars("neg_step", g), kn.divide(mu, kn.add(root, eps)))
            if weight_decay:
                u = kn.add(u, kn.multiply(scalars("neg_decay", p), p))
            return u, mu, nu

        updates, mu, nu = _map_leaves(name, leaf, params, grads, trees, 3)
        return updates, (mu, nu)

    hyper = {"lr": lr, "b1": b1, "b2": b2, "eps": eps}
    if name == "adamw":
        hyper["weight_decay"] = weight_decay
    return Algorithm(init, step, name, hyper, ("mu", "nu"))


def adam(lr: Any, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> Algorithm:
    """Adam (optax ``adam`` with ``eps_root=0``; PyTorch ``Adam``).

    Slots ``mu``, ``nu``: ``mu = b1*mu + (1-b1)*g``, ``nu = b2*nu + (1-b2)*g**2``, then
    ``update = -lr * mu_hat / (sqrt(nu_hat) + eps)`` with ``mu_hat = mu / (1 - b1**t)``,
    ``nu_hat = nu / (1 - b2**t)`` at the 1-based step ``t``.
    """
    return _adam_like("adam", lr, b1, b2, eps, 0.0)


def adamw(lr: Any, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 0.01) -> Algorithm:
    """Adam with decoupled weight decay (optax ``adamw``, whose default decay is 1e-4; PyTorch
    ``AdamW``'s default 0.01 is used here): ``update = -lr * (adam_direction + weight_decay *
    param)``. Every parameter is decayed (no mask)."""
    return _adam_like("adamw", lr, b1, b2, eps, weight_decay)


def rmsprop(lr: Any, decay: float = 0.9, eps: float = 1e-8, momentum: float = 0.0) -> Algorithm:
    """RMSProp with optax's semantics (``optax.rmsprop`` with ``centered=False``).

    Slot ``nu``: ``nu = decay*nu + (1-decay)*g**2`` (starting at 0), ``u = -lr * g /
    sqrt(nu + eps)`` — ``eps`` inside the square root, unlike PyTorch's ``RMSprop`` which adds it
    outside. With ``momentum > 0`` a second slot ``trace`` accumulates the already lr-scaled
    ``u``: ``trace = u + momentum * trace`` is the update (optax's order: the learning rate is
    applied before the momentum, which matters only when the rate changes over time).
    """
    lr = _learning_rate_arg("rmsprop", lr)
    decay = _number("rmsprop", "decay", decay, 0.0, 1.0, high_open=False)
    eps = _number("rmsprop", "eps", eps)
    momentum = _number("rmsprop", "momentum", momentum)
    kn = _kn()

    def init(params):
        trees = (ptree.zeros_like(params),)
        return trees + (ptree.zeros_like(params),) if momentum else trees

    def step(t, trees, params, grads):
        scalars = _Scalars(neg_lr=_scale(_learning_rate(lr, t), -1.0))

        def leaf(p, g, nu, *trace):
            nu = _ema(decay, kn.multiply(g, g), nu)
            u = kn.multiply(scalars("neg_lr", g), kn.multiply(kn.rsqrt(kn.add(nu, eps)), g))
            if not momentum:
                return u, nu
            velocity = kn.add(u, kn.multiply(momentum, trace[0]))
            return velocity, nu, velocity

        if not momentum:
            updates, nu = _map_leaves("rmsprop", leaf, params, grads, trees, 2)
            return updates, (nu,)
        updates, nu, velocity = _map_leaves("rmsprop", leaf, params, grads, trees, 3)
        return updates, (nu, velocity)

    return Algorithm(init, step, "rmsprop", {"lr": lr, "decay": decay, "eps": eps, "momentum": momentum},
                     ("nu", "trace") if momentum else ("nu",))


def adagrad(lr: Any, eps: float = 1e-8, initial_accumulator_value: float = 0.1) -> Algorithm:
    """Adagrad (optax ``adagrad``; its default ``eps`` is 1e-7, ours 1e-8 as in API.md).

    Slot ``sum_of_squares``, starting at ``initial_accumulator_value`` (0.1 like optax and
    TensorFlow; PyTorch starts at 0): ``s = s + g**2``, ``update = -lr * g / sqrt(s + eps)``
    where ``s > 0``, and 0 where ``s == 0``.
    """
    lr = _learning_rate_arg("adagrad", lr)
    eps = _number("adagrad", "eps", eps)
    initial = _number("adagrad", "initial_accumulator_value", initial_accumulator_value)
    kn = _kn()

    def init(params):
        from .core import _filled_like

        return (_filled_like(params, initial),)

    def step(t, trees, params, grads):
        scalars = _Scalars(neg_lr=_scale(_learning_rate(lr, t), -1.0))

        def leaf(p, g, total):
            total = kn.add(kn.multiply(g, g), total)
            inv_root = kn.where(kn.greater(total, 0.0), kn.rsqrt(kn.add(total, eps)), 0.0)
            return kn.multiply(scalars("neg_lr", g), kn.multiply(inv_root, g)), total

        updates, total = _map_leaves("adagrad", leaf, params, grads, trees, 2)
        return updates, (total,)

    return Algorithm(init, step, "adagrad",
                     {"lr": lr, "eps": eps, "initial_accumulator_value": initial}, ("sum_of_squares",))
