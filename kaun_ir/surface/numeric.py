"""The NumPy-style function surface (``kn.exp``, ``kn.where``, ``kn.reshape`` ...).

Every function takes Tensors while tracing and concrete arrays (NumPy, jax.Array, Python
scalars) outside a trace. Broadcasting follows NumPy; dtypes promote along bool < int < float
(see ``dtypes.result_type``), and Python scalars are *weak*: they take the dtype of the other
operand (``x_f16 * 2.0`` stays float16), except that a float scalar next to an integer tensor
gives float32.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.builder import current_path
from kaun_ir.surface.function import op_function
from kaun_ir.surface.tensor import Tensor, apply, type_of

# ------------------------------------------------------------------------------ helpers


def _is_weak(x: Any) -> bool:
    return isinstance(x, (bool, int, float)) and not isinstance(x, np.generic)


def shape_of(x: Any) -> tuple[int, ...]:
    """The shape of a Tensor, jax.Array, NumPy array or Python scalar, as a tuple of ints."""
    return type_of(x).shape


def dtype_of(x: Any) -> np.dtype:
    """The dtype of a Tensor, jax.Array, NumPy array or Python scalar."""
    return type_of(x).dtype


def broadcast_shapes(*shapes: Sequence[int], op: str = "broadcast") -> tuple[int, ...]:
    """NumPy's broadcasting rule; ShapeError naming the shapes when they do not broadcast."""
    ndim = builtins.max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(ndim):
        sizes = {s[axis - ndim + len(s)] for s in shapes if axis - ndim + len(s) >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            where = f"{current_path()}: " if current_path() else ""
            listed = " and ".join(f"[{','.join(map(str, s))}]" for s in shapes)
            raise ShapeError(f"{where}{op}: shapes {listed} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def astype(x: Any, dtype) -> Any:
    """``x`` converted to ``dtype`` (no-op when it already has it)."""
    dtype = dtypes.canonical(dtype)
    if isinstance(x, Tensor):
        return x if x.dtype == dtype else apply("convert", x, dtype=dtype)
    if _is_weak(x) or isinstance(x, (np.ndarray, np.generic)):
        return np.asarray(x, dtype=dtype)
    return apply("convert", x, dtype=dtype) if dtype_of(x) != dtype else x


def broadcast_to(x: Any, shape: Sequence[int]) -> Any:
    """Broadcast ``x`` to ``shape`` with NumPy's rules."""
    shape = tuple(int(d) for d in shape)
    src = shape_of(x)
    if src == shape:
        return x
    if len(src) > len(shape):
        raise ShapeError(
            f"broadcast_to: cannot broadcast [{','.join(map(str, src))}] to "
            f"[{','.join(map(str, shape))}] of lower rank"
        )
    broadcast_shapes(src, shape, op="broadcast_to")
    if broadcast_shapes(src, shape) != shape:
        raise ShapeError(
            f"broadcast_to: cannot broadcast [{','.join(map(str, src))}] to [{','.join(map(str, shape))}]"
        )
    offset = len(shape) - len(src)
    return apply("broadcast_in_dim", x, shape=shape, broadcast_dimensions=tuple(range(offset, len(shape))))


def promote(*xs: Any, op: str = "op", to_float: bool = False) -> list:
    """Operands converted to one dtype and broadcast to one shape (weak scalars adapt)."""
    strong = [dtype_of(x) for x in xs if not _is_weak(x)]
    weak = [x for x in xs if _is_weak(x)]
    if strong:
        dtype = dtypes.result_type(*strong)
        if any(isinstance(w, float) for w in weak) and not dtypes.is_float(dtype):
            dtype = dtypes.float32
        elif any(isinstance(w, int) and not isinstance(w, bool) for w in weak) and dtypes.is_bool(dtype):
            dtype = dtypes.int32
    else:
        dtype = dtypes.result_type(*[dtypes.dtype_of_scalar(w) for w in weak])
    if to_float and not dtypes.is_float(dtype):
        dtype = dtypes.float32
    shape = broadcast_shapes(*[shape_of(x) for x in xs], op=op)
    out = []
    for x in xs:
        x = astype(x, dtype)
        out.append(broadcast_to(x, shape))
    return out


def _unary_float(op: str, x: Any) -> Any:
    x = x if dtypes.is_float(dtype_of(x)) else astype(x, dtypes.float32)
    return apply(op, x)


# ------------------------------------------------------------------------- elementwise


def _binary(prim: str, name: str, to_float: bool = False):
    def fn(a, b):
        a, b = promote(a, b, op=name, to_float=to_float)
        return apply(prim, a, b)

    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}`` with NumPy broadcasting and dtype promotion."
    return op_function(fn)


add = _binary("add", "add")
subtract = _binary("subtract", "subtract")
multiply = _binary("multiply", "multiply")
divide = _binary("divide", "divide", to_float=True)
true_divide = divide
maximum = _binary("maximum", "maximum")
minimum = _binary("minimum", "minimum")
bitwise_and = _binary("and", "bitwise_and")
bitwise_or = _binary("or", "bitwise_or")
bitwise_xor = _binary("xor", "bitwise_xor")
left_shift = _binary("shift_left", "left_shift")
arctan2 = _binary("atan2", "arctan2", to_float=True)


@op_function
def right_shift(a, b):
    """Arithmetic shift for signed integers, logical for unsigned (like NumPy)."""
    a, b = promote(a, b, op="right_shift")
    prim = "shift_right_logical" if dtypes.is_unsigned(dtype_of(a)) else "shift_right_arithmetic"
    return apply(prim, a, b)


@op_function
def power(a, b):
    """``a ** b`` elementwise. A small integer exponent (|b| <= 4) becomes multiplications,
    which is exact and gives a leaner derivative than the general ``power`` op."""
    if isinstance(b, int) and not isinstance(b, bool) and -4 <= b <= 4 and not _is_weak(a):
        if b == 0:
            return ones_like(a)
        result = a
        for _ in range(builtins.abs(b) - 1):
            result = multiply(result, a)
        return reciprocal(result) if b < 0 else result
    a, b = promote(a, b, op="power")
    return apply("power", a, b)


@op_function
def floor_divide(a, b):
    """``a // b``: floor of the quotient (Python semantics for integers too)."""
    a, b = promote(a, b, op="floor_divide")
    if dtypes.is_float(dtype_of(a)):
        return _float_floor_divide(a, b)
    if dtypes.is_unsigned(dtype_of(a)):
        return apply("divide", a, b)
    quotient = apply("divide", a, b)
    remainder = apply("remainder", a, b)
    zero = astype(0, dtype_of(a))
    adjust = (remainder != zero) & ((remainder < zero) != (b < zero))
    return where(adjust, quotient - astype(1, dtype_of(a)), quotient)


def _float_floor_divide(a, b):
    """NumPy's float ``a // b`` computed as jax.numpy (and CPython's float divmod) do: from the
    exact remainder, so that ``-1 // inf`` is ``-1`` and ``1 // 0`` is ``inf``, which
    ``floor(a / b)`` gets wrong."""
    remainder = apply("remainder", a, b)
    zero = astype(0, dtype_of(a))
    quotient = apply("divide", where(b == zero, a, a - remainder), b)
    adjust = (remainder != zero) & (apply("sign", b) != apply("sign", remainder))
    quotient = where(adjust, quotient - astype(1, dtype_of(a)), quotient)
    return apply("round_nearest_even", quotient)


@op_function
def mod(a, b):
    """``a % b`` with the sign of ``b`` (Python / NumPy semantics)."""
    a, b = promote(a, b, op="mod")
    remainder = apply("remainder", a, b)
    if dtypes.is_unsigned(dtype_of(a)):
        return remainder
    zero = astype(0, dtype_of(a))
    adjust = (remainder != zero) & ((remainder < zero) != (b < zero))
    return where(adjust, remainder + b, remainder)


remainder = mod


def _compare(direction: str, name: str):
    def fn(a, b):
        a, b = promote(a, b, op=name)
        return apply("compare", a, b, direction=direction)

    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}`` (bool result) with broadcasting."
    return op_function(fn)


