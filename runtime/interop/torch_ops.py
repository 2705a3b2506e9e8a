"""The ATen op table of the PyTorch importer: each core ATen op written with kaun_ir's NumPy-style surface.

``ATEN`` maps an op's name as ``torch.export`` prints it (``"aten.addmm.default"``) onto a
function of the op's arguments: traced tensors (``Tensor``) where PyTorch has tensors, Python
values (ints, floats, lists, ``None``, dtypes as their ``str``) elsewhere. A function returns
one tensor, or a tuple for an op with several outputs, where ``None`` stands for an output the
importer does not compute (the indices of ``max_pool2d_with_indices``, the saved statistics of
a normalisation): using one raises :class:`~kaun_ir.errors.TorchImportError`.

Because every op is written with the surface functions (``add``, ``matmul``, ``reshape``, the
``convolution`` and ``reduce_window`` primitives ...), an imported program gets reverse mode,
batching and forward mode from the op table's own rules. Most ops map one to one; the others
are decompositions, each stated in the function's docstring. No module here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import TorchImportError
from kaun_ir.surface import creation, elementwise, indexing, linalg, reductions, shapes, take
from kaun_ir.surface.promotion import astype, broadcast_to
from kaun_ir.surface.tensor import apply, type_of

#: PyTorch dtypes (as ``str(torch.float32)`` prints them) -> kaun_ir dtypes. 64-bit integers
#: (PyTorch's default index type) become 32-bit ones.
DTYPES = {
    "torch.float32": dtypes.float32,
    "torch.float64": dtypes.float64,
    "torch.float16": dtypes.float16,
    "torch.bfloat16": dtypes.bfloat16,
    "torch.int64": dtypes.int32,
    "torch.int32": dtypes.int32,
    "torch.int16": dtypes.int16,
    "torch.int8": dtypes.int8,
    "torch.uint8": dtypes.uint8,
    "torch.bool": dtypes.bool_,
}

__all__ = ["ATEN", "DTYPES", "dtype_of_torch"]

ATEN: dict[str, Callable] = {}


def dtype_of_torch(name: Any):
    """The kaun_ir dtype of a PyTorch dtype (or its ``str``); TorchImportError if there is none."""
    key = str(name)
    if key not in DTYPES:
        raise TorchImportError(f"dtype {key} has no kaun_ir counterpart")
    return DTYPES[key]


def _register(*names: str):
    def decorate(fn: Callable) -> Callable:
        for name in names:
            ATEN[name] = fn
        return fn

    return decorate


def _shape(x) -> tuple[int, ...]:
    return type_of(x).shape


def _ndim(x) -> int:
    return len(type_of(x).shape)


def _axis(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim


def _axes(dim, ndim: int) -> tuple[int, ...]:
    """A reduction's ``dim`` argument: None or ``[]`` is every axis."""
    if dim is None or (isinstance(dim, (list, tuple)) and not dim):
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    return tuple(sorted(_axis(d, ndim) for d in dim))


def _float(x):
    dt = type_of(x).dtype
    return x if dtypes.is_float(dt) else astype(x, dtypes.float32)


def _cast(x, dtype):
    return x if dtype is None else astype(x, dtype_of_torch(dtype))


# ------------------------------------------------------------------------------ elementwise

_UNARY = {
    "abs": elementwise.abs,
    "neg": elementwise.negative,
    "exp": elementwise.exp,
    "expm1": elementwise.expm1,
    "log": elementwise.log,
    "log1p": elementwise.log1p,
    "sqrt": elementwise.sqrt,
    "rsqrt": elementwise.rsqrt,
    "sin": elementwise.sin,
    "cos": elementwise.cos,
    "tanh": elementwise.tanh,
    "sigmoid": elementwise.sigmoid,
    "erf": elementwise.erf,
    "floor": elementwise.floor,
    "ceil": elementwise.ceil,
    "round": elementwise.round,
    "sign": elementwise.sign,
    "reciprocal": elementwise.reciprocal,
    "logical_not": elementwise.logical_not,
    "bitwise_not": elementwise.invert,
}
for _name, _fn in _UNARY.items():
    ATEN[f"aten.{_name}.default"] = _fn

