"""Reductions with NumPy semantics: ``kn.sum``, ``kn.mean``, ``kn.max`` ... ``kn.softmax``.

Every function takes ``axis`` as None (all axes), an int or a tuple of ints (negative counts
from the end) and ``keepdims``: reduced axes are removed, or kept with size 1. Dtypes follow
jax.numpy: sum/prod of bool and narrow integers accumulate in (u)int32; mean/var/std of integers
give float32; float16/bfloat16 accumulate in float32 and are cast back.

These names shadow Python's builtins inside this module (``sum``, ``max``, ``min``, ``all``,
``any``), so Python's own are reached through ``builtins``.
"""

from __future__ import annotations

import builtins
import math
from typing import Any

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.surface.elementwise import divide, exp, log, multiply, sqrt, stop_gradient, subtract, where
from kaun_ir.surface.function import op_function
from kaun_ir.surface.promotion import astype, dtype_of, shape_of
from kaun_ir.surface.shapes import reshape
from kaun_ir.surface.tensor import apply

_LOW_PRECISION = (dtypes.float16, dtypes.bfloat16)

# ------------------------------------------------------------------------------ helpers


def _axes(axis: Any, ndim: int, name: str) -> tuple[int, ...]:
    """``axis`` (None, int or tuple; may be negative) as sorted non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    out = []
    for a in items:
        if isinstance(a, bool) or not isinstance(a, int) and not hasattr(a, "__index__"):
            raise TypeError(f"{name}: axis must be an int or a tuple of ints, got {axis!r}")
        a = int(a)
        if not -ndim <= a < ndim:
            raise ShapeError(f"{name}: axis {a} is out of bounds for a tensor of rank {ndim}")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ShapeError(f"{name}: repeated axis in {axis!r}")
    return tuple(sorted(out))


def _keep(y, shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool):
    """Put the reduced axes back as size 1 when ``keepdims``."""
    if not keepdims:
        return y
    return reshape(y, tuple(1 if i in axes else d for i, d in enumerate(shape)))


def _reduce(x, kind: str, axes: tuple[int, ...]):
    return apply("reduce", x, kind=kind, dimensions=axes) if axes else x


def _count(shape: tuple[int, ...], axes: tuple[int, ...]) -> int:
    return math.prod(shape[a] for a in axes)


def _accumulation_dtype(dt):
    """The dtype sum/prod accumulate in (and return, except for low-precision floats)."""
    if dtypes.is_bool(dt) or (dtypes.is_integer(dt) and dt.itemsize < 4):
        return dtypes.uint32 if dtypes.is_unsigned(dt) else dtypes.int32
    if dt in _LOW_PRECISION:
        return dtypes.float32
    return dt


def _float_dtype(dt):
    """Result dtype of mean/var/std: floats keep theirs, everything else gives float32."""
    return dt if dtypes.is_float(dt) else dtypes.float32


def _reject_empty(name: str, shape: tuple[int, ...], axes: tuple[int, ...]) -> None:
    if builtins.any(shape[a] == 0 for a in axes):
        raise ValueError(
            f"{name}: zero-size reduction over axis {[a for a in axes if shape[a] == 0]} of "
            f"shape {list(shape)} has no identity"
        )


def _sum_prod(kind: str, x, axis, keepdims):
    shape, dt = shape_of(x), dtype_of(x)
    axes = _axes(axis, len(shape), kind)
    acc = _accumulation_dtype(dt)
    out = _reduce(astype(x, acc), kind, axes)
    out = astype(out, dt) if dt in _LOW_PRECISION else out
    return _keep(out, shape, axes, keepdims)


# ------------------------------------------------------------------------------ public


@op_function
def sum(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    """Sum over ``axis``: x[d0..dn] -> [dims not in axis] (size 1 with ``keepdims``).

    bool and 8/16-bit integers sum in int32 (uint32 when unsigned); float16/bfloat16 accumulate
    in float32 and are cast back. A size-0 axis sums to 0.
    """
    return _sum_prod("sum", x, axis, keepdims)


@op_function
def prod(x, axis=None, keepdims=False):
    """Product over ``axis`` (shapes and dtypes as in :func:`sum`); a size-0 axis gives 1."""
    return _sum_prod("prod", x, axis, keepdims)


def _max_min(kind: str, x, axis, keepdims):
    shape = shape_of(x)
    axes = _axes(axis, len(shape), kind)
    _reject_empty(kind, shape, axes)
    return _keep(_reduce(x, kind, axes), shape, axes, keepdims)


@op_function
def max(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    """Largest element over ``axis``: x[d0..dn] -> [dims not in axis]; NaN propagates.

    Same dtype as ``x``. ValueError for a size-0 axis (no identity, like NumPy).
    """
    return _max_min("max", x, axis, keepdims)


@op_function
def min(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    """Smallest element over ``axis``: x[d0..dn] -> [dims not in axis]; NaN propagates.

    Same dtype as ``x``. ValueError for a size-0 axis (no identity, like NumPy).
    """
    return _max_min("min", x, axis, keepdims)


def _all_any(kind: str, x, axis, keepdims):
    shape = shape_of(x)
    axes = _axes(axis, len(shape), "all" if kind == "and" else "any")
    truth = astype(x, dtypes.bool_)  # x != 0 (NaN counts as true)
    return _keep(_reduce(truth, kind, axes), shape, axes, keepdims)


@op_function
def all(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    """Whether every element over ``axis`` is nonzero: x[d0..dn] -> bool[dims not in axis].

    True over a size-0 axis.
    """
    return _all_any("and", x, axis, keepdims)


@op_function
def any(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    """Whether some element over ``axis`` is nonzero: x[d0..dn] -> bool[dims not in axis].

    False over a size-0 axis.
    """
    return _all_any("or", x, axis, keepdims)


def _mean_in(x, axes: tuple[int, ...], compute_dtype):
    """Mean over ``axes`` (removed) computed in ``compute_dtype``."""
    total = _reduce(astype(x, compute_dtype), "sum", axes)
    count = _count(shape_of(x), axes)
    # 0 / 0 = NaN over a size-0 axis, as in NumPy
    return divide(total, astype(float(count), compute_dtype))


@op_function
def mean(x, axis=None, keepdims=False):
    """Arithmetic mean over ``axis``: x[d0..dn] -> [dims not in axis].

    Integers and bool give float32; float16/bfloat16 accumulate in float32 and are cast back.
    NaN over a size-0 axis.
    """
    shape, dt = shape_of(x), dtype_of(x)
    axes = _axes(axis, len(shape), "mean")
    out_dt = _float_dtype(dt)
    compute = dtypes.float32 if out_dt in _LOW_PRECISION else out_dt
    return _keep(astype(_mean_in(x, axes, compute), out_dt), shape, axes, keepdims)


def _var(name: str, x, axis, keepdims, ddof):
    shape, dt = shape_of(x), dtype_of(x)
    axes = _axes(axis, len(shape), name)
    out_dt = _float_dtype(dt)
    compute = dtypes.float32 if out_dt in _LOW_PRECISION else out_dt
    xc = astype(x, compute)
    centred = subtract(
        xc, reshape(_mean_in(xc, axes, compute), tuple(1 if i in axes else d for i, d in enumerate(shape)))
    )
    squares = _reduce(multiply(centred, centred), "sum", axes)
    # count - ddof <= 0 gives inf or NaN, as in NumPy
    dof = builtins.max(_count(shape, axes) - ddof, 0)
    return compute, out_dt, axes, divide(squares, astype(float(dof), compute))


@op_function
def var(x, axis=None, keepdims=False, ddof=0):
    """Variance ``mean((x - mean(x))**2)`` over ``axis`` with ``count - ddof`` as the divisor.

    x[d0..dn] -> [dims not in axis]; integers give float32; float16/bfloat16 compute in float32.
    """
    _, out_dt, axes, v = _var("var", x, axis, keepdims, ddof)
    return _keep(astype(v, out_dt), shape_of(x), axes, keepdims)


@op_function
def std(x, axis=None, keepdims=False, ddof=0):
    """Standard deviation ``sqrt(var(x, axis, ddof=ddof))``; shapes and dtypes as :func:`var`."""
    _, out_dt, axes, v = _var("std", x, axis, keepdims, ddof)
    return _keep(astype(sqrt(v), out_dt), shape_of(x), axes, keepdims)


def _arg(kind: str, x, axis, keepdims):
    shape = shape_of(x)
    if axis is None:
        if math.prod(shape) == 0:
            raise ValueError(f"{kind}: attempt to get {kind} of an empty sequence")
        out = apply(kind, reshape(x, (-1,)), axis=0, index_dtype=dtypes.int32)
        return reshape(out, (1,) * len(shape)) if keepdims else out
    if isinstance(axis, (tuple, list)):
        raise TypeError(f"{kind}: axis must be None or an int, got {axis!r}")
    (a,) = _axes(axis, len(shape), kind)
    if shape[a] == 0:
        raise ValueError(f"{kind}: attempt to get {kind} of an empty axis {a} of shape {list(shape)}")
    return _keep(apply(kind, x, axis=a, index_dtype=dtypes.int32), shape, (a,), keepdims)


@op_function
def argmax(x, axis=None, keepdims=False):
    """Index (int32) of the largest element along ``axis`` (None: of the flattened tensor).

    x[d0..dn] -> int32[dims but axis]; ties give the first index; NaN counts as the largest
    (the first NaN wins), like NumPy. ValueError over a size-0 axis.
    """
    return _arg("argmax", x, axis, keepdims)


@op_function
def argmin(x, axis=None, keepdims=False):
    """Index (int32) of the smallest element along ``axis`` (None: of the flattened tensor).

    x[d0..dn] -> int32[dims but axis]; ties give the first index; NaN counts as the smallest
    (the first NaN wins), like NumPy. ValueError over a size-0 axis.
    """
    return _arg("argmin", x, axis, keepdims)


def _to_float(x):
    return x if dtypes.is_float(dtype_of(x)) else astype(x, dtypes.float32)


def _shifted(x, axes: tuple[int, ...], keep_inf: bool = False):
    """``x - max(x)`` over ``axes`` (kept as size-1) and that max, with non-finite maxima as 0.

    Subtracting the max keeps ``exp`` from overflowing; a max of +-inf (or NaN) is replaced by 0
    so that rows of -inf give exp(-inf) = 0 instead of NaN. The max cancels out of the result
    mathematically, so it is not differentiated (``stop_gradient``, as jax does).
    ``keep_inf``: only a -inf max is replaced, so that a row holding +inf gives NaN in softmax
    (``inf / inf``) everywhere, as ``jax.nn.softmax`` does, not a row of made-up zeros.
    """
    shape = shape_of(x)
    kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
    top = stop_gradient(reshape(_reduce(x, "max", axes), kept))
    if keep_inf:
        top = where(top == float("-inf"), 0.0, top)
    else:
        top = where(apply("abs", top) < float("inf"), top, 0.0)
    return subtract(x, top), top


@op_function
def logsumexp(x, axis=None, keepdims=False):
    """``log(sum(exp(x)))`` over ``axis``, computed stably: x[d0..dn] -> [dims not in axis].

    Large values do not overflow (the max is subtracted first); a size-0 axis or an all -inf
    axis gives -inf. Integers are converted to float32.
    """
    x = _to_float(x)
    shape = shape_of(x)
    axes = _axes(axis, len(shape), "logsumexp")
    shifted, top = _shifted(x, axes)
    total = log(_reduce(exp(shifted), "sum", axes))
    out = total + reshape(top, tuple(d for i, d in enumerate(shape) if i not in axes))
    return _keep(out, shape, axes, keepdims)


@op_function
def softmax(x, axis=-1):
    """``exp(x) / sum(exp(x))`` along ``axis`` (int, tuple or None), computed stably; same shape.

    Integers are converted to float32.
    """
    x = _to_float(x)
    shape = shape_of(x)
    axes = _axes(axis, len(shape), "softmax")
    shifted, _ = _shifted(x, axes, keep_inf=True)
    e = exp(shifted)
    total = reshape(_reduce(e, "sum", axes), tuple(1 if i in axes else d for i, d in enumerate(shape)))
    return divide(e, total)


@op_function
def log_softmax(x, axis=-1):
    """``x - logsumexp(x, axis, keepdims=True)`` along ``axis``, computed stably; same shape.

    Integers are converted to float32.
    """
    x = _to_float(x)
    shape = shape_of(x)
    axes = _axes(axis, len(shape), "log_softmax")
    shifted, _ = _shifted(x, axes, keep_inf=True)
    total = log(_reduce(exp(shifted), "sum", axes))
    return subtract(shifted, reshape(total, tuple(1 if i in axes else d for i, d in enumerate(shape))))


__all__ = [
    "sum",
    "mean",
    "max",
    "min",
    "prod",
    "var",
    "std",
    "argmax",
    "argmin",
    "logsumexp",
    "softmax",
    "log_softmax",
    "all",
    "any",
]
