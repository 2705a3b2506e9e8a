"""The ATen table's shape and indexing ops: views, permutations, broadcasting, slicing,
concatenation and splitting, padding, triangles, and ``take``-style indexing (embedding, gather)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kaun_ir.runtime.interop.torch_args import axes as _axes
from kaun_ir.runtime.interop.torch_args import axis as _axis
from kaun_ir.runtime.interop.torch_args import cast as _cast
from kaun_ir.runtime.interop.torch_args import rank as _ndim
from kaun_ir.runtime.interop.torch_args import registrar
from kaun_ir.runtime.interop.torch_args import shape as _shape
from kaun_ir.surface import creation, elementwise, indexing, shapes, take
from kaun_ir.surface.promotion import astype, broadcast_to
from kaun_ir.surface.tensor import type_of

#: this family's entries of the ATen table (``torch_ops.ATEN`` merges the families)
ATEN: dict[str, Callable] = {}
_register = registrar(ATEN)


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
