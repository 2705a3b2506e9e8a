"""``kn.init``: parameter initialisers, in the style of ``jax.nn.initializers``.

An *initialiser* is a function ``(key, shape, dtype=kn.float32) -> array`` of that shape and
(floating-point) dtype. As in jax, ``zeros`` and ``ones`` are initialisers themselves and every
other name is a constructor returning one::

    w = kn.init.glorot_uniform()(kn.random.key(0), (784, 128))
    b = kn.init.zeros(None, (128,))

Each call is one compiled executable, cached per ``(shape, dtype)``: scale factors travel as
array arguments, so initialising many parameters of one shape compiles once. With the same key,
``zeros, ones, constant, uniform, normal`` and the ``uniform`` / ``normal`` /
``truncated_normal`` flavours of :func:`variance_scaling` reproduce ``jax.nn.initializers``
(the uniform ones to within an ulp of the scale factor; ``normal`` up to the rounding of the
inverse error function).

**Fans** (for :func:`variance_scaling` and the named schemes). By default the shape is read in
the layouts of kaun_ir's own layers:

* rank 2 — a dense weight ``[in, out]``: ``fan_in = shape[0]``, ``fan_out = shape[1]``;
* rank >= 3 — a convolution kernel ``[out, in/groups, *kernel]`` (PyTorch's OIHW):
  ``fan_in = shape[1] * receptive``, ``fan_out = shape[0] * receptive`` with ``receptive`` the
  product of the kernel sizes ``shape[2:]`` (PyTorch's and jax's rule);
* rank 1 — ``fan_in = fan_out = shape[0]``; rank 0 — both 1.

``in_axis`` / ``out_axis`` override the default (as in jax): the fans are then
``shape[in_axis] * receptive`` and ``shape[out_axis] * receptive`` where ``receptive`` is the
product of all other axes (use ``in_axis=-2, out_axis=-1`` for jax's HWIO kernels).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.names import public_dir
from kaun_ir.surface import random
from kaun_ir.surface.elementwise import clip, erf
from kaun_ir.surface.function import op_function
from kaun_ir.surface.promotion import astype, broadcast_to
from kaun_ir.surface.random.continuous import erf_inv

__all__ = [
    "Initializer",
    "zeros",
    "ones",
    "constant",
    "uniform",
    "normal",
    "truncated_normal",
    "variance_scaling",
    "glorot_uniform",
    "glorot_normal",
    "xavier_uniform",
    "xavier_normal",
    "he_uniform",
    "he_normal",
    "kaiming_uniform",
    "kaiming_normal",
    "lecun_uniform",
    "lecun_normal",
    "compute_fans",
]


Initializer = Callable[..., Any]  # (key, shape, dtype=float32) -> array


def _shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"kn.init: negative dimension in shape {list(shape)}")
    return shape


def _float_dtype(dtype: Any) -> np.dtype:
    dt = dtypes.canonical(dtype)
    if not dtypes.is_float(dt):
        raise TypeError(f"kn.init: parameters must have a floating-point dtype, got {dtypes.short_name(dt)}")
    return dt


# ------------------------------------------------------------------ compiled samplers
# Each is one op_function: one executable per (shape, dtype); numeric factors are array inputs.


@op_function
def _filled(shape, dtype, value):
    return broadcast_to(astype(value, dtype), shape)


@op_function
def _uniform_between(key, shape, dtype, low, high):
    return random.uniform(key, shape, dtype, low, high)


@op_function
def _symmetric_uniform(key, shape, dtype, scale):
    # jax.nn.initializers' form: uniform(-1, 1) * scale (not uniform(-scale, scale): rounding differs)
    return random.uniform(key, shape, dtype, -1.0, 1.0) * scale


@op_function
def _scaled_normal(key, shape, dtype, stddev):
    return random.normal(key, shape, dtype) * stddev


def _truncated_standard_normal(key, shape, dtype, lower: float, upper: float):
    """Standard normal conditioned on ``[lower, upper]``, by inverting the CDF (jax's method):
    ``sqrt(2) * erf_inv(u)`` for ``u`` uniform in ``[erf(lower/sqrt2), erf(upper/sqrt2))``."""
    compute = dtypes.float32 if dtype in (dtypes.float16, dtypes.bfloat16) else dtype
    sqrt2 = np.asarray(np.sqrt(2.0), compute)
    low, high = np.asarray(lower, compute), np.asarray(upper, compute)
    u = random.uniform(key, shape, compute, erf(low / sqrt2), erf(high / sqrt2))
    z = erf_inv(u) * sqrt2  # the composite erf_inv of kn.random (there is no primitive)
    # erf_inv rounding can land a hair outside the interval; clip strictly inside, as jax does
    inf = np.asarray(np.inf, compute)
    z = clip(z, np.nextafter(low, inf), np.nextafter(high, -inf))
    return astype(z, dtype)


@op_function
def _scaled_truncated_normal(key, shape, dtype, stddev, lower, upper):
    return _truncated_standard_normal(key, shape, dtype, lower, upper) * astype(stddev, dtype)


def _scalar(value: float, dtype: np.dtype) -> np.ndarray:
    return np.asarray(value, dtype=dtype)


# ------------------------------------------------------------------ simple initialisers


def zeros(key, shape, dtype=dtypes.float32):
    """The all-zeros initialiser (``key`` is ignored), like ``jax.nn.initializers.zeros``: pass
    ``kn.init.zeros`` itself, not ``kn.init.zeros()``."""
    dt = _float_dtype(dtype)
    return _filled(_shape(shape), dt, _scalar(0, dt))


def ones(key, shape, dtype=dtypes.float32):
    """The all-ones initialiser (``key`` is ignored), like ``jax.nn.initializers.ones``."""
    dt = _float_dtype(dtype)
    return _filled(_shape(shape), dt, _scalar(1, dt))


def constant(value: float) -> Initializer:
    """Every entry equal to ``value``: ``(key, shape, dtype) -> dtype[shape]``."""
    value = float(value)

    def init(key, shape, dtype=dtypes.float32):
        dt = _float_dtype(dtype)
        return _filled(_shape(shape), dt, _scalar(value, dt))

    return init


def uniform(scale: float | tuple[float, float] = 0.01) -> Initializer:
    """Uniform in ``[0, scale)`` (``jax.nn.initializers.uniform``), or in ``[low, high)`` when
    ``scale`` is a pair ``(low, high)``."""
    if isinstance(scale, (tuple, list)):
        if len(scale) != 2:
            raise ValueError(f"kn.init.uniform: scale must be a number or a (low, high) pair, got {scale!r}")
        low, high = float(scale[0]), float(scale[1])
        if not low < high:
            raise ValueError(f"kn.init.uniform: scale needs low < high, got {scale!r}")
    else:
        low, high = 0.0, float(scale)

    def init(key, shape, dtype=dtypes.float32):
        dt = _float_dtype(dtype)
        return _uniform_between(key, _shape(shape), dt, _scalar(low, dt), _scalar(high, dt))

    return init


def normal(stddev: float = 0.01) -> Initializer:
    """Normal with mean 0 and standard deviation ``stddev`` (``jax.nn.initializers.normal``)."""
    stddev = float(stddev)
    if stddev < 0:
        raise ValueError(f"kn.init.normal: stddev must be non-negative, got {stddev}")

    def init(key, shape, dtype=dtypes.float32):
        dt = _float_dtype(dtype)
        return _scaled_normal(key, _shape(shape), dt, _scalar(stddev, dt))

    return init


def truncated_normal(stddev: float = 0.01, lower: float = -2.0, upper: float = 2.0) -> Initializer:
    """``stddev`` times a standard normal truncated to ``[lower, upper]``
    (``jax.nn.initializers.truncated_normal``; the actual deviation is below ``stddev``)."""
    stddev, lower, upper = float(stddev), float(lower), float(upper)
    if stddev < 0:
        raise ValueError(f"kn.init.truncated_normal: stddev must be non-negative, got {stddev}")
    if not lower < upper:
        raise ValueError(f"kn.init.truncated_normal: needs lower < upper, got {lower} and {upper}")

    def init(key, shape, dtype=dtypes.float32):
        dt = _float_dtype(dtype)
        return _scaled_truncated_normal(key, _shape(shape), dt, _scalar(stddev, dt), lower, upper)

    return init


# ------------------------------------------------------------------ variance scaling


def compute_fans(
    shape: Sequence[int], in_axis: int | None = None, out_axis: int | None = None
) -> tuple[float, float]:
    """``(fan_in, fan_out)`` of a parameter shape (see the module docstring for the rule)."""
    shape = _shape(shape)
    if in_axis is not None or out_axis is not None:
        if len(shape) < 2:
            raise ValueError(f"kn.init: in_axis/out_axis need a shape of rank >= 2, got {list(shape)}")
        in_axis = len(shape) - 2 if in_axis is None else in_axis
        out_axis = len(shape) - 1 if out_axis is None else out_axis
        in_size, out_size = shape[in_axis], shape[out_axis]
        receptive = math.prod(shape) / max(in_size * out_size, 1)
        return in_size * receptive, out_size * receptive
    if len(shape) == 0:
        return 1.0, 1.0
    if len(shape) == 1:
        return float(shape[0]), float(shape[0])
    if len(shape) == 2:
        return float(shape[0]), float(shape[1])
    receptive = math.prod(shape[2:])
    return float(shape[1] * receptive), float(shape[0] * receptive)


# the standard deviation of a standard normal truncated to [-2, 2]
_TRUNCATED_STDDEV = 0.87962566103423978
_MODES = ("fan_in", "fan_out", "fan_avg")
_DISTRIBUTIONS = ("truncated_normal", "normal", "uniform")


def variance_scaling(
    scale: float,
    mode: str = "fan_in",
    distribution: str = "truncated_normal",
    in_axis: int | None = None,
    out_axis: int | None = None,
) -> Initializer:
    """Values with variance ``scale / n`` where ``n`` is ``fan_in``, ``fan_out`` or their mean
    (``mode``), like ``jax.nn.initializers.variance_scaling``.

    ``distribution``: ``"truncated_normal"`` (a normal truncated to two standard deviations,
    rescaled so the variance is exact), ``"normal"``, or ``"uniform"`` (in ``[-limit, limit)``,
    ``limit = sqrt(3 * scale / n)``). Fans follow the module docstring's convention; ``in_axis``
    / ``out_axis`` override it.
    """
    scale = float(scale)
    if not scale > 0:
        raise ValueError(f"kn.init.variance_scaling: scale must be positive, got {scale}")
    if mode not in _MODES:
        raise ValueError(f"kn.init.variance_scaling: mode must be one of {list(_MODES)}, got {mode!r}")
    if distribution not in _DISTRIBUTIONS:
        raise ValueError(
            f"kn.init.variance_scaling: distribution must be one of {list(_DISTRIBUTIONS)}, "
            f"got {distribution!r}"
        )

    def init(key, shape, dtype=dtypes.float32):
        shape, dt = _shape(shape), _float_dtype(dtype)
        fan_in, fan_out = compute_fans(shape, in_axis, out_axis)
        denominator = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[mode]
        variance = scale / max(denominator, 1.0)
        if distribution == "uniform":
            return _symmetric_uniform(key, shape, dt, _scalar(math.sqrt(3.0 * variance), dt))
        if distribution == "normal":
            return _scaled_normal(key, shape, dt, _scalar(math.sqrt(variance), dt))
        stddev = math.sqrt(variance) / _TRUNCATED_STDDEV
        return _scaled_truncated_normal(key, shape, dt, _scalar(stddev, dt), -2.0, 2.0)

    return init


def glorot_uniform(in_axis: int | None = None, out_axis: int | None = None) -> Initializer:
    """Glorot / Xavier uniform: ``variance_scaling(1, "fan_avg", "uniform")``, limit
    ``sqrt(6 / (fan_in + fan_out))``."""
    return variance_scaling(1.0, "fan_avg", "uniform", in_axis, out_axis)


def glorot_normal(in_axis: int | None = None, out_axis: int | None = None) -> Initializer:
    """Glorot / Xavier normal: ``variance_scaling(1, "fan_avg", "truncated_normal")``."""
    return variance_scaling(1.0, "fan_avg", "truncated_normal", in_axis, out_axis)


def he_uniform(in_axis: int | None = None, out_axis: int | None = None) -> Initializer:
    """He / Kaiming uniform: ``variance_scaling(2, "fan_in", "uniform")``."""
    return variance_scaling(2.0, "fan_in", "uniform", in_axis, out_axis)


def he_normal(in_axis: int | None = None, out_axis: int | None = None) -> Initializer:
    """He / Kaiming normal: ``variance_scaling(2, "fan_in", "truncated_normal")``."""
    return variance_scaling(2.0, "fan_in", "truncated_normal", in_axis, out_axis)


def lecun_uniform(in_axis: int | None = None, out_axis: int | None = None) -> Initializer:
    """LeCun uniform: ``variance_scaling(1, "fan_in", "uniform")``."""
    return variance_scaling(1.0, "fan_in", "uniform", in_axis, out_axis)


def lecun_normal(in_axis: int | None = None, out_axis: int | None = None) -> Initializer:
    """LeCun normal: ``variance_scaling(1, "fan_in", "truncated_normal")``."""
    return variance_scaling(1.0, "fan_in", "truncated_normal", in_axis, out_axis)


xavier_uniform = glorot_uniform
xavier_normal = glorot_normal
kaiming_uniform = he_uniform
kaiming_normal = he_normal

__dir__ = public_dir(__all__)
