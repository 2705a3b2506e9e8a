"""The ATen table's reductions: sums, means, variances, extrema and their indices, ``any`` /
``all``, the running sum and (log-)softmax."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kaun_ir import dtypes
from kaun_ir.runtime.interop.torch_args import as_float as _float
from kaun_ir.runtime.interop.torch_args import axes as _axes
from kaun_ir.runtime.interop.torch_args import axis as _axis
from kaun_ir.runtime.interop.torch_args import cast as _cast
from kaun_ir.runtime.interop.torch_args import rank as _ndim
from kaun_ir.runtime.interop.torch_args import registrar
from kaun_ir.runtime.interop.torch_args import shape as _shape
from kaun_ir.surface import elementwise, linalg, reductions, shapes
from kaun_ir.surface.promotion import astype
from kaun_ir.surface.tensor import apply, type_of

#: this family's entries of the ATen table (``torch_ops.ATEN`` merges the families)
ATEN: dict[str, Callable] = {}
_register = registrar(ATEN)


# ------------------------------------------------------------------------------- reductions


@_register("aten.sum.dim_IntList", "aten.sum.default")
def sum_(x, dim=None, keepdim=False, dtype=None):
    """``sum`` over ``dim`` (every axis when None or empty)."""
    x = _cast(x, dtype)
    if type_of(x).dtype == dtypes.bool_:
        x = astype(x, dtypes.int32)
    return reductions.sum(x, axis=_axes(dim, _ndim(x)), keepdims=keepdim)


@_register("aten.mean.dim", "aten.mean.default")
def mean(x, dim=None, keepdim=False, dtype=None):
    """``mean`` over ``dim`` (every axis when None or empty)."""
    x = _cast(x, dtype)
    return reductions.mean(x, axis=_axes(dim, _ndim(x)), keepdims=keepdim)


@_register("aten.var.correction", "aten.var.dim")
def var(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """``var`` over ``dim`` with ``ddof = correction`` (default 1, as in PyTorch)."""
    if isinstance(unbiased, bool):
        correction = 1 if unbiased else 0
    ddof = 1 if correction is None else correction
    return reductions.var(x, axis=_axes(dim, _ndim(x)), keepdims=keepdim, ddof=ddof)


@_register("aten.amax.default")
def amax(x, dim=(), keepdim=False):
    """``max`` over ``dim`` (every axis when empty)."""
    return reductions.max(x, axis=_axes(dim, _ndim(x)), keepdims=keepdim)


@_register("aten.amin.default")
def amin(x, dim=(), keepdim=False):
    """``min`` over ``dim`` (every axis when empty)."""
    return reductions.min(x, axis=_axes(dim, _ndim(x)), keepdims=keepdim)


@_register("aten.max.dim")
def max_dim(x, dim, keepdim=False):
    """``(max, argmax)`` along ``dim``."""
    return (reductions.max(x, axis=dim, keepdims=keepdim), reductions.argmax(x, axis=dim, keepdims=keepdim))


@_register("aten.min.dim")
def min_dim(x, dim, keepdim=False):
    """``(min, argmin)`` along ``dim``."""
    return (reductions.min(x, axis=dim, keepdims=keepdim), reductions.argmin(x, axis=dim, keepdims=keepdim))


@_register("aten.argmax.default")
def argmax(x, dim=None, keepdim=False):
    """``argmax`` along ``dim`` (of the flattened tensor when None)."""
    return reductions.argmax(x, axis=dim, keepdims=keepdim)


@_register("aten.argmin.default")
def argmin(x, dim=None, keepdim=False):
    """``argmin`` along ``dim`` (of the flattened tensor when None)."""
    return reductions.argmin(x, axis=dim, keepdims=keepdim)


@_register("aten.any.dim", "aten.any.dims", "aten.any.default")
def any_(x, dim=None, keepdim=False):
    """``any`` over ``dim``."""
    return reductions.any(astype(x, dtypes.bool_), axis=_axes(dim, _ndim(x)), keepdims=keepdim)


@_register("aten.all.dim", "aten.all.dims", "aten.all.default")
def all_(x, dim=None, keepdim=False):
    """``all`` over ``dim``."""
    return reductions.all(astype(x, dtypes.bool_), axis=_axes(dim, _ndim(x)), keepdims=keepdim)


@_register("aten.cumsum.default")
def cumsum(x, dim, dtype=None):
    """Running sum along ``dim`` (decomposed: for floats a product with a triangular matrix of
    ones; for integers, exactly, a ``reduce_window`` sum over a window of the whole axis padded
    in front; booleans count as integers)."""
    x = _cast(x, dtype)
    if type_of(x).dtype == dtypes.bool_:
        x = astype(x, dtypes.int32)
    out_dtype = type_of(x).dtype
    axis = _axis(dim, _ndim(x))
    n = _shape(x)[axis]
    if not dtypes.is_float(out_dtype) and n > 0:
        nd = _ndim(x)
        window = tuple(n if i == axis else 1 for i in range(nd))
        attrs = {
            "window_dimensions": window,
            "window_strides": (1,) * nd,
            "base_dilations": (1,) * nd,
            "window_dilations": (1,) * nd,
            "padding": tuple((n - 1, 0) if i == axis else (0, 0) for i in range(nd)),
        }
        return apply("reduce_window", x, np.asarray(0, out_dtype), kind="sum", **attrs)
    work = _float(x)
    triangle = np.triu(np.ones((n, n), dtypes.float32)).astype(type_of(work).dtype)
    moved = shapes.transpose(work, [i for i in range(_ndim(x)) if i != axis] + [axis])
    summed = linalg.matmul(moved, triangle)
    order = list(range(_ndim(x) - 1))
    order.insert(axis, _ndim(x) - 1)
    out = shapes.transpose(summed, order)
    if not dtypes.is_float(out_dtype):
        out = elementwise.round(out)
    return astype(out, out_dtype)


@_register("aten._softmax.default")
def softmax(x, dim, half_to_float=False):
    """``softmax`` along ``dim``."""
    return reductions.softmax(x, axis=dim)


@_register("aten._log_softmax.default")
def log_softmax(x, dim, half_to_float=False):
    """``log_softmax`` along ``dim``."""
    return reductions.log_softmax(x, axis=dim)