_BINARY = {
    "mul": elementwise.multiply,
    "eq": elementwise.equal,
    "ne": elementwise.not_equal,
    "lt": elementwise.less,
    "le": elementwise.less_equal,
    "gt": elementwise.greater,
    "ge": elementwise.greater_equal,
    "bitwise_and": elementwise.bitwise_and,
    "bitwise_or": elementwise.bitwise_or,
    "bitwise_xor": elementwise.bitwise_xor,
    "remainder": elementwise.mod,
}
for _name, _fn in _BINARY.items():
    ATEN[f"aten.{_name}.Tensor"] = _fn
    ATEN[f"aten.{_name}.Scalar"] = _fn
ATEN["aten.maximum.default"] = elementwise.maximum
ATEN["aten.minimum.default"] = elementwise.minimum
ATEN["aten.atan2.default"] = elementwise.arctan2


def _logical(fn: Callable) -> Callable:
    def logical(a, b):
        return fn(astype(a, dtypes.bool_), astype(b, dtypes.bool_))

    logical.__doc__ = f"``{fn.__name__}`` of the operands as booleans."
    return logical


ATEN["aten.logical_and.default"] = _logical(elementwise.bitwise_and)
ATEN["aten.logical_or.default"] = _logical(elementwise.bitwise_or)
ATEN["aten.logical_xor.default"] = _logical(elementwise.bitwise_xor)


@_register("aten.add.Tensor", "aten.add.Scalar")
def add(a, b, alpha=1):
    """``a + alpha * b``."""
    return elementwise.add(a, b if alpha == 1 else elementwise.multiply(b, alpha))


@_register("aten.sub.Tensor", "aten.sub.Scalar")
def sub(a, b, alpha=1):
    """``a - alpha * b``."""
    return elementwise.subtract(a, b if alpha == 1 else elementwise.multiply(b, alpha))


@_register("aten.rsub.Scalar", "aten.rsub.Tensor")
def rsub(a, b, alpha=1):
    """``b - alpha * a``."""
    return sub(b, a, alpha)


@_register("aten.div.Tensor", "aten.div.Scalar")
def div(a, b):
    """True division (integers give floats, as in PyTorch)."""
    return elementwise.true_divide(a, b)


