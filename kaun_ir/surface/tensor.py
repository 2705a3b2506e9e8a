"""Symbolic tensors (what user code sees while tracing) and ``apply``, the one way ops are made.

``apply("add", x, y)`` inside a trace appends a node to the active builder and returns Tensors;
outside any trace, with concrete operands, it runs the single op through the runtime (compiled
once per op signature and cached there; see :mod:`kaun_ir.surface.eager`) and returns ``jax.Array``s.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import TracerError
from kaun_ir.ir.builder import Builder, current_builder, is_active
from kaun_ir.ir.core import Graph, TensorType, Value
from kaun_ir.ops import TABLE
from kaun_ir.ops import get as get_op
from kaun_ir.surface.constant_hooks import replacement
from kaun_ir.surface.eager import runtime

# The NumPy-style modules that Tensor's operators and methods are (``x + y`` is
# ``elementwise.add``). They build on this module, so the surface package fills the slot when it
# is imported (kaun_ir/surface/__init__.py), which Python does before this module is used.
_SURFACE = SimpleNamespace()


def bind_functions(**modules) -> None:
    """Called by ``kaun_ir.surface``: the modules (``elementwise``, ``indexing``, ``linalg``,
    ``promotion``, ``reductions``, ``shapes``) that Tensor's operators and methods call."""
    vars(_SURFACE).update(modules)


def _surface() -> SimpleNamespace:
    return _SURFACE