equal = _compare("EQ", "equal")
not_equal = _compare("NE", "not_equal")
less = _compare("LT", "less")
less_equal = _compare("LE", "less_equal")
greater = _compare("GT", "greater")
greater_equal = _compare("GE", "greater_equal")


def _unary(prim: str, name: str, float_only: bool = True):
    def fn(x):
        return _unary_float(prim, x) if float_only else apply(prim, x)

    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}``" + (" (integers are converted to float32)." if float_only else ".")
    return op_function(fn)


exp = _unary("exponential", "exp")
expm1 = _unary("exponential_minus_one", "expm1")
log = _unary("log", "log")
log1p = _unary("log_plus_one", "log1p")
sqrt = _unary("sqrt", "sqrt")
rsqrt = _unary("rsqrt", "rsqrt")
sin = _unary("sine", "sin")
cos = _unary("cosine", "cos")
tanh = _unary("tanh", "tanh")
sigmoid = _unary("logistic", "sigmoid")
erf = _unary("erf", "erf")
negative = _unary("negate", "negative", float_only=False)
sign = _unary("sign", "sign", float_only=False)


@op_function
def abs(x):  # noqa: A001 - NumPy's name
    """Elementwise absolute value (identity on unsigned integers)."""
    return x if dtypes.is_unsigned(dtype_of(x)) else apply("abs", x)


