"""The ATen table's creation ops: ``full``, ``zeros``, ``ones`` (and their ``_like`` and
``new_`` forms), ``scalar_tensor`` and ``arange``, with PyTorch's default dtypes."""

from __future__ import annotations

from collections.abc import Callable

from kaun_ir import dtypes
from kaun_ir.runtime.interop.torch_args import dtype_of_torch, registrar
from kaun_ir.runtime.interop.torch_args import shape as _shape
from kaun_ir.surface import creation
from kaun_ir.surface.tensor import type_of

#: this family's entries of the ATen table (``torch_ops.ATEN`` merges the families)
ATEN: dict[str, Callable] = {}
_register = registrar(ATEN)


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