class Tensor:
    """A value of the graph being traced. Supports the NumPy-style surface of API.md §1."""

    __slots__ = ("value", "builder")
    __array_priority__ = 1000  # NumPy defers binary operators to us

    def __init__(self, value: Value, builder: Builder):
        self.value = value
        self.builder = builder

    # -- metadata ------------------------------------------------------------------------------
    @property
    def type(self) -> TensorType:
        return self.value.type

    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.type.shape

    @property
    def dtype(self) -> np.dtype:
        return self.value.type.dtype

    @property
    def ndim(self) -> int:
        return len(self.value.type.shape)

    @property
    def size(self) -> int:
        return self.value.type.size

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a scalar tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"Tensor({self.type})"

    __hash__ = object.__hash__

    # -- concrete conversions are errors while tracing -----------------------------------------
    def _concrete(self, what: str):
        raise TracerError(
            f"{what} of a traced {self.type} needs a concrete value, which does not exist while "
            "tracing; use kn.where / kn.select-style ops instead of Python control flow"
        )

    def __bool__(self):
        self._concrete("bool()")

    def __int__(self):
        self._concrete("int()")

    def __float__(self):
        self._concrete("float()")

    def __index__(self):
        self._concrete("using as an index")

    def __array__(self, dtype=None, copy=None):
        self._concrete("np.asarray()")

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __setitem__(self, index, value):
        raise TypeError(
            "kaun_ir tensors are immutable: x[...] = v cannot assign; build a new array "
            "with kn.where(mask, v, x) or kn.dynamic_update_slice(x, v, start)"
        )

    def __add__(self, other):
        return _surface().elementwise.add(self, other)

    def __radd__(self, other):
        return _surface().elementwise.add(other, self)

    def __sub__(self, other):
        return _surface().elementwise.subtract(self, other)

    def __rsub__(self, other):
        return _surface().elementwise.subtract(other, self)

    def __mul__(self, other):
        return _surface().elementwise.multiply(self, other)

    def __rmul__(self, other):
        return _surface().elementwise.multiply(other, self)

    def __truediv__(self, other):
        return _surface().elementwise.divide(self, other)

    def __rtruediv__(self, other):
        return _surface().elementwise.divide(other, self)

    def __floordiv__(self, other):
        return _surface().elementwise.floor_divide(self, other)

    def __rfloordiv__(self, other):
        return _surface().elementwise.floor_divide(other, self)

    def __mod__(self, other):
        return _surface().elementwise.mod(self, other)

    def __rmod__(self, other):
        return _surface().elementwise.mod(other, self)

    def __pow__(self, other):
        return _surface().elementwise.power(self, other)

    def __rpow__(self, other):
        return _surface().elementwise.power(other, self)

    def __matmul__(self, other):
        return _surface().linalg.matmul(self, other)

    def __rmatmul__(self, other):
        return _surface().linalg.matmul(other, self)

    def __neg__(self):
        return _surface().elementwise.negative(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return _surface().elementwise.abs(self)

    def __invert__(self):
        return _surface().elementwise.invert(self)

    def __and__(self, other):
        return _surface().elementwise.bitwise_and(self, other)

    def __rand__(self, other):
        return _surface().elementwise.bitwise_and(other, self)

    def __or__(self, other):
        return _surface().elementwise.bitwise_or(self, other)

    def __ror__(self, other):
        return _surface().elementwise.bitwise_or(other, self)

    def __xor__(self, other):
        return _surface().elementwise.bitwise_xor(self, other)

    def __rxor__(self, other):
        return _surface().elementwise.bitwise_xor(other, self)

    def __lshift__(self, other):
        return _surface().elementwise.left_shift(self, other)

    def __rshift__(self, other):
        return _surface().elementwise.right_shift(self, other)

    def __lt__(self, other):
        return _surface().elementwise.less(self, other)

    def __le__(self, other):
        return _surface().elementwise.less_equal(self, other)

    def __gt__(self, other):
        return _surface().elementwise.greater(self, other)

    def __ge__(self, other):
        return _surface().elementwise.greater_equal(self, other)

    def __eq__(self, other):
        return _surface().elementwise.equal(self, other)  # type: ignore[override]

    def __ne__(self, other):
        return _surface().elementwise.not_equal(self, other)  # type: ignore[override]

    def __getitem__(self, index):
        return _surface().indexing.getitem(self, index)

    @property
    def T(self):
        return _surface().shapes.transpose(self)

    def reshape(self, *shape):
        """``kn.reshape(self, shape)``; the shape may also be given as separate ints."""
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return _surface().shapes.reshape(self, shape)

    def transpose(self, *axes):
        """``kn.transpose(self, axes)``; no axes reverses them, as NumPy."""
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        return _surface().shapes.transpose(self, axes or None)

    def astype(self, dtype):
        """``kn.astype(self, dtype)``."""
        return _surface().promotion.astype(self, dtype)

    def sum(self, axis=None, keepdims=False):
        """``kn.sum(self, axis, keepdims)``."""
        return _surface().reductions.sum(self, axis=axis, keepdims=keepdims)

    def mean(self, axis=None, keepdims=False):
        """``kn.mean(self, axis, keepdims)``."""
        return _surface().reductions.mean(self, axis=axis, keepdims=keepdims)

    def max(self, axis=None, keepdims=False):
        """``kn.max(self, axis, keepdims)``."""
        return _surface().reductions.max(self, axis=axis, keepdims=keepdims)

    def min(self, axis=None, keepdims=False):
        """``kn.min(self, axis, keepdims)``."""
        return _surface().reductions.min(self, axis=axis, keepdims=keepdims)

    def prod(self, axis=None, keepdims=False):
        """``kn.prod(self, axis, keepdims)``."""
        return _surface().reductions.prod(self, axis=axis, keepdims=keepdims)

    def var(self, axis=None, keepdims=False):
        """``kn.var(self, axis, keepdims)``."""
        return _surface().reductions.var(self, axis=axis, keepdims=keepdims)

    def std(self, axis=None, keepdims=False):
        """``kn.std(self, axis, keepdims)``."""
        return _surface().reductions.std(self, axis=axis, keepdims=keepdims)

    def all(self, axis=None, keepdims=False):
        """``kn.all(self, axis, keepdims)``."""
        return _surface().reductions.all(self, axis=axis, keepdims=keepdims)

    def any(self, axis=None, keepdims=False):
        """``kn.any(self, axis, keepdims)``."""
        return _surface().reductions.any(self, axis=axis, keepdims=keepdims)

    def argmax(self, axis=None, keepdims=False):
        """``kn.argmax(self, axis, keepdims)``."""
        return _surface().reductions.argmax(self, axis=axis, keepdims=keepdims)

    def argmin(self, axis=None, keepdims=False):
        """``kn.argmin(self, axis, keepdims)``."""
        return _surface().reductions.argmin(self, axis=axis, keepdims=keepdims)

    def flatten(self):
        """The elements as one axis (``kn.reshape(self, (-1,))``)."""
        return _surface().shapes.reshape(self, (-1,))


def is_tensor(x: Any) -> bool:
    """Whether ``x`` is a Tensor of a trace (rather than a concrete array or a number)."""
    return isinstance(x, Tensor)


def is_foreign_array(x: Any) -> bool:
    """An array of another library (a PyTorch tensor, ...) that kaun_ir takes through DLPack."""
    return (
        hasattr(x, "__dlpack__")
        and not isinstance(x, (np.ndarray, np.generic, Tensor))
        and type(x).__module__.split(".")[0] not in ("jax", "jaxlib")
    )


def from_foreign(x: Any):
    """A foreign array as a ``jax.Array`` sharing its memory where DLPack allows (no copy on CPU)."""
    return runtime().from_dlpack(x)


def concrete_array(x: Any) -> np.ndarray:
    """A host array for a concrete operand; Python scalars get the default dtypes (f32 / i32)."""
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        return np.asarray(x, dtype=dtypes.dtype_of_scalar(x))
    if is_foreign_array(x):
        x = from_foreign(x)
    arr = np.asarray(x)
    if arr.dtype not in dtypes.ALL:
        if arr.dtype.kind == "f":
            arr = arr.astype(np.float32)
        else:
            dtypes.canonical(arr.dtype)  # raises a clear TypeError
    return arr


def type_of(x: Any) -> TensorType:
    """The TensorType of a Tensor, jax.Array, NumPy array or Python scalar."""
    if isinstance(x, Tensor):
        return x.type
    if is_foreign_array(x):
        x = from_foreign(x)
    if hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, np.ndarray):
        return TensorType(x.dtype, x.shape)
    arr = concrete_array(x)
    return TensorType(arr.dtype, arr.shape)


