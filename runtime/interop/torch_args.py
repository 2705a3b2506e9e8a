"""What the ATen table's op families share: PyTorch's dtypes, PyTorch's ``dim`` arguments, and the
decorator that enters a function in a family's table under its ATen names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kaun_ir import dtypes
from kaun_ir.errors import TorchImportError
from kaun_ir.surface.promotion import astype
from kaun_ir.surface.tensor import type_of

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

__all__ = ["DTYPES", "as_float", "axes", "axis", "cast", "dtype_of_torch", "rank", "registrar", "shape"]


def dtype_of_torch(name: Any):
    """The kaun_ir dtype of a PyTorch dtype (or its ``str``); TorchImportError if there is none."""
    key = str(name)
    if key not in DTYPES:
        raise TorchImportError(f"dtype {key} has no kaun_ir counterpart")
    return DTYPES[key]


def registrar(table: dict[str, Callable]) -> Callable:
    """A decorator factory: ``@register("aten.x.default", ...)`` enters the function in ``table``
    under each of the names."""

    def register(*names: str) -> Callable:
        def decorate(fn: Callable) -> Callable:
            for name in names:
                table[name] = fn
            return fn

        return decorate

    return register


def shape(x) -> tuple[int, ...]:
    """The shape of the traced tensor ``x``."""
    return type_of(x).shape


def rank(x) -> int:
    """The number of axes of the traced tensor ``x``."""
    return len(type_of(x).shape)


def axis(dim: int, ndim: int) -> int:
    """PyTorch's ``dim`` (negative counts from the end) as an axis in ``[0, ndim)``."""
    return dim + ndim if dim < 0 else dim


def axes(dim, ndim: int) -> tuple[int, ...]:
    """A reduction's ``dim`` argument as sorted axes: None or ``[]`` is every axis."""
    if dim is None or (isinstance(dim, (list, tuple)) and not dim):
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    return tuple(sorted(axis(d, ndim) for d in dim))


def as_float(x):
    """``x`` itself when its dtype is a float, else ``x`` as float32."""
    dt = type_of(x).dtype
    return x if dtypes.is_float(dt) else astype(x, dtypes.float32)


def cast(x, dtype):
    """``x`` as the PyTorch dtype ``dtype`` (unchanged when None)."""
    return x if dtype is None else astype(x, dtype_of_torch(dtype))
