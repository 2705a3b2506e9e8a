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
from collections.abc import Callable
from typing import Any

import numpy as np

from kaun_ir import dtypes, ptree
from kaun_ir.errors import ShapeError
from kaun_ir.optim.core import Algorithm, filled_like
from kaun_ir.optim.masks import decay_mask
from kaun_ir.surface.elementwise import add, divide, greater, multiply, power, rsqrt, sqrt, subtract, where
from kaun_ir.surface.promotion import astype, dtype_of, shape_of
from kaun_ir.surface.tensor import Tensor

__all__ = ["sgd", "adam", "adamw", "rmsprop", "adagrad"]


# ------------------------------------------------------------------------ validation


def _number(
    opt: str, name: str, value: Any, low: float = 0.0, high: float | None = None, high_open: bool = True
) -> float:
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
        value = self.values[name]
        if isinstance(value, float):  # a Python float adapts to the leaf's dtype by itself
            return value
        key = (name, dtype_of(like))
        if key not in self.cast:
            self.cast[key] = astype(value, key[1])
        return self.cast[key]


def _scale(value: Any, factor: float) -> Any:
    """``value * factor`` for a Python float or a scalar Tensor."""
    return value * factor if isinstance(value, (float, int)) else multiply(value, factor)


def _step_float(t: Any) -> Any:
    return astype(t, dtypes.float32)


# ------------------------------------------------------------------- leaf-wise mapping


def _shape_text(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _leaves_like(params: Any, tree: Any, what: str, opt: str) -> list:
    """``tree``'s leaves, checked to have ``params``' structure and shapes."""
    try:
        ptree.map2(lambda a, b: None, params, tree)
    except ValueError as err:
        raise ValueError(f"optim.{opt}: {what} do not match the parameters: {err}") from None
    pairs = zip(ptree.flatten_with_paths(params), ptree.leaves(tree))
    leaves = []
    for (path, p), leaf in pairs:
        if shape_of(p) != shape_of(leaf):
            where = f"at {path!r}" if path else "at the root"
            raise ShapeError(
                f"optim.{opt}: {what} {where} have shape {_shape_text(shape_of(leaf))}, "
                f"the parameter {_shape_text(shape_of(p))}"
            )
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


def _state_dtype_arg(opt: str, state_dtype: Any) -> Any:
    if state_dtype is None:
        return None
    dtype = dtypes.canonical(state_dtype)
    if not dtypes.is_float(dtype):
        raise ValueError(
            f"optim.{opt}: state_dtype must be a floating-point dtype, got {dtypes.short_name(dtype)}"
        )
    return dtype


def _in(like: Any, x: Any) -> Any:
    """``x`` in ``like``'s dtype (the slot dtype the arithmetic runs in)."""
    return astype(x, dtype_of(like))


def _out(p: Any, u: Any) -> Any:
    """An update in its parameter's dtype."""
    return astype(u, dtype_of(p))


def _ema(decay: float, new: Any, old: Any) -> Any:
    """``(1 - decay) * new + decay * old`` (optax's moment update)."""
    return add(multiply(1.0 - decay, new), multiply(decay, old))


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
    masked = decay_mask(name, mask)

    def init(params):
        return filled_like(params, 0.0, state_dtype), filled_like(params, 0.0, state_dtype)

    def step(t, trees, params, grads):
        lr_t = _learning_rate(lr, t)
        t_float = _step_float(t)
        # bias corrections, once per step: mu_hat = mu / (1 - b1**t), nu_hat = nu / (1 - b2**t)
        correction1 = subtract(1.0, power(np.float32(b1), t_float))
        correction2 = subtract(1.0, power(np.float32(b2), t_float))
        scalars = _Scalars(
            neg_step=divide(_scale(lr_t, -1.0), correction1),
            inv_correction2=divide(1.0, correction2),
            neg_decay=_scale(lr_t, -weight_decay),
        )

        decays = iter(masked(params) if weight_decay else ())

        def leaf(p, g, mu, nu):
            g = _in(mu, g)  # the moments' dtype: float32 for float16/bfloat16 parameters
            mu = _ema(b1, g, mu)
            nu = _ema(b2, multiply(g, g), nu)
            root = sqrt(multiply(nu, scalars("inv_correction2", g)))
            u = multiply(scalars("neg_step", g), divide(mu, add(root, eps)))
            if weight_decay and next(decays):
                u = add(u, multiply(scalars("neg_decay", g), _in(g, p)))
            return _out(p, u), mu, nu

        updates, mu, nu = _map_leaves(name, leaf, params, grads, trees, 3)
        return updates, (mu, nu)

    hyper = {"lr": lr, "b1": b1, "b2": b2, "eps": eps}
    if name == "adamw":
        hyper["weight_decay"] = weight_decay
        if mask is not None:
            hyper["mask"] = mask
    if state_dtype is not None:
        hyper["state_dtype"] = dtypes.short_name(state_dtype)
    return Algorithm(init, step, name, hyper, ("mu", "nu"))


def adam(
    lr: Any, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, state_dtype: Any = None
) -> Algorithm:
    """Adam (optax ``adam`` with ``eps_root=0``; PyTorch ``Adam``).

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
    param)``.

    ``mask`` chooses the decayed parameters (default: all): a predicate ``mask(path) -> bool``
    on the dotted parameter path (``"blocks.0.attn.weight"``), or ``mask(path, param) -> bool``
    also given the parameter (nanoGPT decays only matrices: ``lambda path, p: p.ndim >= 2``),
    or a tree of bools shaped like the parameters (optax's form). ``state_dtype``: as in
    :func:`adam`."""
    return _adam_like("adamw", lr, b1, b2, eps, weight_decay, mask, state_dtype)


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