def to_value(builder: Builder, x: Any) -> Value:
    """The graph value for an operand: the tensor's own, a capture, or a new constant node."""
    if isinstance(x, Tensor):
        if x.builder is builder:
            return x.value
        if is_active(x.builder):
            return builder.capture(x)
        raise TracerError(
            f"a {x.type} tensor from a trace that has already finished was used; tensors must not "
            "escape the function being traced (return them instead)"
        )
    replaced = replacement(x)
    if replaced is not None:
        return to_value(builder, replaced)
    arr = concrete_array(x)
    return builder.add(TABLE["constant"], [], {"value": arr})[0]


def apply(op: str, *operands: Any, regions: tuple[Graph, ...] = (), **attrs: Any):
    """Apply primitive ``op``; one output -> Tensor (or jax.Array), several -> a tuple."""
    opdef = TABLE.get(op) or get_op(op)  # get_op raises a KeyError listing the known ops
    builder = current_builder()
    if builder is None:
        for x in operands:
            if isinstance(x, Tensor):
                raise TracerError(
                    f"a {x.type} tensor from a trace that has already finished was used; tensors must "
                    "not escape the function being traced (return them instead)"
                )
        outs = runtime().run_op(opdef, operands, attrs, regions)
        return outs[0] if len(outs) == 1 else tuple(outs)
    values = [to_value(builder, x) for x in operands]
    outs = builder.add(opdef, values, attrs, regions)
    tensors = tuple(Tensor(v, builder) for v in outs)
    return tensors[0] if len(tensors) == 1 else tensors