@_register("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def div_mode(a, b, rounding_mode=None):
    """Division rounded as ``rounding_mode`` says: ``None``, ``"trunc"`` or ``"floor"``."""
    if rounding_mode is None:
        return div(a, b)
    if rounding_mode == "floor":
        return elementwise.floor_divide(a, b)
    floor = elementwise.floor_divide(a, b)
    if not dtypes.is_float(type_of(floor).dtype):
        # integers stay integers (as in PyTorch): the floor moved up by one where the exact
        # quotient is negative and not whole
        inexact = elementwise.not_equal(elementwise.mod(a, b), 0)
        negative = elementwise.not_equal(elementwise.less(a, 0), elementwise.less(b, 0))
        return elementwise.where(elementwise.bitwise_and(inexact, negative), elementwise.add(floor, 1), floor)
    q = elementwise.true_divide(a, b)
    return elementwise.multiply(elementwise.sign(q), elementwise.floor(elementwise.abs(q)))


@_register("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def pow_(a, b):
    """``a ** b``."""
    return elementwise.power(a, b)


@_register("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def where(condition, a, b):
    """``a`` where ``condition``, else ``b``."""
    return elementwise.where(astype(condition, dtypes.bool_), a, b)


@_register("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def masked_fill(x, mask, value):
    """``value`` where ``mask``, else ``x`` (decomposed: ``where``)."""
    return elementwise.where(astype(mask, dtypes.bool_), astype(value, type_of(x).dtype), x)


@_register("aten.clamp.default", "aten.clamp.Tensor")
def clamp(x, min=None, max=None):  # noqa: A002 - PyTorch's argument names
    """``x`` limited to ``[min, max]`` (either may be None): ``maximum`` then ``minimum``."""
    if min is not None:
        x = elementwise.maximum(x, min)
    if max is not None:
        x = elementwise.minimum(x, max)
    return x


@_register("aten.clamp_min.default", "aten.clamp_min.Tensor")
def clamp_min(x, bound):
    """``maximum(x, bound)``."""
    return elementwise.maximum(x, bound)


@_register("aten.clamp_max.default", "aten.clamp_max.Tensor")
def clamp_max(x, bound):
    """``minimum(x, bound)``."""
    return elementwise.minimum(x, bound)


@_register("aten.hardtanh.default")
def hardtanh(x, min_val=-1.0, max_val=1.0):
    """``clamp(x, min_val, max_val)``."""
    return clamp(x, min_val, max_val)


@_register("aten.relu.default")
def relu(x):
    """``maximum(x, 0)``."""
    return elementwise.maximum(x, 0)


@_register("aten.leaky_relu.default")
def leaky_relu(x, negative_slope=0.01):
    """``where(x > 0, x, slope * x)``."""
    return elementwise.where(elementwise.greater(x, 0), x, elementwise.multiply(x, negative_slope))


@_register("aten.gelu.default")
def gelu(x, approximate="none"):
    """GELU: ``x/2 (1 + erf(x/sqrt 2))``, or its tanh approximation for ``approximate="tanh"``."""
    if approximate == "tanh":
        inner = elementwise.multiply(
            x + elementwise.multiply(elementwise.multiply(elementwise.multiply(x, x), x), 0.044715),
            math.sqrt(2.0 / math.pi),
        )
        return elementwise.multiply(elementwise.multiply(x, 0.5), elementwise.tanh(inner) + 1.0)
    return elementwise.multiply(
        elementwise.multiply(x, 0.5), elementwise.erf(elementwise.multiply(x, 1.0 / math.sqrt(2.0))) + 1.0
    )


@_register("aten.silu.default")
def silu(x):
    """``x * sigmoid(x)``."""
    return elementwise.multiply(x, elementwise.sigmoid(x))


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


# ------------------------------------------------------------------------------ linear algebra


@_register("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def matmul(a, b):
    """``a @ b``."""
    return linalg.matmul(a, b)


@_register("aten.addmm.default")
def addmm(bias, a, b, beta=1, alpha=1):
    """``beta * bias + alpha * (a @ b)``."""
    product = linalg.matmul(a, b)
    if alpha != 1:
        product = elementwise.multiply(product, alpha)
    if beta == 0:
        return product
    return elementwise.add(product, bias if beta == 1 else elementwise.multiply(bias, beta))


# -------------------------------------------------------------------------------- shapes


@_register("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.view_copy.default")
def view(x, size):
    """``reshape`` (a ``-1`` entry is inferred)."""
    return shapes.reshape(x, tuple(size))


@_register("aten.permute.default", "aten.permute_copy.default")
def permute(x, dims):
    """``transpose`` by ``dims``."""
    return shapes.transpose(x, [_axis(d, _ndim(x)) for d in dims])


@_register("aten.transpose.int")
def transpose(x, dim0, dim1):
    """Swap two axes."""
    order = list(range(_ndim(x)))
    a, b = _axis(dim0, len(order)), _axis(dim1, len(order))
    order[a], order[b] = order[b], order[a]
    return shapes.transpose(x, order)


@_register("aten.t.default")
def t(x):
    """Swap the two axes of a matrix (a vector is unchanged)."""
    return x if _ndim(x) < 2 else transpose(x, 0, 1)


@_register("aten.expand.default", "aten.expand_copy.default")
def expand(x, size, implicit=False):
    """``broadcast_to`` ``size``, where ``-1`` keeps the axis."""
    shape = _shape(x)
    lead = len(size) - len(shape)
    target = tuple(shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    return broadcast_to(x, target)


@_register("aten.unsqueeze.default")
def unsqueeze(x, dim):
    """``expand_dims``."""
    return shapes.expand_dims(x, dim + _ndim(x) + 1 if dim < 0 else dim)


@_register("aten.squeeze.dims", "aten.squeeze.dim", "aten.squeeze.default")
def squeeze(x, dim=None):
    """Drop the named axes of size 1 (every axis of size 1 when ``dim`` is None)."""
    shape = _shape(x)
    axes = range(len(shape)) if dim is None else _axes(dim, len(shape))
    drop = [a for a in axes if shape[a] == 1]
    if not drop:
        return x
    return shapes.reshape(x, tuple(s for i, s in enumerate(shape) if i not in drop))


@_register("aten.slice.Tensor", "aten.slice_copy.Tensor")
def slice_(x, dim=0, start=None, end=None, step=1):
    """``x[..., start:end:step, ...]`` along ``dim`` (bounds clamped as in PyTorch)."""
    axis = _axis(dim, _ndim(x))
    index = [slice(None)] * _ndim(x)
    index[axis] = slice(start, end, step)
    return indexing.getitem(x, tuple(index))


@_register("aten.select.int", "aten.select_copy.int")
def select(x, dim, index):
    """``x[..., index, ...]`` along ``dim`` (the axis is dropped)."""
    axis = _axis(dim, _ndim(x))
    items = [slice(None)] * _ndim(x)
    items[axis] = index
    return indexing.getitem(x, tuple(items))


@_register("aten.cat.default")
def cat(tensors, dim=0):
    """``concatenate`` along ``dim`` (PyTorch's legacy empty 1-d operands are skipped)."""
    parts = [x for x in tensors if not (_shape(x) == (0,) and _ndim(tensors[0]) > 1)]
    return shapes.concatenate(parts, axis=_axis(dim, _ndim(parts[0])))


@_register("aten.stack.default")
def stack(tensors, dim=0):
    """``stack`` along ``dim``."""
    return shapes.stack(list(tensors), axis=_axis(dim, _ndim(tensors[0]) + 1))


@_register("aten.split_with_sizes.default", "aten.split_with_sizes_copy.default")
def split_with_sizes(x, split_sizes, dim=0):
    """Consecutive slices of the given sizes along ``dim``."""
    out, start = [], 0
    for size in split_sizes:
        out.append(slice_(x, dim, start, start + size))
        start += size
    return tuple(out)


@_register("aten.split.Tensor", "aten.split_copy.Tensor")
def split(x, split_size, dim=0):
    """Consecutive slices of ``split_size`` along ``dim`` (the last may be shorter)."""
    n = _shape(x)[_axis(dim, _ndim(x))]
    return split_with_sizes(x, [min(split_size, n - s) for s in range(0, n, split_size)], dim)


@_register("aten.unbind.int", "aten.unbind_copy.int")
def unbind(x, dim=0):
    """Every index along ``dim``, each with the axis dropped."""
    return tuple(select(x, dim, i) for i in range(_shape(x)[_axis(dim, _ndim(x))]))


@_register("aten.repeat.default")
def repeat(x, repeats):
    """Tile ``x`` ``repeats`` times per axis (decomposed: ``broadcast_to`` and ``reshape``)."""
    shape = (1,) * (len(repeats) - _ndim(x)) + _shape(x)
    x = shapes.reshape(x, shape)
    interleaved = tuple(v for s in shape for v in (1, s))
    x = shapes.reshape(x, interleaved)
    target = tuple(v for r, s in zip(repeats, shape) for v in (r, s))
    return shapes.reshape(broadcast_to(x, target), tuple(r * s for r, s in zip(repeats, shape)))


@_register(
    "aten.clone.default",
    "aten.alias.default",
    "aten.alias_copy.default",
    "aten.detach.default",
    "aten.lift_fresh_copy.default",
    "aten.contiguous.default",
)
def identity(x, *args, **kwargs):
    """The operand itself (memory formats and aliasing do not exist in kaun_ir)."""
    return x


@_register("aten._to_copy.default", "aten.to.dtype")
def to_copy(x, dtype=None, **kwargs):
    """``astype`` when ``dtype`` is given (device and layout arguments are ignored)."""
    return _cast(x, dtype)


@_register("aten.copy.default")
def copy(x, src, non_blocking=False):
    """``src`` broadcast to ``x``'s shape and converted to its dtype."""
    return astype(broadcast_to(src, _shape(x)), type_of(x).dtype)


def _triangle(lower: bool) -> Callable:
    def tri(x, diagonal=0):
        rows, cols = _shape(x)[-2:]
        r = np.arange(rows)[:, None]
        c = np.arange(cols)[None, :]
        keep = c - r <= diagonal if lower else c - r >= diagonal
        return elementwise.where(keep, x, creation.zeros_like(x))

    tri.__doc__ = f"The {'lower' if lower else 'upper'} triangle (``where`` with a constant mask)."
    return tri


ATEN["aten.tril.default"] = _triangle(True)
ATEN["aten.triu.default"] = _triangle(False)


@_register("aten.constant_pad_nd.default")
def constant_pad_nd(x, pad, value=0):
    """Pad the last axes, ``pad = [lo_last, hi_last, lo_second_last, ...]``, with ``value``
    (decomposed: ``concatenate`` with constant blocks; negative pads slice)."""
    for i in range(len(pad) // 2):
        axis = _ndim(x) - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        if lo < 0:
            x, lo = slice_(x, axis, -lo, None), 0
        if hi < 0:
            x, hi = slice_(x, axis, 0, _shape(x)[axis] + hi), 0
        parts = []
        for amount in (lo, None, hi):
            if amount is None:
                parts.append(x)
            elif amount:
                shape = list(_shape(x))
                shape[axis] = amount
                parts.append(creation.full(tuple(shape), value, type_of(x).dtype))
        x = shapes.concatenate(parts, axis=axis) if len(parts) > 1 else x
    return x


# ------------------------------------------------------------------------------ indexing


@_register("aten.embedding.default")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """Rows of ``weight`` (``take`` along axis 0)."""
    return take.take(weight, indices, axis=0)


@_register("aten.index_select.default")
def index_select(x, dim, index):
    """``take`` along ``dim``."""
    return take.take(x, index, axis=_axis(dim, _ndim(x)))


@_register("aten.index.Tensor")
def index(x, indices):
    """Advanced indexing ``x[i0, i1, ...]`` (``None`` entries are full slices), as in NumPy."""
    items = tuple(slice(None) if i is None else i for i in indices)
    return indexing.getitem(x, items)


@_register("aten.gather.default")
def gather(x, dim, index, sparse_grad=False):
    """``take_along_axis`` (the index must have ``x``'s shape off ``dim``)."""
    return take.take_along_axis(x, index, axis=_axis(dim, _ndim(x)))


# ------------------------------------------------------------------------------ creation


def _creation_dtype(dtype, value):
    if dtype is not None:
        return dtype_of_torch(dtype)
    if isinstance(value, bool):
        return dtypes.bool_
    return dtypes.int32 if isinstance(value, int) else dtypes.float32


@_register("aten.full.default")
def full(size, fill_value, dtype=None, **kwargs):
    """A tensor of ``fill_value``."""
    return creation.full(tuple(size), fill_value, _creation_dtype(dtype, fill_value))


@_register("aten.scalar_tensor.default")
def scalar_tensor(value, dtype=None, **kwargs):
    """A 0-d tensor (float32 unless ``dtype`` says otherwise, as in PyTorch)."""
    return creation.full((), value, dtypes.float32 if dtype is None else dtype_of_torch(dtype))


@_register(
    "aten.zeros.default", "aten.empty.memory_format", "aten.new_zeros.default", "aten.new_empty.default"
)
def zeros(*args, dtype=None, **kwargs):
    """Zeros of ``size`` (``empty`` gives zeros too)."""
    return creation.zeros(*_size_and_dtype(args, dtype))


def _size_and_dtype(args: tuple, dtype) -> tuple:
    """``(size, dtype)`` of ``zeros(size)`` / ``new_zeros(like, size)``-style calls: the given
    dtype, else ``like``'s, else float32."""
    like = args[0] if len(args) == 2 else None
    if dtype is not None:
        return tuple(args[-1]), dtype_of_torch(dtype)
    return tuple(args[-1]), type_of(like).dtype if like is not None else dtypes.float32


@_register("aten.ones.default", "aten.new_ones.default")
def ones(*args, dtype=None, **kwargs):
    """Ones of ``size``."""
    return creation.ones(*_size_and_dtype(args, dtype))


@_register("aten.full_like.default", "aten.fill.Scalar")
def full_like(x, fill_value, dtype=None, **kwargs):
    """A tensor of ``fill_value`` with ``x``'s shape (and dtype unless ``dtype`` is given)."""
    return creation.full(_shape(x), fill_value, type_of(x).dtype if dtype is None else dtype_of_torch(dtype))


@_register("aten.zeros_like.default", "aten.empty_like.default")
def zeros_like(x, dtype=None, **kwargs):
    """Zeros with ``x``'s shape."""
    return full_like(x, 0, dtype)


@_register("aten.ones_like.default")
def ones_like(x, dtype=None, **kwargs):
    """Ones with ``x``'s shape."""
    return full_like(x, 1, dtype)


@_register("aten.arange.start_step", "aten.arange.start", "aten.arange.default")
def arange(*args, dtype=None, **kwargs):
    """``arange(start, end, step)`` (ints give int32, floats float32, unless ``dtype`` says)."""
    start, end, step = (0, args[0], 1) if len(args) == 1 else (tuple(args) + (1,))[:3]
    kind = any(isinstance(v, float) for v in (start, end, step))
    dt = dtype_of_torch(dtype) if dtype is not None else (dtypes.float32 if kind else dtypes.int32)
    return creation.arange(start, end, step, dtype=dt)


# ------------------------------------------------------------------------------ neural network


@_register("aten.convolution.default")
def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """N-d convolution (cross-correlation), ``NC...`` input and ``OI...`` weight, onto the
    ``convolution`` primitive. A transposed convolution (weight ``[I, O/groups, k...]``) is the
    convolution of the input dilated by the stride with the spatially flipped kernel, its two
    feature axes swapped per group, padded by ``dilation * (k - 1) - padding`` (plus
    ``output_padding`` at the high end)."""
    nd = _ndim(x) - 2
    layout = tuple(range(nd + 2))
    kernel = _shape(weight)[2:]
    if transposed:
        c_in, c_out_g = _shape(weight)[:2]
        w = shapes.reshape(weight, (groups, c_in // groups, c_out_g) + kernel)
        w = shapes.transpose(w, (0, 2, 1) + tuple(range(3, nd + 3)))
        w = shapes.reshape(w, (groups * c_out_g, c_in // groups) + kernel)
        weight = indexing.getitem(w, (slice(None), slice(None)) + (slice(None, None, -1),) * nd)
        pads = tuple(
            (d * (k - 1) - p, d * (k - 1) - p + o)
            for k, p, d, o in zip(kernel, padding, dilation, output_padding)
        )
        strides, lhs_dilation = (1,) * nd, tuple(stride)
    else:
        pads, strides, lhs_dilation = tuple((p, p) for p in padding), tuple(stride), (1,) * nd
    out = apply(
        "convolution",
        x,
        weight,
        window_strides=strides,
        padding=pads,
        lhs_dilation=lhs_dilation,
        rhs_dilation=tuple(dilation),
        lhs_spec=layout,
        rhs_spec=layout,
        out_spec=layout,
        feature_group_count=groups,
    )
    if bias is not None:
        out = elementwise.add(out, shapes.reshape(bias, (-1,) + (1,) * nd))
    return out


@_register("aten.upsample_nearest2d.vec", "aten.upsample_nearest2d.default", "aten.upsample_nearest1d.vec")
def upsample_nearest(x, output_size, scale_factors=None, *rest):
    """Nearest-neighbour upsampling: output position ``i`` reads input ``floor(i * in / out)``
    (``take`` along each spatial axis; with ``scale_factors``, ``floor(i / scale)``)."""
    nd = _ndim(x) - 2
    sizes = _shape(x)[2:]
    if isinstance(scale_factors, (list, tuple)) and scale_factors:
        scales = [float(f) for f in scale_factors]
        outs = (
            [int(math.floor(n * f)) for n, f in zip(sizes, scales)]
            if output_size is None
            else list(output_size)
        )
        steps = [1.0 / f for f in scales]
    else:
        outs = list(output_size)
        steps = [n / o for n, o in zip(sizes, outs)]
    for axis in range(nd):
        index = np.minimum(np.floor(np.arange(outs[axis]) * steps[axis]).astype(np.int32), sizes[axis] - 1)
        x = take.take(x, index, axis=2 + axis)
    return x


@_register("aten.elu.default")
def elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    """``scale * x`` for ``x > 0``, else ``scale * alpha * (exp(input_scale * x) - 1)``."""
    negative = elementwise.multiply(elementwise.expm1(elementwise.multiply(x, input_scale)), alpha * scale)
    return elementwise.where(elementwise.greater(x, 0), elementwise.multiply(x, scale), negative)


def _window_attrs(nd: int, kernel, stride, padding, dilation=1):
    def per_axis(v):
        v = list(v) if isinstance(v, (list, tuple)) else [v]
        return tuple(v * nd if len(v) == 1 else v)

    kernel = per_axis(kernel)
    stride = (
        kernel if stride is None or (isinstance(stride, (list, tuple)) and not stride) else per_axis(stride)
    )
    return {
        "window_dimensions": (1, 1) + kernel,
        "window_strides": (1, 1) + stride,
        "base_dilations": (1,) * (nd + 2),
        "window_dilations": (1, 1) + per_axis(dilation),
        "padding": ((0, 0), (0, 0)) + tuple((p, p) for p in per_axis(padding)),
    }


@_register("aten.max_pool2d_with_indices.default", "aten.max_pool1d_with_indices.default")
def max_pool_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """Max pooling (padding never wins) onto ``reduce_window``; the indices are not computed."""
    if ceil_mode:
        raise TorchImportError("max pooling with ceil_mode=True has no mapping yet")
    dt = type_of(x).dtype
    lowest = -np.inf if dtypes.is_float(dt) else np.iinfo(dt).min
    attrs = _window_attrs(_ndim(x) - 2, kernel_size, stride, padding, dilation)
    return apply("reduce_window", x, np.asarray(lowest, dt), kind="max", **attrs), None


@_register("aten.avg_pool2d.default", "aten.avg_pool1d.default")
def avg_pool(
    x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
):
    """Average pooling: a ``reduce_window`` sum divided by the window size (or, without
    ``count_include_pad``, by the same sum over ones)."""
    if ceil_mode:
        raise TorchImportError("average pooling with ceil_mode=True has no mapping yet")
    dt = type_of(x).dtype
    attrs = _window_attrs(_ndim(x) - 2, kernel_size, stride, padding)
    total = apply("reduce_window", x, np.asarray(0, dt), kind="sum", **attrs)
    if divisor_override:
        return elementwise.true_divide(total, float(divisor_override))
    if count_include_pad:
        return elementwise.true_divide(total, float(np.prod(attrs["window_dimensions"])))
    count = apply(
        "reduce_window", creation.ones((1, 1) + _shape(x)[2:], dt), np.asarray(0, dt), kind="sum", **attrs
    )
    return elementwise.true_divide(total, count)


@_register("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
def adaptive_avg_pool2d(x, output_size):
    """Adaptive average pooling when each output size divides the input size (decomposed:
    ``reshape`` and ``mean``)."""
    *lead, h, w = _shape(x)
    oh, ow = output_size
    if h % oh or w % ow:
        raise TorchImportError(f"adaptive average pooling of {h}x{w} to {oh}x{ow}: sizes must divide")
    blocks = shapes.reshape(x, (*lead, oh, h // oh, ow, w // ow))
    n = len(lead)
    return reductions.mean(blocks, axis=(n + 1, n + 3))


def _per_channel(v, ndim: int):
    return shapes.reshape(v, (1, -1) + (1,) * (ndim - 2))


def _normalize(x, mean_, var_, weight, bias, eps):
    n = _ndim(x)
    out = elementwise.multiply(
        elementwise.subtract(x, _per_channel(mean_, n)), _per_channel(elementwise.rsqrt(var_ + eps), n)
    )
    if weight is not None:
        out = elementwise.multiply(out, _per_channel(weight, n))
    if bias is not None:
        out = elementwise.add(out, _per_channel(bias, n))
    return out


@_register("aten._native_batch_norm_legit_no_training.default")
def batch_norm_inference(x, weight, bias, running_mean, running_var, momentum, eps):
    """Batch norm with the running statistics (eval mode); the saved statistics are not computed."""
    return _normalize(x, running_mean, running_var, weight, bias, eps), None, None


@_register("aten._native_batch_norm_legit_functional.default")
def batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """Batch norm (train mode: the batch's statistics) and the updated running statistics,
    ``(1 - momentum) * running + momentum * batch`` (the batch variance unbiased, as in PyTorch)."""
    if not training:
        out = batch_norm_inference(x, weight, bias, running_mean, running_var, momentum, eps)[0]
        return out, None, None, running_mean, running_var
    axes = tuple(i for i in range(_ndim(x)) if i != 1)
    count = int(np.prod([_shape(x)[i] for i in axes]))
    batch_mean = reductions.mean(x, axis=axes)
    batch_var = reductions.var(x, axis=axes)
    out = _normalize(x, batch_mean, batch_var, weight, bias, eps)
    unbiased = elementwise.multiply(batch_var, count / max(count - 1, 1))
    new_mean = elementwise.add(
        elementwise.multiply(running_mean, 1 - momentum), elementwise.multiply(batch_mean, momentum)
    )
    new_var = elementwise.add(
        elementwise.multiply(running_var, 1 - momentum), elementwise.multiply(unbiased, momentum)
    )
    return out, batch_mean, elementwise.rsqrt(batch_var + eps), new_mean, new_var


@_register("aten._native_batch_norm_legit.no_stats")
def batch_norm_no_stats(x, weight, bias, training, momentum, eps):
    """Batch norm with the batch's statistics and no running ones (instance norm's form)."""
    axes = tuple(i for i in range(_ndim(x)) if i != 1)
    batch_mean = reductions.mean(x, axis=axes)
    batch_var = reductions.var(x, axis=axes)
    out = _normalize(x, batch_mean, batch_var, weight, bias, eps)
    return out, batch_mean, elementwise.rsqrt(batch_var + eps)


@_register("aten.native_group_norm.default")
def group_norm(x, weight, bias, n, c, hw, group, eps):
    """Group norm: mean and variance over each group of ``c / group`` channels and the spatial
    axes; also the mean and ``1/std`` per ``[n, group]``."""
    shape = _shape(x)
    grouped = shapes.reshape(x, (shape[0], group, -1))
    mean_ = reductions.mean(grouped, axis=2, keepdims=True)
    centered = elementwise.subtract(grouped, mean_)
    var_ = reductions.mean(elementwise.multiply(centered, centered), axis=2, keepdims=True)
    rstd = elementwise.rsqrt(var_ + eps)
    out = shapes.reshape(elementwise.multiply(centered, rstd), shape)
    per_channel = (1, -1) + (1,) * (len(shape) - 2)
    if weight is not None:
        out = elementwise.multiply(out, shapes.reshape(weight, per_channel))
    if bias is not None:
        out = elementwise.add(out, shapes.reshape(bias, per_channel))
    return out, shapes.reshape(mean_, (shape[0], group)), shapes.reshape(rstd, (shape[0], group))


@_register("aten.native_layer_norm.default")
def layer_norm(x, normalized_shape, weight, bias, eps):
    """Layer norm over the last ``len(normalized_shape)`` axes; also the mean and ``1/std``."""
    axes = tuple(range(_ndim(x) - len(normalized_shape), _ndim(x)))
    mean_ = reductions.mean(x, axis=axes, keepdims=True)
    centered = elementwise.subtract(x, mean_)
    rstd = elementwise.rsqrt(
        reductions.mean(elementwise.multiply(centered, centered), axis=axes, keepdims=True) + eps
    )
    out = elementwise.multiply(centered, rstd)
    if weight is not None:
        out = elementwise.multiply(out, weight)
    if bias is not None:
        out = elementwise.add(out, bias)
    return out, mean_, rstd


@_register("aten.native_dropout.default")
def native_dropout(x, p, train):
    """Dropout with ``train=False`` or ``p=0`` (the identity); random dropout is not mapped."""
    if train and p > 0:
        raise TorchImportError(
            "aten.native_dropout in train mode needs random numbers: export the module in eval mode "
            "(module.eval()) or with dropout probability 0"
        )
    return x, None


# ------------------------------------------------------------------------------ no-ops

for _name in (
    "aten._assert_tensor_metadata.default",
    "aten._assert_scalar.default",
    "aten.sym_constrain_range_for_size.default",
    "aten.sym_constrain_range.default",
    "aten._assert_async.msg",
):
    ATEN[_name] = lambda *args, **kwargs: None
