"""``kn.optim.schedule``: learning-rate schedules, functions of the 1-based step number.

A schedule is any callable ``step -> value``. Optimisers call it once per update with the
number of the update being made: ``1`` for the first, ``2`` for the second, ... (like Kaun).
``step`` may be

* a Python int, a NumPy integer or a concrete array of them: evaluated on the host in float64,
  the result is a Python ``float`` (or a NumPy array for an array of steps, handy for plots);
* a traced int32 scalar :class:`kaun_ir.Tensor` (inside ``kn.jit`` / ``train.step``): the result
  is a float32 Tensor, computed with ``kn.where`` / ``kn.minimum`` ... and no Python control flow
  on the step, so one compiled training step serves every step number without retracing.

Relation to optax: each schedule here is the same function of ``n`` as the optax schedule named
below, but optax evaluates it at the 0-based update count (``0, 1, ...``) while kaun_ir
evaluates it at the 1-based step (``1, 2, ...``). The first update therefore uses ``s(1)``:
``cosine_decay(1.0, 100)`` reaches its floor on the 100th update, ``warmup_linear(0, 1, 10)``
reaches the peak on the 10th. To reproduce an optax run exactly, give optax
``lambda count: ours(count + 1)``.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.surface import creation, elementwise, promotion, shapes
from kaun_ir.surface.promotion import astype
from kaun_ir.surface.tensor import Tensor

__all__ = [
    "Schedule",
    "constant",
    "cosine_decay",
    "warmup_cosine",
    "warmup_linear",
    "linear",
    "exponential_decay",
    "piecewise_constant",
]

# What a schedule computes with on a traced step: the kaun_ir functions of the NumPy names it uses
# (on a host step it computes with NumPy itself).
# what a schedule computes with while tracing: the NumPy-style surface, as numpy is on host steps
_TRACED = types.SimpleNamespace(
    **{
        name: getattr(module, name)
        for module in (elementwise, creation, promotion, shapes)
        for name in module.__all__
    }
)


class Schedule:
    """A named schedule: ``schedule(step)`` evaluates it; ``repr`` shows its hyper-parameters."""

    __slots__ = ("_fn", "_description")

    def __init__(self, fn: Callable[[Any, Any], Any], description: str):
        self._fn = fn  # fn(n, xp): n is the step as a float (array), xp is numpy or _TRACED
        self._description = description

    def __call__(self, step):
        n, xp, finish = _prepare(step)
        return finish(self._fn(n, xp))

    def __repr__(self) -> str:
        return self._description


def _prepare(step):
    """The step as a float, the namespace to compute with, and the conversion of the result."""
    if isinstance(step, Tensor):
        if not (dtypes.is_integer(step.dtype) or dtypes.is_float(step.dtype)):
            raise TypeError(f"schedule: the step must be an integer scalar, got a {step.type} tensor")
        return astype(step, dtypes.float32), _TRACED, _traced_result
    n = np.asarray(step)
    if n.dtype.kind not in "iuf":
        raise TypeError(f"schedule: the step must be an integer, got {step!r}")
    return n.astype(np.float64), np, _host_result


def _traced_result(value):
    return astype(value, dtypes.float32)


def _host_result(value):
    value = np.asarray(value, dtype=np.float64)
    return float(value) if value.ndim == 0 else value


def _describe(name: str, **params) -> str:
    inner = ", ".join(f"{key}={value!r}" for key, value in params.items())
    return f"schedule.{name}({inner})"


def _positive_int(name: str, what: str, value: Any, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"schedule.{name}: {what} must be an int, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"schedule.{name}: {what} must be {bound}, got {value}")
    return int(value)


def _float(name: str, what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"schedule.{name}: {what} must be a number, got {value!r}")
    return float(value)


# ------------------------------------------------------------------------------ schedules


def constant(value: float) -> Schedule:
    """``value`` at every step (optax ``constant_schedule``)."""
    value = _float("constant", "value", value)
    return Schedule(lambda n, xp: xp.full_like(n, value), _describe("constant", value=value))


def _linear_ramp(n, xp, start: float, end: float, steps: int):
    """``start`` at n <= 0, ``end`` from n >= steps, a straight line in between."""
    frac = 1.0 - xp.clip(n, 0, steps) / steps
    return (start - end) * frac + end


def _half_cosine(n, xp, steps: int):
    """``0.5 * (1 + cos(pi * min(n, steps) / steps))``: 1 at n = 0, falling to 0 at n = steps."""
    return 0.5 * (1.0 + xp.cos(math.pi * xp.minimum(n, steps) / steps))


def linear(init_value: float, end_value: float, steps: int) -> Schedule:
    """From ``init_value`` (at step 0) to ``end_value`` (at ``steps`` and after) in a straight
    line: ``init + (end - init) * min(step, steps) / steps`` (optax ``linear_schedule``)."""
    init_value = _float("linear", "init_value", init_value)
    end_value = _float("linear", "end_value", end_value)
    steps = _positive_int("linear", "steps", steps)
    return Schedule(
        lambda n, xp: _linear_ramp(n, xp, init_value, end_value, steps),
        _describe("linear", init_value=init_value, end_value=end_value, steps=steps),
    )


def cosine_decay(init_value: float, decay_steps: int, alpha: float = 0.0) -> Schedule:
    """Half a cosine from ``init_value`` down to ``alpha * init_value``, reached at step
    ``decay_steps`` and held afterwards (optax ``cosine_decay_schedule``):
    ``init * ((1 - alpha) * 0.5 * (1 + cos(pi * min(step, decay_steps) / decay_steps)) + alpha)``.
    """
    init_value = _float("cosine_decay", "init_value", init_value)
    decay_steps = _positive_int("cosine_decay", "decay_steps", decay_steps)
    alpha = _float("cosine_decay", "alpha", alpha)

    def fn(n, xp):
        return init_value * ((1.0 - alpha) * _half_cosine(n, xp, decay_steps) + alpha)

    return Schedule(
        fn, _describe("cosine_decay", init_value=init_value, decay_steps=decay_steps, alpha=alpha)
    )


def warmup_linear(init_value: float, peak_value: float, warmup_steps: int) -> Schedule:
    """A straight ramp from ``init_value`` to ``peak_value`` over ``warmup_steps`` steps, then
    ``peak_value`` for ever (Kaun's ``warmup_linear``; optax ``linear_schedule(init, peak,
    warmup_steps)``). ``warmup_steps=0`` means no warm-up. Combine with another schedule by
    writing your own ``step -> value`` function if the rate should decay afterwards."""
    init_value = _float("warmup_linear", "init_value", init_value)
    peak_value = _float("warmup_linear", "peak_value", peak_value)
    warmup_steps = _positive_int("warmup_linear", "warmup_steps", warmup_steps, allow_zero=True)
    description = _describe(
        "warmup_linear", init_value=init_value, peak_value=peak_value, warmup_steps=warmup_steps
    )
    if warmup_steps == 0:
        return Schedule(lambda n, xp: xp.full_like(n, peak_value), description)
    return Schedule(lambda n, xp: _linear_ramp(n, xp, init_value, peak_value, warmup_steps), description)


def warmup_cosine(
    init_value: float,
    peak_value: float,
    warmup_steps: int,
    decay_steps: int | None = None,
    end_value: float = 0.0,
) -> Schedule:
    """Warm-up to ``peak_value``, in one of two forms.

    - ``decay_steps=None`` (Kaun's ``warmup_cosine``): a half-cosine ramp from ``init_value``
      to ``peak_value`` over ``warmup_steps`` steps, ``init + (peak - init) * 0.5 * (1 -
      cos(pi * min(step, warmup_steps) / warmup_steps))``, then ``peak_value`` for ever.
    - ``decay_steps`` given (optax ``warmup_cosine_decay_schedule``): a *linear* ramp from
      ``init_value`` to ``peak_value`` over ``warmup_steps`` steps, then a half cosine from
      ``peak_value`` down to ``end_value``, reached at step ``decay_steps`` (counted from the
      start, warm-up included, as in optax) and held afterwards.
    """
    name = "warmup_cosine"
    init_value = _float(name, "init_value", init_value)
    peak_value = _float(name, "peak_value", peak_value)
    end_value = _float(name, "end_value", end_value)
    if decay_steps is None:
        warmup_steps = _positive_int(name, "warmup_steps", warmup_steps)
        rise = peak_value - init_value

        def ramp(n, xp):
            return init_value + rise * (1.0 - _half_cosine(xp.maximum(n, 0), xp, warmup_steps))

        return Schedule(
            ramp, _describe(name, init_value=init_value, peak_value=peak_value, warmup_steps=warmup_steps)
        )
    warmup_steps = _positive_int(name, "warmup_steps", warmup_steps, allow_zero=True)
    decay_steps = _positive_int(name, "decay_steps", decay_steps)
    if decay_steps <= warmup_steps:
        raise ValueError(
            f"schedule.{name}: decay_steps ({decay_steps}) counts the warm-up too and "
            f"must be greater than warmup_steps ({warmup_steps})"
        )
    cosine_steps = decay_steps - warmup_steps

    def warm_then_decay(n, xp):
        decay = (peak_value - end_value) * _half_cosine(n - warmup_steps, xp, cosine_steps) + end_value
        if warmup_steps == 0:
            return decay
        warm = _linear_ramp(n, xp, init_value, peak_value, warmup_steps)
        return xp.where(n < warmup_steps, warm, decay)

    return Schedule(
        warm_then_decay,
        _describe(
            name,
            init_value=init_value,
            peak_value=peak_value,
            warmup_steps=warmup_steps,
            decay_steps=decay_steps,
            end_value=end_value,
        ),
    )


def exponential_decay(
    init_value: float, decay_rate: float, decay_steps: int, staircase: bool = False
) -> Schedule:
    """``init_value * decay_rate ** (step / decay_steps)``; with ``staircase`` the exponent is
    rounded down, so the value drops once every ``decay_steps`` steps (optax
    ``exponential_decay(init_value, transition_steps=decay_steps, decay_rate, staircase)``).
    Steps <= 0 give ``init_value``."""
    name = "exponential_decay"
    init_value = _float(name, "init_value", init_value)
    decay_rate = _float(name, "decay_rate", decay_rate)
    decay_steps = _positive_int(name, "decay_steps", decay_steps)
    if decay_rate <= 0:
        raise ValueError(f"schedule.{name}: decay_rate must be > 0, got {decay_rate}")
    staircase = bool(staircase)

    def fn(n, xp):
        exponent = xp.maximum(n, 0) / decay_steps
        if staircase:
            exponent = xp.floor(exponent)
        return init_value * xp.power(decay_rate, exponent)

    return Schedule(
        fn,
        _describe(
            name, init_value=init_value, decay_rate=decay_rate, decay_steps=decay_steps, staircase=staircase
        ),
    )


def piecewise_constant(boundaries: Sequence[int], values: Sequence[float]) -> Schedule:
    """``values[0]`` before step ``boundaries[0]``, ``values[i]`` from step ``boundaries[i-1]``
    up to (excluding) ``boundaries[i]``, and ``values[-1]`` from ``boundaries[-1]`` on.

    ``len(values) == len(boundaries) + 1``; boundaries are strictly increasing ints. Example:
    ``piecewise_constant([100, 200], [1e-2, 1e-3, 1e-4])`` uses 1e-2 for steps 1..99, 1e-3 for
    100..199, 1e-4 from 200 (like Kaun's ``piecewise_constant`` and optax
    ``piecewise_constant_schedule`` written with absolute values instead of scale factors).
    """
    name = "piecewise_constant"
    boundaries = [_positive_int(name, "every boundary", b, allow_zero=True) for b in boundaries]
    values = [_float(name, "every value", v) for v in values]
    if len(values) != len(boundaries) + 1:
        raise ValueError(
            f"schedule.{name}: {len(boundaries)} boundaries need {len(boundaries) + 1} "
            f"values, got {len(values)}"
        )
    if any(b >= c for b, c in zip(boundaries, boundaries[1:])):
        raise ValueError(f"schedule.{name}: boundaries must be strictly increasing, got {boundaries}")

    def fn(n, xp):
        value = xp.full_like(n, values[0])
        for boundary, next_value in zip(boundaries, values[1:]):
            value = xp.where(n >= boundary, next_value, value)
        return value

    return Schedule(fn, _describe(name, boundaries=boundaries, values=values))