@op_function
def floor(x):
    """Elementwise floor (identity on integers)."""
    return x if not dtypes.is_float(dtype_of(x)) else apply("floor", x)


@op_function
def ceil(x):
    """Elementwise ceiling (identity on integers)."""
    return x if not dtypes.is_float(dtype_of(x)) else apply("ceil", x)


@op_function
def round(x):  # noqa: A001 - NumPy's name
    """Round to the nearest integer, ties to even (like ``np.round``)."""
    return x if not dtypes.is_float(dtype_of(x)) else apply("round_nearest_even", x)


@op_function
def invert(x):
    """Bitwise not (logical not on bool)."""
    return apply("not", x)


logical_not = invert


@op_function
def square(x):
    """``x * x``."""
    return multiply(x, x)


@op_function
def reciprocal(x):
    """``1 / x`` (float)."""
    return divide(1.0, x)


@op_function
def where(condition, x, y):
    """``x`` where ``condition`` holds, else ``y`` (all three broadcast together)."""
    x, y = promote(x, y, op="where")
    shape = broadcast_shapes(shape_of(condition), shape_of(x), op="where")
    condition = astype(condition, dtypes.bool_) if dtype_of(condition) != dtypes.bool_ else condition
    return apply("select", broadcast_to(condition, shape), broadcast_to(x, shape), broadcast_to(y, shape))


@op_function
def clip(x, min=None, max=None):  # noqa: A002 - NumPy's names
    """Limit ``x`` to ``[min, max]`` (either bound may be None)."""
    if min is not None:
        x = maximum(x, astype(min, dtype_of(x)) if _is_weak(min) else min)
    if max is not None:
        x = minimum(x, astype(max, dtype_of(x)) if _is_weak(max) else max)
    return x


# ------------------------------------------------------------------------------ shapes


