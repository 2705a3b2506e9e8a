"""Gradient transformations, the building blocks optimisers are chains of (optax's names).

Each returns an :class:`~kaun_ir.optim.core.Algorithm` whose ``step`` maps incoming updates to
outgoing ones; ``optim.chain`` composes them, and a chain is an optimiser::

    optim.chain(optim.scale_by_adam(), optim.add_decayed_weights(0.1, mask=...),
                optim.scale_by_learning_rate(3e-4))          # = optim.adamw(3e-4, weight_decay=0.1)

- :func:`scale_by_adam`: Adam's direction ``mu_hat / (sqrt(nu_hat) + eps)`` (slots ``mu``, ``nu``);
- :func:`add_decayed_weights`: ``updates + weight_decay * params`` on the masked leaves;
- :func:`scale` / :func:`scale_by_learning_rate`: times a constant / times ``-lr(step)``;
- :func:`ema`: an exponential moving average of the *weights* after the update (slot ``ema``),
  read with :func:`ema_params` (``train.predict(..., ema=True)``);
- :func:`apply_every` (sum over ``k`` calls, emitted every ``k``-th) and :func:`multi_steps`
  (an optimiser that steps once per ``k`` calls on the mean gradient; optax ``MultiSteps``);
- ``freeze`` (in :mod:`kaun_ir.optim.freezing`): an optimiser run on the trainable leaves only;
  frozen leaves get zero updates and have no optimiser state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kaun_ir import dtypes, ptree
from kaun_ir.ir.builder import current_builder
from kaun_ir.optim.core import Algorithm, filled_like, slot_dtype
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
    _step_float,
)
from kaun_ir.optim.masks import decay_mask
from kaun_ir.runtime import compilation
from kaun_ir.surface.creation import zeros
from kaun_ir.surface.elementwise import (
    add,
    divide,
    equal,
    floor_divide,
    multiply,
    power,
    remainder,
    sign,
    sqrt,
    subtract,
    where,
)
from kaun_ir.surface.promotion import astype, dtype_of, shape_of

__all__ = [
    "scale",
    "scale_by_learning_rate",
    "scale_by_adam",
    "scale_by_lion",
    "add_decayed_weights",
    "ema",
    "ema_params",
    "apply_every",
    "multi_steps",
]


def _int(opt: str, name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"optim.{opt}: {name} must be an int >= {low}, got {value!r}")
    return int(value)


def scale(factor: float) -> Algorithm:
    """``updates * factor`` (optax ``scale``). Stateless."""
    factor = float(_number("scale", "factor", factor, low=-np.inf))

    def init(params):
        return ()

    def step(t, trees, params, updates):
        return ptree.map(lambda u: multiply(u, factor), updates), ()

    return Algorithm(init, step, "scale", {"factor": factor}, ())


def scale_by_learning_rate(lr: Any) -> Algorithm:
    """``updates * -lr(step)`` (optax ``scale_by_learning_rate``): ``lr`` is a number or a
    schedule evaluated at the 1-based step. Stateless."""
    lr = _learning_rate_arg("scale_by_learning_rate", lr)

    def init(params):
        return ()

    def step(t, trees, params, updates):
        scalars = _Scalars(neg_lr=_scale(_learning_rate(lr, t), -1.0))
        return ptree.map(lambda u: multiply(scalars("neg_lr", u), u), updates), ()

    return Algorithm(init, step, "scale_by_learning_rate", {"lr": lr}, ())


def scale_by_adam(
    b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, state_dtype: Any = None
) -> Algorithm:
    """Adam's direction (optax ``scale_by_adam`` with ``eps_root=0``): slots ``mu``, ``nu``;
    ``mu = b1*mu + (1-b1)*g``, ``nu = b2*nu + (1-b2)*g**2``, output ``mu_hat / (sqrt(nu_hat) +
    eps)`` with the bias corrections ``mu_hat = mu / (1 - b1**t)``, ``nu_hat = nu / (1 - b2**t)``.
    The output stays in the slot dtype (float32 for float16/bfloat16 parameters, see
    :func:`kaun_ir.optim.core.slot_dtype`)."""
    b1 = _number("scale_by_adam", "b1", b1, 0.0, 1.0)
    b2 = _number("scale_by_adam", "b2", b2, 0.0, 1.0)
    eps = _number("scale_by_adam", "eps", eps)
    state_dtype = _state_dtype_arg("scale_by_adam", state_dtype)

    def init(params):
        return filled_like(params, 0.0, state_dtype), filled_like(params, 0.0, state_dtype)

    def step(t, trees, params, grads):
        t_float = _step_float(t)
        scalars = _Scalars(
            inv_correction1=divide(1.0, subtract(1.0, power(np.float32(b1), t_float))),
            inv_correction2=divide(1.0, subtract(1.0, power(np.float32(b2), t_float))),
        )

        def leaf(p, g, mu, nu):
            g = _in(mu, g)
            mu = _ema(b1, g, mu)
            nu = _ema(b2, multiply(g, g), nu)
            root = sqrt(multiply(nu, scalars("inv_correction2", g)))
            return divide(multiply(mu, scalars("inv_correction1", g)), add(root, eps)), mu, nu

        updates, mu, nu = _map_leaves("scale_by_adam", leaf, params, grads, trees, 3)
        return updates, (mu, nu)

    hyper = {"b1": b1, "b2": b2, "eps": eps}
    if state_dtype is not None:
        hyper["state_dtype"] = dtypes.short_name(state_dtype)
    return Algorithm(init, step, "scale_by_adam", hyper, ("mu", "nu"))


def scale_by_lion(b1: float = 0.9, b2: float = 0.99, state_dtype: Any = None) -> Algorithm:
    """Lion's direction (optax ``scale_by_lion``; Chen et al. 2023): one slot ``mu``; output
    ``sign((1-b1)*g + b1*mu)``, then ``mu = (1-b2)*g + b2*mu``. Every output element is -1, 0 or
    1, so Lion wants a learning rate 3-10x smaller than Adam's. ``state_dtype`` as in
    :func:`scale_by_adam`."""
    b1 = _number("scale_by_lion", "b1", b1, 0.0, 1.0)
    b2 = _number("scale_by_lion", "b2", b2, 0.0, 1.0)
    state_dtype = _state_dtype_arg("scale_by_lion", state_dtype)

    def init(params):
        return (filled_like(params, 0.0, state_dtype),)

    def step(t, trees, params, grads):
        def leaf(p, g, mu):
            g = _in(mu, g)
            return sign(_ema(b1, g, mu)), _ema(b2, g, mu)

        updates, mu = _map_leaves("scale_by_lion", leaf, params, grads, trees, 2)
        return updates, (mu,)

    hyper = {"b1": b1, "b2": b2}
    if state_dtype is not None:
        hyper["state_dtype"] = dtypes.short_name(state_dtype)
    return Algorithm(init, step, "scale_by_lion", hyper, ("mu",))


def add_decayed_weights(weight_decay: Any, mask: Any = None) -> Algorithm:
    """``updates + weight_decay * params`` (optax ``add_decayed_weights``) on the leaves ``mask``
    selects (default all): a predicate ``mask(path)`` / ``mask(path, param)`` on dotted paths or
    a tree of bools (see ``optim.adamw``). ``weight_decay`` is a number or a schedule ``step ->
    value`` (like a learning rate; it may be negative). Stateless."""
    if not callable(weight_decay):
        weight_decay = _number("add_decayed_weights", "weight_decay", weight_decay, low=-np.inf)
    masked = decay_mask("add_decayed_weights", mask)

    def init(params):
        return ()

    def step(t, trees, params, updates):
        if not callable(weight_decay) and not weight_decay:
            return updates, ()
        scalars = _Scalars(decay=_learning_rate(weight_decay, t))
        flags = iter(masked(params))

        def leaf(p, u):
            return (add(u, multiply(scalars("decay", u), _in(u, p))) if next(flags) else u,)

        return _map_leaves("add_decayed_weights", leaf, params, updates, (), 1)[0], ()

    hyper = {"weight_decay": weight_decay}
    if mask is not None:
        hyper["mask"] = mask
    return Algorithm(init, step, "add_decayed_weights", hyper, ())


def _copy_like(params: Any, state_dtype: Any) -> Any:
    """A copy of ``params`` in each leaf's slot dtype (new buffers: the optimiser state is
    donated with the parameters, so it may not alias them)."""
    if current_builder() is not None:
        return ptree.map(lambda p: astype(p, slot_dtype(dtype_of(p), state_dtype)), params)

    def copy(leaf):
        dtype = slot_dtype(leaf.dtype, state_dtype)
        device = next(iter(leaf.devices())) if compilation.is_device_array(leaf) else None
        return compilation.put(np.array(leaf, dtype=dtype), dtype, device)

    return ptree.map(copy, params)


def ema(decay: float = 0.999, state_dtype: Any = None) -> Algorithm:
    """An exponential moving average of the weights (slot ``ema``), passing the updates through.

    Put it last in a chain (``optim.chain(optim.adam(1e-3), optim.ema(0.999))``): it sees the
    final updates and averages the updated parameters ``p' = p + u``: ``ema = decay * ema +
    (1 - decay) * p'``, starting from the initial parameters (no bias correction, as the weight
    averages of timm and Flax). Kept in the optimiser state, so it is saved with checkpoints;
    :func:`ema_params` reads it and ``train.predict(trainer, st, x, ema=True)`` predicts with it.
    """
    decay = _number("ema", "decay", decay, 0.0, 1.0)  # 1.0 would keep the initial weights forever
    state_dtype = _state_dtype_arg("ema", state_dtype)

    def init(params):
        return (_copy_like(params, state_dtype),)

    def step(t, trees, params, updates):
        def leaf(p, u, average):
            new = astype(add(p, u), dtype_of(p))  # what apply_updates makes of it
            return (_ema(decay, _in(average, new), average),)

        (average,) = _map_leaves("ema", leaf, params, updates, trees, 1)
        return updates, (average,)

    hyper = {"decay": decay}
    if state_dtype is not None:
        hyper["state_dtype"] = dtypes.short_name(state_dtype)
    return Algorithm(init, step, "ema", hyper, ("ema",))


def ema_params(alg: Algorithm, state: Any, params: Any = None) -> Any:
    """The weight average an :func:`ema` member of ``alg`` keeps in ``state`` (``alg`` itself, a
    chain holding it, or anything whose last slot named ``ema`` / ``N.ema`` it is).

    An average kept under ``optim.freeze`` (either order: ``freeze(chain(opt, ema), mask)`` or
    ``chain(freeze(opt, mask), ema)``) holds the trainable leaves only. With ``params`` (the
    current parameters) the result is a whole parameter tree: the averaged leaves cast to the
    parameters' dtypes, every leaf the average does not hold (a frozen one, which never changes)
    taken from ``params``. Without ``params``, the average as kept. ``ValueError`` when ``alg``
    keeps none, or when the average holds a path ``params`` lacks."""
    slots = list(alg.slots)
    found = [i for i, name in enumerate(slots) if name == "ema" or name.endswith(".ema")]
    if not found:
        raise ValueError(
            f"optim.ema_params: the optimiser {alg.name}({','.join(slots)}) keeps no weight average; "
            "add optim.ema(decay) at the end of its chain"
        )
    average = state[1][found[-1]]
    if params is None:
        return average
    by_path = dict(ptree.flatten_with_paths(average))
    leaves = []
    for path, p in ptree.flatten_with_paths(params):
        kept = by_path.pop(path, None)
        if kept is None:  # not averaged: a frozen leaf, read from the current parameters
            leaves.append(p)
        else:
            leaves.append(kept if kept.dtype == p.dtype else astype(kept, p.dtype))
    if by_path:
        raise ValueError(
            f"optim.ema_params: the weight average holds {sorted(by_path)[:3]} that the parameters "
            "lack; pass the parameters of the model this optimiser state was made for"
        )
    return ptree.flatten(params)[1](leaves)


def _phase(t: Any, every: int) -> tuple[Any, Any]:
    """``(position in the cycle, 0-based; is the last call of the cycle)`` at the 1-based step."""
    position = remainder(subtract(t, 1), every)
    return position, equal(position, every - 1)


def apply_every(k: int = 1) -> Algorithm:
    """Sum the incoming updates over ``k`` calls and emit the sum on every ``k``-th call, zeros
    on the others (optax ``apply_every``; slot ``grad_acc``). See :func:`multi_steps` for the
    usual gradient-accumulation optimiser."""
    k = _int("apply_every", "k", k)

    def init(params):
        return (filled_like(params, 0.0),)

    def step(t, trees, params, updates):
        position, last = _phase(t, k)
        first = equal(position, 0)

        def leaf(p, u, acc):
            total = add(where(first, zeros(shape_of(acc), dtype_of(acc)), acc), _in(acc, u))
            return where(last, _in(u, total), zeros(shape_of(u), dtype_of(u))), total

        out, acc = _map_leaves("apply_every", leaf, params, updates, trees, 2)
        return out, (acc,)

    return Algorithm(init, step, "apply_every", {"k": k}, ("grad_acc",))


def multi_steps(inner: Algorithm, every: int) -> Algorithm:
    """``inner`` stepped once per ``every`` calls on the mean of their gradients (optax
    ``MultiSteps``): the calls in between accumulate (slot ``acc``) and return zero updates.
    ``inner``'s schedules see its own step count ``ceil(t / every)``. For accumulation inside one
    compiled step (micro-batches of one large batch), see ``train.make(..., accumulate=N)``."""
    if not isinstance(inner, Algorithm):
        raise TypeError(f"optim.multi_steps: inner must be an optim algorithm, got {type(inner).__name__}")
    every = _int("multi_steps", "every", every)
    n_inner = len(inner.slots)

    def init(params):
        return (filled_like(params, 0.0),) + tuple(inner.init(params))

    def step(t, trees, params, grads):
        _, last = _phase(t, every)
        acc_tree, old = trees[0], tuple(trees[1:])
        acc_tree = ptree.map2(lambda a, g: add(a, _in(a, g)), acc_tree, grads)
        mean = ptree.map2(lambda a, g: _in(g, divide(a, float(every))), acc_tree, grads)
        inner_t = add(floor_divide(subtract(t, 1), every), 1)
        updates, new = inner.step(inner_t, old, params, mean)
        if len(new) != n_inner:
            raise ValueError(
                f"optim.multi_steps: {inner.name}.step returned {len(new)} trees for {inner.slots}"
            )
        updates = ptree.map2(
            lambda u, p: _out(p, where(last, u, zeros(shape_of(u), dtype_of(u)))), updates, params
        )
        new = tuple(ptree.map2(lambda n, o: where(last, n, o), n, o) for n, o in zip(new, old))
        acc_tree = ptree.map(lambda a: where(last, zeros(shape_of(a), dtype_of(a)), a), acc_tree)
        return updates, (acc_tree,) + new

    return Algorithm(
        init, step, "multi_steps", {"inner": inner, "every": every}, ("acc",) + tuple(inner.slots)
    )