def _normalize_shape(shape: Sequence[int], size: int) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
    if shape.count(-1) > 1:
        raise ShapeError(f"more than one -1 in {list(shape)}")
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
        if known == 0 or size % known:
            raise ShapeError(f"cannot infer -1 in {list(shape)} for {size} elements")
        shape = tuple(size // known if d == -1 else d for d in shape)
    return shape


@op_function
def reshape(x, shape):
    """Row-major reshape; one entry of ``shape`` may be -1."""
    t = type_of(x)
    where_ = f"{current_path()}: " if current_path() else ""
    try:
        shape = _normalize_shape(shape, t.size)
    except ShapeError as err:
        raise ShapeError(f"{where_}reshape of {t}: {err}") from None
    if int(np.prod(shape, dtype=np.int64)) != t.size:
        raise ShapeError(f"{where_}reshape of {t}: cannot reshape {t.size} elements into {list(shape)}")
    return x if shape == t.shape else apply("reshape", x, shape=shape)


def normalize_axis(axis: Any, ndim: int, name: str) -> int:
    """``axis`` in ``[-ndim, ndim)`` as a non-negative int; anything else is an error naming
    ``name``: a ``TypeError`` for a non-integer (bools included), a ``ShapeError`` when out of
    range. Axes never wrap around."""
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(
            f"{current_path() + ': ' if current_path() else ''}{name}: axis must be an int, got {axis!r}"
        )
    if not -ndim <= axis < ndim:
        raise ShapeError(
            f"{current_path() + ': ' if current_path() else ''}{name}: axis {int(axis)} is out "
            f"of range for a tensor of rank {ndim}"
        )
    return int(axis) % ndim


@op_function
def transpose(x, axes=None):
    """Permute axes (default: reverse them); ``axes`` must be a permutation of ``range(ndim)``
    (negative entries count from the end)."""
    ndim = len(shape_of(x))
    if axes is None:
        axes = tuple(reversed(range(ndim)))
    else:
        axes = tuple(normalize_axis(a, ndim, "transpose") for a in axes)
        if sorted(axes) != list(range(ndim)):
            raise ShapeError(f"transpose: axes {list(axes)} are not a permutation of {ndim} axes")
    return x if axes == tuple(range(ndim)) else apply("transpose", x, permutation=axes)


@op_function
def expand_dims(x, axis):
    """Insert a size-1 axis at ``axis`` (in ``[-ndim-1, ndim]``, like ``jnp.expand_dims``)."""
    shape = list(shape_of(x))
    shape.insert(normalize_axis(axis, len(shape) + 1, "expand_dims"), 1)
    return reshape(x, shape)


@op_function
def squeeze(x, axis=None):
    """Remove size-1 axes (all of them, or the ones in ``axis``)."""
    shape = shape_of(x)
    if axis is None:
        axes = {i for i, d in enumerate(shape) if d == 1}
    else:
        items = axis if isinstance(axis, (tuple, list)) else (axis,)
        axes = {normalize_axis(a, len(shape), "squeeze") for a in items}
        if any(shape[a] != 1 for a in axes):
            raise ShapeError(f"squeeze: axis {sorted(axes)} of shape {list(shape)} is not of size 1")
    return reshape(x, [d for i, d in enumerate(shape) if i not in axes])


@op_function
def concatenate(xs, axis=0):
    """Join a sequence of arrays along ``axis`` (dtypes promote)."""
    xs = list(xs)
    if not xs:
        raise ValueError("concatenate needs at least one array")
    dtype = dtypes.result_type(*[dtype_of(x) for x in xs])
    ndim = len(shape_of(xs[0]))
    if ndim == 0:
        raise ShapeError("concatenate: zero-dimensional arrays cannot be concatenated (use stack)")
    axis = normalize_axis(axis, ndim, "concatenate")
    return apply("concatenate", *[astype(x, dtype) for x in xs], dimension=axis)


@op_function
def stack(xs, axis=0):
    """Join arrays of one shape along a new axis."""
    xs = list(xs)
    if not xs:
        raise ValueError("stack needs at least one array")
    shapes = [tuple(shape_of(x)) for x in xs]
    if any(s != shapes[0] for s in shapes):
        raise ShapeError(f"stack: arrays must have one shape, got {', '.join(str(list(s)) for s in shapes)}")
    axis = normalize_axis(axis, len(shape_of(xs[0])) + 1, "stack")
    return concatenate([expand_dims(x, axis) for x in xs], axis=axis)


def _fill(shape, value, dtype):
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if any(isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
        raise ValueError(f"shape must be a sequence of non-negative ints, got {shape!r}")
    shape = tuple(int(d) for d in shape)
    scalar = np.asarray(value, dtype=dtypes.canonical(dtype))
    return (
        apply("broadcast_in_dim", scalar, shape=shape, broadcast_dimensions=())
        if shape
        else apply("reshape", scalar, shape=())
    )


@op_function
def full(shape, fill_value, dtype=None):
    """An array of ``shape`` filled with ``fill_value`` (dtype from the value if not given)."""
    dtype = (
        dtype
        if dtype is not None
        else (dtypes.dtype_of_scalar(fill_value) if _is_weak(fill_value) else np.asarray(fill_value).dtype)
    )
    return _fill(shape, fill_value, dtype)


@op_function
def zeros(shape, dtype=dtypes.float32):
    """Zeros of ``shape`` and ``dtype`` (default float32)."""
    return _fill(shape, 0, dtype)


@op_function
def ones(shape, dtype=dtypes.float32):
    """Ones of ``shape`` and ``dtype`` (default float32)."""
    return _fill(shape, 1, dtype)


def zeros_like(x, dtype=None):
    """Zeros with the shape (and dtype) of ``x``."""
    t = type_of(x)
    return zeros(t.shape, dtype or t.dtype)


def ones_like(x, dtype=None):
    """Ones with the shape (and dtype) of ``x``."""
    t = type_of(x)
    return ones(t.shape, dtype or t.dtype)


def full_like(x, fill_value, dtype=None):
    """``fill_value`` with the shape (and dtype) of ``x``."""
    t = type_of(x)
    return full(t.shape, fill_value, dtype or t.dtype)


@op_function
def arange(start, stop=None, step=1, dtype=None):
    """``start, start + step, ...`` below ``stop`` (like ``np.arange``; int32 or float32)."""
    if stop is None:
        start, stop = 0, start
    for name, value in (("start", start), ("stop", stop), ("step", step)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TypeError(f"arange: {name} must be a Python or NumPy number, got {value!r}")
        if not np.isfinite(value):
            raise ValueError(f"arange: {name} must be finite, got {value!r}")
    if step == 0:
        raise ValueError("arange: step must not be zero")
    count = builtins.max(int(np.ceil((stop - start) / step)), 0)
    if dtype is None:
        dtype = dtypes.float32 if any(isinstance(v, float) for v in (start, stop, step)) else dtypes.int32
    dtype = dtypes.canonical(dtype)
    ramp = apply("iota", dtype=dtype, shape=(count,), dimension=0) if count else zeros((0,), dtype)
    if step != 1:
        ramp = ramp * astype(step, dtype)
    if start != 0:
        ramp = ramp + astype(start, dtype)
    return ramp


# ---------------------------------------------------------------------------- indexing


def _is_advanced(index: Any) -> bool:
    return isinstance(index, (Tensor, list, np.ndarray)) or (
        hasattr(index, "shape") and hasattr(index, "dtype") and not isinstance(index, np.generic)
    )


def getitem(x, index):
    """NumPy basic indexing (ints, slices with any step, None, Ellipsis); integer-array
    indices go through ``gather`` (see ``kaun_ir.surface.indexing``)."""
    index = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, (bool, np.bool_)) for i in index):
        # NumPy reads x[True] as a mask adding an axis, not as x[1]; we support neither silently
        raise IndexError("boolean scalar indices are not supported (they add a data-dependent axis)")
    if any(_is_advanced(i) for i in index):
        from kaun_ir.surface.indexing import advanced_getitem

        return advanced_getitem(x, index)
    shape = shape_of(x)
    n_real = builtins.sum(1 for i in index if i is not None and i is not Ellipsis)
    if n_real > len(shape):
        raise IndexError(f"too many indices ({n_real}) for a tensor of rank {len(shape)}")
    if builtins.sum(1 for i in index if i is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis")
    expanded = []
    for i in index:
        if i is Ellipsis:
            expanded += [slice(None)] * (len(shape) - n_real)
        else:
            expanded.append(i)
    starts, limits, strides, flips, out_shape = [], [], [], [], []
    axis = 0
    for item in expanded:
        if item is None:
            out_shape.append(1)
            continue
        if axis >= len(shape):
            break
        size = shape[axis]
        if isinstance(item, (int, np.integer)):
            pos = int(item)
            if not -size <= pos < size:
                raise IndexError(f"index {pos} is out of bounds for axis {axis} with size {size}")
            pos %= size
            starts.append(pos), limits.append(pos + 1), strides.append(1)
        elif isinstance(item, slice):
            positions = range(*item.indices(size))
            if len(positions) == 0:
                starts.append(0), limits.append(0), strides.append(1)
            elif positions.step > 0:
                starts.append(positions[0]), limits.append(positions[-1] + 1), strides.append(positions.step)
            else:
                starts.append(positions[-1]), limits.append(positions[0] + 1), strides.append(-positions.step)
                flips.append(axis)
            out_shape.append(len(positions))
        else:
            raise IndexError(f"unsupported index {item!r} (use ints, slices, None, ..., or integer arrays)")
        axis += 1
    while axis < len(shape):
        starts.append(0), limits.append(shape[axis]), strides.append(1)
        out_shape.append(shape[axis])
        axis += 1
    y = x
    if (tuple(starts), tuple(limits), tuple(strides)) != ((0,) * len(shape), tuple(shape), (1,) * len(shape)):
        y = apply(
            "slice", y, start_indices=tuple(starts), limit_indices=tuple(limits), strides=tuple(strides)
        )
    if flips:
        y = apply("reverse", y, dimensions=tuple(flips))
    return reshape(y, out_shape)


def stop_gradient(x):
    """The identity whose derivative is zero (lowered to nothing)."""
    return apply("stop_gradient", x)


__all__ = [
    "stop_gradient",
    "abs",
    "add",
    "arange",
    "arctan2",
    "astype",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "broadcast_shapes",
    "broadcast_to",
    "ceil",
    "clip",
    "concatenate",
    "cos",
    "divide",
    "dtype_of",
    "equal",
    "erf",
    "exp",
    "expand_dims",
    "expm1",
    "floor",
    "floor_divide",
    "full",
    "full_like",
    "getitem",
    "greater",
    "greater_equal",
    "invert",
    "left_shift",
    "less",
    "less_equal",
    "log",
    "log1p",
    "logical_not",
    "maximum",
    "minimum",
    "mod",
    "multiply",
    "negative",
    "not_equal",
    "ones",
    "ones_like",
    "power",
    "promote",
    "reciprocal",
    "remainder",
    "reshape",
    "right_shift",
    "round",
    "rsqrt",
    "shape_of",
    "sigmoid",
    "sign",
    "sin",
    "sqrt",
    "square",
    "squeeze",
    "stack",
    "subtract",
    "tanh",
    "transpose",
    "true_divide",
    "where",
    "zeros",
    "zeros_like",
]
